"""Evaluations of promotion policies: run one now or on schedule, judge its gates, decide; approve, reject.

An evaluation reads the candidate's metrics from Prometheus (``monitoring.services``), judges
them (``promotions.gates``) and, when every gate passes, moves the target alias to the candidate's
version with ``registry.aliases.set_alias``, recorded as done by ``policy:<id>``; deployments
that follow the target alias then roll out by themselves. Failing, erring or dry runs change no
alias. Every evaluation is a ``PromotionEvaluation`` row with the metrics it saw. A policy with ramp
steps moves its candidate's canary a step at a time instead (``promotions.ramps``).
"""

from dataclasses import dataclass
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from audit.services import acting_user
from deployments.choices import JobStatus
from deployments.models import Replay
from deployments.profiles import profile_comparison
from deployments.replays import latest_replay, start_replay
from modelyard.celery import require_broker
from modelyard.errors import Conflict, DomainError, NotFound, PreconditionFailed, ServiceUnavailable
from monitoring.services import version_gate_metrics
from promotions import gates, ramps
from promotions.choices import FINAL_DECISIONS, Decision, EvaluationTrigger, WebhookEvent
from promotions.enqueue import Job, job
from promotions.models import PromotionEvaluation, PromotionPolicy
from promotions.policies import get_policy
from promotions.webhooks import emit
from registry.aliases import alias_is_protected, set_alias
from registry.models import Alias


@dataclass(frozen=True)
class PolicyActor:
    """The actor a policy's promotion is recorded under: not a user (no row), named ``policy:<id>``."""

    username: str
    is_authenticated: bool = False
    pk: None = None


def get_evaluation(evaluation_id: int) -> PromotionEvaluation:
    """The evaluation with that id, with its policy and model. Raises NotFound."""
    try:
        return PromotionEvaluation.objects.select_related("policy__model").get(pk=evaluation_id)
    except PromotionEvaluation.DoesNotExist as exc:
        raise NotFound(f"no promotion evaluation {evaluation_id}") from exc


def request_evaluation(policy_id: int, *, actor=None,
                       trigger: str = EvaluationTrigger.MANUAL) -> PromotionEvaluation:
    """Queue an evaluation of a policy ("run now"); a worker makes it once the transaction commits.

    Returns:
        The PENDING evaluation; poll it until its decision is final (``FINAL_DECISIONS``).

    Raises:
        NotFound: no such policy.
        ServiceUnavailable: the task queue does not answer; nothing was recorded.
    """
    policy = get_policy(policy_id)
    require_broker("the evaluation")
    with transaction.atomic():
        evaluation = PromotionEvaluation.objects.create(policy=policy, trigger=trigger,
                                                        requested_by=acting_user(actor))
        transaction.on_commit(lambda: job(Job.RUN_EVALUATION, evaluation.pk))
    return evaluation


def evaluate_scheduled(policy_id: int, *, client=None) -> PromotionEvaluation | None:
    """What beat's task does: evaluate a policy now, unless it was paused or deleted since.

    Returns:
        The evaluation, or None when the policy is gone or paused.
    """
    policy = PromotionPolicy.objects.filter(pk=policy_id, enabled=True).first()
    if policy is None:
        return None
    evaluation = PromotionEvaluation.objects.create(policy=policy, trigger=EvaluationTrigger.SCHEDULE)
    return evaluate(evaluation.pk, client=client)


def _alias_version(model, name: str):
    row = Alias.objects.filter(model=model, name=name).select_related("version").first()
    return row.version if row is not None else None


def _finish(evaluation: PromotionEvaluation, decision: str, reason: str, *, actor=None, **fields) -> None:
    for key, value in fields.items():
        setattr(evaluation, key, value)
    evaluation.decision, evaluation.reason = decision, reason[:5000]
    evaluation.decided_by = acting_user(actor)
    evaluation.decided_at = timezone.now()
    evaluation.save()


def _promote(evaluation: PromotionEvaluation, *, approved_by=None) -> None:
    """Move the target alias to the candidate version; inside a transaction holding the evaluation's lock.

    A compare-and-set: the alias moves only if it still names the version the gates judged against
    (``evaluation.target_version``, or still does not exist), checked under the model's row lock.

    Raises:
        PreconditionFailed: the alias moved since the evaluation (another policy, a person); it stays.
    """
    policy = evaluation.policy
    data = {"policy": policy.pk, "evaluation": evaluation.pk}
    if approved_by is not None:
        data["approved_by"] = approved_by.username
    judged = evaluation.target_version

    def still_as_judged(current) -> None:
        if getattr(current, "version_id", None) != getattr(judged, "pk", None):
            now = f"v{current.version.version}" if current is not None else "no version"
            then = f"v{judged.version}" if judged is not None else "no version"
            raise PreconditionFailed(f"@{policy.target_alias} names {now} now, not {then} as when this evaluation "
                                     "judged it; run the policy again")

    set_alias(model_name=policy.model.name, alias=policy.target_alias, version=evaluation.candidate_version.version,
              actor=PolicyActor(policy.actor_label), audit_data=data, owner=approved_by,
              reason=f"promotion policy {policy.pk}, evaluation {evaluation.pk}: {evaluation.reason}"[:1000],
              precondition=still_as_judged)
    emit(WebhookEvent.PROMOTION, model=policy.model, data={
        "model": policy.model.name, "policy": policy.pk, "evaluation": evaluation.pk,
        "alias": policy.target_alias, "from_version": getattr(evaluation.target_version, "version", None),
        "to_version": evaluation.candidate_version.version, "metrics": evaluation.metrics,
        "approved_by": approved_by.username if approved_by is not None else None,
    })


def evaluate(evaluation_id: int, *, client=None) -> PromotionEvaluation:
    """Make a PENDING evaluation: read metrics, judge the gates, and promote, hold or wait for approval.

    Idempotent: an evaluation already decided is returned as it is. Prometheus being down or the
    candidate alias missing is recorded as ERROR with the reason; no alias moves then.

    Args:
        evaluation_id: a PromotionEvaluation's id.
        client: a ``monitoring.prometheus.PrometheusClient``; defaults to one from settings.

    Returns:
        The evaluation with its decision.

    Raises:
        NotFound: no such evaluation.
    """
    evaluation = get_evaluation(evaluation_id)
    if evaluation.decision != Decision.PENDING:
        return evaluation
    policy = evaluation.policy
    candidate = _alias_version(policy.model, policy.candidate_alias)
    target = _alias_version(policy.model, policy.target_alias)
    metrics: dict = {"window_seconds": policy.window_seconds, "candidate": None, "target": None}
    seen: dict = {}
    error = ""
    if candidate is None:
        error = f"{policy.model.name} has no alias @{policy.candidate_alias}"
    elif target is None or target.pk != candidate.pk:
        try:
            seen = version_gate_metrics(policy.model.name, window_seconds=policy.window_seconds, client=client)
        except ServiceUnavailable as exc:
            error = f"metrics unavailable: {exc.message}"
    if candidate is not None:
        metrics["candidate"] = {"version": candidate.version, **(seen.get(str(candidate.version)) or {})}
    if target is not None:
        metrics["target"] = {"version": target.version, **(seen.get(str(target.version)) or {})}
    with transaction.atomic():
        evaluation = PromotionEvaluation.objects.select_for_update().select_related("policy__model").get(
            pk=evaluation_id)
        if evaluation.decision != Decision.PENDING:
            return evaluation
        fields = {"candidate_version": candidate, "target_version": target, "metrics": metrics}
        moved = _alias_version(policy.model, policy.target_alias)
        if not error and getattr(moved, "pk", None) != getattr(target, "pk", None):
            error = f"@{policy.target_alias} moved while the metrics were read; run the policy again"
        if error:
            _finish(evaluation, Decision.ERROR, error, **fields)
            return evaluation
        if target is not None and target.pk == candidate.pk:
            _finish(evaluation, Decision.SKIPPED,
                    f"@{policy.target_alias} already names v{candidate.version}: nothing to promote", **fields)
            return evaluation
        replay = None
        if (policy.min_agreement is not None or policy.max_latency_regression is not None) and target is not None:
            replay = _replay_evidence(policy, candidate, target)
            metrics["replay"] = replay
        profiles = None
        if policy.max_profile_regression is not None and target is not None:
            profiles = profile_comparison(candidate, target)
            metrics["profiles"] = profiles
        checks = gates.judge(
            gates.Limits(policy.min_requests, policy.max_p95_ms, policy.max_error_rate, policy.max_regression,
                         policy.max_profile_regression, policy.min_agreement, policy.max_latency_regression),
            seen.get(str(candidate.version)), seen.get(str(target.version)) if target else None,
            has_target=target is not None, profiles=profiles, replay=replay,
        )
        fields["checks"] = [c.as_dict() for c in checks]
        summary = gates.summarise(checks)
        move = f"v{candidate.version} to @{policy.target_alias}"
        if policy.ramp_steps:
            _ramp(evaluation, policy, candidate, checks, summary, fields)
            return evaluation
        if not all(c.passed for c in checks):
            _finish(evaluation, Decision.HELD, summary, **fields)
        elif policy.dry_run:
            _finish(evaluation, Decision.DRY_RUN_PASS, f"{summary}; dry run: would promote {move}", **fields)
        elif policy.requires_approval:
            _finish(evaluation, Decision.AWAITING_APPROVAL, f"{summary}; promoting {move} awaits approval", **fields)
        elif alias_is_protected(policy.model, policy.target_alias):
            _finish(evaluation, Decision.AWAITING_APPROVAL,
                    f"{summary}; @{policy.target_alias} is protected: promoting {move} awaits an owner's approval",
                    **fields)
        else:
            try:
                with transaction.atomic():
                    _finish(evaluation, Decision.PROMOTED, f"{summary}; promoted {move}", **fields)
                    _promote(evaluation)
            except DomainError as exc:  # the alias was locked a moment ago
                _finish(evaluation, Decision.ERROR, f"{summary}; {move} not promoted: {exc.message}", **fields)
    return evaluation


def replay_tolerances(policy: PromotionPolicy) -> dict:
    """The replay tolerances a policy asks for (``modelyard_agent.replay.compare.Tolerances.as_dict``)."""
    return {"atol": float(policy.replay_atol), "rtol": float(policy.replay_rtol),
            "argmax_outputs": sorted(policy.replay_argmax_outputs or [])}


def _replay_evidence(policy: PromotionPolicy, candidate, target) -> dict:
    """What the replay gates judge: the newest replay of ``candidate`` against ``target`` that succeeded within
    the policy's window with its tolerances and request count; else one is started (or one already runs)
    and the evidence says so (``missing``), so the evaluation holds and the next one judges it.

    Returns:
        ``{"id", "host", "compared", "agreement_rate", "serving_p95_ms", "candidate_p95_ms",
        "serving_p50_ms", "candidate_p50_ms", "finished_at"}`` or ``{"missing": sentence, "id"?: running replay}``.
    """
    tolerances = replay_tolerances(policy)
    since = timezone.now() - timedelta(seconds=policy.window_seconds)
    done = latest_replay(candidate, target, since=since, tolerances=tolerances,
                         max_requests=policy.replay_max_requests)
    if done is not None:
        return {"id": done.pk, "host": done.host.name, "compared": int((done.summary or {}).get("compared") or 0),
                "agreement_rate": done.agreement_rate, "serving_p95_ms": done.latency("serving"),
                "candidate_p95_ms": done.latency("candidate"), "serving_p50_ms": done.latency("serving", "p50"),
                "candidate_p50_ms": done.latency("candidate", "p50"), "finished_at": done.finished_at.isoformat()}
    running = latest_replay(candidate, target, tolerances=tolerances, max_requests=policy.replay_max_requests,
                            active=True)
    if running is not None:
        return {"id": running.pk, "running": True,
                "missing": f"replay {running.pk} running, the next evaluation judges it"}
    failed = _last_failed_replay(policy, candidate, target)
    before = (f"replay {failed.pk} failed: {failed.message or 'no message'}; " if failed is not None else "")
    try:
        started = start_replay(model_name=policy.model.name, version=candidate.version, against=target.version,
                               tolerances=tolerances, max_requests=policy.replay_max_requests,
                               pace=float(policy.replay_pace))
    except DomainError as exc:
        evidence = {"missing": f"{before}no replay of v{candidate.version} against v{target.version} could start: "
                               f"{exc.message}"}
    else:
        evidence = {"id": started.pk, "running": True,
                    "missing": f"{before}replay {started.pk} running, the next evaluation judges it"}
    if failed is not None:
        evidence["failed_replay"] = {"id": failed.pk, "message": failed.message}
    return evidence


def _last_failed_replay(policy: PromotionPolicy, candidate, target):
    """The replay this policy's last evaluation of ``candidate`` against ``target`` started or judged, when it
    has failed since (None otherwise): its message is why the policy keeps holding."""
    previous = (policy.evaluations.filter(candidate_version=candidate, target_version=target,
                                          metrics__replay__id__isnull=False).order_by("-id")
                .values_list("metrics__replay__id", flat=True).first())
    if previous is None:
        return None
    return Replay.objects.filter(pk=previous, status=JobStatus.FAILED).first()


def _ramp(evaluation: PromotionEvaluation, policy: PromotionPolicy, candidate, checks, summary: str,
          fields: dict) -> None:
    """Decide one evaluation of a progressive rollout (``promotions.ramps``), inside ``evaluate``'s transaction."""
    canary = ramps.active_canary(policy.model, candidate)
    if canary is None:
        _finish(evaluation, Decision.ERROR, f"{summary}; v{candidate.version} has no active canary to ramp: start "
                "one with canary_percent (the first step) on the hosts that serve the target", **fields)
        return
    to = ramps.next_step(policy.ramp_steps, canary.canary_percent) or 100.0
    step = {"deployment": canary.pk, "from": canary.canary_percent, "to": to}
    fields["metrics"] = {**fields["metrics"], "ramp": step}
    actor = PolicyActor(policy.actor_label)
    what = (f"promote the canary of v{candidate.version} (rollout {canary.pk}) and move @{policy.target_alias}"
            if to >= 100 else f"move the canary of v{candidate.version} (rollout {canary.pk}) from "
                              f"{canary.canary_percent:g} % to {to:g} %")
    if not all(c.passed for c in checks):
        if policy.ramp_on_failure == "rollback" and not policy.dry_run:
            try:
                rollbacks = ramps.roll_back(canary.pk, actor=actor)
            except DomainError as exc:
                _finish(evaluation, Decision.ERROR, f"{summary}; the canary could not be rolled back: {exc.message}",
                        **fields)
                return
            fields["metrics"]["ramp"] = {**step, "rollbacks": rollbacks}
            _finish(evaluation, Decision.ROLLED_BACK, f"{summary}; rolled the canary of v{candidate.version} back",
                    **fields)
        else:
            _finish(evaluation, Decision.HELD, f"{summary}; the canary stays at {canary.canary_percent:g} %", **fields)
    elif policy.dry_run:
        _finish(evaluation, Decision.DRY_RUN_PASS, f"{summary}; dry run: would {what}", **fields)
    elif policy.requires_approval or (to >= 100 and alias_is_protected(policy.model, policy.target_alias)):
        _finish(evaluation, Decision.AWAITING_APPROVAL, f"{summary}; to {what} awaits approval", **fields)
    else:
        _ramp_step(evaluation, summary=summary, what=what, fields=fields)


def _ramp_step(evaluation: PromotionEvaluation, *, summary: str, what: str, fields: dict, approved_by=None) -> None:
    """Take the ramp step ``evaluation.metrics["ramp"]`` names; at 100 % also move the target alias."""
    step = (fields.get("metrics") or evaluation.metrics)["ramp"]
    actor = approved_by or PolicyActor(evaluation.policy.actor_label)
    try:
        with transaction.atomic():
            taken = ramps.take_step(step["deployment"], step["to"], actor=actor)
            fields["metrics"] = {**(fields.get("metrics") or evaluation.metrics), "ramp": {**step, **taken}}
            if step["to"] >= 100:
                decision = Decision.APPROVED if approved_by else Decision.PROMOTED
                _finish(evaluation, decision, f"{summary}; {what}", actor=approved_by, **fields)
                _promote(evaluation, approved_by=approved_by)
            else:
                _finish(evaluation, Decision.ADVANCED, f"{summary}; {what}", actor=approved_by, **fields)
    except DomainError as exc:
        _finish(evaluation, Decision.ERROR, f"{summary}; could not {what}: {exc.message}", **fields)


def _awaiting(evaluation_id: int) -> PromotionEvaluation:
    evaluation = (PromotionEvaluation.objects.select_for_update(of=("self",))
                  .select_related("policy__model", "candidate_version", "target_version")
                  .filter(pk=evaluation_id).first())
    if evaluation is None:
        raise NotFound(f"no promotion evaluation {evaluation_id}")
    if evaluation.decision != Decision.AWAITING_APPROVAL:
        raise Conflict(f"evaluation {evaluation_id} is {evaluation.get_decision_display().lower()}, "
                       "not awaiting approval")
    return evaluation


def approve_evaluation(evaluation_id: int, *, actor) -> PromotionEvaluation:
    """Approve an evaluation awaiting approval: the target alias moves to the evaluated candidate version.

    Args:
        evaluation_id: the evaluation.
        actor: the approving user (callers check they are staff).

    Raises:
        NotFound: no such evaluation.
        Conflict: it is not awaiting approval, or the target alias moved since it was evaluated
            (its gates compared against another version: run the policy again).
    """
    with transaction.atomic():
        evaluation = _awaiting(evaluation_id)
        policy = evaluation.policy
        now = _alias_version(policy.model, policy.target_alias)
        if getattr(now, "pk", None) != evaluation.target_version_id:
            raise Conflict(f"@{policy.target_alias} moved since this evaluation; run the policy again")
        if evaluation.candidate_version is None:
            raise Conflict("the candidate version was deleted since this evaluation")
        if (evaluation.metrics or {}).get("ramp"):
            step = evaluation.metrics["ramp"]
            what = (f"promoted the canary (rollout {step['deployment']})" if step["to"] >= 100
                    else f"moved the canary (rollout {step['deployment']}) to {step['to']:g} %")
            _ramp_step(evaluation, summary=f"{evaluation.reason}; approved by {actor.username}", what=what,
                       fields={}, approved_by=actor)
            return evaluation
        _finish(evaluation, Decision.APPROVED,
                f"{evaluation.reason}; approved by {actor.username}", actor=actor)
        try:
            _promote(evaluation, approved_by=actor)
        except PreconditionFailed as exc:  # moved between the check above and the model's lock
            raise Conflict(exc.message) from exc
    return evaluation


def reject_evaluation(evaluation_id: int, *, actor, reason: str = "") -> PromotionEvaluation:
    """Reject an evaluation awaiting approval; nothing moves.

    Raises:
        NotFound: no such evaluation.
        Conflict: it is not awaiting approval.
    """
    with transaction.atomic():
        evaluation = _awaiting(evaluation_id)
        why = f"rejected by {actor.username}" + (f": {reason.strip()[:1000]}" if reason.strip() else "")
        _finish(evaluation, Decision.REJECTED, why, actor=actor)
    return evaluation


def is_final(evaluation: PromotionEvaluation) -> bool:
    """True when nothing more will happen to the evaluation (CI may stop polling)."""
    return evaluation.decision in FINAL_DECISIONS
