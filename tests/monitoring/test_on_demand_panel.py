"""The model page's on-demand panel on real components: two models registered on demand behind a real gateway in
front of a real Triton, the agent's loader keeping them within a budget, a real Prometheus scraping the gateway;
the panel shows each host's state, hit rate, cold starts with their waits, and evictions by reason."""

import pytest
import requests

from deployments.choices import Residency
from deployments.models import Deployment, ServingHost
from monitoring.services import on_demand_table
from tests.deployments.test_on_demand import infer
from tests.fixtures.on_demand import MB, put_model
from tests.fixtures.services import wait_for
from tests.monitoring.synthetic import deploy_version

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

HOST = "od-0"


def scraped(prometheus_url: str, query: str) -> float | None:
    rows = requests.get(f"{prometheus_url}/api/v1/query", params={"query": query}, timeout=5).json()["data"]["result"]
    return float(rows[0]["value"][1]) if rows else None


@pytest.fixture
def on_demand_host(make_host, triton_server, start_prometheus, settings) -> ServingHost:
    """Host ``od-0``: panel_a (one cold start, three hits; resident) and panel_b (one cold start, then evicted
    for the budget) registered on demand at a real gateway before a real Triton, each a version deployed on
    demand in the registry, scraped by a real Prometheus that has seen all of it."""
    gateway = make_host(triton_server)
    for name in ("panel_a", "panel_b"):
        put_model(triton_server, name)
        gateway.register_on_demand(name, footprint_bytes=100 * MB)
    gateway.start_loader(budget_bytes=250 * MB)  # two models, and the next load's room when one is idle
    prometheus = start_prometheus([{"target": gateway.url.removeprefix("http://"), "labels": {"host": HOST}}])
    settings.PROMETHEUS_URL = prometheus.url
    wait_for(lambda: scraped(prometheus.url, 'sum(modelyard_on_demand_requests_total{model="panel_a"})') == 0,
             timeout=60, interval=0.5, what="Prometheus to scrape the on-demand series at 0")
    for _ in range(4):
        assert infer(gateway, "panel_a").status_code == 200  # one cold start, then three hits
    assert infer(gateway, "panel_b").status_code == 200  # fits; then, asked least, it leaves to keep room
    wait_for(lambda: scraped(prometheus.url, 'sum(modelyard_evictions_total{model="panel_b"})') == 1,
             timeout=60, interval=0.5, what="Prometheus to see panel_b's eviction")
    wait_for(lambda: scraped(prometheus.url, 'sum(modelyard_on_demand_requests_total{model="panel_a"})') == 4,
             timeout=30, interval=0.5, what="Prometheus to scrape panel_a's requests")

    host = ServingHost.objects.create(name=HOST, inference_url=gateway.url, heartbeat={
        "gateway": {"live": True, "routes": {}, "residency": gateway.residency()}})
    for name in ("panel_a", "panel_b"):
        Deployment.objects.filter(pk=deploy_version(name, 1, host).pk).update(residency=Residency.ON_DEMAND)
    return host


def test_the_panel_shows_state_hit_rate_cold_starts_and_evictions(on_demand_host, client, user):
    measured = on_demand_table("panel_a", window_seconds=900)[HOST]
    assert (measured["hits"], measured["cold"], measured["hit_rate"]) == (3, 1, 0.75)
    assert 0 < measured["cold_p50_ms"] <= measured["cold_p99_ms"] and measured["evictions"] == {}
    # Its one load, as long as Triton took (modelyard_model_load_seconds), within the wait it caused.
    assert 0 < measured["load_p50_ms"] <= measured["load_p99_ms"] <= measured["cold_p99_ms"], measured
    assert on_demand_table("panel_b", window_seconds=900)[HOST]["evictions"] == {"budget": 1}

    client.force_login(user)
    page = client.get("/monitoring/models/panel_a/on-demand/?range=15m").content.decode()
    row = page.split(f'data-host="{HOST}"', 1)[1].split("</tr>", 1)[0]
    assert 'data-state="resident"' in page and "75.0" in row and '<td class="num cold-starts">1</td>' in row
    assert f'<td class="num load-time">{measured["load_p50_ms"]:.0f} / {measured["load_p99_ms"]:.0f}</td>' in row, row
    evicted = client.get("/monitoring/models/panel_b/on-demand/?range=15m").content.decode()
    assert 'data-state="cold"' in evicted and '<td class="evictions">budget 1</td>' in evicted
    # A model no host holds on demand shows no panel.
    deploy_version("plain", 1, on_demand_host)
    assert "On demand" not in client.get("/monitoring/models/plain/on-demand/").content.decode()


def test_the_fleet_page_shows_each_hosts_registered_and_resident_models(client, user):
    ServingHost.objects.create(name="od-1", inference_url="http://od-1:8000", heartbeat={"gateway": {
        "live": True, "routes": {}, "residency": {
            "models": {"a": {"state": "resident"}, "b": {"state": "cold"}, "c": {"state": "evicting"}},
            "budget": {"budget_bytes": 4 << 30, "resident_bytes": 1 << 30}}}})
    ServingHost.objects.create(name="always-0", inference_url="http://always-0:8000", heartbeat={})
    client.force_login(user)
    page = client.get("/monitoring/").content.decode()
    row = page.split('data-host="od-1"', 1)[1].split("</tr>", 1)[0]
    assert '<td class="num registered">3</td>' in row and '<td class="num resident">1</td>' in row
    assert "1.0\xa0GB / 4.0\xa0GB" in row
    assert 'data-host="always-0"' not in page


def test_the_host_page_and_the_overview_show_the_models_on_demand_as_registered_with_their_measures(
        on_demand_host, client, user):
    client.force_login(user)
    page = client.get(f"/hosts/{HOST}/").content.decode()
    assert "<h3>Unloaded</h3>" not in page and "Reload" not in page
    section = page.split('class="card host-on-demand"', 1)[1]
    assert "2 registered" in section and "1 resident" in section
    resident = section.split('data-model="panel_a"', 1)[1].split("</tr>", 1)[0]
    assert 'data-state="resident"' in section and "75.0" in resident
    assert '<td class="num cold-starts">1</td>' in resident
    evicted = section.split('data-model="panel_b"', 1)[1].split("</tr>", 1)[0]
    assert "not resident now" in evicted and '<td class="evictions">budget 1</td>' in evicted

    overview = client.get("/monitoring/table/?range=15m").content.decode()
    row_b = overview.split('data-model="panel_b"', 1)[1].split("</tr>", 1)[0]
    assert f"on demand · not resident now on {HOST}" in row_b and "not deployed now" not in row_b
    row_a = overview.split('data-model="panel_a"', 1)[1].split("</tr>", 1)[0]
    assert f"on demand · resident on {HOST}" in row_a


def test_the_overview_says_which_503s_of_on_demand_loads_make_an_error_rate(
        serve_exposition, start_prometheus, settings, client, user):
    exposition = serve_exposition(
        'modelyard_on_demand_requests_total{model="flaky",outcome="cold"} 1\n'
        'modelyard_on_demand_requests_total{model="flaky",outcome="load_failed"} 3\n'
        'modelyard_on_demand_requests_total{model="flaky",outcome="timeout"} 1\n'
        'modelyard_on_demand_requests_total{model="flaky",outcome="hit"} 0\n')
    prometheus = start_prometheus([{"target": exposition.target, "labels": {"host": HOST}}])
    settings.PROMETHEUS_URL = prometheus.url
    wait_for(lambda: scraped(prometheus.url, 'sum(modelyard_on_demand_requests_total{model="flaky"})') == 5,
             timeout=30, interval=0.5, what="Prometheus to scrape the refusals")
    host = ServingHost.objects.create(name=HOST, inference_url="http://od-0:8000")
    Deployment.objects.filter(pk=deploy_version("flaky", 1, host).pk).update(residency=Residency.ON_DEMAND)
    deploy_version("steady", 1, host)

    client.force_login(user)
    overview = client.get("/monitoring/table/?range=15m").content.decode()
    row = overview.split('data-model="flaky"', 1)[1].split("</tr>", 1)[0]
    assert '<small class="muted refused">503s of on-demand loads: load_failed 3, timeout 1</small>' in row
    steady = overview.split('data-model="steady"', 1)[1].split("</tr>", 1)[0]
    assert "refused" not in steady
