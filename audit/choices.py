"""What an audit event records."""

from django.db import models


class AuditAction(models.TextChoices):
    """What an audit event records."""

    MODEL_CREATED = "model.created", "Model created"
    MODEL_UPDATED = "model.updated", "Model description or tags changed"
    VERSION_REGISTERED = "version.registered", "Version registered"
    VERSION_DELETED = "version.deleted", "Version deleted"
    CARD_UPDATED = "version.card_updated", "Model card edited"
    UPLOAD_STARTED = "upload.started", "Multipart upload started"
    UPLOAD_ABORTED = "upload.aborted", "Multipart upload aborted"
    ARTIFACTS_COLLECTED = "artifacts.collected", "Unreferenced artifacts removed"
    ALIAS_SET = "alias.set", "Alias set or moved"
    ALIAS_DELETED = "alias.deleted", "Alias deleted"
    ALIAS_PROTECTED = "alias.protected", "Alias locked or unlocked"
    HOST_REGISTERED = "host.registered", "Serving host registered"
    HOST_DELETED = "host.deleted", "Serving host deleted"
    HOST_UPDATED = "host.updated", "Serving host changed"
    DEPLOYMENT_CREATED = "deployment.created", "Deployment created"
    DEPLOYMENT_CHANGED = "deployment.changed", "Rollout paused, resumed, cancelled or rolled back"
    MODEL_UNLOADED = "host_model.unloaded", "Model unloaded from a host"
    MODEL_RELOADED = "host_model.reloaded", "Model reloaded on a host"
    TOKEN_CREATED = "token.created", "API token created"
    TOKEN_REVOKED = "token.revoked", "API token revoked"
    TEAM_CREATED = "team.created", "Team created"
    TEAM_DELETED = "team.deleted", "Team deleted"
    MEMBERSHIP_SET = "membership.set", "Team role given"
    MEMBERSHIP_REMOVED = "membership.removed", "Team role taken away"
