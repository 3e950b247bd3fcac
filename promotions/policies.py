"""Promotion policies: create, edit, pause and delete them, and read one.

A policy's schedule is a django-celery-beat ``PeriodicTask`` with a ``CrontabSchedule``, written here in
the same transaction as the policy: beat's database scheduler notices the change and uses it without a
restart. What a run of the policy does is ``promotions.evaluations``.
"""

import json

from celery.schedules import crontab
from django.db import IntegrityError, transaction
from django_celery_beat.models import CrontabSchedule, PeriodicTask

from audit.services import acting_user
from modelyard.errors import Conflict, InvalidInput, NotFound
from modelyard_agent.formats.names import InvalidName, validate_alias
from promotions import ramps
from promotions.enqueue import Job
from promotions.models import PromotionPolicy
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
