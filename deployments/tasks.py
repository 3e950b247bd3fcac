"""Celery tasks of the deployments app: thin wrappers around services.

``dispatch_target`` and ``record_target_report`` run on orchestrator workers
(queue ``default``); ``deploy_version_on_host`` runs on the host agent of the
target host (queue ``host.<name>``) and reports back by enqueueing
``record_target_report``, so the agent never touches the database.
"""

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import redis
from celery import shared_task
from django.conf import settings

from deployments.choices import TERMINAL_TARGET_STATES, TargetState
from deployments.claims import CANCELLED, STARTED, claim_target, target_claim
from deployments.host_agents import host_agent, load_deadline
from deployments.models import DeploymentTarget, ServingHost
from deployments.services import build_agent_payload, record_heartbeat, record_target_progress
from modelyard.celery import DATABASE_ERRORS
from registry.storage import ArtifactStore, StorageError

logger = logging.getLogger(__name__)

ORCHESTRATOR_QUEUE = "default"
LOCK_RETRY_SECONDS = 5
# A host agent's report must outlive a broker restart or failover: publishing it is retried for
# about two minutes (0, 0.5, 1, … then every 3 s) before the task gives up.
REPORT_RETRY_POLICY = {"max_retries": 45, "interval_start": 0, "interval_step": 0.5, "interval_max": 3}
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
    deploy_version_on_host.apply_async(args=[payload], queue=target.host.queue)


@shared_task(name="deployments.record_target_report", acks_late=True, **RETRY_ON_DATABASE_ERRORS)
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


def _report(target_id: int, state: str, message: str = "", details: dict | None = None) -> None:
    record_target_report.apply_async(args=[target_id, state, message, details or {}], queue=ORCHESTRATOR_QUEUE,
                                     retry=True, retry_policy=REPORT_RETRY_POLICY)


def host_model_lock(host: str, model: str, load_deadline: float | None = None) -> redis.lock.Lock:
    """The per-(host, model) lock: one load, swap or unload of a model on a host at a time.

    Held in the broker's Redis, so it spans every agent process of the host; it expires after
    three load deadlines (the host's, when longer than the fleet default), so a SIGKILLed holder
    cannot block the model forever. Other models on the host take locks of their own, so they
    never wait for this one.
    """
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    seconds = max(float(load_deadline or 0), settings.AGENT_LOAD_TIMEOUT)
    return client.lock(f"modelyard:lock:{host}:{model}", timeout=3 * seconds)


@contextmanager
def heartbeats_meanwhile(payload: dict) -> Iterator[None]:
    """Keep reporting the host in, from a thread of its own, while this task works.

    A load can take as long as the host's deadline, and the heartbeat requests queued for the
    host wait behind busy agent processes; without this the host would look offline to every
    team for that long. The thread sends a report every ``HEARTBEAT_INTERVAL`` seconds (the
    first after one interval) and stops when the block ends. Does nothing for a payload that
    lacks the host's endpoints.

    Args:
        payload: an agent payload with ``host``, ``inference_url``, ``metrics_url``, ``runtime``.
    """
    if not payload.get("host") or not payload.get("inference_url"):
        yield
        return
    request = {key: payload.get(key, "") for key in ("host", "inference_url", "metrics_url", "runtime")}
    done = threading.Event()

    def beat() -> None:
        while not done.wait(settings.HEARTBEAT_INTERVAL):
            try:
                _send_heartbeat(request)
            except Exception:  # a missed beat is logged; the next one may get through
                logger.exception("heartbeat of %s during a long task failed", request["host"])

    thread = threading.Thread(target=beat, name=f"heartbeat-{payload['host']}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=settings.HEARTBEAT_INTERVAL)


def _release(lock: redis.lock.Lock, during: str) -> None:
    """Release the (host, model) lock; one that expired, or a broker that cannot be reached (the
    lock then expires by itself), is only logged, so the work's outcome is still reported."""
    try:
        lock.release()
    except redis.exceptions.LockError:
        logger.warning("%s expired %s", lock.name, during)
    except redis.exceptions.RedisError as exc:
        logger.warning("could not release %s %s (%s); it expires by itself", lock.name, during, exc)


def _acquire_or_take_over(lock: redis.lock.Lock, task_id: str | None) -> bool:
    """Take the lock, or take it over from an earlier delivery of this very task.

    A worker killed mid-deployment leaves the lock held under its task id until it expires; the
    broker hands the unacknowledged message out again with the same id, and that redelivery may
    carry on at once instead of waiting out the lock (each step is idempotent).
    """
    token = (task_id or "").encode() or None
    if lock.acquire(blocking=False, token=token):
        return True
    if token and lock.redis.get(lock.name) == token:
        lock.local.token = token
        lock.reacquire()
        logger.warning("took over %s from an earlier delivery of task %s", lock.name, task_id)
        return True
    return False


@shared_task(name="deployments.deploy_version_on_host", acks_late=True, bind=True, max_retries=None)
def deploy_version_on_host(self, payload: dict) -> None:
    """Host agent: stage, load and cut over one model version, reporting each step.

    Runs under the (host, model) lock; when another deployment holds it, the task is
    retried every ``LOCK_RETRY_SECONDS`` until the lock frees or ``DISPATCH_TIMEOUT`` passes.
    Before acting it claims the target (``deployments.claims``): a target whose rollout was
    cancelled while this task waited in the queue is reported cancelled and never started.
    Safe to run twice: staging skips a version dir already built from the same sha256 and
    loading an already-served version is a no-op swap.
    """
    target_id = payload["target_id"]
    claim = payload.get("claim") or str(target_id)
    if target_claim(claim) == CANCELLED:  # cancelled while it waited in the queue or for the lock
        logger.info("target %s was cancelled while queued; not starting it", target_id)
        _report(target_id, TargetState.CANCELLED, "the rollout was cancelled before this host started")
        return
    lock = host_model_lock(payload.get("host", ""), payload["model"], payload.get("load_deadline"))
    if not _acquire_or_take_over(lock, self.request.id):
        if self.request.retries * LOCK_RETRY_SECONDS >= settings.DISPATCH_TIMEOUT:
            _report(target_id, TargetState.FAILED,
                    f"{payload['model']} stayed locked on this host by another deployment for "
                    f"{settings.DISPATCH_TIMEOUT:g} s")
            return
        raise self.retry(countdown=LOCK_RETRY_SECONDS)
    if claim_target(claim, STARTED) == CANCELLED:
        _release(lock, "for a cancelled target")
        logger.info("target %s was cancelled while queued; not starting it", target_id)
        _report(target_id, TargetState.CANCELLED, "the rollout was cancelled before this host started")
        return
    try:
        with heartbeats_meanwhile(payload):
            result = host_agent(payload.get("runtime")).deploy(payload, report=lambda state: _report(target_id, state))
    except Exception as exc:  # the orchestrator must hear of every failure, not only the foreseen ones
        logger.exception("deploying target %s failed", target_id)
        _report(target_id, TargetState.FAILED, f"host agent error: {exc}")
        return
    finally:
        _release(lock, "before the deployment ended")
    if result["state"] == TargetState.READY:
        _report(target_id, TargetState.READY, details=result["details"])
    else:
        _report(target_id, TargetState.FAILED, result["error"], details=result["details"])


@shared_task(name="deployments.request_heartbeats")
def request_heartbeats() -> int:
    """Orchestrator, on a schedule: ask every host agent to report in.

    Each request expires after one interval, so an agent that is down does not act on stale
    requests when it comes back; and a host whose queue still holds a message (its agent is down
    or busy) is not sent another, so the queue of an agent that never comes back does not grow
    in Redis. Returns the number of hosts asked.
    """
    hosts = list(ServingHost.objects.values_list("name", "inference_url", "metrics_url", "runtime"))
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    asked = 0
    for name, inference_url, metrics_url, runtime in hosts:
        if broker.llen(f"host.{name}"):  # Celery's Redis transport keeps each queue as a list of that name
            continue
        asked += 1
        report_heartbeat.apply_async(
            args=[{"host": name, "inference_url": inference_url, "metrics_url": metrics_url, "runtime": runtime}],
            queue=f"host.{name}", expires=settings.HEARTBEAT_INTERVAL,
        )
    return asked


@shared_task(name="deployments.report_heartbeat", acks_late=True)
def report_heartbeat(request: dict) -> None:
    """Host agent: report the runtime's liveness, loaded (or, on BentoML, served) models, GPUs and free disk."""
    _send_heartbeat(request)


def _send_heartbeat(request: dict) -> None:
    report = host_agent(request.get("runtime")).heartbeat(request)
    record_host_heartbeat.apply_async(args=[request["host"], report], queue=ORCHESTRATOR_QUEUE,
                                      retry=True, retry_policy=REPORT_RETRY_POLICY)


@shared_task(name="deployments.record_host_heartbeat", acks_late=True, **RETRY_ON_DATABASE_ERRORS)
def record_host_heartbeat(host_name: str, report: dict) -> None:
    """Orchestrator: store a host agent's report."""
    record_heartbeat(host_name, report)


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


@shared_task(name="deployments.unload_model_on_host", acks_late=True, bind=True, max_retries=None)
def unload_model_on_host(self, payload: dict) -> None:
    """Host agent: stop serving a model (Triton unload, or BentoML's nginx route and processes) under
    the (host, model) lock and wait until it is gone."""
    from deployments.runtimes.base import ServingRuntimeError

    lock = host_model_lock(payload["host"], payload["model"])
    if not _acquire_or_take_over(lock, self.request.id):
        raise self.retry(countdown=LOCK_RETRY_SECONDS)
    try:
        with heartbeats_meanwhile(payload):
            host_agent(payload.get("runtime")).unload(payload)
    except ServingRuntimeError as exc:
        logger.error("unloading %s from %s failed: %s", payload["model"], payload["host"], exc.message)
        if exc.retryable and self.request.retries < 5:
            raise self.retry(countdown=LOCK_RETRY_SECONDS) from exc
    finally:
        _release(lock, "before the unload ended")


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


@shared_task(name="deployments.check_ensemble_on_host", acks_late=True, bind=True, max_retries=None)
def check_ensemble_on_host(self, payload: dict) -> bool:
    """Host agent: make sure an ensemble version is READY after one of its composing models changed.

    Reloads it with its config when it is not (under the (host, model) lock). Returns whether it
    was READY, or became so.
    """
    from deployments.agent import ensure_version_ready

    lock = host_model_lock(payload["host"], payload["model"], payload.get("load_deadline"))
    if not _acquire_or_take_over(lock, self.request.id):
        raise self.retry(countdown=LOCK_RETRY_SECONDS)
    try:
        with heartbeats_meanwhile(payload):
            return ensure_version_ready(payload, load_timeout=load_deadline(payload),
                                        grpc_url=settings.AGENT_TRITON_GRPC_URL)
    finally:
        _release(lock, "during the ensemble check")


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
