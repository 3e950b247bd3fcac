"""Latency and traffic as the gateway measures them, on a real Triton behind a real gateway, scraped by a real
Prometheus, read back by the metrics API, the model page, the fleet page and the promotion gates.

A python-backend model sleeps as long as each request asks, so the latency distribution is known: 70 % of
requests at 3 ms, 20 % at 30 ms, 10 % at 150 ms. The quantiles must fall in the buckets that hold the true
ones, in order, and every reader must give the same figures for the same window.
"""

import math
import random
import re
import time
from pathlib import Path

import numpy as np
import pytest
import requests

import modelyard_agent.runtimes
from deployments.choices import CanaryState, TargetState
from deployments.models import Deployment, DeploymentTarget, ServingHost
from modelyard_agent.formats.triton_config import render_load_config
from modelyard_agent.runtimes.gateway import TritonGateway
from modelyard_agent.runtimes.triton import TritonRuntime
from monitoring import promql
from monitoring.services import version_gate_metrics
from registry.choices import ArtifactFormat
from registry.models import ModelVersion, RegisteredModel
from tests.fixtures.services import free_port, wait_for
from tests.monitoring.synthetic import deploy_version

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

HOST = "cpu-0"
MODEL = "sleeper"
RANGE = "15m"
# Seconds each request sleeps, and how many requests ask it.
# The gateway's latency buckets (modelyard_metrics.lua's M.BUCKETS, seconds), in milliseconds, +Inf last.
BUCKET_EDGES_MS = (*(float(edge) * 1000 for edge in re.search(r"M\.BUCKETS = \{([^}]*)\}", (
    Path(modelyard_agent.runtimes.__file__).parent / "modelyard_metrics.lua").read_text()).group(1).split(",")),
    math.inf)
SLEEPS = {0.003: 140, 0.030: 40, 0.150: 20}
CONFIG = f"""\
name: "{MODEL}"
backend: "python"
max_batch_size: 0
input [ {{ name: "seconds" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "slept" data_type: TYPE_FP32 dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
"""
MODEL_PY = """\
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        answers = []
        for request in requests:
            seconds = pb_utils.get_input_tensor_by_name(request, "seconds").as_numpy()
            time.sleep(float(seconds[0]))
            answers.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("slept", seconds)]))
        return answers
"""


def prometheus_value(prometheus_url: str, query: str) -> float | None:
    rows = requests.get(f"{prometheus_url}/api/v1/query", params={"query": query}, timeout=5).json()["data"]["result"]
    return float(rows[0]["value"][1]) if rows else None


def wait_for_value(prometheus_url: str, query: str, expected: float, what: str, timeout: float = 30) -> None:
    """Wait until ``query`` reads ``expected`` in Prometheus (it scrapes every second)."""
    wait_for(lambda: prometheus_value(prometheus_url, query) == expected, timeout=timeout, interval=0.5, what=what)


def sleep_request(session: requests.Session, url: str, seconds: float, version: int) -> float:
    """Ask ``version`` of the model to sleep ``seconds`` through the gateway; returns what the client waited."""
    body = {"inputs": [{"name": "seconds", "shape": [1], "datatype": "FP32", "data": [seconds]}]}
    started = time.monotonic()
    answer = session.post(f"{url}/v2/models/{MODEL}/infer", json=body, timeout=30)
    waited = time.monotonic() - started
    assert answer.status_code == 200, answer.text
    assert answer.headers["X-Modelyard-Version"] == str(version)
    return waited


@pytest.fixture
def served(triton_server, start_prometheus, tmp_path, settings):
    """Versions 1 and 2 of the sleeper loaded on a real Triton, its gateway routing to version 1, a Prometheus
    scraping the gateway and Triton every second, and the registry rows."""
    for version in (1, 2):
        (triton_server.model_repository / MODEL / str(version)).mkdir(parents=True)
        (triton_server.model_repository / MODEL / str(version) / "model.py").write_text(MODEL_PY)
    TritonRuntime(triton_server.http_url, load_timeout=120).load(MODEL, render_load_config(
        CONFIG, model_name=MODEL, versions=[1, 2],
        parameters={"EXECUTION_ENV_PATH": str(triton_server.execution_env)}))
    gateway = TritonGateway(tmp_path / "gateway", free_port(), triton=triton_server.http_url.removeprefix("http://"),
                            listen_host="127.0.0.1")
    gateway.ensure_running()
    gateway.set_route(MODEL, stable=1)
    url = f"http://127.0.0.1:{gateway.listen_port}"
    prometheus = start_prometheus([
        {"target": url.removeprefix("http://"), "labels": {"host": HOST, "source": "gateway"}},
        {"target": triton_server.metrics_url.removeprefix("http://").removesuffix("/metrics"),
         "labels": {"host": HOST}},
    ])
    settings.PROMETHEUS_URL = prometheus.url
    stable = f'modelyard_gateway_requests_total{{model="{MODEL}",version="1",role="stable",code="2xx"}}'
    wait_for_value(prometheus.url, stable, 0, "Prometheus to scrape the gateway's series of version 1 at 0",
                   timeout=60)
    host = ServingHost.objects.create(name=HOST, inference_url=url, metrics_url=triton_server.metrics_url)
    deploy_version(MODEL, 1, host)
    yield url, gateway, prometheus
    gateway.stop()


def row_of(html: str, marker: str) -> str:
    """The table row of a page that starts with ``marker``."""
    return html.split(marker, 1)[1].split("</tr>", 1)[0]


def test_quantiles_fall_in_the_buckets_of_a_known_distribution_and_every_reader_agrees(served, api_client, client,
                                                                                         user):
    url, _, prometheus = served
    asked = [seconds for seconds, count in SLEEPS.items() for _ in range(count)]
    random.Random(7).shuffle(asked)
    with requests.Session() as session:
        waited = [sleep_request(session, url, seconds, version=1) for seconds in asked]
    wait_for_value(prometheus.url, f'sum(modelyard_gateway_requests_total{{model="{MODEL}"}})', len(asked),
                   "Prometheus to scrape every request")

    api = api_client.get(f"/api/v1/models/{MODEL}/metrics/?range={RANGE}")
    assert api.status_code == 200, api.content
    v1 = {row["version"]: row for row in api.json()["versions"]}[1]
    # The true p50 is 3 ms, in (2.5, 5] ms; the true p95 and p99 are 150 ms, in (100, 250] ms. The gateway
    # measures Triton's own overhead too, which a loaded machine can take past 5 ms: the p50 then falls in the
    # bucket of what the client waited (two runs in a slow spell failed on a bound of 5 ms alone).
    client_p50_ms = float(np.percentile(waited, 50)) * 1000
    assert 2.5 < v1["latency_p50_ms"] <= max(5, next(edge for edge in BUCKET_EDGES_MS if edge >= client_p50_ms))
    assert 100 < v1["latency_p95_ms"] <= v1["latency_p99_ms"] <= 250
    # The mean: at least the sleeps' own mean, at most what the client waited.
    slept_ms = sum(asked) / len(asked) * 1000
    assert slept_ms <= v1["latency_mean_ms"] <= float(np.mean(waited)) * 1000
    assert v1["latency_p50_ms"] < v1["latency_mean_ms"] < v1["latency_p95_ms"]

    # The promotion gates read the same p95 and count every request.
    gates = version_gate_metrics(MODEL, window_seconds=15 * 60)["1"]
    assert gates["requests"] == len(asked) and gates["error_rate"] == 0
    assert gates["latency_p95_ms"] == pytest.approx(v1["latency_p95_ms"])

    # The model page and the fleet page show the API's figures.
    client.force_login(user)
    panel = row_of(client.get(f"/monitoring/models/{MODEL}/panel/?range={RANGE}").content.decode(),
                   'data-version="1">')
    fleet = row_of(client.get(f"/monitoring/?range={RANGE}").content.decode(),
                   f'data-model="{MODEL}" data-version="1">')
    shown = [f"{v1[key]:.2f}" for key in ("latency_mean_ms", "latency_p50_ms", "latency_p95_ms", "latency_p99_ms")]
    # The panel's row: version, throughput, mean, p50, p95, p99, ...; the fleet's: mean, then p50, p95, p99, ...
    assert re.findall(r"<td[^>]*>([^<]*)</td>", panel)[2:6] == shown, panel
    assert re.search(r'<td class="num latency-mean">([^<]*)</td>', fleet).group(1) == shown[0]
    assert re.findall(r'<td class="num">([^<]*)</td>', fleet)[:3] == shown[1:], fleet


def test_a_burst_right_after_a_version_is_routed_counts_whole(served):
    url, gateway, prometheus = served
    gateway.set_route(MODEL, stable=2)
    with requests.Session() as session:
        for _ in range(300):
            sleep_request(session, url, 0.0, version=2)
    counted = f'sum(modelyard_gateway_requests_total{{model="{MODEL}",version="2",role="stable"}})'
    wait_for_value(prometheus.url, counted, 300, "Prometheus to scrape the burst")
    in_window = promql.requests_in_window({"model": MODEL, "version": "2"}, 60)
    # Whether or not Prometheus scraped version 2 at 0 before the burst, the window holds all 300.
    assert prometheus_value(prometheus.url, in_window) == 300


def test_the_model_pages_host_by_version_table_shows_each_versions_measured_share_and_p99(served, client, user):
    url, gateway, prometheus = served
    gateway.set_route(MODEL, stable=1, canary=2, percent=30)
    seen = {"1": 0, "2": 0}
    body = {"inputs": [{"name": "seconds", "shape": [1], "datatype": "FP32", "data": [0.0]}]}
    with requests.Session() as session:
        for _ in range(2000):
            answer = session.post(f"{url}/v2/models/{MODEL}/infer", json=body, timeout=30)
            assert answer.status_code == 200
            seen[answer.headers["X-Modelyard-Version"]] += 1
        for _ in range(25):
            sleep_request_pinned = session.post(f"{url}/v2/models/{MODEL}/versions/2/infer", json=body, timeout=30)
            assert sleep_request_pinned.status_code == 200
    total = f'sum(modelyard_gateway_requests_total{{model="{MODEL}"}})'
    wait_for_value(prometheus.url, total, 2025, "Prometheus to scrape every request")

    client.force_login(user)
    html = client.get(f"/monitoring/models/{MODEL}/traffic/?range={RANGE}").content.decode()

    def cells(version: str, role: str) -> dict[str, str]:
        row = row_of(html, f'data-host="{HOST}" data-version="{version}" data-role="{role}">')
        return dict(re.findall(r'<td class="num ([a-z0-9-]+)">([^<]*)</td>', row))

    stable, canary, pinned = cells("1", "stable"), cells("2", "canary"), cells("2", "pinned")
    # Each share says the window it covers: the range for the seen one, now for the set one.
    assert f"<small>seen, last {RANGE}<br>/ set, now</small>" in html
    # Measured from the front's own counts, so exactly what the clients saw; set: the registry's v1 alone.
    assert stable["share"] == f"{100 * seen['1'] / 2000:.1f} / 100.0"
    assert canary["share"] == f"{100 * seen['2'] / 2000:.1f} / —"
    assert abs(100 * seen["2"] / 2000 - 30) <= 4.5 * (2000 * 0.3 * 0.7) ** 0.5 / 20  # binomial, in points
    assert (stable["requests"], canary["requests"], pinned["requests"]) == (str(seen["1"]), str(seen["2"]), "25")
    assert pinned["share"] == "— / —"
    for row in (stable, canary, pinned):
        assert float(row["p99"]) > 0 and float(row["p99-minute"]) > 0 and row["errors"] == "0.00%"
        assert float(row["rps"]) > 0

    # The canary's rollout page: canary against stable on the hosts it reached, over its lifetime.
    model = RegisteredModel.objects.get(name=MODEL)
    v2 = ModelVersion.objects.create(model=model, version=2, format=ArtifactFormat.TRITON_MODEL_DIR, artifact_key="k2",
                                     artifact_sha256="2" * 64, artifact_size=1)
    canary = Deployment.objects.create(model=model, version=v2, canary_percent=30, canary_state=CanaryState.ACTIVE)
    DeploymentTarget.objects.create(deployment=canary, host=ServingHost.objects.get(name=HOST),
                                    state=TargetState.READY)
    assert "canary active at 30 %" in client.get(f"/deployments/{canary.pk}/").content.decode()
    fragment = client.get(f"/monitoring/rollouts/{canary.pk}/canary/").content.decode()
    shares = dict(re.findall(r'data-role="(stable|canary)" data-version="\d+">.*?<td class="num share">([^<]*)</td>',
                             fragment, re.S))
    assert shares == {"stable": f"{100 * seen['1'] / 2000:.1f}", "canary": f"{100 * seen['2'] / 2000:.1f}"}

    # The host page's table: the same rows, by model.
    host_html = client.get(f"/monitoring/hosts/{HOST}/traffic/").content.decode()
    row = row_of(host_html, f'data-model="{MODEL}" data-version="2" data-role="canary">')
    assert f'<td class="num requests">{seen["2"]}</td>' in row
    assert f'<td class="num share">{100 * seen["2"] / 2000:.1f} / —</td>' in row  # the agent reported no route
    ServingHost.objects.filter(name=HOST).update(heartbeat={"gateway": {"live": True, "routes": {MODEL: {
        "stable": 1, "canary": 2, "percent": 30.0, "shadow": None, "shadow_percent": 0.0}}}})
    host_html = client.get(f"/monitoring/hosts/{HOST}/traffic/").content.decode()
    row = row_of(host_html, f'data-model="{MODEL}" data-version="2" data-role="canary">')
    assert f'<td class="num share">{100 * seen["2"] / 2000:.1f} / 30.0</td>' in row


def test_a_role_row_with_nothing_measured_and_no_share_set_is_not_shown(served, client, user):
    url, _, prometheus = served
    pinned = f'sum(modelyard_gateway_requests_total{{model="{MODEL}",version="1",role="pinned"}})'
    assert prometheus_value(prometheus.url, pinned) == 0  # the route made the series at 0; nobody pinned v1
    with requests.Session() as session:
        for _ in range(20):
            sleep_request(session, url, 0.0, version=1)
    total = f'sum(modelyard_gateway_requests_total{{model="{MODEL}"}})'
    wait_for_value(prometheus.url, total, 20, "Prometheus to scrape the requests")
    client.force_login(user)
    for page in (f"/monitoring/hosts/{HOST}/traffic/", f"/monitoring/models/{MODEL}/traffic/"):
        html = client.get(page).content.decode()
        assert '<td class="num requests">20</td>' in row_of(html, 'data-version="1" data-role="stable">'), page
        assert 'data-role="pinned"' not in html, page


def test_the_fleet_grouped_by_host_shows_each_hosts_models_as_its_front_measured_them(served, client, user):
    url, _, prometheus = served
    with requests.Session() as session:
        for _ in range(30):
            sleep_request(session, url, 0.0, version=1)
    total = f'sum(modelyard_gateway_requests_total{{model="{MODEL}"}})'
    wait_for_value(prometheus.url, total, 30, "Prometheus to scrape the requests")
    ServingHost.objects.filter(name=HOST).update(heartbeat={"gateway": {"live": True, "routes": {MODEL: {
        "stable": 1, "canary": None, "percent": 0.0, "shadow": None, "shadow_percent": 0.0}}}})
    client.force_login(user)

    html = client.get(f"/monitoring/by-host/?range={RANGE}").content.decode()
    section = html.split(f'<section class="card by-host" data-host="{HOST}">', 1)[1].split("</section>", 1)[0]
    row = row_of(section, f'data-model="{MODEL}" data-version="1" data-role="stable">')
    assert '<td class="num requests">30</td>' in row and '<td class="num share">100.0 / 100.0</td>' in row
    assert f'href="/hosts/{HOST}/"' in section
    assert "By host" in client.get("/monitoring/").content.decode()
    other = client.get(f"/monitoring/by-host/?range={RANGE}&host=elsewhere").content.decode()
    assert 'class="card by-host"' not in other and "No traffic measured" in other
