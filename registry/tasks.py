"""Celery tasks of the registry app: thin wrappers around services."""

from celery import shared_task

from registry.gc import collect_garbage
from registry.storage import StorageError


@shared_task(
    name="registry.collect_garbage", acks_late=True, autoretry_for=(StorageError,), retry_backoff=60,
    retry_backoff_max=3600, max_retries=5,
)
def collect_garbage_task() -> dict:
    """On a schedule (``settings.GC_INTERVAL``): remove unreferenced artifacts and abandoned uploads.

    Idempotent: a repeat finds nothing more to remove. Returns the report as a dict.
    """
    return collect_garbage().as_dict()
