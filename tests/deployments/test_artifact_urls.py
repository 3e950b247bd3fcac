"""The download URLs sent to host agents name the S3 endpoint hosts reach (``MODELYARD_S3_HOST_ENDPOINT_URL``),
signed for it, while the control plane keeps its own (``MODELYARD_S3_ENDPOINT_URL``)."""

import base64
import json

import pytest
import requests

from deployments.models import Deployment, DeploymentTarget, ServingHost
from deployments.tasks import dispatch_target
from modelyard_agent.contract import AgentTask, host_queue
from registry.choices import ArtifactFormat
from registry.models import ModelVersion, RegisteredModel
from registry.storage import ArtifactStore

pytestmark = pytest.mark.django_db

BYTES = b"model bytes\n"


@pytest.fixture
def target(s3_endpoint, broker) -> DeploymentTarget:
    """A pending target whose version's artifact is in the bucket."""
    key = "artifacts/test/urls"
    ArtifactStore().client.put_object(Bucket=ArtifactStore().bucket, Key=key, Body=BYTES)
    model = RegisteredModel.objects.create(name="iris", next_version=2)
    version = ModelVersion.objects.create(model=model, version=1, format=ArtifactFormat.TRITON_MODEL_DIR,
                                          artifact_key=key, artifact_sha256="ab" * 32, artifact_size=len(BYTES))
    host = ServingHost.objects.create(name="gpu-0", inference_url="http://gpu-0:8000")
    return DeploymentTarget.objects.create(deployment=Deployment.objects.create(model=model, version=version),
                                           host=host)


def sent_artifact_url(broker, host: str) -> str:
    """The ``artifact_url`` of the DEPLOY payload queued for ``host`` (kombu keeps each message as JSON)."""
    (url,) = [json.loads(base64.b64decode(message["body"]))[0][0]["artifact_url"]
              for message in map(json.loads, broker.lrange(host_queue(host), 0, -1))
              if message["headers"]["task"] == AgentTask.DEPLOY.value]
    return url


def test_without_a_host_endpoint_hosts_get_the_control_planes(target, broker, s3_endpoint, settings):
    settings.S3_HOST_ENDPOINT_URL = ""
    dispatch_target(target.pk)
    url = sent_artifact_url(broker, "gpu-0")
    assert url.startswith(f"{s3_endpoint}/") and requests.get(url, timeout=10).content == BYTES


def test_hosts_get_urls_signed_for_their_own_endpoint(target, broker, s3_endpoint, settings):
    # The same S3 under another name, so the URL can be fetched here.
    host_endpoint = s3_endpoint.replace("127.0.0.1", "localhost")
    settings.S3_HOST_ENDPOINT_URL = host_endpoint
    dispatch_target(target.pk)
    url = sent_artifact_url(broker, "gpu-0")
    assert url.startswith(f"{host_endpoint}/")
    assert requests.get(url, timeout=10).content == BYTES
