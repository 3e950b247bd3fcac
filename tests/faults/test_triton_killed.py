"""Triton SIGKILLed while a new version loads: the host's target is marked failed, and once Triton is
back (same ports, same model repository, serving nothing) the reconciler loads the version the
host served before."""

import pytest

from deployments.models import DeploymentTarget
from deployments.reconcile import reconcile_fleet
from deployments.tasks import request_heartbeats
from tests.e2e.support import wait_deployment
from tests.faults.conftest import kill_triton, restart_triton
from tests.fixtures.services import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_a_triton_killed_mid_load_fails_the_host_and_its_old_version_is_back_once_triton_is(one_host_fleet):
    fleet = one_host_fleet
    rollout_id = fleet.deploy(2)
    target = DeploymentTarget.objects.get(deployment_id=rollout_id)

    def loading() -> bool:
        target.refresh_from_db()
        return target.state == "loading"

    wait_for(loading, timeout=120, what="the agent to start loading v2", interval=0.02)
    kill_triton(fleet.triton)
    rollout = wait_deployment(fleet.client, rollout_id)
    failed = next(t for t in rollout["targets"] if t["host"] == "gpu-1")
    assert rollout["status"] in ("paused", "failed"), rollout
    assert failed["state"] == "failed" and "Triton" in failed["error"], (failed, fleet.worker_logs())

    restart_triton(fleet.triton)
    assert fleet.ready_versions() == []  # explicit model control: a restarted Triton serves nothing
    reported_before = fleet.client.get("/api/v1/hosts/gpu-1/").json()["last_heartbeat_at"]
    request_heartbeats()
    wait_for(lambda: fleet.client.get("/api/v1/hosts/gpu-1/").json()["last_heartbeat_at"] != reported_before,
             timeout=60, what="the agent's heartbeat")
    repairs = reconcile_fleet()
    assert [(r.host, r.model, r.version) for r in repairs] == [("gpu-1", "iris", 1)], fleet.worker_logs()
    repaired = wait_deployment(fleet.client, repairs[0].deployment_id)
    assert repaired["status"] == "succeeded" and repaired["trigger"] == "reconciler", repaired
    assert fleet.ready_versions() == [1]
