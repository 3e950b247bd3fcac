"""No silent truncation, and deleting a host, in a real browser: a name longer than the 63 characters
the registry allows reaches the server whole and is refused with a message (nothing is saved), and a
host is deleted from its page only after a confirmation."""

import pytest
from django.contrib.auth import get_user_model

from audit.models import AuditEvent
from deployments.hosts import register_host
from deployments.models import ServingHost
from registry.models import Alias, ModelVersion, RegisteredModel
from tests.browser.conftest import PASSWORD
from tests.factories import team_member

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

LONG_HOST_NAME = "gpu-" + "a" * 120  # 124 characters
LONG_ALIAS = "p" * 308


@pytest.fixture
def admin_page(logged_in):
    """A page logged in as an administrator."""
    get_user_model().objects.create_user(username="ops", password=PASSWORD, is_staff=True, is_superuser=True)
    return logged_in("ops", PASSWORD)


def test_a_host_name_of_124_characters_is_refused_with_a_message_and_registers_nothing(admin_page, watch):
    page = admin_page
    page.goto("/hosts/new/")
    page.fill("input[name=name]", LONG_HOST_NAME)
    page.fill("input[name=inference_url]", "http://gpu-7:8000")
    page.get_by_role("button", name="Register").click()
    page.wait_for_selector(".errorlist")

    assert "at most 63 characters (it has 124)" in page.locator(".errorlist").first.inner_text()
    assert page.input_value("input[name=name]") == LONG_HOST_NAME  # kept whole, to be corrected
    assert not ServingHost.objects.exists()
    assert not watch.problems(), watch.problems()


def test_an_alias_of_308_characters_is_refused_with_a_message_and_sets_nothing(logged_in):
    team_member(get_user_model().objects.create_user(username="engineer", password=PASSWORD))
    model = RegisteredModel.objects.create(name="iris")
    ModelVersion.objects.create(model=model, version=1, format="triton", artifact_key="k",
                                artifact_sha256="0" * 64, artifact_size=1)
    page = logged_in("engineer", PASSWORD)
    page.goto("/models/iris/")
    page.fill("input[name=alias]", LONG_ALIAS)
    page.get_by_role("button", name="Set alias").click()
    page.wait_for_selector(".message-error")

    assert "at most 63 characters (it has 308)" in page.locator(".message-error").inner_text()
    assert not Alias.objects.exists()


def test_a_host_is_deleted_from_its_page_after_a_confirmation(admin_page, watch):
    register_host(name="gpu-7", runtime="triton", inference_url="http://gpu-7:8000")
    page = admin_page
    page.goto("/hosts/gpu-7/")
    page.get_by_role("link", name="Delete host…").click()
    page.wait_for_url("**/hosts/gpu-7/delete/")

    assert page.locator("h1").inner_text() == "Delete the serving host gpu-7?"
    assert ServingHost.objects.filter(name="gpu-7").exists()  # asking deletes nothing
    page.get_by_role("button", name="Delete the host").click()
    page.wait_for_url("**/hosts/")

    assert "Serving host gpu-7 deleted" in page.locator(".message-success").inner_text()
    assert not ServingHost.objects.filter(name="gpu-7").exists()
    assert AuditEvent.objects.filter(action="host.deleted", actor_label="ops", data__name="gpu-7").exists()
    assert not watch.problems(), watch.problems()


def test_keeping_the_host_on_the_confirmation_leaves_it_registered(admin_page):
    register_host(name="gpu-7", runtime="triton", inference_url="http://gpu-7:8000")
    page = admin_page
    page.goto("/hosts/gpu-7/delete/")
    page.get_by_role("link", name="Keep it").click()
    page.wait_for_url("**/hosts/gpu-7/")

    assert ServingHost.objects.filter(name="gpu-7").exists()
    assert not AuditEvent.objects.filter(action="host.deleted").exists()
