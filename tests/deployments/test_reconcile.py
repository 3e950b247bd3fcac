"""The reconciler: redeploy what a host lost, leave alone what is fine, fail what nobody works on."""

from datetime import timedelta

import pytest
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from audit.models import AuditEvent
from deployments.choices import TargetState
from deployments.models import Deployment, DeploymentTarget, ServingHost
from deployments.reconcile import fail_stalled_targets, reconcile_host
from registry.choices import ArtifactFormat
from registry.models import ModelVersion, RegisteredModel

pytestmark = pytest.mark.django_db


@pytest.fixture
def host(db) -> ServingHost:
    return ServingHost.objects.create(name="gpu-0", inference_url="http://gpu-0:8000")


def deploy(host, version: int, state=TargetState.READY, age_seconds: float = 600) -> DeploymentTarget:
    model, _ = RegisteredModel.objects.get_or_create(name="iris")
    mv, _ = ModelVersion.objects.get_or_create(
        model=model, version=version,
        defaults={"format": ArtifactFormat.TRITON_MODEL_DIR, "artifact_key": "k", "artifact_sha256": "0" * 64,
                  "artifact_size": 1},
    )
    deployment = Deployment.objects.create(model=model, version=mv)
    target = DeploymentTarget.objects.create(deployment=deployment, host=host, state=state)
    then = timezone.now() - timedelta(seconds=age_seconds)
    DeploymentTarget.objects.filter(pk=target.pk).update(updated_at=then, dispatched_at=then)
    Deployment.objects.filter(pk=deployment.pk).update(created_at=then)
    target.refresh_from_db()
    return target


def report(host, models, live=True, age_seconds: float = 1):
    host.heartbeat = {"runtime_live": live, "models": models}
    host.last_heartbeat_at = timezone.now() - timedelta(seconds=age_seconds)
    host.save()


def test_it_redeploys_the_version_a_restarted_triton_lost(host, django_capture_on_commit_callbacks):
    deploy(host, 1, age_seconds=900)
    deploy(host, 2, age_seconds=600)
    report(host, [])  # Triton came back with an empty repository
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        (repair,) = reconcile_host(host)
    assert (repair.model, repair.version) == ("iris", 2)
    new = Deployment.objects.get(pk=repair.deployment_id)
    assert new.version.version == 2 and new.targets.get().state == TargetState.PENDING
    assert len(callbacks) == 1
    assert AuditEvent.objects.filter(action="deployment.created", actor_label="system").exists()


def test_it_leaves_a_host_that_serves_what_it_should(host):
    deploy(host, 2)
    report(host, [{"name": "iris", "version": 2, "state": "READY"}])
    assert reconcile_host(host) == []


def test_it_waits_for_a_report_newer_than_the_deployment(host):
    deploy(host, 2, age_seconds=5)
    report(host, [], age_seconds=30)
    assert reconcile_host(host) == []


def test_it_does_not_act_while_a_deployment_is_in_progress_or_the_host_is_offline(host):
    deploy(host, 2, age_seconds=600)
    deploy(host, 3, state=TargetState.LOADING, age_seconds=10)
    report(host, [])
    assert reconcile_host(host) == []
    other = ServingHost.objects.create(name="gpu-1", inference_url="http://gpu-1:8000")
    deploy(other, 2)
    report(other, [], live=False)
    assert reconcile_host(other) == []


def test_it_does_not_loop_on_a_repair_that_failed(host):
    deploy(host, 2, age_seconds=900)
    deploy(host, 2, state=TargetState.FAILED, age_seconds=60)  # the last repair failed a minute ago
    report(host, [])
    assert reconcile_host(host) == []


def test_a_failed_deployment_of_another_version_does_not_stop_a_repair(host):
    deploy(host, 2, age_seconds=900)
    deploy(host, 3, state=TargetState.FAILED, age_seconds=30)  # a broken v3 that left v2 serving
    report(host, [])
    (repair,) = reconcile_host(host)
    assert repair.version == 2


def test_it_fails_a_target_nobody_picked_up_on_an_offline_host(host, settings):
    settings.DISPATCH_TIMEOUT = 60
    stuck = deploy(host, 1, state=TargetState.PENDING, age_seconds=120)
    fresh = deploy(host, 2, state=TargetState.PENDING, age_seconds=10)
    (repair,) = fail_stalled_targets()
    stuck.refresh_from_db()
    fresh.refresh_from_db()
    assert stuck.state == TargetState.FAILED and "is the agent of gpu-0 running" in stuck.error
    assert fresh.state == TargetState.PENDING
    assert repair.version == 1


def test_it_fails_a_target_whose_agent_went_silent(host, settings):
    settings.DISPATCH_TIMEOUT = 60
    settings.AGENT_LOAD_TIMEOUT = 60
    report(host, [])
    silent = deploy(host, 1, state=TargetState.LOADING, age_seconds=200)
    fail_stalled_targets()
    silent.refresh_from_db()
    assert silent.state == TargetState.FAILED and "stopped reporting while loading" in silent.error


def claim_of(target) -> str | None:
    from modelyard.celery import broker
    from modelyard_agent.claims import claim_key, target_claim

    return target_claim(broker(), claim_key(target.pk, target.dispatched_at))


def test_a_target_on_a_host_whose_agent_never_reported_fails_after_its_own_deadline(host, settings):
    settings.UNREPORTED_HOST_TIMEOUT, settings.DISPATCH_TIMEOUT = 60, 600
    stuck = deploy(host, 1, state=TargetState.PENDING, age_seconds=120)
    fresh = deploy(host, 2, state=TargetState.PENDING, age_seconds=10)
    (repair,) = fail_stalled_targets()
    stuck.refresh_from_db()
    fresh.refresh_from_db()
    assert stuck.state == TargetState.FAILED and repair.version == 1
    assert stuck.error == ("the agent of gpu-0 has never reported, and nothing took this up within 60 s: start "
                           "modelyard-agent --host gpu-0 there (it consumes Celery queue host.gpu-0), then roll out "
                           "again")
    # An agent started later finds the task claimed as cancelled and touches nothing on the host.
    assert claim_of(stuck) == "cancelled"
    assert fresh.state == TargetState.PENDING and claim_of(fresh) is None


def test_a_host_that_reported_once_gets_the_dispatch_timeout_not_the_never_reported_deadline(host, settings):
    settings.UNREPORTED_HOST_TIMEOUT, settings.DISPATCH_TIMEOUT = 60, 600
    report(host, [], age_seconds=3600)  # offline for an hour, but its agent exists
    waiting = deploy(host, 1, state=TargetState.PENDING, age_seconds=120)
    assert fail_stalled_targets() == []
    waiting.refresh_from_db()
    assert waiting.state == TargetState.PENDING


def test_a_target_its_agent_claimed_first_is_left_to_finish(host, settings):
    from modelyard.celery import broker
    from modelyard_agent.claims import STARTED, claim_key, claim_target

    settings.UNREPORTED_HOST_TIMEOUT = 60
    started = deploy(host, 1, state=TargetState.PENDING, age_seconds=120)
    claim_target(broker(), claim_key(started.pk, started.dispatched_at), STARTED)  # the agent came up just now
    assert fail_stalled_targets() == []
    started.refresh_from_db()
    assert started.state == TargetState.PENDING


@pytest.mark.parametrize(("value", "expected"), [("45", "45.0"), ("", "180.0")])
def test_the_never_reported_deadline_comes_from_the_environment(value, expected):
    import os
    import subprocess
    import sys

    env = {**os.environ, "MODELYARD_UNREPORTED_HOST_TIMEOUT": value, "DJANGO_SETTINGS_MODULE": "modelyard.settings"}
    result = subprocess.run(
        [sys.executable, "-c", "from django.conf import settings; print(settings.UNREPORTED_HOST_TIMEOUT)"],
        env=env, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == expected


def stuck_report(host, minutes: float, state: str = "LOADING", version: int = 2):
    since = (timezone.now() - timedelta(minutes=minutes)).isoformat()
    report(host, [{"name": "iris", "version": 1, "state": "READY"},
                  {"name": "iris", "version": version, "state": state, "reason": "", "since": since}])


@pytest.fixture
def repair_backoff_reset():
    from modelyard.celery import broker

    client = broker()  # the broker's Redis, where the reconciler keeps its backoff keys
    client.delete(*client.keys("modelyard:repair-stuck:*") or ["none"])
    yield


def test_a_version_stuck_loading_past_the_deadline_is_repaired_once_per_backoff(
    host, repair_backoff_reset, django_capture_on_commit_callbacks
):
    host.load_deadline = 60
    deploy(host, 1, age_seconds=3600)
    stuck_report(host, minutes=5)
    assert [s["version"] for s in host.stuck_versions()] == [2]
    with django_capture_on_commit_callbacks(execute=False):
        (repair,) = reconcile_host(host)
    assert (repair.model, repair.version) == ("iris", 1)
    assert "iris version 2 LOADING for 300 s, past its deadline of 60 s" in repair.reason
    redeploy = Deployment.objects.get(pk=repair.deployment_id)
    assert redeploy.version.version == 1 and redeploy.trigger == "reconciler"
    # While that redeployment runs, and for the backoff after it, nothing more is sent.
    assert reconcile_host(host) == []
    DeploymentTarget.objects.filter(deployment=redeploy).update(state=TargetState.FAILED)
    assert reconcile_host(host) == []


def test_a_slow_load_within_the_deadline_is_left_alone(host, repair_backoff_reset):
    deploy(host, 1, age_seconds=3600)
    stuck_report(host, minutes=2)  # the fleet default deadline is longer
    assert host.stuck_versions() == [] and reconcile_host(host) == []


def test_a_model_nothing_should_serve_is_unloaded_when_stuck_unloading(
    host, repair_backoff_reset, django_capture_on_commit_callbacks
):
    RegisteredModel.objects.create(name="iris")
    host.unload_deadline = 30
    stuck_report(host, minutes=1, state="UNLOADING", version=3)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        (repair,) = reconcile_host(host)
    assert repair.deployment_id is None and "UNLOADING for 60 s" in repair.reason
    assert len(callbacks) == 1
    event = AuditEvent.objects.get(action="host_model.unloaded")
    assert event.data["by"] == "reconciler"


def test_heartbeats_keep_the_time_a_version_entered_loading(host):
    from deployments.heartbeats import record_heartbeat

    record_heartbeat(host.name, {"runtime_live": True, "models": [{"name": "iris", "version": 2, "state": "LOADING"}]})
    first = ServingHost.objects.get(pk=host.pk).heartbeat["models"][0]["since"]
    record_heartbeat(host.name, {"runtime_live": True, "models": [{"name": "iris", "version": 2, "state": "LOADING"}]})
    assert ServingHost.objects.get(pk=host.pk).heartbeat["models"][0]["since"] == first
    record_heartbeat(host.name, {"runtime_live": True, "models": [{"name": "iris", "version": 2, "state": "READY"}]})
    assert "since" not in ServingHost.objects.get(pk=host.pk).heartbeat["models"][0]


def test_a_heartbeat_that_shows_a_lost_version_starts_its_repair_at_once(host, django_capture_on_commit_callbacks):
    from deployments.tasks import record_host_heartbeat

    deploy(host, 1, age_seconds=900)
    with django_capture_on_commit_callbacks(execute=False):
        record_host_heartbeat(host.name, {"runtime_live": True, "models": []})  # a Triton back with nothing loaded
    repair = Deployment.objects.get(trigger="reconciler")
    assert repair.version.version == 1
    created = AuditEvent.objects.get(action="deployment.created", object_id=str(repair.pk))
    assert created.data["reason"] == "gpu-0 reported iris version 1 missing"
    with django_capture_on_commit_callbacks(execute=False):
        record_host_heartbeat(host.name, {"runtime_live": True, "models": []})  # the repair is under way
    assert Deployment.objects.filter(trigger="reconciler").count() == 1


def test_a_heartbeat_of_a_dead_runtime_starts_nothing(host):
    from deployments.tasks import record_host_heartbeat

    deploy(host, 1, age_seconds=900)
    record_host_heartbeat(host.name, {"runtime_live": False, "models": []})
    assert not Deployment.objects.filter(trigger="reconciler").exists()


def test_a_model_the_report_shows_its_agent_working_on_is_left_alone(host):
    deploy(host, 2, age_seconds=600)
    report(host, [{"name": "iris", "version": 1, "state": "READY"}])
    host.heartbeat["agent"] = {"working_on": [{"task": "deploy", "model": "iris", "target_id": 99, "since": 0}]}
    host.save()
    assert reconcile_host(host) == []


@pytest.mark.django_db(transaction=True)
def test_two_passes_at_the_same_moment_start_one_repair(host):
    from tests.fixtures.concurrency import at_once

    deploy(host, 1, age_seconds=900)
    report(host, [])
    found, errors = at_once(lambda: reconcile_host(ServingHost.objects.get(pk=host.pk)), 2, timeout=30)
    assert errors == [] and sorted(len(repairs) for repairs in found) == [0, 1]
    assert Deployment.objects.filter(trigger="reconciler").count() == 1


def test_a_repair_cut_short_by_a_runtime_that_died_again_is_retried_once_it_is_back(host):
    from deployments.heartbeats import record_heartbeat

    deploy(host, 2, age_seconds=900)
    deploy(host, 2, state=TargetState.FAILED, age_seconds=60)  # its repair failed: Triton died during it
    record_heartbeat(host.name, {"runtime_live": False, "models": []})
    record_heartbeat(host.name, {"runtime_live": True, "models": []})  # back, after that failure
    back_at = ServingHost.objects.get(pk=host.pk).heartbeat["runtime_back_at"]
    record_heartbeat(host.name, {"runtime_live": True, "models": []})
    assert ServingHost.objects.get(pk=host.pk).heartbeat["runtime_back_at"] == back_at  # kept while live
    (repair,) = reconcile_host(host)
    assert repair.version == 2


def test_a_repair_that_failed_with_the_runtime_live_is_still_backed_off(host):
    from deployments.heartbeats import record_heartbeat

    record_heartbeat(host.name, {"runtime_live": False, "models": []})
    record_heartbeat(host.name, {"runtime_live": True, "models": []})
    deploy(host, 2, age_seconds=900)
    repair = deploy(host, 2, state=TargetState.FAILED, age_seconds=0)  # failed after the runtime came back
    assert repair.updated_at > parse_datetime(ServingHost.objects.get(pk=host.pk).heartbeat["runtime_back_at"])
    record_heartbeat(host.name, {"runtime_live": True, "models": []})
    assert reconcile_host(host) == []
