"""Pages and the metrics API when Prometheus cannot be reached."""

import pytest
from django.test import override_settings

from registry.models import RegisteredModel
from tests.factories import page_with_panels
from tests.fixtures.services import free_port

pytestmark = pytest.mark.django_db


@pytest.fixture
def prometheus_down():
    with override_settings(PROMETHEUS_URL=f"http://127.0.0.1:{free_port()}", PROMETHEUS_TIMEOUT=1):
        yield


def test_the_metrics_api_answers_503_with_a_clear_message(api_client, prometheus_down):
    RegisteredModel.objects.create(name="iris")
    answer = api_client.get("/api/v1/models/iris/metrics/?range=15m")
    assert answer.status_code == 503
    assert "unreachable" in answer.json()["detail"]


def test_the_metrics_api_refuses_a_malformed_range(api_client):
    RegisteredModel.objects.create(name="iris")
    answer = api_client.get("/api/v1/models/iris/metrics/?range=forever")
    assert answer.status_code == 400
    assert "range" in answer.json()["detail"]


def test_the_model_page_still_renders_and_says_metrics_are_unavailable(client, user, prometheus_down):
    RegisteredModel.objects.create(name="iris", description="flowers")
    client.force_login(user)
    page = page_with_panels(client, "/models/iris/")
    assert "Metrics unavailable" in page
    assert "flowers" in page


def test_pages_require_a_login(client, db):
    answer = client.get("/models/")
    assert answer.status_code == 302 and "/login/" in answer["Location"]
