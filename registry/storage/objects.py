"""What the artifact store's calls answer with: an object's size and digest, its head, an uploaded
part, a started or pending multipart upload, a listed object (``registry.storage.ArtifactStore``)."""

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class StoredObject:
    """An artifact object in the bucket: its key and size in bytes."""

    key: str
    size: int


@dataclass(frozen=True)
class UploadedPart:
    """One part of a multipart upload that S3 holds: its number (1-based), size in bytes, ETag (as S3
    gives it, quoted) and, where the store keeps flexible checksums, its base64 SHA-256 (else "")."""

    number: int
    size: int
    etag: str
    checksum_sha256: str = ""

    @property
    def etag_hex(self) -> str:
        """The ETag without quotes, lower case: the part's MD5 hex digest where ETags are MD5s."""
        return self.etag.strip('"').lower()


@dataclass(frozen=True)
class ObjectHead:
    """What HEAD says of an object: size in bytes, ETag without quotes, and server-side encryption
    (``ServerSideEncryption``, e.g. ``AES256`` or ``aws:kms``; "" when none is reported)."""

    size: int
    etag: str
    encryption: str


@dataclass(frozen=True)
class StartedMultipart:
    """A multipart upload S3 opened: its upload id and whether its part ETags are MD5 digests.

    ``etags_are_md5`` is False when S3 reports SSE-KMS (``aws:kms``, ``aws:kms:dsse``) or SSE-C for
    the upload: S3 documents that such objects' ETags are not an MD5 digest of their data.
    """

    upload_id: str
    etags_are_md5: bool


@dataclass(frozen=True)
class ListedObject:
    """One object found by ``ArtifactStore.list_objects``: key, size in bytes, last write time (aware, UTC)."""

    key: str
    size: int
    last_modified: datetime


@dataclass(frozen=True)
class PendingMultipartUpload:
    """An S3 multipart upload not yet completed or aborted: its key, upload id and start time (aware, UTC)."""

    key: str
    upload_id: str
    initiated: datetime
