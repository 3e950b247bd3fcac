"""Request capture and a replay end to end: the API turns capture on, the orchestrator sends the settings to
the host's agent, its gateway (real nginx in front of a real Triton) captures client traffic, the heartbeat
reports it, and a replay started through the API sends the captured requests to a candidate on that host.
Turning capture off deletes what was captured."""

import time

import numpy as np
import pytest
import requests
from django.test import override_settings
from rest_framework.test import APIClient

from demo.iris import SAMPLE_INPUT
from deployments.models import ServingHost
from tests.e2e.support import Heartbeats, gateway_stack, wait_deployment
from tests.fixtures.services import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

HOST = "capture-host"
REQUESTS = 60


@pytest.fixture
def stack(s3_endpoint, start_triton, start_celery_worker, tmp_path):
    """(API client, the gateway's URL, the agent's staging directory): iris versions 1 and 2 registered and the
    host's agent running its gateway in front of a real Triton."""
    with gateway_stack(HOST, versions=2, s3_endpoint=s3_endpoint, start_triton=start_triton,
                       start_celery_worker=start_celery_worker, tmp_path=tmp_path) as stack:
        yield stack.client, stack.gateway_url, stack.staging


def host_capture(client: APIClient) -> dict:
    answer = client.get("/api/v1/models/iris/capture/")
    assert answer.status_code == 200, answer.content
    [host] = answer.json()["hosts"]
    return host


@override_settings(HEARTBEAT_INTERVAL=1.0)
def test_captured_client_traffic_is_replayed_against_a_candidate_and_deleted_when_capture_is_turned_off(stack):
    client, gateway_url, staging = stack
    batch = np.asarray(SAMPLE_INPUT, dtype=np.float32)
    body = {"inputs": [{"name": "input", "shape": list(batch.shape), "datatype": "FP32",
                        "data": batch.reshape(-1).tolist()}]}
    with Heartbeats(interval=1.0):
        deploy = client.post("/api/v1/deployments/", {"model": "iris", "version": 1, "hosts": [HOST]}, format="json")
        assert deploy.status_code == 201, deploy.content
        assert wait_deployment(client, deploy.json()["id"])["status"] == "succeeded"
        wait_for(lambda: (ServingHost.objects.get(name=HOST).heartbeat.get("gateway") or {}).get("live"),
                 timeout=60, what="the agent's heartbeat to report its gateway live")

        turned_on = client.patch("/api/v1/models/iris/capture/", {"fraction": 1.0, "retention_seconds": 3600},
                                 format="json")
        assert turned_on.status_code == 200, turned_on.content
        assert turned_on.json()["warnings"] == []
        wait_for(lambda: host_capture(client)["applied"], timeout=60, what="the gateway to hold the settings")

        with requests.Session() as session:
            for _ in range(REQUESTS):
                answer = session.post(f"{gateway_url}/v2/models/iris/infer", json=body, timeout=30)
                assert answer.status_code == 200, answer.text
        wait_for(lambda: host_capture(client)["requests"] == REQUESTS, timeout=60,
                 what=f"the heartbeat to report {REQUESTS} captured requests")
        reported = host_capture(client)
        assert reported["bytes"] > 0 and reported["skipped"] == 0 and reported["problem"] is None

        started = client.post("/api/v1/models/iris/versions/2/replays/", {"against": "1", "pace": 200},
                              format="json")
        assert started.status_code == 202, started.content
        replay_url = f"/api/v1/replays/{started.json()['id']}/"
        deadline = time.monotonic() + 240
        while (replay := client.get(replay_url).json())["status"] in ("queued", "running"):
            assert time.monotonic() < deadline, replay
            time.sleep(0.5)
        assert replay["status"] == "succeeded", replay["message"]
        # v2 is the same model as v1: every captured request agrees.
        assert replay["compared"] == REQUESTS and replay["agreement_rate"] == 1.0 and replay["worst"] == []
        assert replay["host"] == HOST and replay["latency_ms"]["candidate"]["count"] == REQUESTS

        turned_off = client.patch("/api/v1/models/iris/capture/", {"fraction": 0}, format="json")
        assert turned_off.status_code == 200, turned_off.content
        wait_for(lambda: not (staging / "gateway" / "capture" / "iris").exists(), timeout=60,
                 what="the host to delete iris's capture")
        wait_for(lambda: host_capture(client)["requests"] in (0, None), timeout=60,
                 what="the heartbeat to report no capture")
