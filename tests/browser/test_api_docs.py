"""The API docs in a real browser: the navigation's link opens Swagger UI at /api/docs/, served with
every file from this app (nothing from a CDN, nothing the CSP refuses), listing the API's operations,
and an operation tried from the page answers with the signed-in user's session."""

import pytest
from django.contrib.auth import get_user_model

from registry.models import RegisteredModel
from tests.browser.conftest import PASSWORD
from tests.factories import team_member

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_the_api_docs_link_opens_swagger_ui_served_by_the_app_itself(logged_in, watch, screenshots):
    team_member(get_user_model().objects.create_user(username="engineer", password=PASSWORD))
    RegisteredModel.objects.create(name="iris")
    page = logged_in("engineer", PASSWORD)
    page.get_by_role("link", name="API docs").click()
    page.wait_for_url("**/api/docs/")
    page.wait_for_selector(".swagger-ui .info .title")

    assert page.locator(".swagger-ui .info .title").inner_text().startswith("Modelyard API")
    paths = page.locator(".opblock-summary-path").all_inner_texts()
    assert "/api/v1/models/" in paths and "/api/v1/models/{model_name}/versions/" in paths
    static = [url for url in watch.requests if "/static/" in url]
    assert any(url.endswith("/swagger-ui-bundle.js") for url in static), static

    operation = page.locator('.opblock-get:has(.opblock-summary-path[data-path="/api/v1/models/"])').first
    operation.locator(".opblock-summary").click()
    operation.get_by_role("button", name="Try it out").click()
    with page.expect_response(lambda r: r.url.endswith("/api/v1/models/") and r.request.method == "GET") as sent:
        operation.get_by_role("button", name="Execute").click()
    assert sent.value.status == 200 and sent.value.json()["results"][0]["name"] == "iris"
    page.screenshot(path=screenshots / "api_docs.png", full_page=True)
    assert not watch.problems(), watch.problems()
