"""Request body limits end to end: a deployment through the API, the orchestrator and the host's agent over
Redis, which sets its model's limit on the gateway (real nginx) in front of a real Triton: derived from the
version's signature by default, the deployment's own when it gives one."""

import json

import pytest
import requests

from demo.iris import MAX_BATCH_SIZE
from modelyard_agent.formats.request_limits import BYTES_PER_INPUT, ENVELOPE_BYTES, JSON_BYTES_PER_ELEMENT
from tests.deployments.test_gateway import BODY
from tests.e2e.support import gateway_stack, wait_deployment

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

HOST = "limits-host"
DERIVED = MAX_BATCH_SIZE * 4 * JSON_BYTES_PER_ELEMENT + ENVELOPE_BYTES + BYTES_PER_INPUT


def _padded(size: int) -> bytes:
    """A valid iris infer request of exactly ``size`` bytes (JSON allows spaces between tokens)."""
    body = json.dumps(BODY).encode()
    return body[:-1] + b" " * (size - len(body)) + b"}"


def test_a_deployment_sets_its_models_limit_on_the_gateway(s3_endpoint, start_triton, start_celery_worker, tmp_path):
    with gateway_stack(HOST, versions=2, s3_endpoint=s3_endpoint, start_triton=start_triton,
                       start_celery_worker=start_celery_worker, tmp_path=tmp_path) as stack:
        client, url = stack.client, f"{stack.gateway_url}/v2/models/iris/infer"
        made = client.post("/api/v1/deployments/", {"model": "iris", "version": 1, "hosts": [HOST],
                                                     "max_request_bytes": 4096}, format="json")
        assert made.status_code == 201 and made.json()["max_request_bytes"] == 4096, made.content
        done = wait_deployment(client, made.json()["id"])
        assert done["status"] == "succeeded", done
        assert done["targets"][0]["details"]["request_limit"] == {"bytes": 4096, "basis": "deployment"}
        assert requests.post(url, data=_padded(4096), timeout=30).status_code == 200
        refused = requests.post(url, data=_padded(4097), timeout=30)
        assert refused.status_code == 413 and refused.json()["limit_bytes"] == 4096

        # The next version without a limit of its own takes its signature's bound.
        made = client.post("/api/v1/deployments/", {"model": "iris", "version": 2, "hosts": [HOST]}, format="json")
        done = wait_deployment(client, made.json()["id"])
        assert done["status"] == "succeeded", done
        assert done["targets"][0]["details"]["request_limit"] == {"bytes": DERIVED, "basis": "signature"}
        answered = requests.post(url, data=_padded(DERIVED), timeout=30)
        assert answered.status_code == 200 and answered.json()["model_version"] == "2"
        assert requests.post(url, data=_padded(DERIVED + 1), timeout=30).status_code == 413


@pytest.mark.parametrize("value", [1023, 1 << 33, "4MiB", True])
def test_a_bad_limit_is_refused_with_400_and_writes_nothing(api_client, value):
    from deployments.models import Deployment

    answer = api_client.post("/api/v1/deployments/", {"model": "iris", "version": 1, "hosts": ["h"],
                                                      "max_request_bytes": value}, format="json")
    assert answer.status_code == 400 and "max_request_bytes" in answer.content.decode(), answer.content
    assert not Deployment.objects.exists()
