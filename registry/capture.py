"""Request capture settings of a registered model: the one service that changes them.

Per model, the Triton hosts that serve it may keep a sampled share of its real client infer requests
(``fraction``, 0 = off, the default), up to ``max_bytes`` bytes per host, for ``retention_seconds``; the
replay gate of a promotion replays them against a candidate. Captured requests hold users' data, so only
owners of the model's team change the settings (``Action.MANAGE_CAPTURE``), every change is audited
(``model.capture_settings`` with the settings before and after), and the bounds are capped by settings
(``MODELYARD_CAPTURE_MAX_BYTES_LIMIT`` bytes, ``MODELYARD_CAPTURE_MAX_RETENTION_SECONDS``). The deployments
app carries a change to the hosts (``registry.signals.capture_changed``; its ROUTE tasks).
"""

import math

from django.conf import settings
from django.db import transaction

from accounts.access import Action, Principal, require
from audit.choices import AuditAction
from audit.services import record_audit_event
from modelyard.errors import InvalidInput
from registry.models import RegisteredModel
from registry.registered_models import get_model
from registry.signals import capture_changed

MIN_RETENTION_SECONDS = 3600  # the gateway writes one file per hour: a shorter retention could not be kept


def capture_settings(model: RegisteredModel) -> dict:
    """``{"fraction" (0-1), "max_bytes" (bytes per host), "retention_seconds"}`` of ``model``."""
    return {"fraction": model.capture_fraction, "max_bytes": model.capture_max_bytes,
            "retention_seconds": model.capture_retention_seconds}


def check_capture_settings(*, fraction, max_bytes, retention_seconds) -> dict:
    """The capture settings, checked.

    Args:
        fraction: the share of client infer requests captured, a number from 0 (off) to 1.
        max_bytes: the most bytes of captured requests a host keeps, a whole number from 1 to
            ``MODELYARD_CAPTURE_MAX_BYTES_LIMIT``.
        retention_seconds: how long a captured request is kept, a whole number of seconds from
            ``MIN_RETENTION_SECONDS`` (1 hour) to ``MODELYARD_CAPTURE_MAX_RETENTION_SECONDS``.

    Returns:
        ``{"fraction": float, "max_bytes": int, "retention_seconds": int}``.

    Raises:
        InvalidInput: a value of the wrong type or out of its range (the message names the field and the range).
    """
    if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not math.isfinite(fraction) \
            or not 0 <= fraction <= 1:
        raise InvalidInput(f"fraction must be a number from 0 to 1 (0 turns capture off), got {fraction!r}")
    limit = settings.MODELYARD_CAPTURE_MAX_BYTES_LIMIT
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or not 1 <= max_bytes <= limit:
        raise InvalidInput(f"max_bytes must be a whole number of bytes from 1 to {limit} "
                           f"(MODELYARD_CAPTURE_MAX_BYTES_LIMIT), got {max_bytes!r}")
    longest = settings.MODELYARD_CAPTURE_MAX_RETENTION_SECONDS
    if isinstance(retention_seconds, bool) or not isinstance(retention_seconds, int) \
            or not MIN_RETENTION_SECONDS <= retention_seconds <= longest:
        raise InvalidInput(f"retention_seconds must be a whole number of seconds from {MIN_RETENTION_SECONDS} to "
                           f"{longest} (MODELYARD_CAPTURE_MAX_RETENTION_SECONDS), got {retention_seconds!r}")
    return {"fraction": float(fraction), "max_bytes": max_bytes, "retention_seconds": retention_seconds}


def set_capture(*, model_name: str, actor, fraction=None, max_bytes=None,
                retention_seconds=None) -> tuple[RegisteredModel, list[str]]:
    """Change ``model_name``'s request capture settings; None leaves a setting as it is.

    A change is audited (``model.capture_settings``, ``{"from": settings, "to": settings}``) and sent to
    every Triton host whose gateway serves the model (by the deployments app, on commit). Setting what is
    already set writes nothing and sends nothing.

    Args:
        model_name: the registered model.
        actor: the requesting user or ``accounts.access.Principal``: an owner of the model's team.
        fraction, max_bytes, retention_seconds: as ``check_capture_settings``.

    Returns:
        (the model, warnings): each warning names a host the settings cannot reach now (an agent older than
        the capture protocol, no live gateway); the settings are saved all the same.

    Raises:
        NotFound: no such model.
        Forbidden: the actor is not an owner of the model's team.
        InvalidInput: a setting out of range, or none given.
    """
    if fraction is None and max_bytes is None and retention_seconds is None:
        raise InvalidInput("give fraction, max_bytes, retention_seconds or several")
    model = get_model(model_name)
    principal = Principal.of(actor)
    require(principal, Action.MANAGE_CAPTURE, model=model)
    with transaction.atomic():
        model = RegisteredModel.objects.select_for_update().get(pk=model.pk)
        before = capture_settings(model)
        after = check_capture_settings(
            fraction=before["fraction"] if fraction is None else fraction,
            max_bytes=before["max_bytes"] if max_bytes is None else max_bytes,
            retention_seconds=before["retention_seconds"] if retention_seconds is None else retention_seconds)
        if after == before:
            return model, []
        model.capture_fraction = after["fraction"]
        model.capture_max_bytes = after["max_bytes"]
        model.capture_retention_seconds = after["retention_seconds"]
        model.save(update_fields=["capture_fraction", "capture_max_bytes", "capture_retention_seconds",
                                  "updated_at"])
        record_audit_event(action=AuditAction.CAPTURE_SETTINGS, actor=principal.user, obj_type="model",
                           obj_id=model.pk, model=model, data={"from": before, "to": after})
        answers = capture_changed.send(sender=RegisteredModel, model=model, before=before, after=after,
                                       actor=principal.user)
    warnings = [warning for _, found in answers for warning in (found or [])]
    return model, warnings
