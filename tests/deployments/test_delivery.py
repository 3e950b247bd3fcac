"""A dispatched target reaches its host's agent once: a dispatch handed out twice (its orchestrator worker died
after the send, before the acknowledgement) sends it once, and one whose send was lost with its worker is sent
again by the reconciler under a new claim, instead of waiting out the broker's visibility timeout. Real S3,
Redis (the test broker) and PostgreSQL; the worker's death is the send the on-commit hook never made. A target
its agent finished, whose last report died with the worker holding it, is recorded ready from the host's
heartbeat."""

import base64
import json
from datetime import timedelta

import pytest
from django.utils import timezone

from deployments import rollouts
from deployments.choices import DeploymentStatus, TargetState
from deployments.delivery import unsent_targets
from deployments.models import DeploymentTarget, ServingHost
from deployments.reconcile import reconcile_fleet
from deployments.services import start_deployment
from deployments.targets import record_target_progress
from deployments.tasks import dispatch_target, record_host_heartbeat, resend_target
from modelyard.celery import app
from modelyard_agent.claims import STARTED, SUPERSEDED, claim_key, claim_target, target_claim
from modelyard_agent.contract import AgentTask, host_queue
from registry.choices import ArtifactFormat
from registry.models import ModelVersion, RegisteredModel
from registry.storage import ArtifactStore
from tests.registry.test_upload_digests import queued

pytestmark = pytest.mark.django_db


@pytest.fixture
def target(s3_endpoint, broker, django_capture_on_commit_callbacks) -> DeploymentTarget:
    """A rollout's target dispatched a while ago to an online host, whose send never happened (the on-commit
    hook that queues ``dispatch_target`` is not run, as when the worker that was to send it died)."""
    key = "artifacts/test/delivery"
    ArtifactStore().client.put_object(Bucket=ArtifactStore().bucket, Key=key, Body=b"model bytes")
    model = RegisteredModel.objects.create(name="iris", next_version=2)
    ModelVersion.objects.create(model=model, version=1, format=ArtifactFormat.TRITON_MODEL_DIR, artifact_key=key,
                                artifact_sha256="ab" * 32, artifact_size=11, config_text='backend: "python"')
    ServingHost.objects.create(name="gpu-0", inference_url="http://gpu-0:8000", last_heartbeat_at=timezone.now(),
                               heartbeat={"runtime_live": True})
    with django_capture_on_commit_callbacks(execute=False):
        deployment = start_deployment(model_name="iris", version=1, host_names=["gpu-0"])
        rollouts.advance_rollout(deployment.pk)
    found = deployment.targets.get()
    DeploymentTarget.objects.filter(pk=found.pk).update(dispatched_at=timezone.now() - timedelta(minutes=5))
    found.refresh_from_db()
    return found


def sent_claims(broker) -> list[str]:
    """The claims of the DEPLOY tasks waiting in gpu-0's queue."""
    return [json.loads(base64.b64decode(message["body"]))[0][0]["claim"]
            for message in map(json.loads, broker.lrange(host_queue("gpu-0"), 0, -1))
            if message["headers"]["task"] == AgentTask.DEPLOY.value]


def queued_resends(broker) -> list[int]:
    return [args[0] for name, args in queued(broker) if name == "deployments.resend_target"]


def test_a_dispatch_handed_out_twice_sends_its_target_once(target, broker):
    dispatch_target(target.pk)
    dispatch_target(target.pk)  # the broker's redelivery of the same task
    assert sent_claims(broker) == [claim_key(target.pk, target.dispatched_at)]


def test_a_target_whose_send_was_lost_is_sent_again_under_a_new_claim_by_the_reconciler(target, broker):
    old = claim_key(target.pk, target.dispatched_at)
    assert sent_claims(broker) == [] and unsent_targets() == [(target.pk, target.dispatched_at)]
    reconcile_fleet()
    assert queued_resends(broker) == [target.pk]
    assert resend_target(target.pk, target.dispatched_at.isoformat())
    target.refresh_from_db()
    new = claim_key(target.pk, target.dispatched_at)
    assert sent_claims(broker) == [new] and new != old
    assert target_claim(broker, old) == SUPERSEDED  # the lost task, should it come back, does nothing
    assert unsent_targets() == []  # its message waits in the host's queue
    dispatch_target(target.pk)  # the lost task handed out at last, after the visibility timeout
    assert sent_claims(broker) == [new]


def test_a_target_an_agent_worker_took_or_claimed_is_not_sent_again(target, broker, settings):
    dispatch_target(target.pk)
    with app.connection_for_read() as connection:
        taken = connection.SimpleQueue(host_queue("gpu-0")).get(timeout=10)  # prefetched, not acknowledged
        assert sent_claims(broker) == [] and broker.hlen("unacked") >= 1
        assert unsent_targets() == []
        dispatch_target(target.pk)
        assert sent_claims(broker) == []
        assert taken.payload[0][0]["claim"] == claim_key(target.pk, target.dispatched_at)
        taken.ack()
    assert unsent_targets() == [(target.pk, target.dispatched_at)]  # acknowledged and gone, never claimed
    claim_target(broker, claim_key(target.pk, target.dispatched_at), STARTED)
    assert unsent_targets() == []


def test_a_lost_send_to_a_host_that_is_not_online_is_left_to_the_dispatch_timeout(target, broker, settings):
    ServingHost.objects.filter(pk=target.host_id).update(last_heartbeat_at=timezone.now() - timedelta(hours=1))
    assert unsent_targets() == []
    settings.DISPATCH_RESEND_AFTER = 600.0
    ServingHost.objects.filter(pk=target.host_id).update(last_heartbeat_at=timezone.now())
    assert unsent_targets() == []  # dispatched 5 minutes ago: not yet


def agent_report(target: DeploymentTarget, *, models: list[dict], working_on: list[dict] = ()) -> dict:
    """A heartbeat of the agent that took ``target`` (started an hour before its dispatch)."""
    started = (target.dispatched_at - timedelta(hours=1)).timestamp()
    return {"runtime_live": True, "models": models,
            "agent": {"version": "test", "protocol": 6, "started_at": started, "working_on": list(working_on)}}


@pytest.fixture
def taken(target, broker) -> DeploymentTarget:
    """``target`` sent, claimed by its agent, which reported it cutting over two minutes ago and then finished
    it; the worker that held the agent's last report died with it."""
    dispatch_target(target.pk)
    claim_target(broker, claim_key(target.pk, target.dispatched_at), STARTED)
    for state in (TargetState.STAGING, TargetState.LOADING, TargetState.CUTTING_OVER):
        record_target_progress(target.pk, state)
    DeploymentTarget.objects.filter(pk=target.pk).update(updated_at=timezone.now() - timedelta(minutes=2))
    return target


def test_a_finished_target_whose_report_was_lost_is_recorded_ready_from_the_hosts_heartbeat(taken):
    record_host_heartbeat("gpu-0", agent_report(taken, models=[{"name": "iris", "version": 1, "state": "READY"}]))
    taken.refresh_from_db()
    assert taken.state == TargetState.READY
    assert "the agent's own report was lost" in taken.events.order_by("-id").first().message
    taken.deployment.refresh_from_db()
    assert taken.deployment.status == DeploymentStatus.SUCCEEDED  # the rollout went on at once


@pytest.mark.parametrize("unlike", ["still working", "reported lately", "not serving", "not claimed"])
def test_a_target_the_heartbeat_does_not_show_finished_is_left_to_its_report(taken, broker, unlike):
    models = [{"name": "iris", "version": 1, "state": "LOADING" if unlike == "not serving" else "READY"}]
    working = [{"task": "deploy", "model": "iris", "target_id": taken.pk, "since": 0}]
    if unlike != "still working":
        working = []
    if unlike == "reported lately":
        DeploymentTarget.objects.filter(pk=taken.pk).update(updated_at=timezone.now())
    if unlike == "not claimed":
        broker.delete(f"modelyard:target-claim:{claim_key(taken.pk, taken.dispatched_at)}")
    record_host_heartbeat("gpu-0", agent_report(taken, models=models, working_on=working))
    taken.refresh_from_db()
    assert taken.state == TargetState.CUTTING_OVER
