"""Model cards through the API and the pages: validated structured fields, edited by maintainers,
audited, shown on the version page and exported as a README.md with YAML front matter."""

import pytest
import yaml
from django.contrib.auth import get_user_model
from django.test import Client

from accounts.choices import Role
from audit.models import AuditEvent
from registry.models import ModelCard, ModelVersion, RegisteredModel
from tests.factories import api_client_for, team_member

pytestmark = pytest.mark.django_db
CARD = "/api/v1/models/iris/versions/1/card/"
FULL = {
    "license": "apache-2.0", "datasets": ["iris", "s3://data/iris-2024-06.csv"], "base_model": "",
    "intended_use": "Classifying iris flowers from four measurements, for teaching.",
    "limitations": "Trained on 150 samples; not for other species.",
    "evaluation_results": [{"task": "classification", "dataset": "iris", "metric": "accuracy", "value": 0.97}],
}


@pytest.fixture
def iris(db):
    model = RegisteredModel.objects.create(name="iris", description="iris classifier", next_version=2)
    ModelVersion.objects.create(model=model, version=1, format="triton", artifact_key="k", source_commit="abc123",
                                artifact_sha256="1" * 64, artifact_size=4096, tags={"stage": "beta"})
    return model


def member(role: str | None):
    user = get_user_model().objects.create_user(username=f"user-{role}")
    return team_member(user, role) if role else user


def front_matter_and_body(text: str) -> tuple[dict, str]:
    assert text.startswith("---\n"), text[:40]
    header, body = text[4:].split("\n---\n", 1)
    return yaml.safe_load(header), body


def test_a_maintainer_writes_the_card_which_is_normalised_audited_and_read_back(iris):
    maintainer = api_client_for(member(Role.MAINTAINER))
    assert maintainer.get(CARD).json()["license"] == ""  # no card yet: empty fields
    saved = maintainer.patch(CARD, FULL, format="json")
    assert saved.status_code == 200, saved.content
    assert saved.json()["license"] == "Apache-2.0" and saved.json()["updated_by"] == "user-maintainer"
    card = ModelCard.objects.get(version__model__name="iris", version__version=1)
    assert (card.datasets, card.evaluation_results[0]["value"]) == (FULL["datasets"], 0.97)
    event = AuditEvent.objects.get(action="version.card_updated")
    assert event.data["version"] == 1 and event.data["license"] == {"from": "", "to": "Apache-2.0"}
    assert event.object_label == "version v1"

    again = maintainer.patch(CARD, {"limitations": FULL["limitations"]}, format="json")  # unchanged: no event
    assert again.status_code == 200 and AuditEvent.objects.filter(action="version.card_updated").count() == 1
    maintainer.patch(CARD, {"base_model": "sklearn-logreg"}, format="json")
    assert ModelCard.objects.get().intended_use == FULL["intended_use"]  # the fields left out stay


@pytest.mark.parametrize("body,message", [
    ({"license": "do-what-you-like"}, "not an SPDX license expression"),
    ({"license": "MIT AND"}, "not an SPDX license expression"),
    ({"evaluation_results": [{"metric": "accuracy", "value": "high"}]}, "value must be a finite number"),
    ({"evaluation_results": [{"metric": "accuracy", "value": 0.9, "split": "test"}]}, "no other fields"),
    ({"evaluation_results": [{"value": 0.9}]}, "with metric and value"),
    ({"datasets": [""]}, "may not be blank"),
    ({"datasets": ["  "]}, "may not be blank"),
    ({"datasets": ["d"] * 101}, "no more than 100"),
    ({"intended_use": "x" * 10_001}, "no more than 10000"),
    ({"colour": "red"}, "colour"),
])
def test_a_card_that_breaks_a_rule_is_refused_naming_it_and_nothing_is_saved(iris, body, message):
    answer = api_client_for(member(Role.MAINTAINER)).patch(CARD, body, format="json")
    assert answer.status_code == 400 and message in str(answer.json())
    assert not ModelCard.objects.exists() and not AuditEvent.objects.filter(action="version.card_updated").exists()


def test_viewers_read_the_card_outsiders_do_not_see_it_and_only_maintainers_edit_it(iris):
    api_client_for(member(Role.MAINTAINER)).patch(CARD, {"license": "MIT"}, format="json")
    viewer = api_client_for(member(Role.VIEWER))
    assert viewer.get(CARD).json()["license"] == "MIT"
    refused = viewer.patch(CARD, {"license": "GPL-3.0-only"}, format="json")
    assert refused.status_code == 403 and "maintainer role" in refused.json()["detail"]
    outsider = api_client_for(member(None))
    assert outsider.get(CARD).status_code == 404 and outsider.get(f"{CARD}readme/").status_code == 404
    assert outsider.patch(CARD, {"license": "MIT"}, format="json").status_code == 404
    assert ModelCard.objects.get().license == "MIT"
    assert viewer.get("/api/v1/models/iris/versions/9/card/").status_code == 404


def test_the_readme_carries_the_card_as_yaml_front_matter_and_markdown(iris):
    client = api_client_for(member(Role.MAINTAINER))
    client.patch(CARD, FULL, format="json")
    answer = client.get(f"{CARD}readme/")
    assert answer.status_code == 200 and answer["Content-Type"].startswith("text/markdown")
    meta, body = front_matter_and_body(answer.content.decode())
    assert meta == {
        "license": "apache-2.0", "datasets": FULL["datasets"], "tags": ["modelyard", "triton", "stage=beta"],
        "model-index": [{"name": "iris", "results": [{
            "task": {"type": "classification"}, "dataset": {"name": "iris", "type": "iris"},
            "metrics": [{"type": "accuracy", "value": 0.97}]}]}],
    }
    assert body.startswith("\n# iris v1\n\niris classifier\n")
    assert f"## Intended use\n\n{FULL['intended_use']}\n" in body
    assert f"## Limitations\n\n{FULL['limitations']}\n" in body
    assert "| classification | iris | accuracy | 0.97 |" in body
    assert "- source commit: abc123" in body and "1" * 64 in body


def test_the_version_page_shows_the_card_and_its_form_saves_it(iris):
    page = Client()
    page.force_login(member(Role.VIEWER))
    html = page.get("/models/iris/versions/1/").content.decode()
    assert "No model card yet" in html and "Edit the card" not in html
    assert page.get("/models/iris/versions/1/card/").status_code == 403

    page.force_login(member(Role.MAINTAINER))
    refused = page.post("/models/iris/versions/1/card/", {"license": "MIT", "evaluation_results": "acc | 0.9"})
    assert refused.status_code == 200 and "write task | dataset | metric | value" in refused.content.decode()
    refused = page.post("/models/iris/versions/1/card/", {"license": "nonsense-1.0"})
    assert "not an SPDX license expression" in refused.content.decode() and not ModelCard.objects.exists()
    saved = page.post("/models/iris/versions/1/card/", {
        "license": "MIT", "datasets": "iris\n\nuci-iris\n", "intended_use": "teaching",
        "evaluation_results": "classification | iris | accuracy | 0.97\n | | f1 | 1\n"}, follow=True)
    html = saved.content.decode()
    assert saved.redirect_chain == [("/models/iris/versions/1/", 302)] and "model card of v1 is saved" in html
    assert '<span class="card-license">MIT</span>' in html and "<code>uci-iris</code>" in html
    assert ModelCard.objects.get().evaluation_results == [
        {"task": "classification", "dataset": "iris", "metric": "accuracy", "value": 0.97},
        {"task": "", "dataset": "", "metric": "f1", "value": 1}]
    form = page.get("/models/iris/versions/1/card/").content.decode()
    assert "classification | iris | accuracy | 0.97" in form  # the form shows what is saved
    readme = page.get("/models/iris/versions/1/README.md")
    assert readme["Content-Disposition"] == 'attachment; filename="README.md"'
    assert front_matter_and_body(readme.content.decode())[0]["license"] == "mit"
