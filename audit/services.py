"""Writing the audit log; every app records its changes here."""

from audit.models import AuditEvent


def acting_user(actor):
    """The user to record as having made a change: ``actor`` when it is a signed-in user, else None."""
    return actor if getattr(actor, "is_authenticated", False) else None


def record_audit_event(*, action: str, actor, obj_type: str, obj_id, model=None, data=None) -> AuditEvent:
    """Write one audit row for a change; call inside the change's transaction.

    Args:
        action: an ``AuditAction`` value.
        actor: the user who made the change, or None for the system.
        obj_type, obj_id: what changed, e.g. ("version", 12).
        model: the registered model concerned, if any.
        data: JSON-serialisable details.
    """
    return AuditEvent.objects.create(
        action=action,
        actor=acting_user(actor),
        actor_label=getattr(actor, "username", "") or "system",
        model=model,
        object_type=obj_type,
        object_id=str(obj_id),
        data=data or {},
    )
