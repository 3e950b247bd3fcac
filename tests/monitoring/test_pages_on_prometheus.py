"""Monitoring services and pages against a real Prometheus scraping known expositions.

A Triton host (two GPUs, from the recorded fixture) and a BentoML process serve counters
that grow at known rates, so every PromQL query can be checked for its meaning: throughput,
latency, error rate, queue time, pending requests, for both runtimes, probes excluded.
"""

import time

import pytest
from django.test import override_settings

from deployments.models import ServingHost
from monitoring import promql, services
from monitoring.prometheus import PrometheusClient
from tests.factories import page_with_panels
from tests.fixtures.services import wait_for
from tests.monitoring.synthetic import deploy_version, start_fleet

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

WINDOW = 30  # seconds: the shortest rate window; the module's Prometheus holds more data than that
HISTORY_SECONDS = WINDOW + 15  # backfilled, one sample a second, so a full window is there from the start


@pytest.fixture(scope="module")
def fleet_prometheus(tmp_path_factory):
    """Expositions for a Triton host and a BentoML process, and a real Prometheus scraping them
    every second, started once per module with a full rate window of backfilled data before its
    first scrape (start_fleet returns once the live scrapes continue it)."""
    # counters as if serving for a minute already
    fleet = start_fleet(tmp_path_factory.mktemp("fleet-prometheus"), started=time.time() - 60,
                        history_seconds=HISTORY_SECONDS)
    wait_for(lambda: len(PrometheusClient(fleet.prometheus.url).instant(promql.throughput({}, WINDOW))) == 3,
             timeout=40, what="Prometheus to have rates for both runtimes", interval=0.5)
    yield fleet
    fleet.stop()


@pytest.fixture
def fleet(fleet_prometheus):
    gpu = ServingHost.objects.create(name="gpu-a", inference_url="http://gpu-a:8000",
                                     metrics_url=fleet_prometheus.triton.url)
    bento_host = ServingHost.objects.create(name="bento-a", inference_url="http://bento-a:3000",
                                            metrics_url=fleet_prometheus.bento.url)
    deploy_version("iris", 1, gpu)
    deploy_version("iris", 2, gpu, footprint={"gpu": 1_500_000_000, "cpu": 200_000_000})
    deploy_version("bento-iris", 1, bento_host)
    with override_settings(PROMETHEUS_URL=fleet_prometheus.prometheus.url):
        yield fleet_prometheus


def test_the_fleet_overview_gives_both_runtimes_the_same_meanings(fleet):
    overview = services.fleet_overview(window_seconds=WINDOW, sparkline_seconds=60, sparkline_step=5)
    rows = {(r["model"], r["version"]): r for r in overview["rows"]}
    v1, v2, bento = rows[("iris", "1")], rows[("iris", "2")], rows[("bento-iris", "1")]
    assert v1["throughput"] == pytest.approx(10, rel=0.15)
    assert v2["throughput"] == pytest.approx(20, rel=0.15)
    assert (v1["latency_p50_ms"], v1["latency_p95_ms"], v1["latency_p99_ms"]) == (1.5, 3.0, 4.0)
    assert v1["latency_mean_ms"] == pytest.approx(2.0, rel=0.1)  # 20 ms of requests a second / 10 requests
    assert v1["error_rate"] == pytest.approx(0.5 / 10.5, rel=0.15)
    assert v2["error_rate"] == 0
    assert v1["queue_ms"] == pytest.approx(0.1, rel=0.15)
    assert v1["pending_requests"] == 2
    # BentoML: the /readyz probes are not traffic; 5xx are errors; histogram quantiles in ms.
    assert bento["throughput"] == pytest.approx(5, rel=0.15)
    assert bento["error_rate"] == pytest.approx(0.1, rel=0.15)
    assert 0 < bento["latency_p95_ms"] <= 5.0
    assert bento["pending_requests"] == 1
    # gpu-a was last deployed v2: v1 still reporting is serving outside what the registry expects.
    assert (v1["tracked"], v2["tracked"], bento["tracked"]) == (False, True, True)
    assert v1["registered"] is True  # replaced by v2, still reporting: "not deployed now", not "untracked"
    assert v2["hosts"] == ["gpu-a"]
    assert len(v2["sparkline"]) >= 4 and v2["sparkline"][-1][1] == pytest.approx(20, rel=0.25)


def test_the_model_summary_gives_mean_latency_and_compute_time_for_both_runtimes(fleet):
    # Ratios of two rates: right whatever share of the window holds data.
    iris = {row["version"]: row for row in services.model_metrics("iris", "1m")["versions"]}
    assert iris[1]["latency_mean_ms"] == pytest.approx(2.0, rel=0.1)
    assert iris[2]["compute_ms"] == pytest.approx(1.1, rel=0.1)
    assert iris[1]["queue_ms"] == pytest.approx(0.1, rel=0.1)
    bento = services.model_metrics("bento-iris", "1m")["versions"]
    assert bento[0]["version"] == 1
    assert bento[0]["latency_mean_ms"] == pytest.approx(4.0, rel=0.1)
    assert bento[0]["error_rate"] == pytest.approx(0.1, rel=0.1)


class CountingClient(PrometheusClient):
    """A real client that counts the HTTP queries it sends."""

    queries = 0

    def instant(self, query):
        CountingClient.queries += 1
        return super().instant(query)

    def range(self, query, **kwargs):
        CountingClient.queries += 1
        return super().range(query, **kwargs)


def test_the_overview_sends_one_query_per_panel_whatever_the_number_of_models(fleet):
    CountingClient.queries = 0
    services.fleet_overview(client=CountingClient())
    few = CountingClient.queries
    host = ServingHost.objects.get(name="gpu-a")
    for i in range(3, 40):
        deploy_version(f"extra-{i}", 1, host)
    CountingClient.queries = 0
    rows = services.fleet_overview(client=CountingClient())["rows"]
    assert len(rows) == 40
    assert CountingClient.queries == few == len(services.OVERVIEW_METRICS) + 1


def test_the_overview_page_sorts_and_filters(fleet, client, user):
    client.force_login(user)
    page = client.get("/monitoring/?sort=throughput&order=desc").content.decode()
    order = [page.index(f'data-model="{m}" data-version="{v}"') for m, v in (("iris", "2"), ("iris", "1"))]
    assert order == sorted(order)
    only_bento = client.get("/monitoring/table/?q=bento").content.decode()
    assert 'data-model="bento-iris"' in only_bento and 'data-model="iris"' not in only_bento
    by_host = client.get("/monitoring/?host=gpu-a").content.decode()
    assert 'data-model="bento-iris"' not in by_host and 'data-model="iris"' in by_host


def test_the_host_page_shows_each_gpu_the_footprints_and_the_headroom(fleet, client, user):
    client.force_login(user)
    page = client.get("/hosts/gpu-a/").content.decode()
    assert page.count('class="gpu-row"') == 2
    assert 'data-gpu="GPU-5c3f7a9e-1d2b-4c8e-9f60-3a7b2e4d1c85"' in page
    assert "80.0\xa0GiB" in page  # total memory of each GPU (85899345920 bytes)
    assert "37%" in page  # nv_gpu_utilization 0.37
    assert "1.4\xa0GiB" in page  # iris v2's measured GPU footprint
    # headroom: the emptiest GPU has 85899345920 - 9531555840 bytes free
    assert "71.1\xa0GiB</strong> on the emptiest GPU" in page


def test_a_model_series_has_at_most_300_points_and_carries_deployment_markers(fleet):
    body = services.model_series("iris", "15m")
    assert body["step"] * promql.MAX_POINTS >= 900
    assert {row["version"] for row in body["series"]["throughput"]} == {"1", "2"}
    assert all(len(row["points"]) <= promql.MAX_POINTS for rows in body["series"].values() for row in rows)
    assert [m["version"] for m in body["markers"]] == [1, 2]
    assert body["units"]["throughput"] == "inferences/s"


def test_pages_render_with_a_notice_when_prometheus_has_no_data(start_prometheus, client, user):
    empty = start_prometheus([])
    host = ServingHost.objects.create(name="gpu-a", inference_url="http://gpu-a:8000")
    deploy_version("iris", 1, host)
    client.force_login(user)
    with override_settings(PROMETHEUS_URL=empty.url):
        overview = client.get("/monitoring/")
        model = page_with_panels(client, "/models/iris/")
        host_page = client.get("/hosts/gpu-a/")
    assert overview.status_code == host_page.status_code == 200
    assert "no data" in overview.content.decode()
    assert "No traffic recorded" in model
    assert "No GPU metrics for this host" in host_page.content.decode()


def test_pages_render_with_a_notice_when_prometheus_is_too_slow(client, user):
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts connections, never answers
    host = ServingHost.objects.create(name="gpu-a", inference_url="http://gpu-a:8000")
    deploy_version("iris", 1, host)
    client.force_login(user)
    try:
        with override_settings(PROMETHEUS_URL=f"http://127.0.0.1:{silent.getsockname()[1]}", PROMETHEUS_TIMEOUT=0.5):
            for url in ("/monitoring/", "/models/iris/", "/hosts/gpu-a/", "/monitoring/models/iris/panel/"):
                assert "did not answer within 0.5 s" in page_with_panels(client, url), url
    finally:
        silent.close()


def test_the_overview_table_draws_a_sparkline_where_the_points_fall_in_the_hour():
    from django.template.loader import render_to_string

    from monitoring.views import _display_row

    row = _display_row({"model": "iris", "version": "1", "hosts": ["gpu-a"], "tracked": True, "registered": True,
                        **{m.key: 1.0 for m in promql.MODEL_METRICS},
                        "sparkline": [[1800.0, 0.0], [2700.0, 5.0], [3600.0, 10.0]]}, span=(0.0, 3600.0))
    html = render_to_string("monitoring/partials/overview_table.html", {
        "rows": [row], "total": 1, "range": "15m", "columns": [], "query": "", "host": "", "sort": "model",
        "order": "asc",
    })
    # The points cover the second half hour only, so the line starts mid-cell.
    assert '<polyline points="60.0,27.0 90.0,14.0 120.0,1.0"/>' in html
    # Its scale: the bottom edge is 0, the top the row's peak.
    assert "peak 10.00</span>" in html
    assert 'aria-label="throughput over the last hour, from 0 to a peak of 10.00 inferences/s"' in html


def test_the_overview_reads_the_range_it_is_given_and_keeps_it_in_its_links(fleet, client, user):
    client.force_login(user)
    page = client.get("/monitoring/?range=1h&q=iris").content.decode()
    assert "<small>last 1h</small>" in page and "metrics over the last 1h" in page
    assert 'href="?range=1h&amp;q=iris&amp;host=&amp;sort=throughput' in page
    assert '<input type="hidden" name="range" value="1h">' in page
    assert 'class="active">1h</a>' in page
    assert "metrics over the last 15m" in client.get("/monitoring/?range=2w").content.decode()


def test_the_overview_pages_rows_sorted_across_all_pages(client, user):
    from tests.fixtures.services import free_port

    host = ServingHost.objects.create(name="gpu-a", inference_url="http://gpu-a:8000")
    for i in range(57):
        deploy_version(f"m{i:02d}", 1, host)
    client.force_login(user)
    with override_settings(PROMETHEUS_URL=f"http://127.0.0.1:{free_port()}", PROMETHEUS_TIMEOUT=1):
        first = client.get("/monitoring/?sort=model&order=desc").content.decode()
        second = client.get("/monitoring/?sort=model&order=desc&page=2").content.decode()
    assert first.count('class="overview-row"') == 50 and second.count('class="overview-row"') == 7
    assert 'data-model="m56"' in first and 'data-model="m00"' in second
    assert "1–50 shown" in first and "page 2 of 2" in second
    assert "Metrics unavailable" in first


PINNED_QUERIES = {  # SQL queries per page, whatever the number of models and versions
    "/monitoring/?range=15m": 8,  # the hosts that hold models on demand: one query
    "/monitoring/table/?range=1h&sort=latency_mean_ms": 6,
    # the model and the user's role in its team read in one query (registry.registered_models.get_model)
    "/monitoring/models/iris/panel/?range=15m": 6,
    "/api/v1/models/iris/metrics/series/?range=15m": 6,
}


@pytest.mark.parametrize("url", PINNED_QUERIES)
def test_the_metrics_pages_cost_a_fixed_number_of_sql_queries(fleet, client, user, url):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client.force_login(user)
    host = ServingHost.objects.get(name="gpu-a")
    counts = []
    for extra in (range(3, 5), range(5, 30)):
        for i in extra:
            deploy_version(f"extra-{i}", 1, host)
            deploy_version("iris", i, host)
        with CaptureQueriesContext(connection) as queries:
            assert client.get(url).status_code == 200
        counts.append(len(queries))
    assert counts == [PINNED_QUERIES[url]] * 2, counts
