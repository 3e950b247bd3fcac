"""What profiles and replays share: jobs queued for one host's agent, which reports on them until they end.

A job (``Profile``, ``Replay``) has a ``status`` (QUEUED, then RUNNING, then one that ends it), a ``step``,
a ``message``, ``finished_at`` and ``updated_at``, and belongs to a model version. It is stopped through a
key in the broker's Redis that the agent polls (``modelyard_agent.profiling.control``), and given up when
its agent sends no report for the job's time budget plus ``settings.PROFILE_STALL_GRACE`` seconds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import models, transaction
from django.utils import timezone

from audit.services import record_audit_event
from modelyard.celery import broker
from modelyard.errors import Conflict, NotFound, ServiceUnavailable
from modelyard_agent.profiling import control


@dataclass(frozen=True)
class JobKind:
    """One kind of agent job.

    Attributes:
        name: ``"profile"`` or ``"replay"``: in messages, and the kind of its stop key.
        model: the job's Django model.
        active: the statuses of a job not yet ended (queued, running).
        queued, cancelled, failed: those statuses of the kind's choices.
        cancel_action: the ``AuditAction`` of a cancel.
        budget_fields: the fields ``budget`` reads (loaded alone when looking for stalled jobs).
        budget: seconds a job may run on its host, from the job.
    """

    name: str
    model: type[models.Model]
    active: frozenset
    queued: str
    cancelled: str
    failed: str
    cancel_action: str
    budget_fields: tuple[str, ...]
    budget: Callable[[models.Model], float]


def cancel(kind: JobKind, job_id: int, *, actor=None):
    """Stop a job: a queued one ends CANCELLED now, a running one when its agent sees the stop (within about
    a second) and reports it. Audited. Returns the job.

    Raises:
        NotFound: no such job.
        Conflict: it has ended already.
        ServiceUnavailable: the broker cannot be reached (nothing changed).
    """
    import redis


    with transaction.atomic():
        job = kind.model.objects.select_for_update().select_related("version__model").filter(pk=job_id).first()
        if job is None:
            raise NotFound(f"no {kind.name} {job_id}")
        if job.status not in kind.active:
            raise Conflict(f"{kind.name} {job_id} is {job.status}; only a queued or running one can be cancelled")
        try:
            control.request_stop(broker(), job.pk, kind.name)
        except redis.exceptions.RedisError as exc:
            raise ServiceUnavailable(f"the broker cannot be reached to stop {kind.name} {job_id}: {exc}") from exc
        if job.status == kind.queued:
            job.status, job.finished_at = kind.cancelled, timezone.now()
            job.message = "cancelled before its host's agent started it"
        else:
            job.step = "stopping"
        job.save(update_fields=["status", "finished_at", "message", "step", "updated_at"])
        record_audit_event(action=kind.cancel_action, actor=actor, obj_type=kind.name, obj_id=job.pk,
                           model=job.version.model, data={"version": job.version.version})
    return job


def fail_stalled(kind: JobKind, *, now=None) -> list[int]:
    """Fail the jobs whose agent stopped reporting: no report for the job's budget plus
    ``settings.PROFILE_STALL_GRACE`` seconds. Returns the ids of the jobs failed."""
    now = now or timezone.now()
    failed = []
    for job in kind.model.objects.filter(status__in=kind.active).only("pk", "updated_at", *kind.budget_fields):
        budget = kind.budget(job) + settings.PROFILE_STALL_GRACE
        if job.updated_at < now - timedelta(seconds=budget):
            ended = kind.model.objects.filter(pk=job.pk, status__in=kind.active).update(
                status=kind.failed, finished_at=now, step="",
                message=f"the host's agent sent no report for {budget:g} s; the {kind.name} was given up")
            if ended:
                failed.append(job.pk)
    return failed
