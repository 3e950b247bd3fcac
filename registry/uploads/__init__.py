"""Direct-to-S3 multipart uploads of large artifacts: start, presign parts, complete, verify, abort.

The bytes never pass through the web process. The client declares the file (name, size in bytes,
its sha256) and the version's fields; the server opens an S3 multipart upload on the staging key
``uploads/<upload id>`` and hands out presigned ``PUT`` URLs per part, each signed for the part's
declared MD5 and SHA-256 (:mod:`.part_digests`). On completion the part ETags are compared
with the declared MD5s, the upload turns VERIFYING and a Celery task (:func:`verify_upload`,
queue ``default``) checks them again, joins the parts in S3, checks the object's composite ETag
and size, reads a ``.zip``'s central directory or a plain ``.tar``'s headers by ranged GETs, and
registers the version through ``registry.versions.register_version`` with the client's sha256;
a background task (``registry.integrity``) re-hashes the stored bytes once afterwards. Compressed
tars and BentoML exports are inspected and hashed while they stream from S3 once. Single model
files, stores whose ETags are not MD5s, and clients that declare no part digests take the older
road: the object is streamed back once into a temporary file while it is hashed. The staging
object is the version's artifact once registered; it is deleted when the upload fails.

The package is split by topic: :mod:`.lifecycle` (start, presign, complete, fail, abort, expire),
:mod:`.part_digests` (the parts against the store's ETags) and :mod:`.verification` (the worker's
``verify_upload``).

Status changes go through :func:`transition`: a compare-and-set on the old status, so repeating a
step is harmless and two workers cannot both register the same upload.
"""

from registry.storage import ArtifactStore
from registry.uploads.lifecycle import (
    MAX_PRESIGN_PER_CALL,
    SHA256_HEX,
    TERMINAL,
    UPLOAD_MACHINE,
    abort_upload,
    complete_upload,
    expire_uploads,
    fail_upload,
    get_upload,
    part_count,
    presign_parts,
    start_upload,
    transition,
    uploaded_parts,
)
from registry.uploads.verification import verify_upload

__all__ = [
    "MAX_PRESIGN_PER_CALL", "SHA256_HEX", "TERMINAL", "UPLOAD_MACHINE", "ArtifactStore", "abort_upload",
    "complete_upload", "expire_uploads", "fail_upload", "get_upload", "part_count", "presign_parts", "start_upload",
    "transition", "uploaded_parts", "verify_upload",
]
