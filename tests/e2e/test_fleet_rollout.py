"""Rollouts across two real Triton hosts, on real workers, S3 and Redis.

While a client keeps sending each host requests that name no version, a rollout from v1 to v2 in
batches of one fails none of them and afterwards every answer comes from v2; a v3 whose load fails
leaves v2 serving with no failed request. A host agent SIGKILLed in the middle of a rollout leaves
its host serving, and once an agent is back the rollout finishes (its first heartbeat makes the
orchestrator send the dropped target again).
"""

import signal
from dataclasses import dataclass

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from demo.iris import build_iris_archive
from deployments.models import DeploymentTarget
from modelyard_agent.runtimes.triton import TritonRuntime
from tests.e2e.support import Heartbeats, Traffic, upload, wait_deployment
from tests.factories import token_for
from tests.fixtures.services import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

HOSTS = ("fleet-a", "fleet-b")
# A redelivered message must come back soon in these tests, yet never while its first delivery
# still runs (a load here takes a few seconds).
VISIBILITY_TIMEOUT_S = 20


@dataclass
class Fleet:
    client: APIClient
    tritons: dict
    agents: dict
    start_agent: object

    def deploy(self, version: int, **options) -> dict:
        answer = self.client.post("/api/v1/deployments/", {"model": "iris", "version": version,
                                                           "hosts": list(HOSTS), **options}, format="json")
        assert answer.status_code == 201, answer.content
        return answer.json()

    def ready_versions(self) -> dict[str, list[int]]:
        return {name: TritonRuntime(t.http_url).ready_versions("iris") for name, t in self.tritons.items()}


@pytest.fixture
def fleet(s3_endpoint, start_triton, start_celery_worker, tmp_path) -> Fleet:
    env = {"MODELYARD_S3_ENDPOINT_URL": s3_endpoint, "MODELYARD_BROKER_VISIBILITY_TIMEOUT": str(VISIBILITY_TIMEOUT_S)}
    tritons = {name: start_triton() for name in HOSTS}
    start_celery_worker("default", env=env)

    def start_agent(name: str):
        return start_celery_worker(f"host.{name}", env={
            **env, "MODELYARD_AGENT_MODEL_REPOSITORY": str(tritons[name].model_repository)})

    agents = {name: start_agent(name) for name in HOSTS}
    user = get_user_model().objects.create_user(username="ci", is_staff=True)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token_for(user)}")
    assert client.post("/api/v1/models/", {"name": "iris"}, format="json").status_code == 201
    for name, triton in tritons.items():
        answer = client.post("/api/v1/hosts/", {
            "name": name, "runtime": "triton", "inference_url": triton.http_url,
            "config_overrides": {"parameters": {"EXECUTION_ENV_PATH": str(triton.execution_env)}},
        }, format="json")
        assert answer.status_code == 201, answer.content
    for number, broken in ((1, False), (2, False), (3, True)):
        assert upload(client, build_iris_archive(tmp_path / f"v{number}.tar.gz", broken=broken)) == number
    fleet = Fleet(client, tritons, agents, start_agent)
    first = wait_deployment(client, fleet.deploy(1, batch_size=2)["id"])
    assert first["status"] == "succeeded", first
    return fleet


def test_a_rollout_across_two_hosts_drops_no_request_and_a_broken_version_leaves_v2_serving(fleet):
    with Traffic(fleet.tritons["fleet-a"].http_url) as a, Traffic(fleet.tritons["fleet-b"].http_url) as b:
        rollout = wait_deployment(fleet.client, fleet.deploy(2, batch_size=1)["id"])
        wait_for(lambda: a.versions[-1:] == ["2"] and b.versions[-1:] == ["2"], timeout=10, what="answers from v2")
        seen_after = (len(a.versions), len(b.versions))
        wait_for(lambda: len(a.versions) > seen_after[0] + 20 and len(b.versions) > seen_after[1] + 20,
                 timeout=30, what="more answers")
    assert rollout["status"] == "succeeded", rollout
    assert sorted(t["batch"] for t in rollout["targets"]) == [0, 1]
    assert a.failures == [] and b.failures == []
    for traffic in (a, b):
        first_v2 = traffic.versions.index("2")
        assert set(traffic.versions[first_v2:]) == {"2"}  # once moved, a host never answers from v1 again
    assert fleet.ready_versions() == {"fleet-a": [2], "fleet-b": [2]}

    with Traffic(fleet.tritons["fleet-a"].http_url) as a, Traffic(fleet.tritons["fleet-b"].http_url) as b:
        broken = wait_deployment(fleet.client, fleet.deploy(3, batch_size=1, failure_policy="rollback")["id"])
    assert broken["status"] == "rolled_back", broken
    states = {t["host"]: t["state"] for t in broken["targets"]}
    assert states == {"fleet-a": "failed", "fleet-b": "cancelled"}  # the first batch failed; b was never touched
    assert a.failures == [] and b.failures == [] and set(a.versions) == {"2"} and set(b.versions) == {"2"}
    assert fleet.ready_versions() == {"fleet-a": [2], "fleet-b": [2]}


def test_a_rollout_survives_a_host_agent_killed_mid_load(fleet, settings):
    """The restarted agent's heartbeat names its start; the orchestrator sends again what it dropped."""
    settings.HEARTBEAT_INTERVAL = 1
    with Heartbeats(1), Traffic(fleet.tritons["fleet-a"].http_url) as a:
        started = fleet.deploy(2, batch_size=1)
        target = DeploymentTarget.objects.get(deployment_id=started["id"], host__name="fleet-a")

        def in_flight() -> bool:
            target.refresh_from_db()
            return target.state in ("staging", "loading", "verifying")

        wait_for(in_flight, timeout=60, what="the agent to start on fleet-a", interval=0.05)
        fleet.agents["fleet-a"].stop(sig=signal.SIGKILL)  # the whole worker, as a crashed machine would
        wait_for(lambda: len(a.versions) > 10, timeout=30, what="answers while no agent runs")
        fleet.start_agent("fleet-a")
        rollout = wait_deployment(fleet.client, started["id"], timeout=240)
    assert rollout["status"] == "succeeded", rollout
    assert a.failures == []
    assert fleet.ready_versions() == {"fleet-a": [2], "fleet-b": [2]}
