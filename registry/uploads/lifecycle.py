"""Opening, presigning, completing, failing and aborting multipart uploads (the web process's side)."""

import logging
import math
import re
import uuid
from datetime import timedelta
from pathlib import PurePosixPath, PureWindowsPath

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from audit.choices import AuditAction
from audit.services import record_audit_event
from modelyard.celery import require_broker
from modelyard.errors import Conflict, InvalidInput, NotFound, ServiceUnavailable
from modelyard.states import IllegalTransition, StateMachine
from registry.choices import UploadStatus
from registry.enqueue import Job, job
from registry.formats import check_filename
from registry.models import ModelVersion, Upload, UploadPart
from registry.registered_models import get_model, validate_tags
from registry.storage import (
    MAX_PART_BYTES,
    MAX_PARTS,
    MD5_HEX,
    MIN_PART_BYTES,
    ArtifactStore,
    StorageError,
    UploadedPart,
)
from registry.uploads import part_digests
from registry.versions import check_lineage

logger = logging.getLogger(__name__)

SHA256_HEX = re.compile(r"[0-9a-f]{64}")
MAX_PRESIGN_PER_CALL = 1000

# Which status may follow which; every change goes through transition().
UPLOAD_MACHINE = StateMachine("upload", "status", {
    UploadStatus.OPEN: frozenset({UploadStatus.VERIFYING, UploadStatus.ABORTED, UploadStatus.FAILED}),
    UploadStatus.VERIFYING: frozenset({UploadStatus.COMPLETED, UploadStatus.FAILED}),
})
TERMINAL = frozenset({UploadStatus.COMPLETED, UploadStatus.ABORTED, UploadStatus.FAILED})



def part_count(upload: Upload) -> int:
    """How many parts the upload's declared size makes at its part size (the last may be shorter)."""
    return max(1, math.ceil(upload.size / upload.part_size))


def transition(upload: Upload, to: str, **fields) -> bool:
    """Move ``upload`` from the status it has in memory to ``to``, setting ``fields`` too.

    A compare-and-set on the old status: a repeat (the row already has ``to``) is a no-op.

    Returns:
        True when this call made the change, False when the row already had status ``to``.

    Raises:
        IllegalTransition: the move is not allowed from the row's current status (a ``Conflict``).
    """
    if upload.status == to:
        return False
    if UPLOAD_MACHINE.move(upload, to, updated_at=timezone.now(), **fields):
        return True
    upload.refresh_from_db()  # another request moved it first
    if upload.status == to:
        return False
    raise IllegalTransition(f"upload {upload.pk} is {upload.status}; it cannot become {to}")


def _clean_filename(filename: str) -> str:
    name = PureWindowsPath(PurePosixPath(filename or "").name).name.strip()
    if name in {"", ".", ".."} or "\x00" in name or len(name) > 255:
        raise InvalidInput("filename must be a file name (no directories) of 1 to 255 characters")
    return name


def _clean_sha256(sha256: str) -> str:
    value = (sha256 or "").strip().lower()
    if value and not SHA256_HEX.fullmatch(value):
        raise InvalidInput("sha256 must be 64 hexadecimal digits")
    return value


def _clean_part_size(size: int, part_size: int | None) -> int:
    part_size = part_size or settings.UPLOAD_PART_BYTES
    if part_size < MIN_PART_BYTES or part_size > MAX_PART_BYTES:
        raise InvalidInput(f"part_size must be between {MIN_PART_BYTES} and {MAX_PART_BYTES} bytes (S3's limits)")
    if math.ceil(size / part_size) > MAX_PARTS:
        raise InvalidInput(
            f"{size} bytes in parts of {part_size} bytes make more than {MAX_PARTS} parts; choose a larger part_size"
        )
    return part_size


def start_upload(
    *, model_name: str, filename: str, size: int, sha256: str = "", part_size: int | None = None,
    metadata=None, tags=None, lineage: dict | None = None, signature=None, max_batch_size: int | None = None,
    actor=None, store: ArtifactStore | None = None,
) -> Upload:
    """Open a multipart upload for a new version of ``model_name``; audited as UPLOAD_STARTED.

    Args:
        model_name: the registered model the version will belong to.
        filename: the file's name as the client knows it (directories are dropped).
        size: the file's size in bytes, 1 to ``settings.MAX_ARTIFACT_BYTES``.
        sha256: its hex digest if the client knows it now ("" to declare it at completion).
        part_size: bytes per part, 5 MiB to 5 GiB and at most 10,000 parts;
            default ``settings.UPLOAD_PART_BYTES``.
        metadata, tags, lineage: the version's fields, as ``register_version`` takes them;
            checked now so a mistake is reported before gigabytes are sent.
        signature, max_batch_size: for a single model file (.onnx, .pt, .plan), the tensors
            and batch size its generated config.pbtxt gets (see ``registry.formats``).
        actor: the requesting user, who alone (with staff) may act on the upload.
        store: the artifact store; defaults to one built from settings.

    Returns:
        The OPEN upload, expiring ``settings.UPLOAD_EXPIRY_SECONDS`` from now.

    Raises:
        NotFound: no such model.
        InvalidInput: a bad size, part size, sha256, file name or version field.
        ServiceUnavailable: S3 refused or could not be reached.
    """
    model = get_model(model_name)
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        raise InvalidInput("size must be a positive number of bytes")
    if size > settings.MAX_ARTIFACT_BYTES:
        raise InvalidInput(f"the artifact is {size} bytes; the limit is {settings.MAX_ARTIFACT_BYTES} bytes")
    name, digest, part_size = _clean_filename(filename), _clean_sha256(sha256), _clean_part_size(size, part_size)
    check_filename(name)  # a kind the registry cannot take is refused before gigabytes are sent
    if metadata is not None and not isinstance(metadata, dict):
        raise InvalidInput("metadata must be a JSON object")
    if signature is not None and not isinstance(signature, dict):
        raise InvalidInput("signature must be a JSON object of inputs and outputs")
    if max_batch_size is not None and (isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int)
                                       or max_batch_size < 0):
        raise InvalidInput("max_batch_size must be 0 or more")
    fields = {"metadata": metadata or {}, "tags": validate_tags(tags), "lineage": check_lineage(lineage)}
    if signature is not None:
        fields["signature"] = signature
    if max_batch_size is not None:
        fields["max_batch_size"] = max_batch_size
    upload_id = uuid.uuid4()
    staging_key = f"uploads/{upload_id}"
    store = store or ArtifactStore()
    try:
        started = store.start_multipart(staging_key, checksum_sha256=settings.S3_PART_CHECKSUMS)
    except StorageError as exc:
        raise ServiceUnavailable(f"the upload could not be started: {exc.message}") from exc
    s3_upload_id = started.upload_id
    try:
        with transaction.atomic():
            upload = Upload.objects.create(
                id=upload_id, model=model, filename=name, size=size, sha256=digest, part_size=part_size,
                staging_key=staging_key, s3_upload_id=s3_upload_id, version_fields=fields,
                etags_are_md5=started.etags_are_md5 and settings.S3_ETAGS_ARE_MD5,
                created_by=actor if getattr(actor, "is_authenticated", False) else None,
                expires_at=timezone.now() + timedelta(seconds=settings.UPLOAD_EXPIRY_SECONDS),
            )
            record_audit_event(
                action=AuditAction.UPLOAD_STARTED, actor=actor, obj_type="upload", obj_id=upload.pk, model=model,
                data={"filename": name, "size": size, "part_size": part_size},
            )
    except BaseException:
        store.abort_multipart(staging_key, s3_upload_id)
        raise
    return upload


def get_upload(upload_id, actor) -> Upload:
    """Return the upload ``upload_id`` if ``actor`` created it or is staff.

    Raises:
        NotFound: no such upload, or it belongs to someone else (its existence is not revealed).
    """
    upload = Upload.objects.select_related("model", "version", "created_by").filter(pk=upload_id).first()
    if upload is None or not (getattr(actor, "is_staff", False) or upload.created_by_id == getattr(actor, "pk", None)):
        raise NotFound(f"no upload {upload_id}")
    return upload


def _require_open(upload: Upload) -> None:
    if upload.status != UploadStatus.OPEN:
        raise Conflict(f"upload {upload.pk} is {upload.status}; parts can only be sent to an open upload")


def _clean_part_digests(parts: list[dict], count: int) -> dict[int, tuple[str, str]]:
    numbers = [p.get("part_number") for p in parts]
    bad = sorted({n for n in numbers if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= count},
                 key=str)
    if bad:
        raise InvalidInput(f"part numbers must be between 1 and {count}; got {bad[:10]}")
    if len(set(numbers)) != len(numbers):
        raise InvalidInput("each part may be declared once per request")
    clean = {}
    for part in parts:
        md5, sha256 = str(part.get("md5") or "").strip().lower(), str(part.get("sha256") or "").strip().lower()
        if not MD5_HEX.fullmatch(md5) or not SHA256_HEX.fullmatch(sha256):
            raise InvalidInput(f"part {part['part_number']}: md5 must be 32 and sha256 64 hexadecimal digits")
        clean[part["part_number"]] = (md5, sha256)
    return clean


def presign_parts(upload: Upload, numbers: list[int] | None = None, *, declared: list[dict] | None = None,
                  store: ArtifactStore | None = None) -> dict[int, tuple[str, dict[str, str]]]:
    """Presigned ``PUT`` URLs for parts (1-based), valid ``settings.UPLOAD_PART_URL_SECONDS``.

    Args:
        upload: an OPEN upload.
        numbers: part numbers to sign without digests (older clients); the upload is then
            verified by reading it back.
        declared: instead, ``{"part_number", "md5", "sha256"}`` per part, digests as hex. They
            are stored (replacing an earlier declaration of the same part) and signed into the
            URL as ``Content-MD5`` and, with ``settings.S3_PART_CHECKSUMS``,
            ``x-amz-checksum-sha256``, headers the PUT must then carry.

    Returns:
        ``{part number: (url, headers the PUT must carry)}``.

    Raises:
        InvalidInput: a number outside 1..part count, a repeated number, a malformed digest,
            none or more than 1,000 parts, or both or neither of ``numbers`` and ``declared``.
        Conflict: the upload is not OPEN.
    """
    _require_open(upload)
    count = part_count(upload)
    if (numbers is None) == (declared is None):
        raise InvalidInput("give either part_numbers or parts (with their md5 and sha256)")
    wanted = numbers if numbers is not None else declared
    if not wanted or len(wanted) > MAX_PRESIGN_PER_CALL:
        raise InvalidInput(f"ask for 1 to {MAX_PRESIGN_PER_CALL} parts at a time")
    if declared is not None:
        digests = _clean_part_digests(declared, count)
    else:
        bad = sorted({n for n in numbers if not 1 <= n <= count})
        if bad:
            raise InvalidInput(f"part numbers must be between 1 and {count}; got {bad[:10]}")
        digests = {n: ("", "") for n in numbers}
    with transaction.atomic():
        for number, (md5, sha256) in digests.items():
            if md5:
                UploadPart.objects.update_or_create(upload=upload, number=number,
                                                    defaults={"md5": md5, "sha256": sha256})
    store = store or ArtifactStore()
    seconds = settings.UPLOAD_PART_URL_SECONDS
    checksums = settings.S3_PART_CHECKSUMS
    return {
        n: store.presign_part(upload.staging_key, upload.s3_upload_id, n, seconds, md5=md5,
                              sha256=sha256 if checksums else "")
        for n, (md5, sha256) in sorted(digests.items())
    }


def uploaded_parts(upload: Upload, *, store: ArtifactStore | None = None) -> list[UploadedPart]:
    """The parts S3 already holds for an OPEN upload (what a resumed client can skip); [] otherwise.

    Raises:
        ServiceUnavailable: S3 could not be asked.
    """
    if upload.status != UploadStatus.OPEN:
        return []
    try:
        return (store or ArtifactStore()).list_parts(upload.staging_key, upload.s3_upload_id)
    except StorageError as exc:
        if exc.code == "NoSuchUpload":
            return []
        raise ServiceUnavailable(f"the upload's parts could not be listed: {exc.message}") from exc


def complete_upload(upload: Upload, *, sha256: str = "", actor=None, store: ArtifactStore | None = None) -> Upload:
    """Close the upload for verification; the version is registered by :func:`verify_upload` in a worker.

    Idempotent: completing an upload that is already VERIFYING or COMPLETED returns it unchanged.
    Every part 1..N must be in S3, hold its expected size, and (where the store's ETags are MD5s)
    have the ETag its declared MD5 predicts; otherwise nothing changes and the client may upload
    those parts again and complete again. Parts that add up to another size than declared fail the
    upload.

    Args:
        upload: the upload (from :func:`get_upload`).
        sha256: the file's hex digest, if not declared at the start (it must agree if it was).
        actor: the requesting user (for the log).
        store: the artifact store; defaults to one built from settings.

    Returns:
        The upload, now VERIFYING (or FAILED when the parts' sizes disagree with the declared size).

    Raises:
        InvalidInput: parts are missing, of the wrong size, or differ from their declared MD5 (by
            ETag), or ``sha256`` is malformed or contradicts the declared one.
        Conflict: the upload was aborted or has failed.
        ServiceUnavailable: S3 could not be asked, or the task queue does not answer (the upload stays open).
    """
    if upload.status in (UploadStatus.VERIFYING, UploadStatus.COMPLETED):
        return upload
    _require_open(upload)
    digest = _clean_sha256(sha256)
    if digest and upload.sha256 and digest != upload.sha256:
        raise InvalidInput(f"sha256 {digest} differs from the {upload.sha256} declared when the upload started")
    parts = uploaded_parts(upload, store=store)
    count = part_count(upload)
    present = {p.number for p in parts}
    missing = [n for n in range(1, count + 1) if n not in present]
    if missing:
        shown = ", ".join(map(str, missing[:20])) + (" …" if len(missing) > 20 else "")
        raise InvalidInput(f"parts {shown} of {count} have not been uploaded; upload them and complete again")
    received = sum(p.size for p in parts)
    if received != upload.size or len(parts) != count:
        fail_upload(upload, f"the parts hold {received} bytes in {len(parts)} parts, "
                            f"but {upload.size} bytes in {count} parts were declared", store=store)
        return upload
    declared = part_digests.declared_md5s(upload)
    # ETags that are not MD5s (a store that encrypts without saying so) are left to the worker's read-back.
    by_etag = upload.etags_are_md5 and all(MD5_HEX.fullmatch(p.etag_hex) for p in parts)
    problems = part_digests.part_problems(upload, parts, declared, by_etag=by_etag)
    if problems:
        raise InvalidInput("; ".join(problems[:20]) + "; send those parts again and complete again")
    require_broker("the upload's verification")  # the upload stays open: complete it again once the queue is back
    with transaction.atomic():
        if transition(upload, UploadStatus.VERIFYING, sha256=digest or upload.sha256):
            upload_id = str(upload.pk)
            transaction.on_commit(lambda: job(Job.VERIFY_UPLOAD, upload_id))
            logger.info("upload %s of %s complete by %s; verifying", upload.pk, upload.model.name, actor)
    return upload


def _discard_staging(upload: Upload, store: ArtifactStore) -> None:
    """Abort the S3 multipart upload and delete the staging object, unless a version adopted it as
    its artifact (see ``ArtifactStore.put_artifact``); failures are only logged."""
    try:
        store.abort_multipart(upload.staging_key, upload.s3_upload_id)
        if not ModelVersion.objects.filter(artifact_key=upload.staging_key).exists():
            store.delete(upload.staging_key)
    except StorageError as exc:
        logger.warning("could not clean up %s of upload %s: %s", upload.staging_key, upload.pk, exc.message)


def fail_upload(upload: Upload, error: str, *, store: ArtifactStore | None = None) -> Upload:
    """Mark an OPEN or VERIFYING upload FAILED with ``error`` and remove its bytes from S3.

    Idempotent: a FAILED upload stays as it is (with its first error).
    """
    if upload.status != UploadStatus.FAILED:
        transition(upload, UploadStatus.FAILED, error=error[:4000])
        logger.info("upload %s failed: %s", upload.pk, error)
    _discard_staging(upload, store or ArtifactStore())
    return upload


def abort_upload(upload: Upload, *, actor=None, reason: str = "", store: ArtifactStore | None = None) -> Upload:
    """Cancel an OPEN upload: ABORTED, S3 frees its parts; audited as UPLOAD_ABORTED.

    Idempotent: aborting an ABORTED upload changes nothing.

    Raises:
        Conflict: the upload is being verified or has finished.
    """
    if upload.status == UploadStatus.ABORTED:
        return upload
    with transaction.atomic():
        if transition(upload, UploadStatus.ABORTED, error=reason):
            record_audit_event(
                action=AuditAction.UPLOAD_ABORTED, actor=actor, obj_type="upload", obj_id=upload.pk,
                model=upload.model, data={"filename": upload.filename, "reason": reason or "aborted by the client"},
            )
    _discard_staging(upload, store or ArtifactStore())
    return upload


def expire_uploads(*, now=None, store: ArtifactStore | None = None) -> int:
    """Abort every OPEN upload whose ``expires_at`` has passed; return how many were aborted."""
    now = now or timezone.now()
    store = store or ArtifactStore()
    count = 0
    for upload in Upload.objects.select_related("model").filter(status=UploadStatus.OPEN, expires_at__lt=now):
        try:
            abort_upload(upload, reason=f"expired at {upload.expires_at.isoformat()}", store=store)
            count += 1
        except Conflict:  # completed by its client a moment ago
            continue
    return count
