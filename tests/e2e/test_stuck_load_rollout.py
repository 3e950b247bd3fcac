"""A rollout whose load never finishes in time takes neither the host nor its other models down.

Real components: API, S3 stand-in, orchestrator and host-agent workers over Redis, real Triton. The
host's load deadline is 10 s and version 2 of ``iris`` takes 18 s to load. Meanwhile the host keeps
reporting in (online for every team), another model's rollout on the same host finishes, clients of
version 1 are all answered, and the failed target carries Triton's own state for version 2.
"""

import time

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from demo.iris import build_iris_archive
from deployments.models import DeploymentTarget, ServingHost
from modelyard_agent.runtimes.triton import TritonRuntime
from tests.e2e.support import Traffic, build_slow_iris_archive, wait_deployment
from tests.factories import token_for
from tests.fixtures.services import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

HOST = "stuck-host"
DEADLINE = 10
SLOW_LOAD = 18  # seconds: well past the deadline, so the load is abandoned while it runs


def upload(client: APIClient, model: str, archive) -> int:
    with open(archive, "rb") as handle:
        answer = client.post(f"/api/v1/models/{model}/versions/", {"artifact": handle}, format="multipart")
    assert answer.status_code == 201, answer.content
    return answer.json()["version"]


def start(client: APIClient, model: str, version: int) -> int:
    answer = client.post("/api/v1/deployments/", {"model": model, "version": version, "hosts": [HOST]},
                         format="json")
    assert answer.status_code == 201, answer.content
    return answer.json()["id"]


def test_a_stuck_load_keeps_the_host_online_and_delays_no_other_model(
    s3_endpoint, start_triton, start_celery_worker, tmp_path
):
    triton = start_triton()
    start_celery_worker("default", env={"MODELYARD_S3_ENDPOINT_URL": s3_endpoint})
    start_celery_worker(f"host.{HOST}", concurrency=2, env={
        "MODELYARD_AGENT_MODEL_REPOSITORY": str(triton.model_repository),
        "MODELYARD_AGENT_TRITON_GRPC_URL": triton.grpc_url, "MODELYARD_HEARTBEAT_INTERVAL": "1",
    })
    user = get_user_model().objects.create_user(username="ci", password="a-long-test-password", is_staff=True)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token_for(user)}")
    for name in ("iris", "other"):
        assert client.post("/api/v1/models/", {"name": name}, format="json").status_code == 201
    assert upload(client, "iris", build_iris_archive(tmp_path / "iris-1.tar.gz")) == 1
    assert upload(client, "iris", build_slow_iris_archive(tmp_path / "iris-2.tar.gz", seconds=SLOW_LOAD)) == 2
    assert upload(client, "other", build_iris_archive(tmp_path / "other-1.tar.gz", name="other")) == 1
    host = client.post("/api/v1/hosts/", {
        "name": HOST, "inference_url": triton.http_url, "metrics_url": triton.metrics_url,
        "load_deadline": DEADLINE,
        "config_overrides": {"parameters": {"EXECUTION_ENV_PATH": str(triton.execution_env)}},
    }, format="json")
    assert host.status_code == 201, host.content
    assert host.json()["load_deadline"] == DEADLINE
    assert wait_deployment(client, start(client, "iris", 1))["status"] == "succeeded"

    with Traffic(triton.http_url) as traffic:
        stuck = start(client, "iris", 2)
        wait_for(lambda: DeploymentTarget.objects.get(deployment_id=stuck).state == "loading", timeout=60,
                 what="iris version 2 to start loading")
        loading_since = time.time()

        other = start(client, "other", 1)
        assert wait_deployment(client, other)["status"] == "succeeded"

        # The agent keeps reporting while the load goes on: the host stays online for every team.
        wait_for(lambda: (ServingHost.objects.get(name=HOST).last_heartbeat_at.timestamp() > loading_since + 1
                          and DeploymentTarget.objects.get(deployment_id=stuck).state == "loading"),
                 timeout=DEADLINE, what="a heartbeat while iris version 2 is loading")
        assert client.get(f"/api/v1/hosts/{HOST}/").json()["online"] is True

        failed = wait_deployment(client, stuck)
        runtime = TritonRuntime(triton.http_url)
        assert runtime.ready_versions("iris") == [1]
        wait_for(lambda: 2 not in runtime.ready_versions("iris") and all(
            e.state not in ("LOADING", "UNLOADING") for e in runtime.repository_index() if e.name == "iris"),
            timeout=SLOW_LOAD + 60, what="Triton to carry out the unload of the abandoned version")
        settled = len(traffic.versions)
        time.sleep(1)

    (target,) = failed["targets"]
    assert failed["status"] in ("paused", "failed") and target["state"] == "failed"
    assert (f"did not finish loading iris version 2 within the host's load deadline of {DEADLINE} s and reports it "
            "LOADING") in target["error"]
    assert "version 1 keeps serving" in target["error"]
    other_ready = DeploymentTarget.objects.get(deployment_id=other).updated_at
    assert other_ready < DeploymentTarget.objects.get(deployment_id=stuck).updated_at  # not queued behind it
    assert runtime.ready_versions("iris") == [1] and runtime.ready_versions("other") == [1]
    assert traffic.ok > 0 and traffic.failures == []
    # Once Triton has carried out the unload, version 1 alone answers. (Between the end of the slow
    # load and that unload, Triton reloads version 1 under the restored config and version 2 is
    # READY meanwhile, so it may answer a few requests: Triton cannot unload one version alone.)
    assert set(traffic.versions[settled:]) == {"1"}
