"""The server's own check of a version's stored bytes, off the upload's critical path.

A version registered from a multipart upload whose parts were checked by their ETags carries the
client's sha256 (``ModelVersion.sha256_verified_at`` None). :func:`verify_version_bytes`, run once
per such version by the ``registry.verify_version_bytes`` task, streams the stored object and
hashes it. When the digest or size differs, :func:`mark_corrupt` makes the version CORRUPT: it is
refused for deployment, flagged on its page, audited (``version.corrupt``) and a ``version.corrupt``
webhook event goes out. Host agents check the same sha256 while they stage a version, so bytes that
do not match are never loaded, whether or not this check has run yet.
"""

import logging
import time

from django.db import transaction
from django.utils import timezone

from audit.choices import AuditAction
from audit.services import record_audit_event
from registry.choices import VersionStatus
from registry.models import ModelVersion
from registry.signals import version_corrupt
from registry.storage import ArtifactStore, StorageError

logger = logging.getLogger(__name__)


def verify_version_bytes(version_id: int, *, store: ArtifactStore | None = None) -> ModelVersion:
    """Hash the stored object of version ``version_id`` and record the outcome.

    Reads the object once, front to back, in constant memory (``ArtifactStore.stream_to``, 8 MiB
    chunks); sets ``sha256_verified_at`` when the sha256 and size (bytes) match, else marks the
    version CORRUPT (:func:`mark_corrupt`).

    Idempotent: a version already verified, CORRUPT or DELETED is returned as it is.

    Raises:
        ModelVersion.DoesNotExist: no such version.
        StorageError: S3 failed while reading (retrying may help); nothing is recorded. A missing
            object (``NoSuchKey``) is not retried: the version is marked CORRUPT.
    """
    version = ModelVersion.objects.select_related("model").get(pk=version_id)
    if version.sha256_verified_at is not None or version.status != VersionStatus.READY:
        return version
    began = time.monotonic()
    try:
        digest, size = (store or ArtifactStore()).stream_to(version.artifact_key)
    except StorageError as exc:
        if exc.code not in {"NoSuchKey", "404"}:
            raise
        return mark_corrupt(version, f"the stored object {version.artifact_key} is missing")
    logger.info("version %s: re-hashed %s bytes in %.2f s", version, size, time.monotonic() - began)
    if digest != version.artifact_sha256 or size != version.artifact_size:
        return mark_corrupt(version, f"the stored bytes ({size} bytes) have sha256 {digest}, not the "
                                     f"{version.artifact_sha256} ({version.artifact_size} bytes) it was "
                                     "registered with")
    ModelVersion.objects.filter(pk=version.pk, sha256_verified_at__isnull=True).update(
        sha256_verified_at=timezone.now())
    version.refresh_from_db()
    return version


def mark_corrupt(version: ModelVersion, reason: str) -> ModelVersion:
    """Make a READY version CORRUPT with ``reason``: audited as ``version.corrupt`` and announced by
    the ``registry.signals.version_corrupt`` signal (webhooks), both in the same transaction.

    A compare-and-set on READY: a version already CORRUPT or DELETED is left as it is, and nothing is
    recorded twice.

    Returns:
        The version as it now is.
    """
    with transaction.atomic():
        changed = ModelVersion.objects.filter(pk=version.pk, status=VersionStatus.READY).update(
            status=VersionStatus.CORRUPT, integrity_error=reason[:4000])
        version.refresh_from_db()
        if changed:
            logger.error("version %s is corrupt: %s", version, reason)
            record_audit_event(
                action=AuditAction.VERSION_CORRUPT, actor=None, obj_type="version", obj_id=version.pk,
                model=version.model, data={"version": version.version, "sha256": version.artifact_sha256,
                                           "key": version.artifact_key, "reason": reason},
            )
            version_corrupt.send(sender=ModelVersion, version=version, reason=reason)
    return version
