"""The orchestrator's Celery tasks of the deployments app: thin wrappers around services.

They run on orchestrator workers (queue ``default``). Work for a host goes to its agent's queue
(``host.<name>``) by task name (``modelyard_agent.contract.AgentTask``, sent by ``send_to_host``);
the agent reports back by enqueueing ``record_target_report`` and ``record_host_heartbeat`` by
name, so it never touches the database and shares no code with these tasks but the contract.
"""

import logging

from celery import shared_task
from django.conf import settings

from deployments.choices import TERMINAL_TARGET_STATES, TargetState
from deployments.models import DeploymentTarget, ServingHost
from deployments.services import build_agent_payload, record_heartbeat, record_target_progress
from modelyard.celery import DATABASE_ERRORS, app, broker
from modelyard_agent.contract import PROTOCOL_VERSION, AgentTask, OrchestratorTask, host_queue
from registry.storage import ArtifactStore, StorageError

logger = logging.getLogger(__name__)
# Orchestrator tasks that only read and compare-and-set rows retry a dropped database connection.
RETRY_ON_DATABASE_ERRORS = {"autoretry_for": DATABASE_ERRORS, "retry_backoff": True, "retry_backoff_max": 60,
                            "max_retries": 8}


@shared_task(
    name="deployments.dispatch_target", acks_late=True, autoretry_for=(StorageError, *DATABASE_ERRORS),
    retry_backoff=True, retry_backoff_max=60, max_retries=5,
)
def dispatch_target(target_id: int) -> None:
    """Hand one deployment target to its host's agent; a target already started is left alone."""
    target = DeploymentTarget.objects.select_related("host", "deployment__version__model").get(pk=target_id)
    if target.state != TargetState.PENDING:
        logger.info("target %s is %s; not dispatching again", target_id, target.state)
        return
    store = ArtifactStore()
    key = target.deployment.version.artifact_key
    if store.head(key) is None:
        from deployments.rollouts import advance_rollout

        record_target_progress(
            target_id, TargetState.FAILED,
            message=f"the artifact of {target.deployment.version} ({key}) is missing from bucket {store.bucket}",
        )
        advance_rollout(target.deployment_id)  # as after an agent's report: pause, fail or roll back now
        return
    payload = build_agent_payload(target, download_url=store.presigned_download_url(key))
    send_to_host(target.host.name, AgentTask.DEPLOY, payload)


@shared_task(
    name="deployments.resend_target", acks_late=True, autoretry_for=(StorageError, *DATABASE_ERRORS),
    retry_backoff=True, retry_backoff_max=60, max_retries=5,
)
def resend_target(target_id: int, dispatched_at: str) -> bool:
    """Send a target again that its host's agent dropped (it was restarted and does not work on it).

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
    from django.utils import timezone
    from django.utils.dateparse import parse_datetime

    from deployments.choices import ACTIVE_TARGET_STATES
    from modelyard_agent.claims import claim_key, supersede

    seen = parse_datetime(dispatched_at)
    target = DeploymentTarget.objects.select_related("host", "deployment__version__model").get(pk=target_id)
    if target.state not in ACTIVE_TARGET_STATES or target.dispatched_at != seen:
        return False
    supersede(broker(), claim_key(target.pk, seen))
    now = timezone.now()
    if not DeploymentTarget.objects.filter(pk=target.pk, dispatched_at=seen).update(dispatched_at=now):
        return False
    target.dispatched_at = now
    url = ArtifactStore().presigned_download_url(target.deployment.version.artifact_key)
    send_to_host(target.host.name, AgentTask.DEPLOY, build_agent_payload(target, download_url=url))
    logger.warning("target %s (%s on %s, %s) was dropped by a restarted agent; sent again", target.pk,
                   target.deployment.version, target.host.name, target.state)
    return True


def send_to_host(host: str, task: AgentTask, payload: dict, **options) -> None:
    """Send ``task`` with ``payload`` (stamped with this orchestrator's protocol) to ``host``'s agent.

    Args:
        host: the serving host's name; its agent consumes ``host.<name>``.
        task: the agent task (``modelyard_agent.contract.AgentTask``).
        payload: the task's payload (``contract.DeployPayload``, ``UnloadPayload`` …).
        options: Celery publishing options (``expires`` …).
    """
    app.send_task(str(task), args=[{**payload, "protocol": PROTOCOL_VERSION}], queue=host_queue(host), **options)


@shared_task(name=OrchestratorTask.TARGET_REPORT.value, acks_late=True, **RETRY_ON_DATABASE_ERRORS)
def record_target_report(target_id: int, state: str, message: str = "", details: dict | None = None) -> None:
    """Record a host agent's progress or result for one target, then advance its rollout (idempotent)."""
    from deployments.rollouts import advance_rollout

    record_target_progress(target_id, state, message=message, details=details)
    if state in TERMINAL_TARGET_STATES:
        deployment_id = DeploymentTarget.objects.filter(pk=target_id).values_list("deployment_id", flat=True).first()
        if deployment_id is not None:
            advance_rollout(deployment_id)


@shared_task(name="deployments.advance_rollout", acks_late=True, **RETRY_ON_DATABASE_ERRORS)
def advance_rollout_task(deployment_id: int) -> str:
    """Orchestrator: take a rollout's next step (dispatch a batch, pause, finish); idempotent."""
    from deployments.rollouts import advance_rollout

    return advance_rollout(deployment_id)


@shared_task(name="deployments.request_heartbeats")
def request_heartbeats() -> int:
    """Orchestrator, on a schedule: ask every host agent to report in.

    Each request expires after one interval, so an agent that is down does not act on stale
    requests when it comes back; and a host whose queue still holds a message (its agent is down
    or busy) is not sent another, so the queue of an agent that never comes back does not grow
    in Redis. Returns the number of hosts asked.
    """
    hosts = list(ServingHost.objects.values_list("name", "inference_url", "metrics_url", "runtime"))
    client = broker()
    asked = 0
    for name, inference_url, metrics_url, runtime in hosts:
        if client.llen(host_queue(name)):  # Celery's Redis transport keeps each queue as a list of that name
            continue
        asked += 1
        send_to_host(name, AgentTask.HEARTBEAT,
                     {"host": name, "inference_url": inference_url, "metrics_url": metrics_url, "runtime": runtime},
                     expires=settings.HEARTBEAT_INTERVAL)
    return asked


@shared_task(name=OrchestratorTask.HOST_HEARTBEAT.value, acks_late=True, **RETRY_ON_DATABASE_ERRORS)
def record_host_heartbeat(host_name: str, report: dict) -> None:
    """Orchestrator: store a host agent's report, then send again what a restarted agent dropped
    (``reconcile.dropped_targets``)."""
    from deployments.reconcile import dropped_targets

    if record_heartbeat(host_name, report):
        for target_id, dispatched_at in dropped_targets(host_name):
            resend_target.delay(target_id, dispatched_at.isoformat())


@shared_task(name="deployments.reconcile")
def reconcile() -> int:
    """Orchestrator, on a schedule: fail stalled targets and redeploy what hosts lost. Returns the action count."""
    from deployments.reconcile import reconcile_fleet

    return len(reconcile_fleet())


@shared_task(name="deployments.follow_alias", acks_late=True, **RETRY_ON_DATABASE_ERRORS)
def follow_alias_task(model_id: int, alias: str, actor_id: int | None = None) -> int | None:
    """Orchestrator: roll the version an alias now names out to the deployments following it.

    Returns the new deployment's id, or None when there was nothing to do (idempotent).
    """
    from django.contrib.auth import get_user_model

    from deployments.rollouts import follow_alias

    actor = get_user_model().objects.filter(pk=actor_id).first() if actor_id else None
    deployment = follow_alias(model_id, alias, actor=actor)
    return deployment.pk if deployment else None


@shared_task(name="deployments.unload_idle_models")
def unload_idle_models() -> int:
    """Orchestrator, on a schedule: unload models that served no request for IDLE_UNLOAD_AFTER s."""
    from deployments.lifecycle import unload_idle_models as unload
    from modelyard.errors import ServiceUnavailable

    try:
        return len(unload())
    except ServiceUnavailable as exc:
        logger.warning("idle unload skipped: %s", exc.message)
        return 0


@shared_task(name="deployments.autoscale")
def autoscale() -> int:
    """Orchestrator, on a schedule: add or remove model instances by queue time. Returns the changes made."""
    from deployments.autoscale import autoscale_fleet
    from modelyard.errors import ServiceUnavailable

    try:
        return len(autoscale_fleet())
    except ServiceUnavailable as exc:
        logger.warning("autoscale skipped: %s", exc.message)
        return 0


@shared_task(
    name="deployments.dispatch_profile", acks_late=True, autoretry_for=(StorageError, *DATABASE_ERRORS),
    retry_backoff=True, retry_backoff_max=60, max_retries=5,
)
def dispatch_profile(profile_id: int) -> bool:
    """Hand a queued profile to its host's agent (a presigned artifact URL in its payload); a profile no
    longer queued (cancelled meanwhile) is left alone. Returns whether it was sent."""
    from deployments.choices import ProfileStatus
    from deployments.models import Profile
    from deployments.profiles import build_profile_payload

    profile = Profile.objects.select_related("host", "version__model").get(pk=profile_id)
    if profile.status != ProfileStatus.QUEUED:
        return False
    url = ArtifactStore().presigned_download_url(profile.version.artifact_key)
    send_to_host(profile.host.name, AgentTask.PROFILE, build_profile_payload(profile, download_url=url))
    return True


@shared_task(name=OrchestratorTask.PROFILE_REPORT.value, acks_late=True, **RETRY_ON_DATABASE_ERRORS)
def record_profile_report(profile_id: int, report: dict) -> bool:
    """Record a host agent's progress or result for a profile (``deployments.profiles.record_profile_report``)."""
    from deployments.profiles import record_profile_report as record

    return record(profile_id, report)


@shared_task(
    name="deployments.dispatch_replay", acks_late=True, autoretry_for=(StorageError, *DATABASE_ERRORS),
    retry_backoff=True, retry_backoff_max=60, max_retries=5,
)
def dispatch_replay(replay_id: int) -> bool:
    """Hand a queued replay to its host's agent (a presigned URL of the candidate's artifact in its payload); a
    replay no longer queued (cancelled meanwhile) is left alone. Returns whether it was sent."""
    from deployments.choices import ReplayStatus
    from deployments.models import Replay
    from deployments.replays import build_replay_payload

    replay = Replay.objects.select_related("host", "version__model", "against").get(pk=replay_id)
    if replay.status != ReplayStatus.QUEUED:
        return False
    url = ArtifactStore().presigned_download_url(replay.version.artifact_key)
    send_to_host(replay.host.name, AgentTask.REPLAY, build_replay_payload(replay, download_url=url))
    return True


@shared_task(name=OrchestratorTask.REPLAY_REPORT.value, acks_late=True, **RETRY_ON_DATABASE_ERRORS)
def record_replay_report(replay_id: int, report: dict) -> bool:
    """Record a host agent's progress or result for a replay (``deployments.replays.record_replay_report``)."""
    from deployments.replays import record_replay_report as record

    return record(replay_id, report)
