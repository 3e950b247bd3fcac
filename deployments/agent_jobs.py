"""One shape for every agent job (profiles, replays): queued for one host's agent, reported on until it ends.

A job (a ``models.AgentJob``: ``Profile``, ``Replay``) has a ``status`` (QUEUED, then RUNNING, then one
that ends it, moved by ``choices.JOB_MACHINE``), a ``step``, a ``message``, ``details``, ``finished_at``
and ``updated_at``, and belongs to a model version. Each kind describes only what differs in a
``JobKind``; this module dispatches it to the host's agent, records the agent's reports, cancels it
(through a key in the broker's Redis that the agent polls, ``modelyard_agent.profiling.control``) and
gives it up when its agent sends no report for the job's time budget plus
``settings.PROFILE_STALL_GRACE`` seconds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import redis
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from audit.services import record_audit_event
from deployments.choices import ACTIVE_JOB_STATES, JOB_MACHINE, JobStatus
from deployments.enqueue import send_to_host
from deployments.models import AgentJob, ServingHost
from modelyard.celery import broker
from modelyard.errors import Conflict, NotFound, ServiceUnavailable
from modelyard_agent.contract import AgentTask
from modelyard_agent.profiling import control
from registry.formats import archive_limits
from registry.models import ModelVersion
from registry.storage import ArtifactStore

logger = logging.getLogger(__name__)

STEP_CHARS = 200  # the ``step`` column's length


@dataclass(frozen=True)
class JobKind:
    """What one kind of agent job does differently; every other part is this module's.

    Attributes:
        name: ``"profile"`` or ``"replay"``: in messages, the payload's ``<name>_id`` and its stop key.
        model: the job's Django model (an ``AgentJob``).
        task: the agent task that runs it.
        related: what ``dispatch`` loads with the job (``select_related``) to build its payload.
        payload: the kind's own payload fields, from the job (``contract.ProfilePayload`` beyond
            ``StagedJobPayload``, …).
        report_fields: the kind's own columns set from a report: ``(job, report, ended) -> {field: value}``.
        cancel_action: the ``AuditAction`` of a cancel.
        budget_fields: the fields ``budget`` reads (loaded alone when looking for stalled jobs).
        budget: seconds a job may run on its host, from the job.
    """

    name: str
    model: type[AgentJob]
    task: AgentTask
    related: tuple[str, ...]
    payload: Callable[[AgentJob], dict]
    report_fields: Callable[[AgentJob, dict, bool], dict]
    cancel_action: str
    budget_fields: tuple[str, ...]
    budget: Callable[[AgentJob], float]


def staging_payload(version: ModelVersion, host, *, download_url: str) -> dict:
    """The ``modelyard_agent.contract.StagedJobPayload`` fields that stage and load a copy of ``version`` on
    ``host`` (a ``ServingHost``): the artifact from a presigned URL, checked against its size in bytes and
    sha256 on the host, its config and the host's overrides, deadlines in seconds."""
    return {
        "host": host.name, "runtime": host.runtime, "format": version.format, "model": version.model.name,
        "version": version.version, "artifact_url": download_url, "sha256": version.artifact_sha256,
        "size": version.artifact_size, "config_text": version.config_text,
        "parameters": dict(host.config_overrides.get("parameters", {})),
        "sample_input": (version.metadata or {}).get("sample_input"), "signature": version.signature,
        "inference_url": host.inference_url, "metrics_url": host.metrics_url,
        "load_deadline": host.load_deadline_seconds, "unload_deadline": host.unload_deadline_seconds,
        "archive_limits": archive_limits().as_payload(),
    }


def build_payload(kind: JobKind, job: AgentJob, *, download_url: str) -> dict:
    """The payload of ``job`` for its host's agent: ``<kind>_id``, the staging fields of its version
    (``staging_payload``) and the kind's own (``kind.payload``)."""
    return {f"{kind.name}_id": job.pk, **staging_payload(job.version, job.host, download_url=download_url),
            **kind.payload(job)}


def refuse_a_second(kind: JobKind, host: ServingHost) -> None:
    """Inside the caller's transaction, before it creates a job: lock ``host``'s row (so two requests
    cannot both pass) and refuse when a job of this kind is queued or running there, since a host runs
    one at a time.

    Raises:
        Conflict: one is; the message names it, its version and its status.
    """
    ServingHost.objects.select_for_update().get(pk=host.pk)
    running = (kind.model.objects.filter(host=host, status__in=ACTIVE_JOB_STATES)
               .select_related("version__model").first())
    if running is not None:
        raise Conflict(f"{kind.name} {running.pk} ({running.version}) is {running.status} on {host.name!r}; a host "
                       f"runs one {kind.name} at a time (cancel it, or wait)")


def dispatch(kind: JobKind, job_id: int) -> bool:
    """Hand a queued job to its host's agent, with a presigned URL of its version's artifact in the payload.

    Returns:
        Whether it was sent: a job no longer queued (cancelled meanwhile) is left alone.

    Raises:
        registry.storage.StorageError: the URL could not be presigned (the task retries).
    """
    job = kind.model.objects.select_related("host", "version__model", *kind.related).get(pk=job_id)
    if job.status != JobStatus.QUEUED:
        return False
    url = ArtifactStore().presigned_host_download_url(job.version.artifact_key)
    send_to_host(job.host.name, kind.task, build_payload(kind, job, download_url=url))
    return True


def record_report(kind: JobKind, job_id: int, report: dict) -> bool:
    """Store an agent's progress or result for a job (``contract.ProfileReport``, ``ReplayReport``).

    A RUNNING report updates the step and the kind's fields; an ending one (SUCCEEDED, FAILED,
    CANCELLED) also sets ``message`` and ``finished_at``. A report that ``JOB_MACHINE`` does not allow
    from the job's status (a late RUNNING after a cancel) is ignored, as is one with an unknown status.

    Returns:
        True when the report was taken.
    """
    status = report.get("status")
    if status not in JobStatus.values or status == JobStatus.QUEUED:
        logger.warning("%s %s: report with unknown status %r ignored", kind.name, job_id, status)
        return False
    with transaction.atomic():
        job = kind.model.objects.select_for_update().filter(pk=job_id).first()
        if job is None or not (status == job.status == JobStatus.RUNNING or JOB_MACHINE.allows(job.status, status)):
            return False
        now, ended = timezone.now(), status != JobStatus.RUNNING
        fields = {"started_at": job.started_at or now, "updated_at": now, **kind.report_fields(job, report, ended)}
        if ended:
            fields |= {"step": "", "finished_at": now, "message": str(report.get("message") or "")}
        else:
            fields["step"] = str(report.get("step") or job.step)[:STEP_CHARS]
        if status == job.status:
            kind.model.objects.filter(pk=job.pk).update(**fields)
            return True
        return JOB_MACHINE.move(job, status, **fields)


def cancel(kind: JobKind, job_id: int, *, actor=None) -> AgentJob:
    """Stop a job: a queued one ends CANCELLED now, a running one when its agent sees the stop (within about
    a second) and reports it. Audited. Returns the job.

    Raises:
        NotFound: no such job.
        Conflict: it has ended already.
        ServiceUnavailable: the broker cannot be reached (nothing changed).
    """
    with transaction.atomic():
        job = kind.model.objects.select_for_update().select_related("version__model").filter(pk=job_id).first()
        if job is None:
            raise NotFound(f"no {kind.name} {job_id}")
        if job.status not in ACTIVE_JOB_STATES:
            raise Conflict(f"{kind.name} {job_id} is {job.status}; only a queued or running one can be cancelled")
        try:
            control.request_stop(broker(), job.pk, kind.name)
        except redis.exceptions.RedisError as exc:
            raise ServiceUnavailable(f"the broker cannot be reached to stop {kind.name} {job_id}: {exc}") from exc
        if job.status == JobStatus.QUEUED:
            now = timezone.now()
            JOB_MACHINE.move(job, JobStatus.CANCELLED, finished_at=now, updated_at=now,
                             message="cancelled before its host's agent started it")
        else:
            job.step = "stopping"
            job.save(update_fields=["step", "updated_at"])
        record_audit_event(action=kind.cancel_action, actor=actor, obj_type=kind.name, obj_id=job.pk,
                           model=job.version.model, data={"version": job.version.version})
    return job


def fail_stalled(kind: JobKind, *, now=None) -> list[int]:
    """Fail the jobs whose agent stopped reporting: no report for the job's budget plus
    ``settings.PROFILE_STALL_GRACE`` seconds. Returns the ids of the jobs failed."""
    now = now or timezone.now()
    failed = []
    for job in kind.model.objects.filter(status__in=ACTIVE_JOB_STATES).only(
            "pk", "status", "updated_at", *kind.budget_fields):
        budget = kind.budget(job) + settings.PROFILE_STALL_GRACE
        if job.updated_at < now - timedelta(seconds=budget) and JOB_MACHINE.move(
                job, JobStatus.FAILED, finished_at=now, step="", updated_at=now,
                message=f"the host's agent sent no report for {budget:g} s; the {kind.name} was given up"):
            failed.append(job.pk)
    return failed
