"""The orchestrator's Celery tasks of the deployments app: thin wrappers around services.

They run on orchestrator workers (queue ``default``), registered under the names of
``deployments.enqueue.Job``; the app's modules queue them through ``deployments.enqueue`` and never
import this module, so it may import every one of them. Work for a host goes to its agent's queue
(``host.<name>``) by task name (``modelyard_agent.contract.AgentTask``, sent by ``send_to_host``);
the agent reports back by enqueueing ``record_target_report`` and ``record_host_heartbeat`` by
name, so it never touches the database and shares no code with these tasks but the contract.
"""

import logging
from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.contrib.auth import get_user_model
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from deployments import agent_jobs, delivery, lifecycle, profiles, replays, rollouts
from deployments import autoscale as autoscaling
from deployments import reconcile as reconciling
from deployments.choices import ACTIVE_TARGET_STATES, TERMINAL_TARGET_STATES, TargetState
from deployments.enqueue import Job, send_to_host
from deployments.footprints import deploy_payload
from deployments.heartbeats import record_heartbeat
from deployments.models import DeploymentTarget, ServingHost
from deployments.targets import record_target_progress
from modelyard.celery import DATABASE_ERRORS, broker
from modelyard.errors import ServiceUnavailable
from modelyard_agent.claims import claim_key, supersede
from modelyard_agent.contract import AgentTask, OrchestratorTask, host_queue
from registry.storage import ArtifactStore, StorageError

logger = logging.getLogger(__name__)
# Orchestrator tasks that only read and compare-and-set rows retry a dropped database connection.
RETRY_ON_DATABASE_ERRORS = {"autoretry_for": DATABASE_ERRORS, "retry_backoff": True, "retry_backoff_max": 60,
                            "max_retries": 8}


@shared_task(
    name=Job.DISPATCH_TARGET.value, acks_late=True, autoretry_for=(StorageError, *DATABASE_ERRORS),
    retry_backoff=True, retry_backoff_max=60, max_retries=5,
)
def dispatch_target(target_id: int) -> None:
    """Hand one deployment target to its host's agent; a target already started is left alone."""
    target = DeploymentTarget.objects.select_related("host", "deployment__version__model").get(pk=target_id)
    if target.state != TargetState.PENDING:
        logger.info("target %s is %s; not dispatching again", target_id, target.state)
        return
    if target.dispatched_at is not None and delivery.reached_agent(target):  # this task handed out twice
        logger.info("target %s reached %s's agent already; not sending it again", target_id, target.host.name)
        return
    store = ArtifactStore()
    key = target.deployment.version.artifact_key
    if store.head(key) is None:
        record_target_progress(
            target_id, TargetState.FAILED,
            message=f"the artifact of {target.deployment.version} ({key}) is missing from bucket {store.bucket}",
        )
        rollouts.advance_rollout(target.deployment_id)  # as after an agent's report: pause, fail or roll back now
        return
    payload = deploy_payload(target, download_url=store.presigned_host_download_url(key))
    send_to_host(target.host.name, AgentTask.DEPLOY, payload)


@shared_task(
    name=Job.RESEND_TARGET.value, acks_late=True, autoretry_for=(StorageError, *DATABASE_ERRORS),
    retry_backoff=True, retry_backoff_max=60, max_retries=5,
)
def resend_target(target_id: int, dispatched_at: str) -> bool:
    """Send a target again that never reached its host's agent (the orchestrator worker that was to send it died
    first: ``delivery.unsent_targets``) or that its agent dropped (it was restarted and does not work on it).

    The earlier dispatch's claim is superseded first (``modelyard_agent.claims.supersede``), so its
    message, should the broker hand it out again, is never acted on; the new dispatch gets a claim
    of its own. Each agent step is idempotent, so the agent picks up where its predecessor died.

    Args:
        target_id: the DeploymentTarget.
        dispatched_at: its ``dispatched_at`` (ISO 8601) when the drop was seen; a target dispatched
            again since, or finished, is left alone.

    Returns:
        True when the target was sent again.
    """
    seen = parse_datetime(dispatched_at)
    target = DeploymentTarget.objects.select_related("host", "deployment__version__model").get(pk=target_id)
    if target.state not in ACTIVE_TARGET_STATES or target.dispatched_at != seen:
        return False
    supersede(broker(), claim_key(target.pk, seen))
    now = timezone.now()
    if not DeploymentTarget.objects.filter(pk=target.pk, dispatched_at=seen).update(dispatched_at=now):
        return False
    target.dispatched_at = now
    url = ArtifactStore().presigned_host_download_url(target.deployment.version.artifact_key)
    send_to_host(target.host.name, AgentTask.DEPLOY, deploy_payload(target, download_url=url))
    logger.warning("target %s (%s on %s, %s) had not reached its agent or was dropped by it; sent again", target.pk,
                   target.deployment.version, target.host.name, target.state)
    return True


@shared_task(name=OrchestratorTask.TARGET_REPORT.value, acks_late=True, **RETRY_ON_DATABASE_ERRORS)
def record_target_report(target_id: int, state: str, message: str = "", details: dict | None = None) -> None:
    """Record a host agent's progress or result for one target, then advance its rollout (idempotent)."""
    record_target_progress(target_id, state, message=message, details=details)
    if state in TERMINAL_TARGET_STATES:
        deployment_id = DeploymentTarget.objects.filter(pk=target_id).values_list("deployment_id", flat=True).first()
        if deployment_id is not None:
            rollouts.advance_rollout(deployment_id)


@shared_task(name=Job.ADVANCE_ROLLOUT.value, acks_late=True, **RETRY_ON_DATABASE_ERRORS)
def advance_rollout_task(deployment_id: int) -> str:
    """Orchestrator: take a rollout's next step (dispatch a batch, pause, finish); idempotent."""
    return rollouts.advance_rollout(deployment_id)


@shared_task(name="deployments.request_heartbeats")
def request_heartbeats() -> int:
    """Orchestrator, on a schedule: ask every host agent to report in.

    Each request expires after one interval, so an agent that is down does not act on stale
    requests when it comes back; and a host whose queue still holds a message (its agent is down
    or busy) is not sent another, so the queue of an agent that never comes back does not grow
    in Redis. Returns the number of hosts asked.
    """
    return _ask_to_report(ServingHost.objects.all(), expires=settings.HEARTBEAT_INTERVAL)


@shared_task(name="deployments.request_recovery_heartbeats")
def request_recovery_heartbeats() -> int:
    """Orchestrator, on a short schedule (``RECOVERY_HEARTBEAT_INTERVAL``): ask again, between the
    regular heartbeats, the hosts whose agent reported recently (within ``HOST_OFFLINE_AFTER``) that
    its runtime was not live. The first report that shows the runtime back reconciles the host
    (``record_host_heartbeat``), so a restarted Triton serves again within this interval plus the
    loads, not a whole heartbeat interval. Returns the number of hosts asked.
    """
    recent = timezone.now() - timedelta(seconds=settings.HOST_OFFLINE_AFTER)
    hosts = ServingHost.objects.filter(last_heartbeat_at__gte=recent, heartbeat__runtime_live=False)
    return _ask_to_report(hosts, expires=settings.RECOVERY_HEARTBEAT_INTERVAL)


def _ask_to_report(hosts, *, expires: float) -> int:
    """Send a heartbeat request to each of ``hosts`` (a ServingHost queryset) whose queue is empty; each
    request expires after ``expires`` seconds. Returns the number asked."""
    client = broker()
    asked = 0
    for name, inference_url, metrics_url, runtime in hosts.values_list("name", "inference_url", "metrics_url",
                                                                       "runtime"):
        if client.llen(host_queue(name)):  # Celery's Redis transport keeps each queue as a list of that name
            continue
        asked += 1
        send_to_host(name, AgentTask.HEARTBEAT,
                     {"host": name, "inference_url": inference_url, "metrics_url": metrics_url, "runtime": runtime},
                     expires=expires)
    return asked


@shared_task(name=OrchestratorTask.HOST_HEARTBEAT.value, acks_late=True, **RETRY_ON_DATABASE_ERRORS)
def record_host_heartbeat(host_name: str, report: dict) -> None:
    """Orchestrator: store a host agent's report, send again what a restarted agent dropped
    (``reconcile.dropped_targets``), record ready what the agent finished and whose report was lost
    (``reconcile.finished_unreported``), then reconcile that host at once (``reconcile.reconcile_host``).

    Reconciling here rather than only on the fleet-wide schedule is what brings back a restarted
    runtime's models within one heartbeat interval plus their load time: a Triton that crashed
    and came back empty is repaired at the first report that shows it live again.
    """
    if record_heartbeat(host_name, report):
        for target_id, dispatched_at in reconciling.dropped_targets(host_name):
            resend_target.delay(target_id, dispatched_at.isoformat())
        for target_id, deployment_id in reconciling.finished_unreported(host_name):
            logger.warning("target %s on %s: its agent finished it and %s's heartbeat shows its version serving, but "
                           "no report of it came; recorded ready", target_id, host_name, host_name)
            record_target_progress(target_id, TargetState.READY,
                                   message="recorded from the host's heartbeat: the agent's own report was lost")
            rollouts.advance_rollout(deployment_id)
        host = ServingHost.objects.filter(name=host_name).only("pk").first()  # reconcile_host reads it locked
        if host is not None:
            reconciling.reconcile_host(host)  # each repair is logged there


@shared_task(name="deployments.reconcile")
def reconcile() -> int:
    """Orchestrator, on a schedule: fail stalled targets and redeploy what hosts lost. Returns the action count."""
    return len(reconciling.reconcile_fleet())


@shared_task(name=Job.FOLLOW_ALIAS.value, acks_late=True, **RETRY_ON_DATABASE_ERRORS)
def follow_alias_task(model_id: int, alias: str, actor_id: int | None = None) -> int | None:
    """Orchestrator: roll the version an alias now names out to the deployments following it.

    Returns the new deployment's id, or None when there was nothing to do (idempotent).
    """
    actor = get_user_model().objects.filter(pk=actor_id).first() if actor_id else None
    deployment = rollouts.follow_alias(model_id, alias, actor=actor)
    return deployment.pk if deployment else None


@shared_task(name="deployments.unload_idle_models")
def unload_idle_models() -> int:
    """Orchestrator, on a schedule: unload models that served no request for IDLE_UNLOAD_AFTER s."""
    try:
        return len(lifecycle.unload_idle_models())
    except ServiceUnavailable as exc:
        logger.warning("idle unload skipped: %s", exc.message)
        return 0


@shared_task(name="deployments.autoscale")
def autoscale() -> int:
    """Orchestrator, on a schedule: add or remove model instances by queue time. Returns the changes made."""
    try:
        return len(autoscaling.autoscale_fleet())
    except ServiceUnavailable as exc:
        logger.warning("autoscale skipped: %s", exc.message)
        return 0


@shared_task(
    name=Job.DISPATCH_PROFILE.value, acks_late=True, autoretry_for=(StorageError, *DATABASE_ERRORS),
    retry_backoff=True, retry_backoff_max=60, max_retries=5,
)
def dispatch_profile(profile_id: int) -> bool:
    """Hand a queued profile to its host's agent (a presigned artifact URL in its payload); a profile no
    longer queued (cancelled meanwhile) is left alone. Returns whether it was sent."""
    return agent_jobs.dispatch(profiles.PROFILE_JOBS, profile_id)


@shared_task(name=OrchestratorTask.PROFILE_REPORT.value, acks_late=True, **RETRY_ON_DATABASE_ERRORS)
def record_profile_report(profile_id: int, report: dict) -> bool:
    """Record a host agent's progress or result for a profile (``deployments.profiles.record_profile_report``)."""
    return profiles.record_profile_report(profile_id, report)


@shared_task(
    name=Job.DISPATCH_REPLAY.value, acks_late=True, autoretry_for=(StorageError, *DATABASE_ERRORS),
    retry_backoff=True, retry_backoff_max=60, max_retries=5,
)
def dispatch_replay(replay_id: int) -> bool:
    """Hand a queued replay to its host's agent (a presigned URL of the candidate's artifact in its payload); a
    replay no longer queued (cancelled meanwhile) is left alone. Returns whether it was sent."""
    return agent_jobs.dispatch(replays.REPLAY_JOBS, replay_id)


@shared_task(name=OrchestratorTask.REPLAY_REPORT.value, acks_late=True, **RETRY_ON_DATABASE_ERRORS)
def record_replay_report(replay_id: int, report: dict) -> bool:
    """Record a host agent's progress or result for a replay (``deployments.replays.record_replay_report``)."""
    return replays.record_replay_report(replay_id, report)
