"""BentoML serving metrics end to end on real services: a real ``bentoml serve`` behind its host
agent's nginx, discovered through the app's service discovery and scraped by a real Prometheus with
the shipped config; the metrics API and the model page show its throughput and p95 latency, and
health probes (and Prometheus's own scrapes) are not counted as traffic."""

import re

import pytest
import requests
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from deployments.heartbeats import record_heartbeat
from deployments.models import ServingHost
from modelyard_agent.bentoml_host import deploy_bentoml_version
from modelyard_agent.bentoml_instances import collect_bentoml_heartbeat
from monitoring import services
from monitoring.prometheus import PrometheusClient
from registry.choices import ArtifactFormat
from tests.deployments.bentoml_host import MODEL, SAMPLE, agent_root, artifact_server, make_payload
from tests.factories import page_with_panels, team_member, token_for
from tests.fixtures.services import local_prometheus_config, wait_for
from tests.monitoring.synthetic import deploy_version

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
__all__ = ["agent_root", "artifact_server"]  # fixtures

HOST = "bento-m"


def prometheus_value(prometheus_url: str, query: str) -> float:
    """The single value of an instant query, 0 when it has no result."""
    result = PrometheusClient(prometheus_url).instant(query)
    return result[0].value if result else 0.0


def test_a_bentoml_version_shows_throughput_and_p95_while_probes_are_not_counted(
    bentos, artifact_server, agent_root, live_server, start_prometheus_with_config, settings, tmp_path
):
    root, url = agent_root
    _, base_url = artifact_server
    # No sample input: not a single model request before the test sends them.
    served = deploy_bentoml_version(make_payload(bentos["v1"], base_url, url, 1, sample=None), root=root)
    assert served["state"] == "ready", served
    host = ServingHost.objects.create(name=HOST, runtime="bentoml", inference_url=url)
    record_heartbeat(HOST, collect_bentoml_heartbeat(inference_url=url, root=root, labels={}))
    deploy_version(MODEL, 1, host, artifact_format=ArtifactFormat.BENTO)
    user = get_user_model().objects.create_user(username="prometheus", password="a-long-test-password")
    token_file = tmp_path / "prometheus.token"
    token_file.write_text(token_for(user) + "\n")
    prometheus = start_prometheus_with_config(local_prometheus_config(live_server.url.rsplit(":", 1)[1], token_file))
    settings.PROMETHEUS_URL = prometheus.url
    probes = f'bentoml_service_request_total{{host="{HOST}",model="{MODEL}",version="1",endpoint="/readyz"}}'

    # Only health probes: Prometheus sees them counted by BentoML, and no throughput.
    def probed() -> bool:
        for path in ("readyz", "livez"):
            assert requests.get(f"{url}/{MODEL}/{path}", timeout=5).status_code == 200
        return prometheus_value(prometheus.url, f"increase({probes}[30s])") > 0

    wait_for(probed, timeout=40, what="Prometheus to scrape the bento process's probe counts", interval=0.3)
    quiet = services.model_metrics(MODEL, "1m")["versions"]
    assert all(not row["throughput"] for row in quiet), quiet

    # Model requests through nginx: throughput, p95 and no errors, for exactly that version.
    session = requests.Session()

    def busy() -> bool:
        for _ in range(10):
            answer = session.post(f"{url}/{MODEL}/classify", json=SAMPLE, timeout=30)
            assert answer.status_code == 200 and answer.headers["X-Modelyard-Version"] == "1"
        rows = services.model_metrics(MODEL, "1m")["versions"]
        return bool(rows) and rows[0]["throughput"] > 0 and rows[0]["latency_p95_ms"] > 0

    wait_for(busy, timeout=40, what="throughput and p95 of the bento version", interval=0.3)
    (series,) = PrometheusClient(prometheus.url).instant(
        f'bentoml_service_request_total{{host="{HOST}",endpoint="/classify",http_response_code="200"}}')
    assert {k: series.labels[k] for k in ("model", "version", "runtime")} == {
        "model": MODEL, "version": "1", "runtime": "bentoml"}
    assert not [label for label in series.labels if label.startswith("exported_")]

    engineer = team_member(get_user_model().objects.create_user(username="engineer"), "viewer")
    client = APIClient()
    client.force_authenticate(engineer)
    (row,) = client.get(f"/api/v1/models/{MODEL}/metrics/?range=1m").json()["versions"]
    assert row["version"] == 1 and row["throughput"] > 0 and row["latency_p95_ms"] > 0
    assert row["error_rate"] == 0

    client.force_login(engineer)
    page = page_with_panels(client, f"/models/{MODEL}/?range=15m")
    cells = re.search(r'data-version="1">\s*<td>v1</td>\s*<td class="num throughput">([^<]*)</td>'
                      r'(?:\s*<td class="num">[^<]*</td>){2}\s*<td class="num">([^<]*)</td>', page)
    assert cells, page[:3000]
    assert float(cells.group(1)) > 0 and float(cells.group(2)) > 0  # throughput and p95
