"""Aliases of a registered model: resolve one, point one at a version, remove it, lock or unlock it.

Every move and removal happens under the model's row lock (serialised with ``registry.deletion``), is
audited with the version it left, and sends ``registry.signals.alias_moved`` inside the transaction.
"""

from collections.abc import Callable

from django.db import transaction

from accounts.access import Action, Principal, require
from audit.choices import AuditAction
from audit.services import acting_user, record_audit_event
from modelyard.errors import Conflict, Forbidden, InvalidInput, NotFound
from modelyard_agent.formats.names import RESERVED_ALIASES, InvalidName, validate_alias
from registry.choices import VersionStatus
from registry.models import Alias, ModelVersion, RegisteredModel
from registry.registered_models import get_model
from registry.signals import alias_moved
from registry.versions import get_version


def resolve_alias(model_name: str, alias: str) -> ModelVersion:
    """Return the version an alias of ``model_name`` points at; ``latest`` is the newest live version.

    Raises:
        NotFound: no such model, alias, or (for ``latest``) no version yet.
    """
    model = get_model(model_name)
    live = model.versions.exclude(status=VersionStatus.DELETED)
    if alias in RESERVED_ALIASES:
        version = live.order_by("-version").first()
        if version is None:
            raise NotFound(f"model {model_name!r} has no version yet")
        return version
    try:
        return live.get(aliases__name=alias)
    except ModelVersion.DoesNotExist as exc:
        raise NotFound(f"model {model_name!r} has no alias {alias!r}") from exc


def current_alias(model: RegisteredModel, name: str) -> Alias | None:
    """The alias ``name`` of ``model`` with its version, or None."""
    return Alias.objects.filter(model=model, name=name).select_related("version").first()


REASON_MAX_LENGTH = 1000


def _clean_reason(reason) -> str:
    reason = (reason or "").strip()
    if len(reason) > REASON_MAX_LENGTH:
        raise InvalidInput(f"the reason must be at most {REASON_MAX_LENGTH} characters; it has {len(reason)}")
    return reason


def alias_is_protected(model: RegisteredModel, alias: str | None) -> bool:
    """True when ``model`` has an alias called ``alias`` and it is protected (locked)."""
    return bool(alias) and Alias.objects.filter(model=model, name=alias, protected=True).exists()


def set_alias(*, model_name: str, alias: str, version: int, actor=None, audit_data: dict | None = None,
              reason: str = "", owner=None, precondition: Callable[[Alias | None], None] | None = None) -> Alias:
    """Point ``alias`` of a model at one of its versions, creating or moving it.

    Idempotent: setting an alias to the version it already names writes nothing.
    The model row is locked, so two concurrent moves are serialised and each
    audit event's ``from`` is the version the alias really left. A protected alias moves only
    when an owner of the model's team decides it and gives a reason; both are in the audit event
    (``owner``, ``reason``, ``protected``).

    Args:
        model_name: the registered model.
        alias: the alias name (``modelyard_agent.formats.names.validate_alias``).
        version: the version number to point at.
        actor: the requesting user, or an object with ``username`` (and ``is_authenticated``
            False) naming an automated actor such as a promotion policy.
        audit_data: extra JSON details for the audit event (e.g. the promotion policy that moved it).
        reason: why the alias moves (at most 1000 characters); required for a protected alias.
        owner: the user who decided the move of a protected alias when ``actor`` is an automated
            actor (the owner approving a promotion); default ``actor``.
        precondition: called under the model's row lock with the alias as it is then (None when it
            does not exist yet), before anything is written: a compare-and-set raises
            ``PreconditionFailed`` from it when the alias is no longer what the caller saw (an API
            client's ``If-Match``, the version a promotion judged against).

    Returns:
        The Alias row.

    Raises:
        PreconditionFailed: ``precondition`` refused the alias's current state; nothing changed.
        InvalidInput: bad or reserved alias name; a protected alias without a reason.
        Forbidden: the alias is protected and the deciding user is not an owner of the model's team.
        NotFound: no such model or version.
        Conflict: the version is CORRUPT (an alias followed by deployments must not name it).
    """
    try:
        name = validate_alias(alias)
    except InvalidName as exc:
        raise InvalidInput(str(exc)) from exc
    reason = _clean_reason(reason)
    target = get_version(model_name, version)
    with transaction.atomic():
        model = RegisteredModel.objects.select_for_update().get(pk=target.model_id)
        # delete_version holds the same lock: a version deleted since get_version is not pointed at.
        status = ModelVersion.objects.filter(pk=target.pk).values_list("status", flat=True).first()
        if status in (None, VersionStatus.DELETED):
            raise NotFound(f"model {model_name!r} has no version {version}")
        if status == VersionStatus.CORRUPT:
            raise Conflict(f"{model_name} v{version} is corrupt (its stored bytes do not match its sha256); "
                           "an alias cannot name it")
        current = current_alias(model, name)
        if precondition is not None:
            precondition(current)
        if current is not None and current.version_id == target.pk:
            return current
        details = dict(audit_data or {})
        if current is not None and current.protected:
            decider = owner if owner is not None else actor
            if not getattr(decider, "is_authenticated", False):  # an automated actor: a policy, the system
                raise Forbidden(f"@{name} is protected: only an owner of team '{model.team.name}' moves it")
            require(Principal.of(decider), Action.MOVE_ALIAS, model=model, alias=name, protected=True)
            if not reason:
                raise InvalidInput(f"@{name} is protected: moving it needs a reason")
            details.update(protected=True, owner=getattr(decider, "username", None))
        if reason:
            details["reason"] = reason
        previous = current.version.version if current is not None else None
        if current is None:
            current = Alias.objects.create(model=model, name=name, version=target, updated_by=acting_user(actor))
        else:
            current.version = target
            current.updated_by = acting_user(actor)
            current.save(update_fields=["version", "updated_by", "updated_at"])
        record_audit_event(
            action=AuditAction.ALIAS_SET, actor=actor, obj_type="alias", obj_id=current.pk, model=model,
            data={**details, "alias": name, "from": previous, "to": target.version},
        )
        alias_moved.send(sender=Alias, model=model, alias=name, version=target, previous=previous, reason=reason,
                         actor=actor)
    return current


def delete_alias(*, model_name: str, alias: str, actor=None,
                 precondition: Callable[[Alias | None], None] | None = None) -> None:
    """Remove an alias from a model (the versions are untouched).

    ``precondition``, as ``set_alias``'s, runs under the model's row lock with the alias as it is then.

    Raises:
        PreconditionFailed: ``precondition`` refused the alias's current state; nothing changed.
        NotFound: no such model or alias.
        Conflict: the alias is protected (an owner unlocks it first).
    """
    model = get_model(model_name)
    with transaction.atomic():
        RegisteredModel.objects.select_for_update().get(pk=model.pk)
        current = current_alias(model, alias)
        if current is None:
            raise NotFound(f"model {model_name!r} has no alias {alias!r}")
        if precondition is not None:
            precondition(current)
        if current.protected:
            raise Conflict(f"@{alias} is protected: an owner of team '{model.team.name}' unlocks it before it "
                           "can be deleted")
        record_audit_event(
            action=AuditAction.ALIAS_DELETED, actor=actor, obj_type="alias", obj_id=current.pk, model=model,
            data={"alias": alias, "from": current.version.version, "to": None},
        )
        current.delete()


def protect_alias(*, model_name: str, alias: str, protected: bool, actor, reason: str = "",
                  precondition: Callable[[Alias | None], None] | None = None) -> Alias:
    """Lock (``protected=True``) or unlock an alias; audited as ``alias.protected`` with the reason.

    Idempotent: locking a locked alias (or unlocking an unlocked one) writes nothing.

    Args:
        model_name: the registered model.
        alias: an existing alias of it.
        protected: the new state.
        actor: the requesting user or ``accounts.access.Principal``; an owner of the model's team.
        reason: why (optional, at most 1000 characters).
        precondition: as ``set_alias``'s, under the model's row lock.

    Returns:
        The Alias row.

    Raises:
        PreconditionFailed: ``precondition`` refused the alias's current state; nothing changed.
        NotFound: no such model or alias.
        Forbidden: the actor is not an owner of the model's team.
        InvalidInput: the reason is too long.
    """
    model = get_model(model_name)
    reason = _clean_reason(reason)
    principal = Principal.of(actor)
    require(principal, Action.PROTECT_ALIAS, model=model, alias=alias)
    with transaction.atomic():
        RegisteredModel.objects.select_for_update().get(pk=model.pk)
        current = current_alias(model, alias)
        if current is None:
            raise NotFound(f"model {model_name!r} has no alias {alias!r}")
        if precondition is not None:
            precondition(current)
        if current.protected == bool(protected):
            return current
        current.protected = bool(protected)
        current.save(update_fields=["protected", "updated_at"])
        record_audit_event(
            action=AuditAction.ALIAS_PROTECTED, actor=principal.user, obj_type="alias", obj_id=current.pk,
            model=model, data={"alias": alias, "protected": current.protected, "version": current.version.version,
                               **({"reason": reason} if reason else {})},
        )
    return current
