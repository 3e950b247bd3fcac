"""Garbage collection of the artifact bucket: objects no live version references, abandoned uploads.

Deleting a version is a soft delete; its artifact stays until this job finds that no live
(non-DELETED) version references the object's key. Content addressing means two versions may share
one object: it stays while either is live. Two defences keep an object that a registration has just
stored (or found and reused) but whose version row is not committed yet:

- the grace period: an object written less than ``grace_seconds`` ago is never deleted;
- the advisory lock of ``registry.locks``: the registration holds its key from before the store to
  after the commit, and the collector deletes a key only under the exclusive lock, after checking
  references again.

Staging objects of multipart uploads (``uploads/...``) and unfinished S3 multipart uploads go when
their ``Upload`` row is terminal or missing, no live version adopted the object as its artifact,
and they are older than the grace period.
"""

import logging
from dataclasses import asdict, dataclass, field
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from audit.choices import AuditAction
from audit.services import record_audit_event
from registry.choices import TERMINAL_UPLOAD_STATUSES, VersionStatus
from registry.locks import artifact_for_deletion
from registry.models import ModelVersion, Upload
from registry.storage import ARTIFACT_PREFIX, ArtifactStore, ListedObject

logger = logging.getLogger(__name__)

UPLOAD_PREFIX = "uploads/"
BATCH = 1000


@dataclass
class GarbageReport:
    """What one collection found and did (with ``dry_run``: would do).

    ``scanned``: objects listed under both prefixes; ``deleted_keys``: objects removed;
    ``bytes_freed``: their total size in bytes; ``kept_referenced``: objects a live version or an
    unfinished upload still needs; ``kept_young``: unreferenced objects inside the grace period;
    ``kept_in_use``: objects a registration held at that moment; ``aborted_uploads``: staging keys
    of S3 multipart uploads aborted.
    """

    dry_run: bool
    grace_seconds: int
    scanned: int = 0
    deleted_keys: list[str] = field(default_factory=list)
    bytes_freed: int = 0
    kept_referenced: int = 0
    kept_young: int = 0
    kept_in_use: int = 0
    aborted_uploads: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        """The report as JSON-serialisable data."""
        return asdict(self)

    def summary(self) -> str:
        """One line for logs and the command's output."""
        verb = "would delete" if self.dry_run else "deleted"
        return (
            f"scanned {self.scanned} objects; {verb} {len(self.deleted_keys)} ({self.bytes_freed} bytes); "
            f"kept {self.kept_referenced} referenced, {self.kept_young} younger than {self.grace_seconds} s, "
            f"{self.kept_in_use} in use; {'would abort' if self.dry_run else 'aborted'} "
            f"{len(self.aborted_uploads)} unfinished uploads"
        )


def _batches(objects, size: int = BATCH):
    batch = []
    for item in objects:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _live_artifact_keys(keys: list[str]) -> set[str]:
    return set(
        ModelVersion.objects.filter(artifact_key__in=keys).exclude(status=VersionStatus.DELETED)
        .values_list("artifact_key", flat=True)
    )


def _needed_staging_keys(keys: list[str]) -> set[str]:
    # An unfinished upload still needs its object, and a verified upload's object may be the
    # artifact of a live version itself (see ArtifactStore.put_artifact).
    unfinished = set(
        Upload.objects.filter(staging_key__in=keys).exclude(status__in=TERMINAL_UPLOAD_STATUSES)
        .values_list("staging_key", flat=True)
    )
    return unfinished | _live_artifact_keys(keys)


def _sweep(store: ArtifactStore, prefix: str, needed, report: GarbageReport, cutoff) -> None:
    """Delete the objects under ``prefix`` that ``needed(keys)`` does not return and that are older
    than ``cutoff``; ``needed`` is asked again for each key under its exclusive lock."""
    for batch in _batches(store.list_objects(prefix, page_size=BATCH)):
        report.scanned += len(batch)
        old: list[ListedObject] = []
        for item in batch:
            if item.last_modified > cutoff:
                report.kept_young += 1
            else:
                old.append(item)
        referenced = needed([item.key for item in old]) if old else set()
        report.kept_referenced += len(referenced)
        for item in old:
            if item.key in referenced:
                continue
            with artifact_for_deletion(item.key) as free:
                if not free:
                    report.kept_in_use += 1
                    continue
                if needed([item.key]):  # committed since the batch was checked
                    report.kept_referenced += 1
                    continue
                if not report.dry_run:
                    store.delete(item.key)
            report.deleted_keys.append(item.key)
            report.bytes_freed += item.size


def _abort_abandoned_uploads(store: ArtifactStore, report: GarbageReport, cutoff) -> None:
    pending = [u for u in store.list_multipart_uploads(UPLOAD_PREFIX) if u.initiated <= cutoff]
    for batch in _batches(pending):
        live = set(
            Upload.objects.filter(s3_upload_id__in=[u.upload_id for u in batch])
            .exclude(status__in=TERMINAL_UPLOAD_STATUSES).values_list("s3_upload_id", flat=True)
        )
        for upload in batch:
            if upload.upload_id in live:
                continue
            if not report.dry_run:
                store.abort_multipart(upload.key, upload.upload_id)
            report.aborted_uploads.append(upload.key)


def collect_garbage(*, dry_run: bool = False, grace_seconds: int | None = None, actor=None,
                    store: ArtifactStore | None = None) -> GarbageReport:
    """Remove artifact objects no live version references, and abandoned upload staging objects.

    Idempotent: a second run finds nothing more to delete. Safe to run while versions are being
    registered (see the module docstring).

    Args:
        dry_run: report what would be removed without removing anything (and without an audit event).
        grace_seconds: objects written more recently than this many seconds ago are kept; default
            ``settings.GC_GRACE_SECONDS``.
        actor: who asked (None: the schedule).
        store: the artifact store; defaults to one built from settings.

    Returns:
        The GarbageReport. When something was removed, an ``artifacts.collected`` audit event
        records the counts.

    Raises:
        StorageError: S3 is unreachable or refuses (what was deleted before stays deleted).
    """
    grace = settings.GC_GRACE_SECONDS if grace_seconds is None else int(grace_seconds)
    if grace < 0:
        raise ValueError("grace_seconds must not be negative")
    store = store or ArtifactStore()
    report = GarbageReport(dry_run=dry_run, grace_seconds=grace)
    cutoff = timezone.now() - timedelta(seconds=grace)
    _sweep(store, ARTIFACT_PREFIX, _live_artifact_keys, report, cutoff)
    _sweep(store, UPLOAD_PREFIX, _needed_staging_keys, report, cutoff)
    _abort_abandoned_uploads(store, report, cutoff)
    logger.info("garbage collection of %s: %s", store.bucket, report.summary())
    if not dry_run and (report.deleted_keys or report.aborted_uploads):
        record_audit_event(
            action=AuditAction.ARTIFACTS_COLLECTED, actor=actor, obj_type="bucket", obj_id=store.bucket,
            data={"deleted": len(report.deleted_keys), "bytes_freed": report.bytes_freed,
                  "aborted_uploads": len(report.aborted_uploads), "kept_referenced": report.kept_referenced,
                  "grace_seconds": grace, "keys": report.deleted_keys[:100]},
        )
    return report
