"""Figures PromQL computes no number for (NaN from 0/0, Inf from x/0) are null with a reason, never a 500.

A Triton exposition serves a version whose every request failed: its failure counter and its queue time
grow while its success counter stays at 0, so a real Prometheus computes the mean latency as 0/0 (NaN) and
the queue time as x/0 (+Inf), the case of an on-demand model whose requests were only held or refused.
DRF's strict JSON refuses both, and answered 500 ("Out of range float values are not JSON compliant").
"""

import json
import time

import pytest
import requests

from deployments.models import ServingHost
from monitoring.prometheus import PrometheusClient
from tests.fixtures.services import wait_for
from tests.monitoring.synthetic import deploy_version

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

MODEL = "held"
V1 = f'model="{MODEL}",version="1"'


def failing_triton_text(started: float) -> str:
    """Triton's counters for ``held`` v1 ``time.time() - started`` s after it started: 2 failures and 3 ms of
    queue time a second, no success, no inference."""
    t = time.time() - started
    lines = []
    for name, per_second in (("count", 0), ("request_success", 0), ("request_failure", 2),
                             ("request_duration_us", 0), ("queue_duration_us", 3_000)):
        extra = ',reason="BACKEND"' if name == "request_failure" else ""
        lines += [f"# TYPE nv_inference_{name} counter", f"nv_inference_{name}{{{V1}{extra}}} {per_second * t:.3f}"]
    return "\n".join(lines) + "\n"


@pytest.fixture
def held(serve_exposition, start_prometheus, settings):
    """``held`` v1 ready on host ``gpu-h``, scraped every second by a real Prometheus, once a rate
    window of its counters can be read."""
    started = time.time()
    exposition = serve_exposition(lambda: failing_triton_text(started))
    prometheus = start_prometheus([{"target": exposition.target, "labels": {"host": "gpu-h"}}])
    settings.PROMETHEUS_URL = prometheus.url
    host = ServingHost.objects.create(name="gpu-h", inference_url="http://gpu-h:8000", metrics_url=exposition.url)
    deploy_version(MODEL, 1, host)
    queue = (f"sum(rate(nv_inference_queue_duration_us{{{V1}}}[30s]))"
             f" / sum(rate(nv_inference_request_success{{{V1}}}[30s]))")
    # 2 s ago, so that the last point of a range query ending now (rounded to the second) holds it too
    wait_for(lambda: _raw(prometheus.url, queue, at=time.time() - 2) == "+Inf", timeout=40, interval=0.5,
             what="Prometheus to compute the queue time as +Inf")
    return prometheus


def _raw(prometheus_url: str, query: str, *, at: float) -> str | None:
    """The first value of ``query`` at unix time ``at`` as Prometheus writes it ("+Inf", "NaN"), or None."""
    answer = requests.get(f"{prometheus_url}/api/v1/query", params={"query": query, "time": at}, timeout=5)
    rows = answer.json()["data"]["result"]
    return rows[0]["value"][1] if rows else None


def _refuse(constant: str):
    raise AssertionError(f"{constant} in a JSON answer")


def test_the_metrics_give_null_with_a_reason_where_promql_computed_nan_or_inf(held, api_client):
    answer = api_client.get(f"/api/v1/models/{MODEL}/metrics/?range=1m")
    assert answer.status_code == 200, answer.content[:500]
    (row,) = json.loads(answer.content, parse_constant=_refuse)["versions"]
    assert row["version"] == 1 and row["error_rate"] == 1
    assert row["queue_ms"] is None and row["latency_mean_ms"] is None
    assert "+Inf" in row["missing"]["queue_ms"] and "NaN" in row["missing"]["latency_mean_ms"]
    assert "error_rate" not in row["missing"]
    assert all(row[key] is None for key in row["missing"])


def test_the_series_leave_out_undefined_points_and_count_them(held, api_client):
    answer = api_client.get(f"/api/v1/models/{MODEL}/metrics/series/?range=1m")
    assert answer.status_code == 200, answer.content[:500]
    body = json.loads(answer.content, parse_constant=_refuse)  # Python's json would read NaN and Infinity
    (queue,) = body["series"]["queue_ms"]
    assert queue["points"] == [] and queue["undefined_points"] > 0 and "NaN or Inf" in queue["missing"]
    assert body["series"]["latency_p99_ms"] == []  # Triton's summary holds none: no series, nothing to count
    (errors,) = body["series"]["error_rate"]
    assert errors["points"] and errors["undefined_points"] == 0 and errors["missing"] is None


def test_no_reading_of_the_adapter_holds_a_number_json_cannot_carry(held):
    client = PrometheusClient(held.url)
    samples = client.instant("vector(1) / 0 or label_replace(vector(0) / 0, 'k', 'nan', '', '')")
    assert samples == [] and sorted(text for _, text in samples.undefined) == ["+Inf", "NaN"]
    (series,) = client.range("vector(-1) / 0", seconds=60, step=15)
    assert series.points == [] and series.undefined == 5
