"""Latency that is there when the traffic is, on a real Triton scraped by a real Prometheus.

A client sends inferences to iris v1 and stops. Triton's latency summary empties once its own
sliding window (60 s) holds no request, while the counters still show the traffic inside the
pages' range: the fleet overview, the model page and the metrics API must then give one mean
latency, from the counters, and keep the quantiles the summary held earlier in the range.
"""

import math
import re
import shutil

import numpy as np
import pytest
import requests

from demo.iris import SAMPLE_INPUT, build_iris_model_dir
from deployments.models import ServingHost
from modelyard_agent.formats.triton_config import render_load_config
from modelyard_agent.runtimes.triton import TritonRuntime
from tests.fixtures.services import wait_for
from tests.monitoring.synthetic import deploy_version

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

HOST = "cpu-0"
REQUESTS = 120
RANGE = "15m"
V1 = 'model="iris",version="1"'
SAMPLE = re.compile(r"^(?P<series>[a-z_]+\{[^}]*\})\s+(?P<value>\S+)$", re.M)


def triton_counters(metrics_url: str) -> dict[str, float]:
    """Triton's own exposition: ``{'name{labels}': value}`` (NaN as float('nan'))."""
    text = requests.get(metrics_url, timeout=5).text
    return {m.group("series"): float(m.group("value")) for m in SAMPLE.finditer(text)}


def prometheus_value(prometheus_url: str, query: str) -> str | None:
    """The first result of an instant query as Prometheus writes it ("NaN" included), or None."""
    result = requests.get(f"{prometheus_url}/api/v1/query", params={"query": query}, timeout=5).json()
    rows = result["data"]["result"]
    return rows[0]["value"][1] if rows else None


@pytest.fixture
def served(triton_server, start_prometheus, tmp_path, settings):
    """iris v1 loaded on a real Triton, a Prometheus scraping it every second (holding its counters
    at zero before any request, so every rate covers the whole traffic) and the registry rows."""
    source = build_iris_model_dir(tmp_path / "iris", name="iris")
    (triton_server.model_repository / "iris").mkdir()
    shutil.copytree(source / "1", triton_server.model_repository / "iris" / "1")
    TritonRuntime(triton_server.http_url, load_timeout=120).load("iris", render_load_config(
        (source / "config.pbtxt").read_text(), model_name="iris", versions=[1],
        parameters={"EXECUTION_ENV_PATH": str(triton_server.execution_env)}))
    target = triton_server.metrics_url.removeprefix("http://").removesuffix("/metrics")
    prometheus = start_prometheus([{"target": target, "labels": {"host": HOST}}])
    settings.PROMETHEUS_URL = prometheus.url
    wait_for(lambda: prometheus_value(prometheus.url, f"nv_inference_request_success{{{V1}}}") == "0",
             timeout=60, what="Prometheus to scrape iris's counters before any request", interval=0.5)
    host = ServingHost.objects.create(name=HOST, inference_url=triton_server.http_url,
                                      metrics_url=triton_server.metrics_url)
    deploy_version("iris", 1, host)
    return triton_server, prometheus


def cell(html: str, row_marker: str, css: str) -> str:
    """The text of the ``<td class="{css}">`` in the table row that starts with ``row_marker``."""
    row = html.split(row_marker, 1)[1].split("</tr>", 1)[0]
    return re.search(rf'<td class="{css}">([^<]*)</td>', row).group(1)


def panel_cells(html: str) -> list[str]:
    """The model page's metrics row of v1: version, throughput, mean, p50, p95, p99, queue, compute, errors."""
    row = html.split('data-version="1">', 1)[1].split("</tr>", 1)[0]
    return re.findall(r"<td[^>]*>([^<]*)</td>", row)


def test_the_fleet_model_page_and_api_give_one_latency_after_the_traffic_paused(served, client, api_client, user):
    triton, prometheus = served
    runtime = TritonRuntime(triton.http_url)
    batch = np.asarray(SAMPLE_INPUT, dtype=np.float32)
    for _ in range(REQUESTS):
        runtime.infer("iris", {"input": batch}, ["label"])
    truth = triton_counters(triton.metrics_url)
    requests_done = truth[f"nv_inference_request_success{{{V1}}}"]
    inferences = truth[f"nv_inference_count{{{V1}}}"]
    assert requests_done == REQUESTS and inferences == REQUESTS * len(SAMPLE_INPUT)
    mean_ms = truth[f"nv_inference_request_duration_us{{{V1}}}"] / requests_done / 1000
    queue_ms = truth[f"nv_inference_queue_duration_us{{{V1}}}"] / requests_done / 1000
    compute_ms = sum(truth[f"nv_inference_compute_{part}_duration_us{{{V1}}}"]
                     for part in ("input", "infer", "output")) / requests_done / 1000

    # The pause: Triton's summary window empties, and Prometheus has scraped it empty.
    quantile = f'nv_inference_request_summary_us{{{V1},quantile="0.95"}}'
    wait_for(lambda: math.isnan(triton_counters(triton.metrics_url)[quantile]),
             timeout=120, what="Triton's latency summary to empty (NaN) after the traffic stopped", interval=1)
    wait_for(lambda: prometheus_value(prometheus.url, quantile) == "NaN", timeout=30,
             what="Prometheus to scrape the empty summary", interval=0.5)

    api = api_client.get(f"/api/v1/models/iris/metrics/?range={RANGE}")
    assert api.status_code == 200, api.content
    v1 = {row["version"]: row for row in api.json()["versions"]}[1]
    # Per request, from the counters: the request count is the denominator, not the inference count
    # (a batch of four is one request of four inferences).
    assert v1["latency_mean_ms"] == pytest.approx(mean_ms, rel=1e-6)
    assert v1["latency_mean_ms"] != pytest.approx(mean_ms * requests_done / inferences, rel=0.01)
    assert v1["queue_ms"] == pytest.approx(queue_ms, rel=1e-6)
    assert v1["compute_ms"] == pytest.approx(compute_ms, rel=1e-6)
    assert v1["latency_p95_ms"] is not None and v1["latency_p95_ms"] > 0  # what the summary held in the range

    client.force_login(user)
    fleet = client.get(f"/monitoring/?range={RANGE}").content.decode()
    panel = client.get(f"/monitoring/models/iris/panel/?range={RANGE}").content.decode()
    fleet_row = 'data-model="iris" data-version="1">'
    shown = f"{v1['latency_mean_ms']:.2f}"
    assert shown != "—"
    assert cell(fleet, fleet_row, "num latency-mean") == shown == panel_cells(panel)[2]
    p95 = f"{v1['latency_p95_ms']:.2f}"
    assert panel_cells(panel)[4] == p95
    fleet_cells = re.findall(r'<td class="num">([^<]*)</td>', fleet.split(fleet_row, 1)[1].split("</tr>", 1)[0])
    assert fleet_cells[1] == p95  # p50, p95, p99, errors, queue, pending
    # The pages show the API's figure (checked against Triton's counters above); formatting the
    # counters' own quotient instead can round the other way at a half-way digit (0.0235).
    assert panel_cells(panel)[6] == fleet_cells[4] == f"{v1['queue_ms']:.3f}"

    # A range without traffic has no latency to show: "—", not a stale figure.
    wait_for(lambda: prometheus_value(prometheus.url, f"increase(nv_inference_request_success{{{V1}}}[1m])") == "0",
             timeout=60, what="a minute without requests in Prometheus", interval=1)
    quiet = {row["version"]: row for row in api_client.get("/api/v1/models/iris/metrics/?range=1m").json()["versions"]}
    assert quiet[1]["throughput"] == 0
    assert quiet[1]["latency_mean_ms"] is None and quiet[1]["latency_p95_ms"] is None
