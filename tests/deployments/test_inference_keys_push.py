"""The control plane sends a host's front the inference keys it checks: an API call that creates or revokes a key, or
switches a model's requirement, queues ``AgentTask.KEYS`` on the real broker for each host of the model, and the
agent's task applies it to a real gateway in front of a real Triton."""

import base64
import json
import shutil
import tempfile
import time
from pathlib import Path

import pytest
import requests

from accounts.services import default_team
from deployments.footprints import deploy_payload
from deployments.models import DeploymentTarget, ServingHost
from deployments.services import start_deployment
from modelyard_agent.contract import AgentTask, host_queue
from modelyard_agent.runtimes.triton import TritonRuntime
from registry.choices import ArtifactFormat
from registry.models import ModelVersion, RegisteredModel
from tests.deployments.test_gateway import BODY
from tests.deployments.test_triton_runtime import MODEL, load_config, put_iris

pytestmark = [pytest.mark.django_db(transaction=False), pytest.mark.integration]


def queued_keys(broker, host: str) -> list[dict]:
    """The ``KeysPayload``s waiting on ``host``'s queue, oldest first, taken off it."""
    payloads = []
    while (raw := broker.rpop(host_queue(host))) is not None:
        message = json.loads(raw)
        if message["headers"]["task"] == AgentTask.KEYS:
            payloads.append(json.loads(base64.b64decode(message["body"]))[0][0])
    return payloads


@pytest.fixture
def served(user, broker, triton_server, tmp_path, agent_settings, django_capture_on_commit_callbacks):
    """iris v1 deployed (a target) on host gpu-0, whose agent runs a real gateway before a real Triton."""
    from modelyard_agent.adapters.triton import triton_gateway
    from tests.fixtures.services import free_port

    # A short home: the gateway's control socket path must stay under a Unix socket's 107 bytes, which this
    # test's own tmp_path under scripts/test.sh's base passes.
    home = Path(tempfile.mkdtemp(prefix="modelyard-keys-"))
    home.chmod(0o711)
    agent_settings(model_repository=triton_server.model_repository, staging_dir=home / "staging",
                   triton_url=triton_server.http_url)
    put_iris(triton_server.model_repository, tmp_path, versions=[1])
    TritonRuntime(triton_server.http_url, load_timeout=120).load(MODEL, load_config(triton_server, [1]))
    url = f"http://127.0.0.1:{free_port()}"
    ServingHost.objects.create(name="gpu-0", inference_url=url)
    model = RegisteredModel.objects.create(name=MODEL, team=default_team())
    ModelVersion.objects.create(model=model, version=1, format=ArtifactFormat.ONNX, artifact_key="k/iris",
                                artifact_sha256="0" * 64, artifact_size=1)
    with django_capture_on_commit_callbacks(execute=False):
        start_deployment(model_name=MODEL, version=1, host_names=["gpu-0"], actor=user)
    gateway = triton_gateway(url)
    gateway.ensure_running()
    gateway.url = url
    yield gateway
    gateway.stop()
    shutil.rmtree(home, ignore_errors=True)


def deliver(broker) -> None:
    """Run the agent's task on each keys payload queued for gpu-0, as its worker would."""
    from modelyard_agent.worker import set_inference_keys_on_host

    for payload in queued_keys(broker, "gpu-0"):
        set_inference_keys_on_host.run(payload)


def infer(gateway, key: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return requests.post(f"{gateway.url}/v2/models/{MODEL}/infer", json=BODY, headers=headers, timeout=30).status_code


def test_requiring_a_key_creating_and_revoking_one_reach_the_gateway_in_one_push_each(
        served, api_client, broker, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        assert api_client.patch(f"/api/v1/models/{MODEL}/", {"inference_key_required": True},
                                format="json").status_code == 200
    [payload] = queued_keys(broker, "gpu-0")
    assert payload["keys"] == {MODEL: []} and payload["protocol"] >= 6
    # A deployment of the model carries its keys, so a host it reaches later checks them before it serves.
    target = DeploymentTarget.objects.get()
    assert deploy_payload(target, download_url="http://s3/iris")["inference_keys"] == []
    from modelyard_agent.worker import set_inference_keys_on_host

    set_inference_keys_on_host.run(payload)
    assert infer(served) == 401

    with django_capture_on_commit_callbacks(execute=True):
        created = api_client.post("/api/v1/inference-keys/", {"name": "shop", "models": [MODEL]}, format="json")
    key = created.json()["key"]
    deliver(broker)
    assert infer(served, key) == 200

    started = time.monotonic()
    with django_capture_on_commit_callbacks(execute=True):
        assert api_client.post(f"/api/v1/inference-keys/{created.json()['id']}/revoke/").status_code == 200
    deliver(broker)
    assert infer(served, key) == 403
    seconds = time.monotonic() - started
    print(f"revoke API call to first 403, agent task run in process: {seconds:.3f} s")
    assert seconds < 5
    assert key not in served.keys_file.read_text()

    with django_capture_on_commit_callbacks(execute=True):
        api_client.patch(f"/api/v1/models/{MODEL}/", {"inference_key_required": False}, format="json")
    deliver(broker)
    assert infer(served) == 200 and served.inference_keys() == {}
