"""Celery tasks of the registry app: thin wrappers around ``registry.uploads`` and ``registry.gc``.

They run on orchestrator workers (queue ``default``) and take ids only.
"""

import logging

from celery import shared_task

from modelyard.celery import DATABASE_ERRORS
from modelyard.errors import ServiceUnavailable
from registry import integrity, uploads
from registry.enqueue import Job
from registry.gc import collect_garbage
from registry.models import Upload
from registry.storage import StorageError

logger = logging.getLogger(__name__)

VERIFY_MAX_RETRIES = 5


@shared_task(name=Job.VERIFY_UPLOAD.value, bind=True, acks_late=True, max_retries=VERIFY_MAX_RETRIES)
def verify_upload_task(self, upload_id: str) -> None:
    """Verify a completed multipart upload and register its version (idempotent).

    A transient S3 failure is retried with backoff (10 s doubling, at most 5 times); after the
    last try the upload is marked FAILED with the reason, so a client polling it stops waiting.
    A dropped database connection is retried the same way (the upload stays VERIFYING meanwhile;
    the version and the COMPLETED status commit together, so no try registers it twice).
    """
    try:
        uploads.verify_upload(upload_id)
    except DATABASE_ERRORS as exc:
        logger.warning("verifying upload %s lost its database connection (%s); retrying", upload_id, exc)
        raise self.retry(exc=exc, countdown=10 * 2**self.request.retries) from exc
    except (StorageError, ServiceUnavailable) as exc:
        message = getattr(exc, "message", str(exc))
        if self.request.retries >= VERIFY_MAX_RETRIES:
            uploads.fail_upload(Upload.objects.get(pk=upload_id), f"S3 kept failing: {message}")
            return
        logger.warning("verifying upload %s failed (%s); retrying", upload_id, message)
        raise self.retry(exc=exc, countdown=10 * 2**self.request.retries) from exc


@shared_task(name=Job.VERIFY_VERSION_BYTES.value, bind=True, acks_late=True, max_retries=VERIFY_MAX_RETRIES)
def verify_version_bytes_task(self, version_id: int) -> None:
    """Re-hash a version's stored bytes once, off the upload's critical path (idempotent).

    Marks the version CORRUPT when they do not match its sha256 (``registry.integrity``). A
    transient S3 failure or a dropped database connection is retried with backoff (60 s doubling,
    at most 5 times); the version stays READY and unverified meanwhile.
    """
    try:
        integrity.verify_version_bytes(version_id)
    except (StorageError, *DATABASE_ERRORS) as exc:
        logger.warning("re-hashing version %s failed (%s); retrying", version_id, getattr(exc, "message", exc))
        raise self.retry(exc=exc, countdown=60 * 2**self.request.retries) from exc


@shared_task(name="registry.expire_uploads", acks_late=True, autoretry_for=DATABASE_ERRORS, retry_backoff=True,
             max_retries=5)
def expire_uploads_task() -> int:
    """Abort multipart uploads left open past their expiry; returns how many (run by beat)."""
    return uploads.expire_uploads()


@shared_task(
    name="registry.collect_garbage", acks_late=True, autoretry_for=(StorageError, *DATABASE_ERRORS), retry_backoff=60,
    retry_backoff_max=3600, max_retries=5,
)
def collect_garbage_task() -> dict:
    """On a schedule (``settings.GC_INTERVAL``): remove unreferenced artifacts and abandoned uploads.

    Idempotent: a repeat finds nothing more to remove. Returns the report as a dict.
    """
    return collect_garbage().as_dict()
