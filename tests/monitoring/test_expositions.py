"""The recorded Triton GPU exposition, served by ``serve_exposition``, as a real Prometheus sees it."""

import re
import time

import pytest
import requests

from tests.fixtures.expositions import EXPOSITIONS

pytestmark = pytest.mark.integration

SCRAPE_DEADLINE_S = 20


def instant(prometheus_url: str, query: str) -> list[dict]:
    answer = requests.get(f"{prometheus_url}/api/v1/query", params={"query": query}, timeout=5)
    answer.raise_for_status()
    return answer.json()["data"]["result"]


def test_a_real_prometheus_scrapes_gpu_memory_per_gpu_and_host(serve_exposition, start_prometheus):
    text = EXPOSITIONS["triton_gpu"].read_text()
    uuids = sorted(set(re.findall(r'nv_gpu_memory_total_bytes\{gpu_uuid="(GPU-[0-9a-f-]+)"\}', text)))
    assert len(uuids) == 2
    exposition = serve_exposition(EXPOSITIONS["triton_gpu"])
    prometheus = start_prometheus([{"target": exposition.target, "labels": {"host": "gpu-a"}}])

    query = f'nv_gpu_memory_total_bytes{{host="gpu-a",gpu_uuid="{uuids[0]}"}}'
    deadline = time.monotonic() + SCRAPE_DEADLINE_S
    result = instant(prometheus.url, query)
    while not result and time.monotonic() < deadline:
        time.sleep(0.5)
        result = instant(prometheus.url, query)

    assert [float(r["value"][1]) for r in result] == [85899345920.0]
    per_gpu = instant(prometheus.url, 'nv_gpu_memory_total_bytes{host="gpu-a"}')
    assert sorted(r["metric"]["gpu_uuid"] for r in per_gpu) == uuids
    assert exposition.scrapes >= 1


def test_triton_models_count_their_requests_per_host_for_idle_unloading(serve_exposition, start_prometheus):
    """``promql.requests_per_host_model`` (what idle unloading reads) gives each Triton model a row: Triton labels
    its failures with a ``reason`` its successes lack, so success + failure added series by series matched none."""
    from monitoring import promql

    exposition = serve_exposition(EXPOSITIONS["triton_cpu"])
    prometheus = start_prometheus([{"target": exposition.target, "labels": {"host": "cpu-a"}}])
    query = promql.requests_per_host_model(60)
    deadline = time.monotonic() + SCRAPE_DEADLINE_S
    rows = instant(prometheus.url, query)
    while len(rows) < 2 and time.monotonic() < deadline:  # increase() needs two scrapes of a series
        time.sleep(0.5)
        rows = instant(prometheus.url, query)
    counted = {(r["metric"]["host"], r["metric"]["model"]): float(r["value"][1]) for r in rows}
    assert set(counted) == {("cpu-a", "iris"), ("cpu-a", "resnet50")}, rows
    assert all(value == 0 for value in counted.values())  # the recorded page never changes: idle
