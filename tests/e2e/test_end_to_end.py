"""End to end on real components.

API upload -> S3 (stand-in server) -> orchestrator worker -> host agent worker
via Redis -> real Triton load -> tritonclient inference gives the model's real
prediction -> Prometheus scrapes the series -> the metrics API and the model
page show non-zero throughput. Then a rolling swap to v2 while a client keeps
sending requests, and a broken v3 that leaves v2 serving.
"""

import time

import numpy as np
import pytest
import requests
from django.contrib.auth import get_user_model
from django.test import override_settings
from rest_framework.test import APIClient

from demo.iris import SAMPLE_INPUT, build_iris_archive, expected_labels
from modelyard_agent.runtimes.triton import TritonRuntime
from tests.e2e.support import Traffic, upload, wait_deployment
from tests.factories import page_with_panels, token_for
from tests.fixtures.services import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

HOST = "e2e-host"


def _deploy(client: APIClient, version: int) -> dict:
    answer = client.post("/api/v1/deployments/", {"model": "iris", "version": version, "hosts": [HOST]},
                         format="json")
    assert answer.status_code == 201, answer.content
    return wait_deployment(client, answer.json()["id"])


def test_a_version_goes_from_upload_to_live_metrics_on_real_components(
    s3_endpoint, start_triton, start_prometheus, start_celery_worker, tmp_path
):
    triton = start_triton()
    metrics_target = triton.metrics_url.removeprefix("http://").removesuffix("/metrics")
    prometheus = start_prometheus([{"target": metrics_target, "labels": {"host": HOST}}])
    start_celery_worker("default", env={"MODELYARD_S3_ENDPOINT_URL": s3_endpoint})
    start_celery_worker(
        f"host.{HOST}", env={"MODELYARD_AGENT_MODEL_REPOSITORY": str(triton.model_repository)}
    )

    user = get_user_model().objects.create_user(username="ci", password="a-long-test-password", is_staff=True)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token_for(user)}")

    assert client.post("/api/v1/models/", {"name": "iris"}, format="json").status_code == 201
    assert upload(client, build_iris_archive(tmp_path / "v1.tar.gz")) == 1
    host = client.post("/api/v1/hosts/", {
        "name": HOST, "runtime": "triton", "inference_url": triton.http_url, "metrics_url": triton.metrics_url,
        "config_overrides": {"parameters": {"EXECUTION_ENV_PATH": str(triton.execution_env)}},
    }, format="json")
    assert host.status_code == 201, host.content

    deployed = _deploy(client, 1)
    assert deployed["status"] == "succeeded", deployed
    assert deployed["targets"][0]["state"] == "ready"

    runtime = TritonRuntime(triton.http_url)
    assert runtime.ready_versions("iris") == [1]
    answer = runtime.infer("iris", {"input": np.asarray(SAMPLE_INPUT, dtype=np.float32)}, ["label"])
    assert answer["label"].reshape(-1).tolist() == expected_labels()

    # v2 rolls out while a client keeps sending requests; none may fail.
    assert upload(client, build_iris_archive(tmp_path / "v2.tar.gz")) == 2
    with Traffic(triton.http_url) as traffic:
        deployed = _deploy(client, 2)
        time.sleep(1)
    assert deployed["status"] == "succeeded", deployed
    assert deployed["targets"][0]["details"]["previous_versions"] == [1]
    assert traffic.ok > 0 and traffic.failures == []
    assert runtime.ready_versions("iris") == [2]

    # A broken v3 fails with Triton's message and leaves v2 serving.
    assert upload(client, build_iris_archive(tmp_path / "v3.tar.gz", broken=True)) == 3
    with Traffic(triton.http_url) as traffic:
        deployed = _deploy(client, 3)
    assert deployed["status"] == "failed"
    assert "version 3" in deployed["targets"][0]["error"]
    assert traffic.failures == []
    assert runtime.ready_versions("iris") == [2]

    # The host agent reports in: Triton live, iris v2 READY in its repository index.
    from deployments.models import ServingHost
    from deployments.tasks import request_heartbeats

    request_heartbeats.delay()

    def reported() -> bool:
        host = ServingHost.objects.get(name=HOST)
        return host.is_online() and {"name": "iris", "version": 2, "state": "READY"} in host.heartbeat["models"]

    wait_for(reported, timeout=60, what="the host agent's heartbeat", interval=0.5)

    # Drift: the model disappears from Triton (as after a restart); the reconciler brings v2 back.
    from deployments.tasks import reconcile

    runtime.unload("iris")
    runtime.wait_versions_gone("iris", [2], timeout=60)
    request_heartbeats.delay()

    def drift_reported() -> bool:
        host = ServingHost.objects.get(name=HOST)
        return host.is_online() and not any(m["name"] == "iris" and m["state"] == "READY"
                                            for m in host.heartbeat["models"])

    wait_for(drift_reported, timeout=60, what="a heartbeat without iris", interval=0.5)
    reconcile.delay()
    wait_for(lambda: runtime.ready_versions("iris") == [2], timeout=120, what="the reconciler to restore iris v2",
             interval=0.5)

    # Prometheus has the series; the API and the page show non-zero throughput.
    with override_settings(PROMETHEUS_URL=prometheus.url):
        def throughput_seen() -> bool:
            for _ in range(20):
                runtime.infer("iris", {"input": np.asarray(SAMPLE_INPUT, dtype=np.float32)}, ["label"])
            query = requests.get(f"{prometheus.url}/api/v1/query",
                                 params={"query": 'sum(rate(nv_inference_count{model="iris"}[30s]))'}, timeout=5)
            result = query.json()["data"]["result"]
            return bool(result) and float(result[0]["value"][1]) > 0

        wait_for(throughput_seen, timeout=60, what="Prometheus to record iris throughput", interval=1)
        metrics = client.get("/api/v1/models/iris/metrics/?range=15m")
        assert metrics.status_code == 200, metrics.content
        rows = {row["version"]: row for row in metrics.json()["versions"]}
        assert rows[2]["throughput"] > 0
        assert rows[2]["latency_p95_ms"] > 0 and rows[2]["latency_mean_ms"] > 0
        assert rows[2]["error_rate"] == 0

        page_client = APIClient()
        page_client.force_login(user)
        html = page_with_panels(page_client, "/models/iris/")
        assert 'data-version="2"' in html
        assert "Metrics unavailable" not in html
        throughput_cell = html.split('data-version="2"')[1].split('throughput">')[1].split("<")[0]
        assert float(throughput_cell) > 0
