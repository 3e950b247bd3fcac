"""Promotion policies: create, edit, pause and run them; evaluate, approve and reject.

An evaluation reads the candidate's metrics from Prometheus (``monitoring.services``), judges
them (``promotions.gates``) and, when every gate passes, moves the target alias to the candidate's
version with ``registry.aliases.set_alias``, recorded as done by ``policy:<id>``; deployments
that follow the target alias then roll out by themselves. Failing, erring or dry runs change no
alias. Every evaluation is a ``PromotionEvaluation`` row with the metrics it saw.

The schedule is a django-celery-beat ``PeriodicTask`` with a ``CrontabSchedule``, written here in
the same transaction as the policy: beat's database scheduler notices the change and uses it
without a restart.
"""

import json
from dataclasses import dataclass

from celery.schedules import crontab
from django.db import IntegrityError, transaction
from django.utils import timezone
from django_celery_beat.models import CrontabSchedule, PeriodicTask

from audit.services import acting_user
from deployments.choices import ReplayStatus
from deployments.models import Replay
from deployments.profiles import profile_comparison
from deployments.replays import latest_replay, start_replay
from modelyard.celery import require_broker
from modelyard.errors import Conflict, DomainError, InvalidInput, NotFound, ServiceUnavailable
from modelyard_agent.formats.names import InvalidName, validate_alias
from monitoring.services import version_gate_metrics
from promotions import gates, ramps
from promotions.choices import FINAL_DECISIONS, Decision, EvaluationTrigger, WebhookEvent
from promotions.enqueue import Job, job
from promotions.models import PromotionEvaluation, PromotionPolicy
from promotions.webhooks import emit
from registry.aliases import alias_is_protected, set_alias
from registry.models import Alias
from registry.registered_models import get_model

EVALUATE_TASK = Job.EVALUATE_POLICY.value
MIN_WINDOW_SECONDS = 60
MAX_WINDOW_SECONDS = 7 * 86400
POLICY_NAME_MAX_LENGTH = PromotionPolicy._meta.get_field("name").max_length
EDITABLE = ("name", "candidate_alias", "target_alias", "schedule", "window_seconds", "min_requests", "max_p95_ms",
            "max_error_rate", "max_regression", "max_profile_regression", "min_agreement", "max_latency_regression",
            "replay_atol", "replay_rtol", "replay_argmax_outputs", "replay_max_requests", "replay_pace",
            "ramp_steps", "ramp_on_failure", "requires_approval", "dry_run", "enabled")
REPLAY_DEFAULTS = {"min_agreement": None, "max_latency_regression": None, "replay_atol": 1e-5, "replay_rtol": 1e-3,
                   "replay_argmax_outputs": [], "replay_max_requests": 1000, "replay_pace": 20.0}
MIN_REPLAY_PACE, MAX_REPLAY_PACE = 1.0, 1000.0  # captured requests per second


@dataclass(frozen=True)
class PolicyActor:
    """The actor a policy's promotion is recorded under: not a user (no row), named ``policy:<id>``."""

    username: str
    is_authenticated: bool = False
    pk: None = None


def _alias(value, field: str) -> str:
    try:
        return validate_alias(value or "")
    except InvalidName as exc:
        raise InvalidInput(f"{field}: {exc}") from exc


def _cron_fields(text: str) -> list[str]:
    fields = (text or "").split()
    if len(fields) != 5:
        raise InvalidInput(f"schedule must be a crontab of five fields (minute hour day month weekday), got {text!r}")
    try:
        crontab(minute=fields[0], hour=fields[1], day_of_month=fields[2], month_of_year=fields[3],
                day_of_week=fields[4])
    except (ValueError, KeyError) as exc:
        raise InvalidInput(f"schedule {text!r} is not a valid crontab: {exc}") from exc
    return fields


def _number(value, field: str, *, low: float, high: float | None = None, integer: bool = False):
    if value is None:
        return None
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or value < low or (high is not None and value > high):
        bounds = f"from {low} to {high}" if high is not None else f"of at least {low}"
        raise InvalidInput(f"{field} must be {'a whole number' if integer else 'a number'} {bounds}, or empty")
    return value


def _check(fields: dict) -> dict:
    """Check and normalise a policy's fields; raises InvalidInput naming the field."""
    clean = dict(fields)
    clean["candidate_alias"] = _alias(fields["candidate_alias"], "candidate_alias")
    clean["target_alias"] = _alias(fields["target_alias"], "target_alias")
    if clean["candidate_alias"] == clean["target_alias"]:
        raise InvalidInput("candidate_alias and target_alias must differ")
    clean["schedule"] = " ".join(_cron_fields(fields["schedule"]))
    if _number(fields["window_seconds"], "window_seconds", low=MIN_WINDOW_SECONDS, high=MAX_WINDOW_SECONDS,
               integer=True) is None:
        raise InvalidInput("window_seconds is required")
    _number(fields["min_requests"], "min_requests", low=0, integer=True)
    _number(fields["max_p95_ms"], "max_p95_ms", low=0)
    _number(fields["max_error_rate"], "max_error_rate", low=0, high=1)
    _number(fields["max_regression"], "max_regression", low=0)
    _number(fields["max_profile_regression"], "max_profile_regression", low=0, high=1)
    for key, default in REPLAY_DEFAULTS.items():
        clean.setdefault(key, fields.get(key, default))
    _number(clean["min_agreement"], "min_agreement", low=0, high=1)
    _number(clean["max_latency_regression"], "max_latency_regression", low=0)
    for key in ("replay_atol", "replay_rtol"):
        if _number(clean[key], key, low=0) is None:
            raise InvalidInput(f"{key} must be a number of at least 0")
    if _number(clean["replay_max_requests"], "replay_max_requests", low=1, high=100_000, integer=True) is None:
        raise InvalidInput("replay_max_requests must be a whole number from 1 to 100000")
    pace = clean["replay_pace"]
    if isinstance(pace, bool) or not isinstance(pace, int | float) or not MIN_REPLAY_PACE <= pace <= MAX_REPLAY_PACE:
        raise InvalidInput(f"replay_pace must be a number of requests per second from {MIN_REPLAY_PACE:g} to "
                           f"{MAX_REPLAY_PACE:g}; got {pace!r}")
    clean["replay_pace"] = float(clean["replay_pace"])
    names = clean["replay_argmax_outputs"]
    if not isinstance(names, list) or not all(isinstance(n, str) and n.strip() for n in names):
        raise InvalidInput("replay_argmax_outputs must be a list of output names")
    clean["replay_argmax_outputs"] = sorted({n.strip() for n in names})
    clean["ramp_steps"] = ramps.check_ramp_steps(fields.get("ramp_steps"))
    clean["ramp_on_failure"] = ramps.check_failure_action(fields.get("ramp_on_failure") or "hold")
    for flag in ("requires_approval", "dry_run", "enabled"):
        if not isinstance(fields[flag], bool):
            raise InvalidInput(f"{flag} must be true or false")
    clean["name"] = str(fields.get("name") or "")
    if len(clean["name"]) > POLICY_NAME_MAX_LENGTH:
        raise InvalidInput(f"name must be at most {POLICY_NAME_MAX_LENGTH} characters; it has {len(clean['name'])}")
    return clean


def _sync_schedule(policy: PromotionPolicy) -> None:
    """Write the policy's PeriodicTask (crontab, enabled) so that beat follows the edit."""
    minute, hour, day, month, weekday = policy.schedule.split()
    schedule = CrontabSchedule.objects.filter(
        minute=minute, hour=hour, day_of_month=day, month_of_year=month, day_of_week=weekday, timezone="UTC"
    ).first() or CrontabSchedule.objects.create(
        minute=minute, hour=hour, day_of_month=day, month_of_year=month, day_of_week=weekday, timezone="UTC"
    )
    task = policy.periodic_task or PeriodicTask(name=f"promotion-policy-{policy.pk}")
    task.task = EVALUATE_TASK
    task.crontab, task.interval = schedule, None
    task.args = json.dumps([policy.pk])
    task.enabled = policy.enabled
    task.description = str(policy)
    task.save()
    if policy.periodic_task_id != task.pk:
        policy.periodic_task = task
        PromotionPolicy.objects.filter(pk=policy.pk).update(periodic_task=task)


def get_policy(policy_id: int) -> PromotionPolicy:
    """The policy with that id. Raises NotFound."""
    try:
        return PromotionPolicy.objects.select_related("model", "periodic_task").get(pk=policy_id)
    except PromotionPolicy.DoesNotExist as exc:
        raise NotFound(f"no promotion policy {policy_id}") from exc


def get_evaluation(evaluation_id: int) -> PromotionEvaluation:
    """The evaluation with that id, with its policy and model. Raises NotFound."""
    try:
        return PromotionEvaluation.objects.select_related("policy__model").get(pk=evaluation_id)
    except PromotionEvaluation.DoesNotExist as exc:
        raise NotFound(f"no promotion evaluation {evaluation_id}") from exc


def create_policy(*, model_name: str, candidate_alias: str, target_alias: str, schedule: str = "*/15 * * * *",
                  window_seconds: int = 900, min_requests: int | None = 100, max_p95_ms: float | None = None,
                  max_error_rate: float | None = None, max_regression: float | None = None,
                  max_profile_regression: float | None = None, requires_approval: bool = False, dry_run: bool = False,
                  enabled: bool = True, name: str = "", ramp_steps: list | None = None, ramp_on_failure: str = "hold",
                  actor=None, **replay) -> PromotionPolicy:
    """Create a promotion policy and its schedule.

    Args:
        model_name: the registered model.
        candidate_alias, target_alias: alias names (different); the candidate's version is promoted
            to the target.
        schedule: a five-field crontab in UTC, e.g. ``*/15 * * * *``.
        window_seconds: how far back the gates look, 60 s to 7 days.
        min_requests, max_p95_ms (ms), max_error_rate (0..1), max_regression (relative),
            max_profile_regression (relative, 0..1): the gates; None switches one off (see
            ``PromotionPolicy``).
        replay: the replay gates and their settings, each optional: ``min_agreement`` (0..1),
            ``max_latency_regression`` (relative), ``replay_atol``, ``replay_rtol`` (at least 0),
            ``replay_argmax_outputs`` (output names), ``replay_max_requests`` (1..100000),
            ``replay_pace`` (captured requests per second of the replays it starts, 1..1000; default 20).
        ramp_steps, ramp_on_failure: a progressive rollout (``promotions.ramps``); empty: none.
        requires_approval, dry_run, enabled: see ``PromotionPolicy``.
        name: a label for people.
        actor: the requesting user (callers check they are staff).

    Returns:
        The new policy, its PeriodicTask written.

    Raises:
        NotFound: no such model.
        InvalidInput: a field is invalid.
        Conflict: the model already has a policy from that candidate alias to that target alias.
    """
    model = get_model(model_name)
    unknown = set(replay) - set(REPLAY_DEFAULTS)
    if unknown:
        raise InvalidInput(f"unknown policy field(s) {', '.join(sorted(unknown))}")
    fields = _check({**REPLAY_DEFAULTS, **replay,
        "name": name, "candidate_alias": candidate_alias, "target_alias": target_alias, "schedule": schedule,
        "window_seconds": window_seconds, "min_requests": min_requests, "max_p95_ms": max_p95_ms,
        "max_error_rate": max_error_rate, "max_regression": max_regression,
        "max_profile_regression": max_profile_regression, "requires_approval": requires_approval,
        "dry_run": dry_run, "enabled": enabled, "ramp_steps": ramp_steps, "ramp_on_failure": ramp_on_failure,
    })
    try:
        with transaction.atomic():
            policy = PromotionPolicy.objects.create(model=model, created_by=acting_user(actor), **fields)
            _sync_schedule(policy)
    except IntegrityError as exc:
        raise Conflict(f"{model.name} already has a policy from @{fields['candidate_alias']} "
                       f"to @{fields['target_alias']}") from exc
    return policy


def update_policy(policy_id: int, *, actor=None, **changes) -> PromotionPolicy:
    """Change some of a policy's fields (those of ``create_policy`` but the model); the schedule
    follows at once.

    Raises:
        NotFound: no such policy.
        InvalidInput: an unknown or invalid field.
        Conflict: the new aliases clash with another policy of the model.
    """
    unknown = set(changes) - set(EDITABLE)
    if unknown:
        raise InvalidInput(f"cannot change {', '.join(sorted(unknown))}")
    try:
        with transaction.atomic():
            policy = PromotionPolicy.objects.select_for_update(of=("self",)).select_related(
                "model", "periodic_task").filter(pk=policy_id).first()
            if policy is None:
                raise NotFound(f"no promotion policy {policy_id}")
            fields = _check({**{f: getattr(policy, f) for f in EDITABLE}, **changes})
            for key, value in fields.items():
                setattr(policy, key, value)
            policy.save()
            _sync_schedule(policy)
    except IntegrityError as exc:
        raise Conflict("the model already has a policy between those aliases") from exc
    return policy


def set_policy_enabled(policy_id: int, enabled: bool, *, actor=None) -> PromotionPolicy:
    """Pause (False) or resume (True) a policy's schedule; idempotent. Run-now still works while paused.

    Raises:
        NotFound: no such policy.
    """
    return update_policy(policy_id, enabled=enabled, actor=actor)


def delete_policy(policy_id: int, *, actor=None) -> None:
    """Delete a policy, its schedule and its evaluations.

    Raises:
        NotFound: no such policy.
    """
    with transaction.atomic():
        policy = get_policy(policy_id)
        task = policy.periodic_task
        policy.delete()
        if task is not None:
            task.delete()


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
    """Move the target alias to the candidate version; inside a transaction holding the evaluation's lock."""
    policy = evaluation.policy
    data = {"policy": policy.pk, "evaluation": evaluation.pk}
    if approved_by is not None:
        data["approved_by"] = approved_by.username
    set_alias(model_name=policy.model.name, alias=policy.target_alias, version=evaluation.candidate_version.version,
              actor=PolicyActor(policy.actor_label), audit_data=data, owner=approved_by,
              reason=f"promotion policy {policy.pk}, evaluation {evaluation.pk}: {evaluation.reason}"[:1000])
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
    from datetime import timedelta


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
    return Replay.objects.filter(pk=previous, status=ReplayStatus.FAILED).first()


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
        _promote(evaluation, approved_by=actor)
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
