"""Enumerations of the registry app."""

from django.db import models


class ArtifactFormat(models.TextChoices):
    """How a model version's artifact is laid out."""

    TRITON_MODEL_DIR = "triton", "Triton model directory"


class VersionStatus(models.TextChoices):
    """Lifecycle of a model version.

    A version row is only written once its artifact is stored and verified, so
    the first status a version has is READY; DELETED is a soft delete.
    """

    READY = "ready", "Ready"
    DELETED = "deleted", "Deleted"


class AuditAction(models.TextChoices):
    """What an audit event records."""

    MODEL_CREATED = "model.created", "Model created"
    MODEL_UPDATED = "model.updated", "Model description or tags changed"
    VERSION_REGISTERED = "version.registered", "Version registered"
    ALIAS_SET = "alias.set", "Alias set or moved"
    ALIAS_DELETED = "alias.deleted", "Alias deleted"
    HOST_REGISTERED = "host.registered", "Serving host registered"
    HOST_DELETED = "host.deleted", "Serving host deleted"
    DEPLOYMENT_CREATED = "deployment.created", "Deployment created"
