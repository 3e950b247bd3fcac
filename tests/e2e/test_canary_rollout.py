"""A canary end to end: API, orchestrator and a host agent over Redis, the agent's gateway (real nginx) in front
of a real Triton, and clients sending through the gateway while the canary starts, changes its percent, is
promoted, and while a second canary is rolled back. No request fails."""

import pytest
from django.test import override_settings
from rest_framework.test import APIClient

from deployments.models import ServingHost
from modelyard_agent.runtimes.triton import TritonRuntime
from tests.e2e.support import Heartbeats, Traffic, deploy_iris, gateway_stack, wait_deployment
from tests.fixtures.services import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

HOST = "canary-host"


@pytest.fixture
def stack(s3_endpoint, start_triton, start_celery_worker, tmp_path):
    """(API client, Triton, the gateway's URL): iris versions 1-3 registered, the host's agent running its
    gateway in front of Triton."""
    with gateway_stack(HOST, versions=3, s3_endpoint=s3_endpoint, start_triton=start_triton,
                       start_celery_worker=start_celery_worker, tmp_path=tmp_path) as stack:
        yield stack.client, stack.triton, stack.gateway_url


def deploy(client, version: int, **fields) -> dict:
    return deploy_iris(client, HOST, version, **fields)


def applied(client: APIClient, deployment: int) -> float | None:
    return client.get(f"/api/v1/deployments/{deployment}/").json()["canary"]["hosts"][0]["applied_percent"]


@override_settings(HEARTBEAT_INTERVAL=1.0)
def test_a_canary_changes_percent_is_promoted_and_a_second_one_rolled_back_without_a_failed_request(stack):
    client, triton, gateway_url = stack
    runtime = TritonRuntime(triton.http_url)
    with Heartbeats(interval=1.0):
        deploy(client, 1)
        wait_for(lambda: (ServingHost.objects.get(name=HOST).heartbeat.get("gateway") or {}).get("live"),
                 timeout=60, what="the agent's heartbeat to report its gateway live")
        with Traffic(gateway_url) as first, Traffic(gateway_url) as second:
            canary = deploy(client, 2, canary_percent=20)
            assert (canary["canary_state"], runtime.ready_versions("iris")) == ("active", [1, 2])
            wait_for(lambda: applied(client, canary["id"]) == 20.0, timeout=30, what="the gateway to report 20 %")

            answer = client.patch(f"/api/v1/deployments/{canary['id']}/", {"canary_percent": 60}, format="json")
            assert answer.status_code == 200, answer.content
            wait_for(lambda: applied(client, canary["id"]) == 60.0, timeout=30, what="the gateway to report 60 %")
            seen_during_canary = len(first.versions)

            promoted = client.post(f"/api/v1/deployments/{canary['id']}/promote/")
            assert promoted.status_code == 201, promoted.content
            assert wait_deployment(client, promoted.json()["id"])["status"] == "succeeded"
            assert runtime.ready_versions("iris") == [2]
            after_promotion = len(first.versions)

            second_canary = deploy(client, 3, canary_percent=30)
            assert runtime.ready_versions("iris") == [2, 3]
            rolled_back = client.post(f"/api/v1/deployments/{second_canary['id']}/rollback/")
            assert rolled_back.status_code == 200, rolled_back.content
            [rollback] = rolled_back.json()
            assert rollback["version"] == 2
            assert wait_deployment(client, rollback["id"])["status"] == "succeeded"
            assert runtime.ready_versions("iris") == [2]
            # Requests sent after the rollback finished: every one answered by version 2.
            mark = len(second.versions)
            wait_for(lambda: len(second.versions) > mark + 20, timeout=30, what="more requests after the rollback")

    assert first.failures == [] and second.failures == [], (first.failures[:5], second.failures[:5])
    assert {"1", "2"} <= set(first.versions[:seen_during_canary])
    assert "1" not in first.versions[after_promotion:]
    assert set(second.versions[mark:]) == {"2"}
    assert client.get(f"/api/v1/deployments/{canary['id']}/").json()["canary_state"] == "promoted"
    assert client.get(f"/api/v1/deployments/{second_canary['id']}/").json()["canary_state"] == "rolled_back"
