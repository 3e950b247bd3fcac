"""A completed multipart upload checked and registered: ``verify_upload``, run by a worker."""

import logging
import tempfile
import time
from contextlib import closing
from pathlib import Path

from django.db import transaction

from modelyard.errors import InvalidInput
from registry.choices import UploadStatus, UploadVerification
from registry.enqueue import Job, job
from registry.formats import RANGED, STREAMED, prepare_stored_archive, stored_archive_reading
from registry.models import Upload
from registry.storage import ArtifactStore, StorageError
from registry.uploads import part_digests
from registry.uploads.lifecycle import _discard_staging, fail_upload, transition
from registry.versions import register_version

logger = logging.getLogger(__name__)


def _join_parts(upload: Upload, store: ArtifactStore) -> str | None:
    """Check the parts against their declared digests, record how the upload will be verified, and
    complete the S3 multipart upload (unless an earlier run did); return why it cannot be, or None."""
    try:
        parts = store.list_parts(upload.staging_key, upload.s3_upload_id)
    except StorageError as exc:
        if exc.code != "NoSuchUpload":
            raise
        return None if store.head(upload.staging_key) is not None else "the upload's parts are gone from S3"
    declared = part_digests.declared_md5s(upload)
    method, note = part_digests.plan_verification(upload, parts, declared)
    problems = part_digests.part_problems(upload, parts, declared, by_etag=method == UploadVerification.PART_ETAGS)
    if problems:
        return "; ".join(problems[:20])
    Upload.objects.filter(pk=upload.pk).update(verification=method, verification_note=note)
    upload.verification, upload.verification_note = method, note
    if method == UploadVerification.READ_BACK:
        logger.warning("upload %s: the parts cannot be checked by their ETags (%s); reading the object back",
                       upload.pk, note)
    try:
        store.complete_multipart(upload.staging_key, upload.s3_upload_id, parts)
    except StorageError as exc:
        if exc.retryable:
            raise
        return f"S3 could not join the parts: {exc.message}"
    return None


def verify_upload(upload_id, *, store: ArtifactStore | None = None) -> Upload:
    """Verify a VERIFYING upload and register its version; run by the ``registry.verify_upload`` task.

    1. ListParts: every part must hold its expected size and, where the store's ETags are MD5s and
       the client declared the parts' digests, an ETag equal to the declared MD5 (so the store
       received the bytes the client hashed); then S3 joins the parts.
    2. HEAD: the joined object's size must be the declared size and its ETag the composite of the
       declared MD5s (``registry.storage.composite_etag``).
    3. A Triton model directory as ``.zip`` or plain ``.tar`` is inspected by ranged GETs (its
       central directory or headers, and its config.pbtxt) and registered with the client's
       sha256, unverified by the server until ``registry.integrity.verify_version_bytes`` (queued
       on commit) has re-hashed it. A compressed tar or a BentoML export is inspected while it
       streams from S3 once, hashed on the way, no scratch file. A single model file, or an upload
       whose parts could not be checked by ETag (``Upload.verification`` READ_BACK), is streamed
       into a temporary file (8 MiB at a time) while it is hashed, its sha256 checked against the
       declared one, and registered from that file.

    A refusal at any step makes the upload FAILED with the reason and no version row, and its
    staging object is deleted; once registered, the staging object is the version's artifact.

    Idempotent: an upload that is not VERIFYING is returned as it is; the version row and the
    COMPLETED status are written in one transaction under the upload's row lock, so a repeated
    or concurrent run registers nothing twice.

    Raises:
        StorageError: a transient S3 failure (retrying may help); the upload stays VERIFYING.
        ServiceUnavailable: ``register_version`` could not store the artifact; likewise.
    """
    upload = Upload.objects.select_related("model", "created_by").get(pk=upload_id)
    if upload.status != UploadStatus.VERIFYING:
        return upload
    store = store or ArtifactStore()
    began = time.monotonic()
    problem = _join_parts(upload, store)
    if problem:
        return fail_upload(upload, problem, store=store)
    joined = time.monotonic()
    logger.info("upload %s: S3 joined the parts in %.2f s", upload.pk, joined - began)
    if upload.verification == UploadVerification.PART_ETAGS:
        head = store.head_details(upload.staging_key)
        if head is None:
            return fail_upload(upload, "the joined object is gone from S3", store=store)
        problem = part_digests.composite_problem(upload, part_digests.declared_md5s(upload), head.etag, head.size)
        if problem:
            return fail_upload(upload, problem, store=store)
        # A name that says .zip or .tar: its head and tail are what will be read, fetch both at once.
        both_ends = upload.filename.lower().endswith((".zip", ".tar"))
        with store.open_ranged(upload.staging_key, head.size, prefetch_ends=both_ends) as source:
            reading = stored_archive_reading(source, upload.filename)
            if reading == RANGED:
                try:
                    prepared = _prepare_stored(upload, source, decode_members=False)
                except InvalidInput as exc:
                    return fail_upload(upload, exc.message, store=store)
                logger.info("upload %s: parts checked by ETag; archive read by %d ranged GETs (%d bytes)",
                            upload.pk, source.requests, source.bytes_read)
        if reading == RANGED:
            return _register(upload, store, prepared=prepared, size=head.size, sha256=upload.sha256,
                             sha256_verified=False)
        if reading == STREAMED:
            return _stream_and_register(upload, store, head.size)
    return _read_back_and_register(upload, store)


def _prepare_stored(upload: Upload, source, *, decode_members: bool):
    """``prepare_stored_archive`` of the upload's object, with the version fields that bear on it."""
    fields = upload.version_fields or {}
    return prepare_stored_archive(source, filename=upload.filename, model_name=upload.model.name,
                                  decode_members=decode_members, signature=fields.get("signature"),
                                  max_batch_size=fields.get("max_batch_size"))


def _stream_and_register(upload: Upload, store: ArtifactStore, size: int) -> Upload:
    """Inspect a compressed tar or BentoML export while it streams from S3 once, hashing it on the way;
    check, register."""
    began = time.monotonic()
    with closing(store.open_stream(upload.staging_key, size)) as stream:
        try:
            prepared = _prepare_stored(upload, stream, decode_members=True)
        except InvalidInput as exc:
            return fail_upload(upload, exc.message, store=store)
        stream.drain()
        digest, seen = stream.digest.hexdigest(), stream.bytes_read
    logger.info("upload %s: inspected and hashed %s bytes in one stream in %.2f s", upload.pk, seen,
                time.monotonic() - began)
    if seen != upload.size:
        return fail_upload(upload, f"S3 holds {seen} bytes but {upload.size} bytes were declared", store=store)
    if digest != upload.sha256:
        return fail_upload(upload, f"the uploaded bytes have sha256 {digest}, not the declared {upload.sha256}",
                           store=store)
    return _register(upload, store, prepared=prepared, size=seen, sha256=digest)


def _read_back_and_register(upload: Upload, store: ArtifactStore) -> Upload:
    """Stream the joined object into a temporary file while hashing it, check it, register from it."""
    began = time.monotonic()
    with tempfile.NamedTemporaryFile(prefix="modelyard-upload-", suffix=Path(upload.filename).suffix) as tmp:
        digest, size = store.stream_to(upload.staging_key, tmp)
        tmp.flush()
        logger.info("upload %s: read back %s bytes in %.2f s", upload.pk, size, time.monotonic() - began)
        if size != upload.size:
            return fail_upload(upload, f"S3 holds {size} bytes but {upload.size} bytes were declared", store=store)
        if upload.sha256 and digest != upload.sha256:
            return fail_upload(upload, f"the uploaded bytes have sha256 {digest}, not the declared {upload.sha256}",
                               store=store)
        return _register(upload, store, artifact_path=Path(tmp.name), sha256=digest)


def _register(upload: Upload, store: ArtifactStore, **artifact) -> Upload:
    """Register the upload's version under the upload's row lock and mark it COMPLETED, or FAILED
    with ``register_version``'s refusal; ``artifact`` is what ``register_version`` takes of it.
    A version whose sha256 the server has not checked yet gets its background re-hash on commit."""
    fields = upload.version_fields or {}
    with transaction.atomic():
        upload = (Upload.objects.select_for_update(of=("self",)).select_related("model", "created_by")
                  .get(pk=upload.pk))
        if upload.status != UploadStatus.VERIFYING:
            return upload
        try:
            with transaction.atomic():
                version = register_version(
                    model=upload.model, filename=upload.filename, actor=upload.created_by, store=store,
                    staged_key=upload.staging_key, **artifact, **fields,
                )
        except InvalidInput as exc:
            error = exc.message
        else:
            transition(upload, UploadStatus.COMPLETED, version=version, sha256=artifact["sha256"])
            error = ""
            if version.sha256_verified_at is None:
                transaction.on_commit(lambda: job(Job.VERIFY_VERSION_BYTES, version.pk))
    if error:
        return fail_upload(upload, error, store=store)
    _discard_staging(upload, store)
    logger.info("upload %s registered %s v%s", upload.pk, upload.model.name, upload.version.version)
    return upload
