"""Prometheus HTTP service discovery of serving hosts: GET /api/v1/prometheus/targets/."""

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from deployments.choices import TargetState
from deployments.models import DeploymentTarget, ServingHost
from registry.choices import ArtifactFormat
from tests.factories import token_for
from tests.fixtures.services import TEST_BROKER_URL, local_prometheus_config, wait_for
from tests.monitoring.synthetic import deploy_version

pytestmark = pytest.mark.django_db

SD_URL = "/api/v1/prometheus/targets/"
EXPOSITION = b"""# HELP nv_inference_count Number of inferences performed
# TYPE nv_inference_count counter
nv_inference_count{model="iris",version="1"} 42
"""


@pytest.fixture
def user(db):
    """Hosts are registered by administrators: the API client here is one."""
    return get_user_model().objects.create_user(username="ops-api", password="a-long-test-password", is_staff=True)


def register(api_client: APIClient, name: str, **fields) -> None:
    payload = {"name": name, "runtime": "triton", "inference_url": f"http://{name}:8000", **fields}
    answer = api_client.post("/api/v1/hosts/", payload, format="json")
    assert answer.status_code == 201, answer.content


def test_it_lists_each_host_with_a_metrics_url_as_one_target_group_with_its_labels(api_client):
    register(api_client, "gpu-a", metrics_url="http://gpu-a:8002/metrics",
             labels={"zone": "eu-west-1", "gpu.model": "H200", "team-name": "ml"})
    register(api_client, "gpu-b", metrics_url="https://metrics.example.com/triton/metrics?format=prometheus")
    register(api_client, "no-metrics")

    answer = api_client.get(SD_URL)

    assert answer.status_code == 200
    assert answer["Content-Type"] == "application/json"
    assert answer.json() == [
        {
            "targets": ["gpu-a:8002"],
            "labels": {
                "host": "gpu-a",
                "runtime": "triton",
                "__scheme__": "http",
                "__metrics_path__": "/metrics",
                "label_zone": "eu-west-1",
                "label_gpu_model": "H200",
                "label_team_name": "ml",
            },
        },
        gateway_group("gpu-a", "gpu-a:8000", label_zone="eu-west-1", label_gpu_model="H200", label_team_name="ml"),
        {
            "targets": ["metrics.example.com:443"],
            "labels": {
                "host": "gpu-b",
                "runtime": "triton",
                "__scheme__": "https",
                "__metrics_path__": "/triton/metrics",
                "__param_format": "prometheus",
            },
        },
        gateway_group("gpu-b", "gpu-b:8000"),
        gateway_group("no-metrics", "no-metrics:8000"),
    ]


def gateway_group(host: str, address: str, **labels) -> dict:
    """The target group of a Triton host's gateway, whose /metrics is at the host's inference_url."""
    return {"targets": [address], "labels": {"host": host, "runtime": "triton", "source": "gateway",
                                             "__scheme__": "http", "__metrics_path__": "/metrics", **labels}}


def test_a_triton_hosts_gateway_is_scraped_at_its_inference_url_by_its_scheme(api_client):
    register(api_client, "gpu-a", inference_url="https://inference.example.com")

    (group,) = api_client.get(SD_URL).json()

    assert group == {"targets": ["inference.example.com:443"], "labels": {
        "host": "gpu-a", "runtime": "triton", "source": "gateway", "__scheme__": "https",
        "__metrics_path__": "/metrics"}}


def test_triton_targets_carry_no_model_or_version_label_even_from_host_labels(api_client):
    register(api_client, "gpu-a", metrics_url="http://[::1]:8002/metrics", labels={"model": "iris", "version": "3"})

    groups = api_client.get(SD_URL).json()

    assert [group["targets"] for group in groups] == [["[::1]:8002"], ["gpu-a:8000"]]  # Triton's, the gateway's
    for group in groups:
        assert "model" not in group["labels"] and "version" not in group["labels"]
        assert group["labels"]["label_model"] == "iris" and group["labels"]["label_version"] == "3"


def test_an_empty_fleet_is_an_empty_list(api_client):
    answer = api_client.get(SD_URL)
    assert answer.status_code == 200 and answer.json() == []


def test_discovery_requires_an_api_token(db):
    ServingHost.objects.create(name="gpu-a", inference_url="http://gpu-a:8000", metrics_url="http://gpu-a:8002/metrics")
    anonymous = APIClient().get(SD_URL)
    assert anonymous.status_code in (401, 403)
    assert "gpu-a" not in anonymous.content.decode()
    wrong = APIClient()
    wrong.credentials(HTTP_AUTHORIZATION="Token " + "0" * 40)
    assert wrong.get(SD_URL).status_code == 401
    unknown = APIClient()
    unknown.credentials(HTTP_AUTHORIZATION="Bearer my_0123456789ab_" + "A" * 43)
    assert unknown.get(SD_URL).status_code == 401


def bento_host(name: str, models: list[dict] | None = None, **fields) -> ServingHost:
    """A BentoML host whose agent last reported serving ``models`` (``[{"name", "version", "state"}]``)."""
    fields = {"inference_url": f"http://{name}:3000", **fields}
    return ServingHost.objects.create(name=name, runtime="bentoml",
                                      heartbeat={"runtime_live": True, "models": models or []}, **fields)


def test_each_version_a_bentoml_host_serves_is_one_target_through_its_nginx_labelled_with_model_and_version(
    api_client,
):
    host = bento_host("bento-a", [{"name": "iris", "version": 2, "state": "READY"},
                                  {"name": "clf", "version": 7, "state": "UNAVAILABLE"}],
                      labels={"zone": "lab-1", "model": "not-this"})

    groups = api_client.get(SD_URL).json()

    front = {"targets": ["bento-a:3000"], "labels": {
        "label_zone": "lab-1", "label_model": "not-this", "host": "bento-a", "runtime": "bentoml", "source": "gateway",
        "__scheme__": "http", "__metrics_path__": "/metrics"}}
    assert groups == [front] + [
        {"targets": ["bento-a:3000"], "labels": {
            "label_zone": "lab-1", "label_model": "not-this", "host": "bento-a", "runtime": "bentoml",
            "model": model, "version": version,
            "__scheme__": "http", "__metrics_path__": f"/_metrics/{model}/{version}",
        }}
        for model, version in (("clf", "7"), ("iris", "2"))
    ]
    assert host.metrics_url == ""


def test_a_bentoml_version_is_a_target_from_its_cut_over_before_the_agent_reports_it(api_client):
    host = bento_host("bento-a", [{"name": "iris", "version": 1, "state": "READY"}])
    deploy_version("iris", 1, host, artifact_format=ArtifactFormat.BENTO)
    deploy_version("iris", 2, host, artifact_format=ArtifactFormat.BENTO)  # READY now; not yet in a heartbeat
    failed = deploy_version("other", 1, host, artifact_format=ArtifactFormat.BENTO)
    DeploymentTarget.objects.filter(deployment=failed).update(state=TargetState.FAILED)

    paths = [g["labels"]["__metrics_path__"] for g in api_client.get(SD_URL).json()]

    # The front's own, then v1 still reported until the next heartbeat: scraped too, its path answers 404 once
    # v2 serves.
    assert paths == ["/metrics", "/_metrics/iris/1", "/_metrics/iris/2"]


def test_a_bentoml_host_with_a_metrics_url_keeps_its_host_target_and_a_bad_heartbeat_entry_is_skipped(api_client):
    bento_host("bento-a", [{"name": "iris"}, "junk", {"name": "iris", "version": "x"}],
               metrics_url="http://bento-a:9100/metrics")
    bento_host("bento-b", [{"name": "iris", "version": 3}], inference_url="ftp://bento-b/")

    groups = api_client.get(SD_URL).json()

    assert [(g["targets"], g["labels"].get("model"), g["labels"]["__metrics_path__"]) for g in groups] == [
        (["bento-a:9100"], None, "/metrics"), (["bento-a:3000"], None, "/metrics")]  # its metrics_url, its front


def test_the_number_of_queries_does_not_grow_with_the_number_of_hosts(api_client):
    def count_queries() -> int:
        with CaptureQueriesContext(connection) as queries:
            assert api_client.get(SD_URL).status_code == 200
        return len(queries)

    def add_hosts(numbers: range) -> None:
        for i in numbers:
            ServingHost.objects.create(name=f"gpu-{i}", inference_url="http://h:8000", metrics_url=f"http://h{i}:8002/m")
            host = bento_host(f"bento-{i}", [{"name": "clf", "version": 1, "state": "READY"}])
            deploy_version(f"iris-{i}", 1, host, artifact_format=ArtifactFormat.BENTO)

    count_queries()  # the token's first use writes its last_used_at (once a minute), not counted
    add_hosts(range(2))
    few = count_queries()
    add_hosts(range(2, 20))
    assert count_queries() == few


@pytest.fixture
def fixed_metrics_server() -> Iterator[str]:
    """A tiny HTTP server answering GET /metrics with a fixed Prometheus exposition; yields its URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(EXPOSITION)))
            self.end_headers()
            self.wfile.write(EXPOSITION)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    server.shutdown()
    server.server_close()


def prometheus_targets(prometheus_url: str) -> list[dict]:
    answer = requests.get(f"{prometheus_url}/api/v1/targets", params={"state": "active"}, timeout=5)
    answer.raise_for_status()
    return answer.json()["data"]["activeTargets"]


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_prometheus_scrapes_a_host_registered_through_the_api_or_the_page_without_a_config_edit(
    live_server, start_prometheus_with_config, fixed_metrics_server, tmp_path, settings
):
    settings.CELERY_BROKER_URL = TEST_BROKER_URL
    settings.METRICS_TOKEN = ""
    user = get_user_model().objects.create_user(username="prometheus")
    token = token_for(user, ["read"])  # read-only: discovery only
    admin = get_user_model().objects.create_user(username="ci-admin", is_staff=True)
    admin_token = token_for(admin)
    token_file = tmp_path / "admin.token"
    token_file.write_text(token + "\n")  # as manage.py bootstrap_local writes it
    web_port = live_server.url.rsplit(":", 1)[1]

    # The shipped local config, rendered as scripts/stack.sh does, with 1 s intervals.
    config = local_prometheus_config(web_port, token_file)
    (serving_hosts,) = [job for job in config["scrape_configs"] if job["job_name"] == "serving-hosts"]
    (sd,) = serving_hosts["http_sd_configs"]
    assert sd["url"].endswith(f":{web_port}{SD_URL}")
    sd["url"] = live_server.url + SD_URL
    prometheus = start_prometheus_with_config(config)

    # The app's own /metrics is scraped by the same config.
    def app_scraped() -> bool:
        targets = prometheus_targets(prometheus.url)
        return any(t["labels"]["job"] == "modelyard" and t["health"] == "up" for t in targets)

    wait_for(app_scraped, timeout=30, what="Prometheus to scrape the app's /metrics")
    assert not [t for t in prometheus_targets(prometheus.url) if t["labels"]["job"] == "serving-hosts"]

    # Register a host through the API; nothing else changes.
    answer = requests.post(
        f"{live_server.url}/api/v1/hosts/",
        json={"name": "gpu-sd", "runtime": "triton", "inference_url": "http://127.0.0.1:1",
              "metrics_url": fixed_metrics_server, "labels": {"zone": "lab-1"}},
        headers={"Authorization": f"Bearer {admin_token}"},
        timeout=10,
    )
    assert answer.status_code == 201, answer.text

    def host_target() -> dict | None:
        for target in prometheus_targets(prometheus.url):
            labels = target["labels"]
            if labels.get("job") == "serving-hosts" and labels.get("host") == "gpu-sd" and "source" not in labels:
                return target
        return None

    wait_for(lambda: (host_target() or {}).get("health") == "up", timeout=30,
             what="Prometheus to discover and scrape the registered host")
    target = host_target()
    assert target["scrapeUrl"] == fixed_metrics_server
    # Its gateway is a target of its own, under the inference_url (nothing listens there in this test).
    assert [t["scrapeUrl"] for t in prometheus_targets(prometheus.url)
            if t["labels"].get("host") == "gpu-sd" and t["labels"].get("source") == "gateway"] == [
        "http://127.0.0.1:1/metrics"]
    assert target["labels"]["runtime"] == "triton" and target["labels"]["label_zone"] == "lab-1"

    # Triton's own model/version labels arrive unrenamed, next to the target's host label.
    def series() -> list[dict]:
        answer = requests.get(f"{prometheus.url}/api/v1/query", params={"query": 'nv_inference_count{host="gpu-sd"}'},
                              timeout=5)
        return answer.json()["data"]["result"]

    wait_for(lambda: bool(series()), timeout=30, what="the host's series in Prometheus")
    (sample,) = series()
    assert sample["metric"]["model"] == "iris" and sample["metric"]["version"] == "1"
    assert "exported_model" not in sample["metric"]

    # A host registered from the browser page is discovered the same way.
    get_user_model().objects.create_user(username="ops", password="a-long-test-password", is_staff=True)
    browser = requests.Session()
    login_page = browser.get(f"{live_server.url}/login/", timeout=10)
    csrf = login_page.cookies["csrftoken"]
    browser.post(f"{live_server.url}/login/", data={"username": "ops", "password": "a-long-test-password",
                                                    "csrfmiddlewaretoken": csrf}, timeout=10)
    form_page = browser.get(f"{live_server.url}/hosts/new/", timeout=10)
    assert form_page.status_code == 200
    created = browser.post(
        f"{live_server.url}/hosts/new/",
        data={"name": "gpu-ui", "runtime": "triton", "inference_url": "http://127.0.0.1:2",
              "metrics_url": fixed_metrics_server + "?from=page", "parameters": "",
              "csrfmiddlewaretoken": browser.cookies["csrftoken"]},
        timeout=10, allow_redirects=False,
    )
    assert created.status_code == 302, created.text[:500]

    def ui_host_up() -> bool:
        targets = prometheus_targets(prometheus.url)
        return any(t["labels"].get("host") == "gpu-ui" and t["health"] == "up" for t in targets)

    wait_for(ui_host_up, timeout=30, what="Prometheus to scrape the host registered from the page")
