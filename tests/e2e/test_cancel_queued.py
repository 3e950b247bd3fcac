"""Cancel means cancelled: a target still queued on its host when its rollout is cancelled never starts, and a
rollout whose host is loading is not cancelled at all (409), since the load would go on.

Real components: API, S3 stand-in, orchestrator and a one-process host agent over Redis, real Triton.
A slow load of another model keeps the agent busy, so the cancelled rollout's task waits in the
host's queue; when the agent reaches it, it reports the target cancelled and loads nothing.
"""

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from demo.iris import build_iris_archive
from deployments.models import DeploymentTarget
from deployments.rollouts import cancel_rollout
from modelyard.celery import broker
from modelyard.errors import Conflict
from modelyard_agent.claims import STARTED, claim_key, claim_target
from modelyard_agent.runtimes.triton import TritonRuntime
from tests.e2e.support import build_slow_iris_archive, wait_deployment
from tests.e2e.test_stuck_load_rollout import start, upload
from tests.factories import token_for
from tests.fixtures.services import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

HOST = "stuck-host"  # the name the helpers above deploy to


def test_a_rollout_cancelled_while_its_task_is_queued_never_loads(s3_endpoint, start_triton, start_celery_worker,
                                                                   tmp_path):
    triton = start_triton()
    start_celery_worker("default", env={"MODELYARD_S3_ENDPOINT_URL": s3_endpoint})
    agent = start_celery_worker(f"host.{HOST}", concurrency=1, env={
        "MODELYARD_AGENT_MODEL_REPOSITORY": str(triton.model_repository),
        "MODELYARD_AGENT_TRITON_GRPC_URL": triton.grpc_url,
    })
    user = get_user_model().objects.create_user(username="ci", password="a-long-test-password", is_staff=True)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token_for(user)}")
    for name in ("iris", "other"):
        assert client.post("/api/v1/models/", {"name": name}, format="json").status_code == 201
    assert upload(client, "iris", build_slow_iris_archive(tmp_path / "iris-1.tar.gz", seconds=10)) == 1
    assert upload(client, "other", build_iris_archive(tmp_path / "other-1.tar.gz", name="other")) == 1
    assert client.post("/api/v1/hosts/", {
        "name": HOST, "inference_url": triton.http_url,
        "config_overrides": {"parameters": {"EXECUTION_ENV_PATH": str(triton.execution_env)}},
    }, format="json").status_code == 201

    slow = start(client, "iris", 1)
    wait_for(lambda: DeploymentTarget.objects.get(deployment_id=slow).state == "loading", timeout=60,
             what="the slow load to start")
    queued = start(client, "other", 1)
    wait_for(lambda: DeploymentTarget.objects.get(deployment_id=queued).dispatched_at is not None, timeout=30,
             what="the second rollout's task to be dispatched to the busy host")
    assert DeploymentTarget.objects.get(deployment_id=queued).state == "pending"

    # The loading one cannot be cancelled: 409, and it carries on.
    refused = client.post(f"/api/v1/deployments/{slow}/cancel/")
    assert refused.status_code == 409, refused.content
    assert f"host {HOST} is already loading iris v1, which a cancel cannot stop" in refused.json()["detail"]
    assert client.get(f"/api/v1/deployments/{slow}/").json()["status"] == "running"

    answer = client.post(f"/api/v1/deployments/{queued}/cancel/")
    assert answer.status_code == 200, answer.content
    assert answer.json()["status"] == "cancelled"
    assert answer.json()["targets"][0]["state"] == "cancelled"

    assert wait_deployment(client, slow)["status"] == "succeeded"
    def what_the_agent_did() -> str:
        events = DeploymentTarget.objects.get(deployment_id=queued).events.values_list("to_state", "message")
        return f"target events: {list(events)}\nagent log:\n{agent.log_text()[-6000:]}"

    wait_for(lambda: "was cancelled while queued; not starting it" in agent.log_text(), timeout=60,
             what="the agent to reach the cancelled task", describe=what_the_agent_did)
    runtime = TritonRuntime(triton.http_url)
    assert runtime.ready_versions("other") == []
    assert not (triton.model_repository / "other").exists()
    target = DeploymentTarget.objects.get(deployment_id=queued)
    assert target.state == "cancelled"
    assert "still queued" in target.events.get(to_state="cancelled").message


def test_a_cancel_after_the_agent_claimed_its_target_is_refused(db):
    from django.utils import timezone

    from deployments.models import Deployment, ServingHost
    from registry.choices import ArtifactFormat
    from registry.models import ModelVersion, RegisteredModel

    model = RegisteredModel.objects.create(name="iris")
    version = ModelVersion.objects.create(model=model, version=1, format=ArtifactFormat.TRITON_MODEL_DIR,
                                          artifact_key="k", artifact_sha256="0" * 64, artifact_size=1)
    host = ServingHost.objects.create(name="gpu-0", inference_url="http://gpu-0:8000")
    deployment = Deployment.objects.create(model=model, version=version)
    target = DeploymentTarget.objects.create(deployment=deployment, host=host, dispatched_at=timezone.now())
    # the agent got there first: the cancel is refused, and nothing changes
    assert claim_target(broker(), claim_key(target.pk, target.dispatched_at), STARTED) == STARTED
    with pytest.raises(Conflict, match="host gpu-0 is already starting iris v1, which a cancel cannot stop"):
        cancel_rollout(deployment.pk)
    target.refresh_from_db()
    deployment.refresh_from_db()
    assert deployment.status == "running" and target.state == "pending"
