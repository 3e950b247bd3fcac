"""Deleting a model version: who may, what keeps a version from going, and the soft delete itself.

The artifact stays in S3 until ``registry.gc`` finds no live version referencing it.
"""

import logging
from collections.abc import Callable

from django.db import transaction
from django.utils import timezone

from accounts.access import Action, Principal, check, require
from audit.choices import AuditAction
from audit.services import acting_user, record_audit_event
from modelyard.errors import Conflict, NotFound
from registry.choices import VersionStatus
from registry.models import ModelVersion, RegisteredModel
from registry.registered_models import get_model
from registry.signals import version_deleted, version_deletion_check

logger = logging.getLogger(__name__)


def may_delete_version(version: ModelVersion, actor) -> bool:
    """True when ``actor`` (a user or an ``accounts.access.Principal``) may delete ``version``: an owner
    of the model's team, or the maintainer who registered it (see ``accounts.access``)."""
    return check(Principal.of(actor), Action.DELETE_VERSION, model=version.model, version=version) is None


def _version_in_use(version: ModelVersion) -> list[str]:
    """What keeps ``version`` from being deleted: live ensembles composing it, and whatever the
    receivers of ``registry.signals.version_deletion_check`` name (the deployments app: hosts that
    serve it or are deploying it). Returns one phrase per reason."""
    reasons = []
    ensembles = (
        version.used_by.exclude(ensemble__status=VersionStatus.DELETED)
        .select_related("ensemble__model").order_by("ensemble__model__name", "ensemble__version")
    )
    names = [f"{m.ensemble.model.name} v{m.ensemble.version}" for m in ensembles]
    if names:
        reasons.append(f"ensemble version(s) {', '.join(names)} compose it")
    for _, found in version_deletion_check.send(sender=ModelVersion, version=version):
        reasons.extend(found)
    return reasons


def delete_version(*, model_name: str, version: int, actor=None,
                   precondition: Callable[[ModelVersion], None] | None = None) -> ModelVersion:
    """Soft-delete a model version: status DELETED, its aliases removed, all in one transaction.

    The number is never given out again (``RegisteredModel.next_version`` only grows); the artifact
    stays in S3 until ``registry.gc.collect_garbage`` finds no live version referencing it. Audited:
    one ``alias.deleted`` event per removed alias (``from`` the version) and one ``version.deleted``.

    Args:
        model_name: the registered model.
        version: the version number.
        actor: the requesting user or ``accounts.access.Principal``; an owner of the model's team or
            the maintainer who registered the version.
        precondition: called under the model's and the version's row locks with the version as it is
            then, before anything is written; raises ``PreconditionFailed`` to refuse (an API client's
            ``If-Match``).

    Returns:
        The version row, now DELETED.

    Raises:
        PreconditionFailed: ``precondition`` refused the version's current state; nothing changed.
        NotFound: no such model, or no live version with that number (deleting twice is a 404).
        Forbidden: the actor is neither an owner of the model's team nor the maintainer who registered it.
        Conflict: a live ensemble version composes it, or a host serves it or is deploying it
            (the message names them).
    """
    model = get_model(model_name)
    with transaction.atomic():
        # The model lock serialises this with set_alias; the version lock with start_deployment.
        RegisteredModel.objects.select_for_update().get(pk=model.pk)
        row = (
            ModelVersion.objects.select_for_update().filter(model=model, version=version)
            .exclude(status=VersionStatus.DELETED).first()
        )
        if row is None:
            raise NotFound(f"model {model_name!r} has no version {version}")
        require(Principal.of(actor), Action.DELETE_VERSION, model=model, version=row)
        if precondition is not None:
            precondition(row)
        reasons = _version_in_use(row)
        locked = [f"@{a}" for a in row.aliases.filter(protected=True).order_by("name").values_list("name", flat=True)]
        if locked:
            reasons.append(f"the protected alias {', '.join(locked)} names it (an owner moves or unlocks it first)")
        if reasons:
            raise Conflict(f"{model_name} v{version} cannot be deleted: {'; '.join(reasons)}")
        for alias in row.aliases.order_by("name"):
            record_audit_event(
                action=AuditAction.ALIAS_DELETED, actor=actor, obj_type="alias", obj_id=alias.pk, model=model,
                data={"alias": alias.name, "from": version, "to": None, "reason": "version deleted"},
            )
        row.aliases.all().delete()
        row.status = VersionStatus.DELETED
        row.deleted_at = timezone.now()
        row.deleted_by = acting_user(actor)
        row.save(update_fields=["status", "deleted_at", "deleted_by"])
        record_audit_event(
            action=AuditAction.VERSION_DELETED, actor=actor, obj_type="version", obj_id=row.pk, model=model,
            data={"version": version, "sha256": row.artifact_sha256},
        )
        version_deleted.send(sender=ModelVersion, model=model, version=row, actor=actor)
    logger.info("deleted %s v%s", model_name, version)
    return row
