"""Protected aliases in a real browser: a team owner locks an alias on the model page, a move without a
reason is refused with a message, a move with one goes through, and the audit log shows who and why."""

import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import Page
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from registry.models import Alias, ModelVersion, RegisteredModel
from tests.browser.conftest import PASSWORD
from tests.factories import team_member

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def wait_for_message(page: Page, selector: str) -> str:
    """The text of the message ``selector`` once the page shows it; fails with what the page shows instead (its
    address, its messages and the start of its text), so a run that misses it says where the page was."""
    try:
        page.wait_for_selector(selector)
    except PlaywrightTimeout:
        raise AssertionError(f"no {selector} on {page.url}; the page shows: {page.inner_text('body')[:1500]!r}") \
            from None
    return page.locator(selector).inner_text()


def test_an_owner_locks_an_alias_and_moves_it_only_with_a_reason_which_the_audit_log_shows(logged_in):
    team_member(get_user_model().objects.create_user(username="lead", password=PASSWORD))  # an owner
    model = RegisteredModel.objects.create(name="iris", next_version=3)
    for number in (1, 2):
        ModelVersion.objects.create(model=model, version=number, format="triton", artifact_key=f"k{number}",
                                    artifact_sha256=f"{number}" * 64, artifact_size=1)
    Alias.objects.create(model=model, name="production", version=model.versions.get(version=1))
    page = logged_in("lead", PASSWORD)
    page.goto("/models/iris/")
    row = page.locator('tr.alias-row[data-alias="production"]')
    row.get_by_role("button", name="Lock").click()
    assert "@production locked" in wait_for_message(page, ".message-success")
    assert row.locator(".tag.protected").inner_text() == "protected"

    page.fill("input[name=alias]", "production")
    page.select_option("select[name=version]", "2")
    page.get_by_role("button", name="Set alias").click()
    assert "@production is protected: moving it needs a reason" in wait_for_message(page, ".message-error")
    assert Alias.objects.get(name="production").version.version == 1

    page.fill("input[name=alias]", "production")
    page.select_option("select[name=version]", "2")
    page.fill("input[name=reason]", "v2 passed the canary")
    page.get_by_role("button", name="Set alias").click()
    wait_for_message(page, ".message-success")
    assert Alias.objects.get(name="production").version.version == 2

    page.goto("/audit/?action=alias.set")
    details = dict(zip(page.locator("tr.audit-row dl.audit-data dt").all_inner_texts(),
                       page.locator("tr.audit-row dl.audit-data dd").all_inner_texts(), strict=True))
    assert (details["reason"], details["owner"], details["protected"]) == ("v2 passed the canary", "lead", "yes")
    assert details["change"] == "1 → 2"
