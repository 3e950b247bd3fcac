from django.apps import AppConfig


class AuditConfig(AppConfig):
    """The audit log that every app writes to (``audit.services.record_audit_event``)."""

    name = "audit"
    default_auto_field = "django.db.models.BigAutoField"
