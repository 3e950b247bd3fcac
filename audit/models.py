"""The audit log: one row per change to the registry or the fleet, written in the change's transaction."""

from django.conf import settings
from django.db import models

from audit.choices import AuditAction


class AuditEvent(models.Model):
    """One change made to the registry or the fleet: who, when, what.

    ``data`` holds the action's details (for example the version number and
    sha256 of a registered version).
    """

    action = models.CharField(max_length=40, choices=AuditAction.choices)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor_label = models.CharField(max_length=150, blank=True)
    model = models.ForeignKey(
        "registry.RegisteredModel", null=True, blank=True, on_delete=models.SET_NULL, related_name="audit_events"
    )
    object_type = models.CharField(max_length=40)
    object_id = models.CharField(max_length=64)
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        db_table = "registry_auditevent"  # the table it had when the registry app held it

    def __str__(self) -> str:
        return f"{self.action} {self.object_type}:{self.object_id}"

    # The field of ``data`` that names the object as users know it, per object type.
    LABEL_FIELDS = {"version": "version", "alias": "alias", "host": "name", "team": "team", "model": "name",
                    "token": "name", "deployment": "deployment"}

    @property
    def object_label(self) -> str:
        """The object as users name it: ``version 3``, ``alias production``, ``host gpu-0``; else
        ``<type> #<row id>``."""
        field = self.LABEL_FIELDS.get(self.object_type)
        value = (self.data or {}).get(field) if field else None
        if value is None or isinstance(value, dict | list):
            return f"{self.object_type} #{self.object_id}"
        return f"{self.object_type} {'v' if self.object_type == 'version' else ''}{value}"
