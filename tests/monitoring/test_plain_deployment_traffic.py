"""A version deployed with no route (a plain deployment, no canary, shadow or capture) by a Triton host agent, on a
real Triton behind its real gateway, scraped by a real Prometheus: counted from its first request, by the gateway
and by the metrics API that reads Prometheus."""

import re

import pytest
import requests

from deployments.models import ServingHost
from modelyard_agent.runtimes.base import ServingRuntimeError
from monitoring.services import LATENCY_KEYS, version_gate_metrics
from tests.deployments.test_gateway import BODY
from tests.deployments.test_gateway_canary import host
from tests.deployments.test_gateway_metrics import LATENCY, REQUESTS, scrape, scrape_logged, value
from tests.deployments.triton_host import artifacts
from tests.fixtures.services import wait_for
from tests.monitoring.synthetic import deploy_version

pytestmark = [pytest.mark.integration, pytest.mark.django_db]
__all__ = ["artifacts", "host"]  # fixtures

MODEL = "iris"
HOST = "cpu-0"
BURST = 300
SCRAPE_SECONDS = 1  # start_prometheus's scrape interval
QUERY_SECONDS = 4  # the API's queries, on a busy test machine


def infer_burst(url: str, count: int) -> None:
    """``count`` requests that name no version, as a client of the model sends them, each answered 200."""
    with requests.Session() as session:
        for _ in range(count):
            answer = session.post(f"{url}/v2/models/{MODEL}/infer", json=BODY, timeout=30)
            assert answer.status_code == 200, answer.text


def test_a_version_deployed_without_a_route_has_its_series_at_zero_before_its_first_request(host):
    result = host.deploy(1)
    assert result["details"]["route"] is None and "series_error" not in result["details"], result
    samples = scrape(host)
    for role in ("stable", "pinned"):
        labels = {"model": MODEL, "version": "1", "role": role}
        for code in ("2xx", "4xx", "5xx"):
            assert value(samples, REQUESTS, code=code, **labels) == 0
        assert value(samples, LATENCY + "_count", **labels) == 0
        assert value(samples, LATENCY + "_sum", **labels) == 0
        assert value(samples, LATENCY + "_bucket", le="+Inf", **labels) == 0

    # Told again (a redeployment of the same version), the gateway keeps what it counted.
    infer_burst(host.url, 20)
    assert host.gateway.create_series(MODEL, [1]) == {MODEL: [1]}
    samples = scrape_logged(host, 20)
    assert value(samples, REQUESTS, model=MODEL, version="1", role="stable", code="2xx") == 20
    assert value(samples, LATENCY + "_count", model=MODEL, version="1", role="stable") == 20


def test_the_gateway_refuses_series_that_are_not_model_names_with_version_numbers(host):
    host.gateway.ensure_running()
    for body in ([1], {MODEL: "1"}, {MODEL: [0]}, {MODEL: [1.5]}, {MODEL: {"1": 1}}, {"a\tb": [1]}, {"a/b": [1]}):
        with pytest.raises(ServingRuntimeError, match="series must be a JSON object of model names"):
            host.gateway._control("POST", body, path="/series")
    assert "modelyard_gateway_requests_total{" not in requests.get(f"{host.url}/metrics", timeout=10).text


def test_a_burst_right_after_a_plain_deployment_shows_in_the_api_and_on_the_model_page_within_one_scrape(
        host, triton_server, start_prometheus, settings, api_client, client, user):
    host.deploy(1)
    deploy_version(MODEL, 1, ServingHost.objects.create(name=HOST, inference_url=host.url,
                                                        metrics_url=triton_server.metrics_url))
    infer_burst(host.url, BURST)
    # Prometheus scrapes the version for the first time after the burst, as it does whenever a burst falls between
    # the deployment and the next scrape: every series of the version, the gateway's and Triton's, is first seen
    # holding the whole burst.
    prometheus = start_prometheus([
        {"target": host.url.removeprefix("http://"), "labels": {"host": HOST, "source": "gateway"}},
        {"target": triton_server.metrics_url.removeprefix("http://").removesuffix("/metrics"),
         "labels": {"host": HOST}},
    ])
    settings.PROMETHEUS_URL = prometheus.url
    # Prometheus hands its scrape loops their targets some 5 s after it starts; from that first scrape on, the
    # burst has to show within one scrape interval plus the API's queries.
    wait_for(lambda: requests.get(f"{prometheus.url}/api/v1/query", params={"query": "count(up)"}, timeout=5)
             .json()["data"]["result"][0]["value"][1] == "2", timeout=30, interval=0.1,
             what="Prometheus's first scrape of the gateway and of Triton")
    shown: dict = {}

    def counted() -> bool:
        answer = api_client.get(f"/api/v1/models/{MODEL}/metrics/?range=15m")
        assert answer.status_code == 200, answer.content
        shown.update({row["version"]: row for row in answer.json()["versions"]})
        row = shown.get(1) or {}
        return bool(row.get("throughput")) and all(row[key] is not None for key in LATENCY_KEYS)

    wait_for(counted, timeout=SCRAPE_SECONDS + QUERY_SECONDS, interval=0.1,
             what="the burst in the metrics API", describe=lambda: repr(shown))
    # Triton counts inferences (the rows of each request) over the 15 minutes; the gates count the requests.
    v1 = shown[1]
    assert v1["throughput"] == pytest.approx(BURST * BODY["inputs"][0]["shape"][0] / 900)
    assert v1["error_rate"] == 0
    assert version_gate_metrics(MODEL, window_seconds=15 * 60)["1"]["requests"] == BURST

    client.force_login(user)
    panel = client.get(f"/monitoring/models/{MODEL}/panel/?range=15m").content.decode()
    cells = re.findall(r"<td[^>]*>([^<]*)</td>", panel.split('data-version="1">', 1)[1].split("</tr>", 1)[0])
    # The row: version, throughput, mean, p50, p95, p99, ...
    assert cells[1:6] == [f"{v1[key]:.2f}" for key in ("throughput", "latency_mean_ms", "latency_p50_ms",
                                                         "latency_p95_ms", "latency_p99_ms")], panel
