"""A model card in a real browser: a maintainer fills the card's form from the version page, the page
shows the card, and its README.md downloads with the card as YAML front matter."""

import pytest
import yaml
from django.contrib.auth import get_user_model

from accounts.choices import Role
from audit.models import AuditEvent
from registry.models import ModelVersion, RegisteredModel
from tests.browser.conftest import PASSWORD
from tests.factories import team_member

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_a_maintainer_writes_a_card_sees_it_on_the_version_page_and_downloads_its_readme(
    logged_in, watch, screenshots
):
    team_member(get_user_model().objects.create_user(username="dev", password=PASSWORD), Role.MAINTAINER)
    model = RegisteredModel.objects.create(name="iris", next_version=2)
    ModelVersion.objects.create(model=model, version=1, format="onnx", artifact_key="k", artifact_sha256="1" * 64,
                                artifact_size=1)
    page = logged_in("dev", PASSWORD)
    page.goto("/models/iris/versions/1/")
    assert "No model card yet" in page.locator("#model-card").inner_text()
    page.get_by_role("link", name="Edit the card").click()
    page.fill("input[name=license]", "bsd-3-clause")
    page.fill("textarea[name=datasets]", "iris\nuci-iris")
    page.fill("textarea[name=intended_use]", "Teaching classification.")
    page.fill("textarea[name=limitations]", "Three species only.")
    page.fill("textarea[name=evaluation_results]", "classification | iris | accuracy | 0.97")
    page.get_by_role("button", name="Save the card").click()
    page.wait_for_url("**/models/iris/versions/1/")

    card = page.locator("#model-card")
    assert card.locator(".card-license").inner_text() == "BSD-3-Clause"
    assert card.locator(".card-datasets").inner_text() == "iris, uci-iris"
    assert card.locator(".card-limitations").inner_text() == "Three species only."
    assert card.locator("table.card-results tbody tr").all_inner_texts() == ["classification\tiris\taccuracy\t0.97"]
    page.screenshot(path=screenshots / "version_card.png", full_page=True)
    with page.expect_download() as download:
        card.get_by_role("link", name="README.md").click()
    assert download.value.suggested_filename == "README.md"
    text = open(download.value.path(), encoding="utf-8").read()
    meta = yaml.safe_load(text.split("---\n")[1])
    assert (meta["license"], meta["datasets"]) == ("bsd-3-clause", ["iris", "uci-iris"])
    assert meta["model-index"][0]["results"][0]["metrics"] == [{"type": "accuracy", "value": 0.97}]
    assert AuditEvent.objects.filter(action="version.card_updated", actor_label="dev").count() == 1
    # Chromium ends the navigation that turned into the download with ERR_ABORTED: that one is expected.
    problems = [p for p in watch.problems() if not p.endswith("/versions/1/README.md: net::ERR_ABORTED")]
    assert not problems, problems
