"""Prometheus stopped: pages render and say so, the metrics API answers its documented 503, and the
gates that read Prometheus (idle unload, autoscale) change nothing until it is back.

Complements tests/monitoring/test_prometheus_down.py (a port nothing listens on),
tests/monitoring/test_pages_on_prometheus.py (no data, too slow) and
tests/deployments/test_placement.py (placement falls back to heartbeats); here a real Prometheus
that answered a moment ago is killed.
"""

import signal

import pytest

from deployments import tasks
from deployments.models import Deployment, DeploymentTarget, ServingHost
from tests.factories import page_with_panels
from tests.monitoring.synthetic import deploy_version

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


@pytest.fixture
def stopped_prometheus(start_prometheus, settings):
    """A real Prometheus the settings point at, killed once it answered."""
    prometheus = start_prometheus([])
    settings.PROMETHEUS_URL = prometheus.url
    settings.PROMETHEUS_TIMEOUT = 2
    prometheus.stop(sig=signal.SIGKILL)
    return prometheus


def test_pages_render_and_say_metrics_are_unavailable_when_prometheus_stops(client, user, stopped_prometheus):
    host = ServingHost.objects.create(name="gpu-a", inference_url="http://gpu-a:8000")
    deploy_version("iris", 1, host)
    client.force_login(user)
    for url in ("/monitoring/", "/monitoring/table/", "/models/iris/", "/hosts/gpu-a/",
                "/monitoring/models/iris/panel/", "/monitoring/models/iris/traffic/",
                "/monitoring/hosts/gpu-a/traffic/"):
        assert "Metrics unavailable" in page_with_panels(client, url), url  # the model page's is its panel


def test_the_metrics_api_answers_503_saying_prometheus_is_unreachable(api_client, stopped_prometheus):
    host = ServingHost.objects.create(name="gpu-a", inference_url="http://gpu-a:8000")
    deploy_version("iris", 1, host)
    for url in ("/api/v1/models/iris/metrics/", "/api/v1/models/iris/metrics/series/"):
        answer = api_client.get(url)
        assert answer.status_code == 503, url
        assert "unreachable" in answer.json()["detail"], url


def test_idle_unload_and_autoscale_change_nothing_while_prometheus_is_down(stopped_prometheus, settings):
    settings.IDLE_UNLOAD_AFTER = 60
    host = ServingHost.objects.create(name="gpu-a", inference_url="http://gpu-a:8000")
    deployment = deploy_version("iris", 1, host)
    Deployment.objects.filter(pk=deployment.pk).update(
        autoscale={"min_instances": 1, "max_instances": 4, "queue_ms_high": 20, "queue_ms_low": 2})
    DeploymentTarget.objects.filter(deployment=deployment).update(updated_at="2000-01-01T00:00:00Z")

    assert tasks.unload_idle_models() == 0
    assert tasks.autoscale() == 0
    assert Deployment.objects.count() == 1  # no unload, no scaling rollout
    assert list(DeploymentTarget.objects.values_list("state", flat=True)) == ["ready"]
