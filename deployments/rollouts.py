"""Rollouts: move a deployment's hosts in batches, and pause, resume, cancel or roll it back.

A deployment's targets carry a batch number. ``advance_rollout`` is the one place that moves a
rollout forward; it runs after every target report, after resume, and from the reconciler, and
is idempotent: under a row lock on the deployment it looks at the targets and

- dispatches the lowest batch that still has undispatched pending targets, once every earlier
  batch has finished (READY, FAILED or CANCELLED) — at most ``batch_size`` hosts move at once;
- on a FAILED target, waits for the batch in flight to finish, then pauses (policy ``pause``)
  or sends the hosts already moved back to their previous version (policy ``rollback``);
- marks the rollout SUCCEEDED when every target is READY, FAILED when all finished otherwise.

A host in a batch never stops serving: the agent loads the new version beside the old one and
cuts over only once the new one is READY (see ``modelyard_agent.triton_host``). A SIGKILLed worker loses
nothing: targets and statuses are rows, dispatch is guarded by ``dispatched_at``, and the
reconciler calls ``advance_rollout`` for every running rollout.
"""

import logging
from collections import defaultdict

from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from audit.choices import AuditAction
from audit.services import record_audit_event
from deployments.choices import (
    ACTIVE_TARGET_STATES,
    DEPLOYMENT_MACHINE,
    TERMINAL_DEPLOYMENT_STATUSES,
    CanaryState,
    DeploymentStatus,
    FailurePolicy,
    RolloutTrigger,
    TargetState,
)
from deployments.enqueue import Job, job, send_to_host
from deployments.models import Deployment, DeploymentTarget, RolloutEvent
from deployments.served import serving_now
from deployments.services import create_rollout
from deployments.signals import rollout_finished
from deployments.targets import build_agent_payload, transition
from modelyard.celery import broker
from modelyard.errors import Conflict, NotFound
from modelyard_agent.claims import CANCELLED, STARTED, claim_key, claim_target, target_claim
from modelyard_agent.contract import AgentTask
from registry.aliases import resolve_alias
from registry.models import EnsembleMember

logger = logging.getLogger(__name__)


def set_status(deployment: Deployment, to_status: str, *, actor=None, message: str = "") -> bool:
    """Move a rollout to ``to_status`` with a compare-and-set update and a RolloutEvent.

    Call inside a transaction that holds the deployment's row lock. Reaching a terminal status
    sends ``deployments.signals.rollout_finished`` (promotion webhooks listen).

    Returns:
        True when it changed, False when it already was ``to_status`` (a repeat is a no-op).

    Raises:
        IllegalTransition: the move is not in ``DEPLOYMENT_TRANSITIONS`` (e.g. resuming a finished
            rollout); a ``Conflict``.
    """
    from_status = deployment.status
    finished = None if to_status in (DeploymentStatus.RUNNING, DeploymentStatus.PAUSED) else timezone.now()
    changed = DEPLOYMENT_MACHINE.move(
        deployment, to_status, finished_at=finished,
        refusal=f"deployment {deployment.pk} is {deployment.get_status_display().lower()}; "
                f"it cannot become {DeploymentStatus(to_status).label.lower()}",
    )
    if changed:
        RolloutEvent.objects.create(
            deployment=deployment, from_status=from_status, to_status=to_status,
            actor_label=getattr(actor, "username", "") or "system", message=message,
        )
        if finished and deployment.prerequisite_for_id:

            parent = deployment.prerequisite_for_id
            transaction.on_commit(lambda: job(Job.ADVANCE_ROLLOUT, parent))
        if to_status == DeploymentStatus.SUCCEEDED:
            transaction.on_commit(lambda pk=deployment.pk: _check_ensembles_after(pk))
        if to_status in TERMINAL_DEPLOYMENT_STATUSES:
            rollout_finished.send(sender=Deployment, deployment=deployment, from_status=from_status,
                                  to_status=to_status)
    return changed


def _locked(deployment_id: int) -> Deployment:
    try:
        return Deployment.objects.select_for_update().select_related("model", "version").get(pk=deployment_id)
    except Deployment.DoesNotExist as exc:
        raise NotFound(f"no deployment {deployment_id}") from exc


def advance_rollout(deployment_id: int) -> str:
    """Take the next step of a running rollout (see the module docstring); idempotent.

    Returns:
        The rollout's status afterwards (a ``DeploymentStatus`` value).

    Raises:
        NotFound: no such deployment.
    """

    with transaction.atomic():
        deployment = _locked(deployment_id)
        if deployment.status == DeploymentStatus.ROLLED_BACK and not deployment.canary_state:  # plain rollouts
            _send_back_late_arrivals(deployment)
        if deployment.status != DeploymentStatus.RUNNING:
            return deployment.status
        prerequisites = list(deployment.prerequisites.select_related("model").order_by("id"))
        broken = [p for p in prerequisites if p.status in TERMINAL_DEPLOYMENT_STATUSES
                  and p.status != DeploymentStatus.SUCCEEDED]
        if broken:
            _cancel_waiting(deployment)
            names = ", ".join(f"{p.model.name} (rollout {p.pk}, {p.get_status_display().lower()})" for p in broken)
            set_status(deployment, DeploymentStatus.FAILED,
                       message=f"composing model(s) could not be deployed: {names}; no host was moved")
            return deployment.status
        if any(p.status != DeploymentStatus.SUCCEEDED for p in prerequisites):
            return deployment.status  # composing models first: each one's end advances this rollout
        targets = list(deployment.targets.select_for_update().order_by("batch", "host__name"))
        in_flight = [t for t in targets if t.state in ACTIVE_TARGET_STATES and t.dispatched_at is not None]
        failed = [t for t in targets if t.state == TargetState.FAILED]
        resumed = deployment.events.filter(to_status=DeploymentStatus.RUNNING).aggregate(at=Max("created_at"))["at"]
        if resumed is not None:  # failures from before the last resume were accepted by the operator
            failed = [t for t in failed if t.updated_at > resumed]
        if failed and not in_flight:
            hosts = ", ".join(t.host.name for t in failed)
            if deployment.failure_policy == FailurePolicy.ROLLBACK:
                _roll_back(deployment, actor=None, reason=f"{hosts} failed to load {deployment.version}")
            elif any(t.state == TargetState.PENDING for t in targets):
                set_status(deployment, DeploymentStatus.PAUSED,
                           message=f"{hosts} failed to load {deployment.version}; the rest waits")
            else:
                set_status(deployment, DeploymentStatus.FAILED, message=f"{hosts} failed")
            return deployment.status
        if failed or in_flight:
            return deployment.status
        waiting = [t for t in targets if t.state == TargetState.PENDING]
        if not waiting:
            if all(t.state == TargetState.READY for t in targets):
                set_status(deployment, DeploymentStatus.SUCCEEDED, message="every host serves the version")
            else:
                set_status(deployment, DeploymentStatus.FAILED, message="finished; some hosts kept their old version")
            return deployment.status
        batch = min(t.batch for t in waiting)
        now = timezone.now()
        for target in (t for t in waiting if t.batch == batch):
            DeploymentTarget.objects.filter(pk=target.pk, dispatched_at__isnull=True).update(dispatched_at=now)
            transaction.on_commit(lambda pk=target.pk: job(Job.DISPATCH_TARGET, pk))
        logger.info("deployment %s: dispatching batch %s", deployment.pk, batch)
        return deployment.status


def pause_rollout(deployment_id: int, *, actor=None) -> Deployment:
    """Stop dispatching further batches; hosts in flight finish their step.

    Raises:
        NotFound: no such deployment.
        Conflict: the rollout is not running.
    """
    with transaction.atomic():
        deployment = _locked(deployment_id)
        if deployment.status != DeploymentStatus.RUNNING:
            raise Conflict(f"deployment {deployment_id} is {deployment.get_status_display().lower()}, not running")
        set_status(deployment, DeploymentStatus.PAUSED, actor=actor, message="paused by an operator")
        _audit(deployment, "paused", actor)
    return deployment


def resume_rollout(deployment_id: int, *, actor=None) -> Deployment:
    """Continue a paused rollout with its next batch (hosts that failed keep their old version).

    Raises:
        NotFound: no such deployment.
        Conflict: the rollout is not paused.
    """

    with transaction.atomic():
        deployment = _locked(deployment_id)
        if deployment.status != DeploymentStatus.PAUSED:
            raise Conflict(f"deployment {deployment_id} is {deployment.get_status_display().lower()}, not paused")
        # The failures that paused it stay recorded on their targets; resuming accepts them.
        set_status(deployment, DeploymentStatus.RUNNING, actor=actor, message="resumed by an operator")
        _audit(deployment, "resumed", actor)
        # Robust: a lost publish leaves it RUNNING, which the reconciler's advance_running_rollouts takes on.
        transaction.on_commit(lambda: job(Job.ADVANCE_ROLLOUT, deployment_id), robust=True)
    return deployment


def cancel_rollout(deployment_id: int, *, actor=None) -> Deployment:
    """Stop a rollout for good: hosts whose agent has not started are left as they are (CANCELLED),
    including those whose task is still queued on the host.

    A cancel never answers "cancelled" for work that goes on: while any host's agent has started its
    part (staging or loading, or claimed from its queue), the cancel is refused and nothing changes:
    roll back instead, which sends such a host back once its load ends (``advance_rollout``).
    Hosts already moved keep the new version; roll back to undo them.

    Raises:
        NotFound: no such deployment.
        Conflict: the rollout has finished, or a host is staging or loading its version now.
    """
    with transaction.atomic():
        deployment = _locked(deployment_id)
        if deployment.status not in (DeploymentStatus.RUNNING, DeploymentStatus.PAUSED):
            raise Conflict(f"deployment {deployment_id} has finished ({deployment.get_status_display().lower()})")
        _refuse_while_started(deployment)
        _cancel_waiting(deployment)
        set_status(deployment, DeploymentStatus.CANCELLED, actor=actor, message="cancelled by an operator")
        _audit(deployment, "cancelled", actor)
    return deployment


def rollback_rollout(deployment_id: int, *, actor=None) -> list[Deployment]:
    """Send every host this rollout moved back to the version it served before.

    Hosts not yet moved are cancelled. One rollback deployment is started per previous version
    (usually one), as a rollout of its own in the same batch size, linked by ``rollback_of``. A host
    staging or loading now (a load cannot be stopped) gets a rollback of its own when it reaches READY
    (``_send_back_late_arrivals``, from ``advance_rollout``).

    Returns:
        The rollback deployments started (none when no host had moved).

    Raises:
        NotFound: no such deployment.
        Conflict: it was rolled back already.
    """
    with transaction.atomic():
        deployment = _locked(deployment_id)
        rollbacks = _roll_back(deployment, actor=actor, reason="rolled back by an operator")
        _audit(deployment, "rolled_back", actor, rollbacks=[d.pk for d in rollbacks])
    return rollbacks


def _refuse_while_started(deployment: Deployment) -> None:
    """Raise Conflict naming the first host whose agent has started its part of ``deployment``: a target
    STAGING or LOADING, or one still PENDING whose claim its agent holds (``modelyard_agent.claims``)."""
    version = deployment.version.version
    for target in deployment.targets.filter(state__in=(TargetState.PENDING, TargetState.STAGING,
                                                       TargetState.LOADING)).select_related("host"):
        started = target.state != TargetState.PENDING or (
            target.dispatched_at is not None
            and target_claim(broker(), claim_key(target.pk, target.dispatched_at)) == STARTED)
        if started:
            doing = {TargetState.LOADING: "loading", TargetState.STAGING: "staging"}.get(target.state, "starting")
            raise Conflict(f"host {target.host.name} is already {doing} {deployment.model.name} v{version}, which a "
                           f"cancel cannot stop: roll it back instead (a host still loading is sent back once its load "
                           f"ends)")


def _cancel_waiting(deployment: Deployment) -> None:
    """Cancel every target no host agent has started: those not dispatched, and those dispatched but
    still queued on their host, whose agent then finds the cancel's claim and never acts
    (``modelyard_agent.claims``). A target whose agent claimed it first is left to finish."""

    for target in deployment.targets.filter(state=TargetState.PENDING):
        if target.dispatched_at is None:
            transition(target.pk, TargetState.CANCELLED, message="the rollout stopped before this host")
        elif claim_target(broker(), claim_key(target.pk, target.dispatched_at), CANCELLED) == CANCELLED:
            transition(target.pk, TargetState.CANCELLED,
                       message="the rollout stopped while this host's task was still queued; it will not start")


def _roll_back(deployment: Deployment, *, actor, reason: str) -> list[Deployment]:

    if deployment.status == DeploymentStatus.ROLLED_BACK:
        raise Conflict(f"deployment {deployment.pk} was rolled back already")
    if deployment.status not in (DeploymentStatus.RUNNING, DeploymentStatus.PAUSED):
        _check_newest(deployment)
    _cancel_waiting(deployment)
    rollbacks = _send_back(deployment, deployment.targets.filter(state=TargetState.READY), actor=actor)
    set_status(deployment, DeploymentStatus.ROLLED_BACK, actor=actor, message=reason)
    if deployment.canary_state == CanaryState.ACTIVE:
        Deployment.objects.filter(pk=deployment.pk).update(canary_state=CanaryState.ROLLED_BACK)
    return rollbacks


def _send_back(deployment: Deployment, targets, *, actor) -> list[Deployment]:
    """Start one rollback rollout per previous version for those of ``targets`` (READY targets of
    ``deployment``) that moved their host off another version; returns them."""
    back_to: dict[int, list] = defaultdict(list)
    for target in targets.select_related("host", "previous_version"):
        if target.previous_version_id and target.previous_version_id != deployment.version_id:
            back_to[target.previous_version_id].append(target)
    return [create_rollout(
        model_version=moved[0].previous_version, hosts=[t.host for t in moved], batch_size=deployment.batch_size,
        failure_policy=FailurePolicy.PAUSE, config_overrides=deployment.config_overrides,
        autoscale=deployment.autoscale, max_request_bytes=deployment.max_request_bytes,
        **deployment.residency_settings(), rollback_of=deployment,
        trigger=RolloutTrigger.ROLLBACK, actor=actor,
    ) for moved in back_to.values()]


def _send_back_late_arrivals(deployment: Deployment) -> list[Deployment]:
    """Roll back the hosts of a rolled-back ``deployment`` that reached READY after the rollback: they
    were staging or loading then, and a load cannot be stopped. Each such host is sent back once (a host
    already in one of its rollbacks is not sent again). The caller holds the deployment's row lock."""
    sent = DeploymentTarget.objects.filter(deployment__rollback_of=deployment).values("host")
    late = deployment.targets.filter(state=TargetState.READY).exclude(host__in=sent)
    rollbacks = _send_back(deployment, late, actor=None)
    for rollback in rollbacks:
        logger.warning("deployment %s: a host finished loading after its rollback; rolling it back too "
                       "(deployment %s)", deployment.pk, rollback.pk)
    return rollbacks


def _check_newest(deployment: Deployment) -> None:
    """A finished rollout may be rolled back only while no later rollout of the model moved its hosts."""
    later = DeploymentTarget.objects.filter(
        deployment__model=deployment.model, deployment__created_at__gt=deployment.created_at,
        host__in=deployment.targets.values("host"),
    ).exclude(state=TargetState.CANCELLED)
    if later.exists():
        raise Conflict(f"a later deployment of {deployment.model.name} has moved these hosts since; roll that back")


def _audit(deployment: Deployment, what: str, actor, **data) -> None:
    record_audit_event(
        action=AuditAction.DEPLOYMENT_CHANGED, actor=actor, obj_type="deployment", obj_id=deployment.pk,
        model=deployment.model, data={"change": what, "version": deployment.version.version, **data},
    )


def advance_running_rollouts() -> int:
    """Advance every running rollout (the reconciler's safety net after a lost task). Returns how many."""
    ids = list(Deployment.objects.filter(status=DeploymentStatus.RUNNING).values_list("pk", flat=True))
    for pk in ids:
        advance_rollout(pk)
    return len(ids)


def on_alias_moved(sender, *, model, alias: str, version, actor=None, **kwargs) -> None:
    """Receiver of ``registry.signals.alias_moved``: roll out to deployments that follow the alias, on commit."""

    if Deployment.objects.filter(model=model, follow_alias=alias).exists():
        transaction.on_commit(lambda: job(Job.FOLLOW_ALIAS, model.pk, alias, getattr(actor, "pk", None)))


def follow_alias(model_id: int, alias: str, *, actor=None) -> Deployment | None:
    """Start a rollout of the version ``alias`` names now to the hosts of the newest deployment following it.

    The rollout copies that deployment's batch size, failure policy, overrides and hosts; a
    rollout of it still running or paused is cancelled first (superseded). Idempotent: nothing
    happens when the newest following deployment already has that version.

    Returns:
        The new deployment, or None when there was nothing to do.

    Raises:
        NotFound: the alias no longer exists.
    """

    newest = (Deployment.objects.filter(model_id=model_id, follow_alias=alias, rollback_of__isnull=True)
              .select_related("model", "version").order_by("-created_at", "-id").first())
    if newest is None:
        return None
    version = resolve_alias(newest.model.name, alias)
    if version.pk == newest.version_id:
        return None
    with transaction.atomic():
        current = _locked(newest.pk)
        if current.status in (DeploymentStatus.RUNNING, DeploymentStatus.PAUSED):
            _cancel_waiting(current)
            set_status(current, DeploymentStatus.CANCELLED, actor=actor,
                       message=f"superseded: {alias} moved to version {version.version}")
        hosts = [t.host for t in current.targets.select_related("host").order_by("batch", "host__name")]
        return create_rollout(
            model_version=version, hosts=hosts, batch_size=current.batch_size,
            failure_policy=current.failure_policy, config_overrides=current.config_overrides,
            follow_alias=alias, selector=current.selector, autoscale=current.autoscale,
            max_request_bytes=current.max_request_bytes, **current.residency_settings(),
            trigger=RolloutTrigger.ALIAS, actor=actor,
        )


def _check_ensembles_after(deployment_id: int) -> None:
    """After a model was swapped on some hosts, have each host check every ensemble it serves that
    composes that model, and reload one that is not READY (Triton reloads dependants itself, so
    usually nothing needs doing)."""

    deployment = Deployment.objects.select_related("model").get(pk=deployment_id)
    hosts = list(deployment.targets.filter(state=TargetState.READY).values_list("host_id", flat=True))
    ensembles = set(EnsembleMember.objects.filter(member__model=deployment.model).values_list("ensemble_id", flat=True))
    if not hosts or not ensembles:
        return
    for target in serving_now(host_id__in=hosts):
        if target.deployment.version_id in ensembles:
            payload = build_agent_payload(target, download_url="")
            send_to_host(target.host.name, AgentTask.CHECK_ENSEMBLE, payload)
