"""Monitoring services and pages against a real Prometheus scraping known expositions.

A Triton host (two GPUs, from the recorded fixture) and a BentoML process serve counters
that grow at known rates, so every PromQL query can be checked for its meaning: throughput,
latency, error rate, queue time, pending requests, for both runtimes, probes excluded.
"""

import time

import pytest
from django.test import override_settings

from deployments.choices import TargetState
from deployments.models import Deployment, DeploymentTarget, ServingHost
from monitoring import promql, services
from monitoring.prometheus import PrometheusClient
from registry.choices import ArtifactFormat
from registry.models import ModelVersion, RegisteredModel
from tests.fixtures.expositions import EXPOSITIONS
from tests.fixtures.services import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

GPU_LINES = [
    line for line in EXPOSITIONS["triton_gpu"].read_text().splitlines()
    if line.startswith(("nv_gpu_", "nv_cpu_", "# HELP nv_gpu", "# TYPE nv_gpu", "# HELP nv_cpu", "# TYPE nv_cpu"))
]
# Per second: (inferences, successes, failures, request µs, queue µs, compute µs split input/infer/output)
TRITON_RATES = {
    "1": (10, 10, 0.5, 20_000, 1_000, (500, 15_000, 500)),
    "2": (20, 20, 0.0, 30_000, 4_000, (1_000, 20_000, 1_000)),
}
QUANTILES_US = {"0.5": 1500, "0.9": 2500, "0.95": 3000, "0.99": 4000}


def triton_text(started: float) -> str:
    t = time.time() - started
    lines = list(GPU_LINES)
    for name in ("count", "request_success", "request_failure", "request_duration_us", "queue_duration_us",
                 "compute_input_duration_us", "compute_infer_duration_us", "compute_output_duration_us"):
        lines.append(f"# TYPE nv_inference_{name} counter")
        for version, (inf, ok, bad, req_us, queue_us, compute) in TRITON_RATES.items():
            value = {"count": inf, "request_success": ok, "request_failure": bad, "request_duration_us": req_us,
                     "queue_duration_us": queue_us, "compute_input_duration_us": compute[0],
                     "compute_infer_duration_us": compute[1], "compute_output_duration_us": compute[2]}[name]
            extra = ',reason="BACKEND"' if name == "request_failure" else ""
            lines.append(f'nv_inference_{name}{{model="iris",version="{version}"{extra}}} {value * t:.3f}')
    lines.append("# TYPE nv_inference_pending_request_count gauge")
    lines += [f'nv_inference_pending_request_count{{model="iris",version="{v}"}} 2' for v in TRITON_RATES]
    lines.append("# TYPE nv_inference_request_summary_us summary")
    for version in TRITON_RATES:
        lines += [f'nv_inference_request_summary_us{{model="iris",version="{version}",quantile="{q}"}} {us}'
                  for q, us in QUANTILES_US.items()]
    return "\n".join(lines) + "\n"


def bentoml_text(started: float) -> str:
    """A BentoML 1.4 exposition: /classify at 4.5 ok + 0.5 5xx per second, /readyz probes at 2/s."""
    t = time.time() - started
    common = 'runner_name="IrisClassifier",service_name="IrisClassifier",service_version="not available"'
    rows = [("/classify", "200", 4.5, 0.004), ("/classify", "500", 0.5, 0.004), ("/readyz", "200", 2.0, 0.5)]
    lines = ["# TYPE bentoml_service_request counter", "# TYPE bentoml_service_request_duration_seconds histogram"]
    for endpoint, code, rate, seconds in rows:
        labels = f'endpoint="{endpoint}",http_response_code="{code}",{common}'
        n = rate * t
        lines.append(f"bentoml_service_request_total{{{labels}}} {n:.3f}")
        for le in ("0.005", "0.01", "0.1", "1.0", "+Inf"):
            inside = n if le == "+Inf" or seconds <= float(le) else 0
            lines.append(f'bentoml_service_request_duration_seconds_bucket{{{labels},le="{le}"}} {inside:.3f}')
        lines.append(f"bentoml_service_request_duration_seconds_sum{{{labels}}} {n * seconds:.4f}")
        lines.append(f"bentoml_service_request_duration_seconds_count{{{labels}}} {n:.3f}")
    lines.append("# TYPE bentoml_service_request_in_progress gauge")
    lines.append(f'bentoml_service_request_in_progress{{endpoint="/classify",{common}}} 1')
    lines.append(f'bentoml_service_request_in_progress{{endpoint="/readyz",{common}}} 5')
    return "\n".join(lines) + "\n"


def _deploy(model_name: str, version: int, host: ServingHost, footprint=None) -> None:
    model, _ = RegisteredModel.objects.get_or_create(name=model_name)
    mv = ModelVersion.objects.create(
        model=model, version=version, format=ArtifactFormat.TRITON_MODEL_DIR, artifact_key=f"k{version}",
        artifact_sha256=f"{version:064d}", artifact_size=1,
    )
    deployment = Deployment.objects.create(model=model, version=mv)
    DeploymentTarget.objects.create(deployment=deployment, host=host, state=TargetState.READY,
                                    details={"footprint_bytes": footprint or {}})


WINDOW = 30  # seconds: the shortest rate window; the module's Prometheus holds more data than that


@pytest.fixture(scope="module")
def fleet_prometheus(tmp_path_factory):
    """Expositions for a Triton host and a BentoML process, and a real Prometheus scraping them
    every second, started once per module and given a full rate window of data."""
    import yaml

    from tests.fixtures.expositions import ServedExposition
    from tests.fixtures.services import _spawn, free_port

    started = time.time() - 60  # counters as if serving for a minute already
    triton = ServedExposition(lambda: triton_text(started))
    bento = ServedExposition(lambda: bentoml_text(started))
    workdir = tmp_path_factory.mktemp("fleet-prometheus")
    config = {
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [{"job_name": "serving", "static_configs": [
            {"targets": [triton.target], "labels": {"host": "gpu-a"}},
            {"targets": [bento.target], "labels": {"host": "bento-a", "model": "bento-iris", "version": "1"}},
        ]}],
    }
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    service = _spawn("prometheus", ["prometheus", f"--config.file={workdir / 'prometheus.yml'}",
                                    f"--storage.tsdb.path={workdir / 'tsdb'}",
                                    f"--web.listen-address=127.0.0.1:{port}"], workdir)
    service.url = f"http://127.0.0.1:{port}"
    first_scrape = time.time()
    wait_for(lambda: len(PrometheusClient(service.url).instant(promql.throughput({}, WINDOW))) == 3,
             timeout=40, what="Prometheus to have rates for both runtimes", interval=0.5)
    time.sleep(max(0.0, first_scrape + WINDOW + 2 - time.time()))
    yield {"prometheus": service, "triton": triton, "bento": bento}
    service.stop()
    triton.stop()
    bento.stop()


@pytest.fixture
def fleet(fleet_prometheus):
    gpu = ServingHost.objects.create(name="gpu-a", inference_url="http://gpu-a:8000",
                                     metrics_url=fleet_prometheus["triton"].url)
    bento_host = ServingHost.objects.create(name="bento-a", inference_url="http://bento-a:3000",
                                            metrics_url=fleet_prometheus["bento"].url)
    _deploy("iris", 1, gpu)
    _deploy("iris", 2, gpu, footprint={"gpu": 1_500_000_000, "cpu": 200_000_000})
    _deploy("bento-iris", 1, bento_host)
    with override_settings(PROMETHEUS_URL=fleet_prometheus["prometheus"].url):
        yield fleet_prometheus


def test_the_fleet_overview_gives_both_runtimes_the_same_meanings(fleet):
    overview = services.fleet_overview(window_seconds=WINDOW, sparkline_seconds=60, sparkline_step=5)
    rows = {(r["model"], r["version"]): r for r in overview["rows"]}
    v1, v2, bento = rows[("iris", "1")], rows[("iris", "2")], rows[("bento-iris", "1")]
    assert v1["throughput"] == pytest.approx(10, rel=0.15)
    assert v2["throughput"] == pytest.approx(20, rel=0.15)
    assert v1["latency_mean_ms"] == pytest.approx(2.0, rel=0.15)
    assert (v1["latency_p50_ms"], v1["latency_p95_ms"], v1["latency_p99_ms"]) == (1.5, 3.0, 4.0)
    assert v1["error_rate"] == pytest.approx(0.5 / 10.5, rel=0.15)
    assert v2["error_rate"] == 0
    assert v1["queue_ms"] == pytest.approx(0.1, rel=0.15)
    assert v2["compute_ms"] == pytest.approx(1.1, rel=0.15)
    assert v1["pending_requests"] == 2
    # BentoML: the /readyz probes are not traffic; 5xx are errors; histogram quantiles in ms.
    assert bento["throughput"] == pytest.approx(5, rel=0.15)
    assert bento["error_rate"] == pytest.approx(0.1, rel=0.15)
    assert bento["latency_mean_ms"] == pytest.approx(4.0, rel=0.15)
    assert 0 < bento["latency_p95_ms"] <= 5.0
    assert bento["pending_requests"] == 1
    # gpu-a was last deployed v2: v1 still reporting is serving outside what the registry expects.
    assert (v1["tracked"], v2["tracked"], bento["tracked"]) == (False, True, True)
    assert v2["hosts"] == ["gpu-a"]
    assert len(v2["sparkline"]) >= 4 and v2["sparkline"][-1] == pytest.approx(20, rel=0.25)


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
        _deploy(f"extra-{i}", 1, host)
    CountingClient.queries = 0
    rows = services.fleet_overview(client=CountingClient())["rows"]
    assert len(rows) == 40
    assert CountingClient.queries == few == len(promql.MODEL_METRICS) + 1


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
    assert "80.0\xa0GB" in page  # total memory of each GPU (85899345920 bytes)
    assert "37%" in page  # nv_gpu_utilization 0.37
    assert "1.4\xa0GB" in page  # iris v2's measured GPU footprint
    # headroom: the emptiest GPU has 85899345920 - 9531555840 bytes free
    assert "71.1\xa0GB</strong> on the emptiest GPU" in page


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
    _deploy("iris", 1, host)
    client.force_login(user)
    with override_settings(PROMETHEUS_URL=empty.url):
        overview = client.get("/monitoring/")
        model = client.get("/models/iris/")
        host_page = client.get("/hosts/gpu-a/")
    assert overview.status_code == model.status_code == host_page.status_code == 200
    assert "no data" in overview.content.decode()
    assert "No traffic recorded" in model.content.decode()
    assert "reports no GPUs" in host_page.content.decode()


def test_pages_render_with_a_notice_when_prometheus_is_too_slow(client, user):
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts connections, never answers
    host = ServingHost.objects.create(name="gpu-a", inference_url="http://gpu-a:8000")
    _deploy("iris", 1, host)
    client.force_login(user)
    try:
        with override_settings(PROMETHEUS_URL=f"http://127.0.0.1:{silent.getsockname()[1]}", PROMETHEUS_TIMEOUT=0.5):
            for url in ("/monitoring/", "/models/iris/", "/hosts/gpu-a/", "/monitoring/models/iris/panel/"):
                answer = client.get(url)
                assert answer.status_code == 200, url
                assert "did not answer within 0.5 s" in answer.content.decode(), url
    finally:
        silent.close()


def test_the_overview_table_draws_a_sparkline_from_the_series():
    from django.template.loader import render_to_string

    from monitoring.views import _display_row

    row = _display_row({"model": "iris", "version": "1", "hosts": ["gpu-a"], "tracked": True,
                        **{m.key: 1.0 for m in promql.MODEL_METRICS}, "sparkline": [0.0, 5.0, 10.0]})
    html = render_to_string("monitoring/partials/overview_table.html", {
        "rows": [row], "total": 1, "window_minutes": 5, "columns": [], "query": "", "host": "", "sort": "model",
        "order": "asc",
    })
    assert '<polyline points="0.0,27.0 60.0,14.0 120.0,1.0"/>' in html


def test_the_overview_pages_rows_sorted_across_all_pages(client, user):
    from tests.fixtures.services import free_port

    host = ServingHost.objects.create(name="gpu-a", inference_url="http://gpu-a:8000")
    for i in range(57):
        _deploy(f"m{i:02d}", 1, host)
    client.force_login(user)
    with override_settings(PROMETHEUS_URL=f"http://127.0.0.1:{free_port()}", PROMETHEUS_TIMEOUT=1):
        first = client.get("/monitoring/?sort=model&order=desc").content.decode()
        second = client.get("/monitoring/?sort=model&order=desc&page=2").content.decode()
    assert first.count('class="overview-row"') == 50 and second.count('class="overview-row"') == 7
    assert 'data-model="m56"' in first and 'data-model="m00"' in second
    assert "1–50 shown" in first and "page 2 of 2" in second
    assert "Metrics unavailable" in first
