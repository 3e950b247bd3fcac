"""How the pages' counters read a series that a real Prometheus first saw inside the window and that then reset.

A version unloaded and loaded again (the reconciler restoring it after a drift, an operator's reload) or a
restarted process makes Triton start its counters over from 0 under the same labels. Read whole, such a series
held only what it counted since the reload, so a version that served hundreds of requests in the range read
0.0 inferences/s when the reload came right before the page.
"""

import time

import pytest
import requests

from monitoring import promql

pytestmark = pytest.mark.integration

SCRAPE_DEADLINE_S = 20
WINDOW_S = 900
SERIES = 'nv_inference_count{model="iris",version="2"}'


def instant(prometheus_url: str, query: str) -> list[dict]:
    answer = requests.get(f"{prometheus_url}/api/v1/query", params={"query": query}, timeout=5)
    answer.raise_for_status()
    return answer.json()["data"]["result"]


def scraped(prometheus_url: str, values: list[float], what: str) -> None:
    """Wait until Prometheus's latest value of SERIES is among ``values`` (``[]``: until it has none)."""
    deadline = time.monotonic() + SCRAPE_DEADLINE_S
    while time.monotonic() < deadline:
        now = [float(r["value"][1]) for r in instant(prometheus_url, SERIES)]
        if (now and now[0] in values) or (not values and not now):
            return
        time.sleep(0.2)
    raise AssertionError(f"Prometheus never scraped {what}")


def serve_in_turn(exposition, prometheus_url: str, steps: list[tuple[float | None, str]]) -> None:
    """Serve each step's value of SERIES (None: no series) until Prometheus has scraped it."""
    for value, what in steps:
        exposition.set_text("" if value is None else f"{SERIES} {value:g}\n")
        scraped(prometheus_url, [] if value is None else [value], what)


def served(prometheus_url: str) -> float:
    """Inferences of iris v2 over the window, as the pages read them (throughput times the window)."""
    rows = instant(prometheus_url, promql.throughput({"model": "iris"}, WINDOW_S))
    assert [r["metric"]["version"] for r in rows] == ["2"], rows
    return float(rows[0]["value"][1]) * WINDOW_S


def test_a_version_reloaded_inside_the_window_keeps_what_it_served_before_the_reload(
        serve_exposition, start_prometheus):
    exposition = serve_exposition("")
    prometheus = start_prometheus([{"target": exposition.target, "labels": {"host": "cpu-a"}}])
    serve_in_turn(exposition, prometheus.url, [
        (0, "the loaded version at 0"),
        (300, "300 inferences"),
        (None, "the unload"),  # Triton drops an unloaded version's series
        (0, "the reloaded version at 0"),  # the same labels, counting from 0
    ])

    # Before: the series, first seen inside the window, was read whole: 0.
    assert served(prometheus.url) >= 300


def test_a_burst_before_the_first_scrape_counts_exactly_while_the_series_never_reset(
        serve_exposition, start_prometheus):
    exposition = serve_exposition("")
    prometheus = start_prometheus([{"target": exposition.target, "labels": {"host": "cpu-a"}}])
    serve_in_turn(exposition, prometheus.url, [(300, "the burst"), (320, "20 more inferences")])

    assert served(prometheus.url) == pytest.approx(320)
