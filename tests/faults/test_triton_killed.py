"""Triton SIGKILLed: the host reads "runtime not live"; a target loading there is marked failed; and
once Triton is back (same ports, same model repository, serving nothing) the first heartbeat that
shows it live reconciles the host, which loads the version it served before."""

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from deployments.models import Deployment, DeploymentTarget
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
    # That report reconciles the host: v1, which served before, is deployed again.
    wait_for(lambda: Deployment.objects.filter(trigger="reconciler").exists(), timeout=30,
             what="the heartbeat's repair")
    (repair,) = Deployment.objects.filter(trigger="reconciler")
    assert repair.version.version == 1, fleet.worker_logs()
    assert reconcile_fleet() == []  # a scheduled pass now finds the repair under way
    repaired = wait_deployment(fleet.client, repair.pk)
    assert repaired["status"] == "succeeded" and repaired["trigger"] == "reconciler", repaired
    assert fleet.ready_versions() == [1]


def test_a_triton_that_died_shows_runtime_not_live_and_its_version_is_back_at_the_first_report_after_restart(
        one_host_fleet):
    """The host page says "runtime not live" at the report after the crash; once Triton is back, that
    report alone (no scheduled reconcile pass) redeploys what served, so the outage after the restart
    is one heartbeat interval plus the load (bench/triton_restart.py measures it with the defaults)."""
    fleet = one_host_fleet
    page = Client()
    page.force_login(get_user_model().objects.get(username="ci"))

    def report_after(previous: str) -> dict:
        request_heartbeats()
        wait_for(lambda: fleet.client.get("/api/v1/hosts/gpu-1/").json()["last_heartbeat_at"] != previous,
                 timeout=60, what="the agent's heartbeat")
        return fleet.client.get("/api/v1/hosts/gpu-1/").json()

    kill_triton(fleet.triton)
    host = report_after(fleet.client.get("/api/v1/hosts/gpu-1/").json()["last_heartbeat_at"])
    assert host["heartbeat"]["runtime_live"] is False and host["online"] is False, host
    assert "runtime not live" in page.get("/hosts/gpu-1/").content.decode()

    restart_triton(fleet.triton)
    assert fleet.ready_versions() == []
    report_after(host["last_heartbeat_at"])
    wait_for(lambda: fleet.ready_versions() == [1], timeout=120, what="v1 to be loaded again",
             interval=0.2)
    repair = Deployment.objects.get(trigger="reconciler")
    assert repair.version.version == 1
    assert wait_deployment(fleet.client, repair.pk)["status"] == "succeeded", fleet.worker_logs()
    assert "runtime not live" not in page.get("/hosts/gpu-1/").content.decode()
