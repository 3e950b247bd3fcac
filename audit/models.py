"""The audit log: one row per change to the registry or the fleet, written in the change's transaction."""

from django.conf import settings
from django.db import models

from audit.choices import AuditAction
from audit.display import detail_items


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

    # The fields of ``data`` that name the object as users know it, per object type (first one found).
    LABEL_FIELDS = {"version": ("version",), "alias": ("alias",), "host": ("name", "host"), "team": ("team",),
                    "model": ("name",), "token": ("name",), "inference_key": ("name",), "upload": ("filename",),
                    "webhook": ("url",)}
    # Object types whose id is the name users know (the rollout page's number, the bucket's name).
    NAMED_BY_ID = frozenset({"deployment", "bucket"})

    @property
    def object_label(self) -> str:
        """The object as users name it: ``model iris``, ``version v3``, ``alias production``, ``host gpu-0``,
        ``deployment 12``; ``<type> #<row id>`` only when the event recorded no name."""
        if self.object_type == "model" and self.model_id is not None:
            return f"model {self.model.name}"
        if self.object_type in self.NAMED_BY_ID:
            return f"{self.object_type} {self.object_id}"
        data = self.data if isinstance(self.data, dict) else {}
        for field in self.LABEL_FIELDS.get(self.object_type, ()):
            value = data.get(field)
            if value is not None and not isinstance(value, dict | list):
                return f"{self.object_type} {'v' if self.object_type == 'version' else ''}{value}"
        return f"{self.object_type} #{self.object_id}"

    @property
    def detail_items(self) -> list[tuple[str, str]]:
        """``data`` as (label, text) pairs for people; see :func:`audit.display.detail_items`."""
        return detail_items(self.data)
