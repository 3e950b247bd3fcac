"""The audit log and the token pages in a real browser: long values wrap inside the page, details read
as labelled values, objects by their names, the token list is paged and a new token lives 90 days."""

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from accounts.models import ApiToken
from accounts.tokens import issue_token
from registry.registered_models import create_model, update_model
from tests.browser.conftest import PASSWORD

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

LONG_DESCRIPTION = "a description without a single space " * 3 + "x" * 1500


@pytest.fixture
def admin(db):
    return get_user_model().objects.create_user(username="ops", password=PASSWORD, is_staff=True, is_superuser=True)


def test_a_long_audit_value_wraps_inside_the_page_and_details_read_as_labelled_values(logged_in, admin, watch):
    create_model(name="iris", actor=admin)
    update_model(name="iris", description=LONG_DESCRIPTION, tags={"team": "vision"}, actor=admin)
    page = logged_in("ops", PASSWORD)
    page.goto("/audit/?action=model.updated")

    assert page.evaluate("document.documentElement.scrollWidth <= document.documentElement.clientWidth")
    row = page.locator("tr.audit-row")
    assert row.count() == 1
    assert row.locator("td").nth(4).inner_text() == "model iris"
    labels = row.locator("dl.audit-data dt").all_inner_texts()
    assert sorted(labels) == ["description", "tags"]
    description = row.locator("dl.audit-data dd").nth(labels.index("description"))
    assert description.inner_text() == f"— → {LONG_DESCRIPTION}"
    box, cell = description.bounding_box(), row.locator("td").nth(5).bounding_box()
    assert box["x"] + box["width"] <= cell["x"] + cell["width"] + 1  # wrapped within its column
    assert box["height"] > 5 * 16  # over many lines
    assert not watch.problems(), watch.problems()


def test_the_token_list_pages_through_every_token_and_a_new_token_lives_90_days(logged_in, admin, watch):
    for i in range(30):
        issue_token(user=admin, name=f"ci-{i:02d}", scopes=["read"])
    page = logged_in("ops", PASSWORD)
    page.goto("/account/tokens/")
    assert page.locator("table.grid tbody tr").count() == 25
    page.get_by_role("link", name="older →").click()
    page.wait_for_url("**/account/tokens/?page=2")
    assert page.locator("table.grid tbody tr").count() == 5
    assert "page 2 of 2" in page.locator("nav.pager").inner_text()

    page.get_by_role("link", name="New token").click()
    assert page.input_value("input[name=expires_in_days]") == "90"
    page.fill("input[name=name]", "laptop")
    page.get_by_role("button", name="Make the token").click()
    page.wait_for_selector("pre.secret")
    left = ApiToken.objects.get(name="laptop").expires_at - timezone.now()
    assert timedelta(days=89, hours=23) < left <= timedelta(days=90)
    assert not watch.problems(), watch.problems()
