"""The S3 artifact store: the only module that talks to S3 (through boto3).

Artifacts are content-addressed: the object key is ``sha256/<aa>/<sha256>``,
so the same bytes are stored once and a key always names the same content.
Uploads go through boto3's transfer manager (multipart above 8 MiB, parallel
parts); verification streams the object back in constant memory.

Large artifacts take another road: the client uploads parts straight to S3
through presigned ``upload_part`` URLs into a multipart upload on a staging key
(``uploads/<upload id>``); each URL is signed for the part's declared MD5
(``Content-MD5``) and, where the store supports flexible checksums, its SHA-256
(``x-amz-checksum-sha256``), so S3 refuses a part whose bytes differ on arrival.
The server checks the part ETags (ListParts) and the completed object's composite
ETag (:func:`composite_etag`) against the declared digests, and reads the archive's
structure by ranged GETs (:class:`RangedObjectReader`) rather than the whole object.
That object is the artifact itself (nothing else writes to its key).

The package is split by topic: :mod:`.errors` (``StorageError``), :mod:`.etags` (S3's digests),
:mod:`.objects` (what the store's calls answer with) and :mod:`.readers` (files over one object:
ranged, or one forward stream); this module is the store itself, ``ArtifactStore``.
"""

import functools
import hashlib
import logging
import os
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import closing
from pathlib import Path
from typing import BinaryIO

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError
from django.conf import settings

from registry.storage.errors import CHUNK_BYTES, StorageError, _wrap
from registry.storage.etags import MD5_HEX, composite_etag, hex_to_base64
from registry.storage.objects import (
    ListedObject,
    ObjectHead,
    PendingMultipartUpload,
    StartedMultipart,
    StoredObject,
    UploadedPart,
)
from registry.storage.readers import RangedObjectReader, StreamedObjectReader

__all__ = [
    "ARTIFACT_PREFIX", "CHUNK_BYTES", "MAX_PARTS", "MAX_PART_BYTES", "MD5_HEX", "MIN_PART_BYTES", "ArtifactStore",
    "ListedObject", "ObjectHead", "PendingMultipartUpload", "RangedObjectReader", "StartedMultipart", "StorageError",
    "StoredObject", "StreamedObjectReader", "UploadedPart", "artifact_key", "composite_etag", "hex_to_base64",
]

logger = logging.getLogger(__name__)

TRANSFER_CONFIG = TransferConfig(
    multipart_threshold=8 * 1024 * 1024, multipart_chunksize=8 * 1024 * 1024, max_concurrency=4
)

# S3's multipart rules: every part but the last at least 5 MiB, at most 5 GiB, at most 10,000 parts.
MIN_PART_BYTES = 5 * 1024**2
MAX_PART_BYTES = 5 * 1024**3
MAX_PARTS = 10_000


ARTIFACT_PREFIX = "sha256/"
# Encryption modes whose ETags S3 documents as not being the MD5 digest of the data.
_NON_MD5_ENCRYPTION = frozenset({"aws:kms", "aws:kms:dsse"})


@functools.lru_cache(maxsize=8)
def _client(endpoint_url, region, access_key_id, secret_access_key, connect_timeout, read_timeout, pid: int):
    """The boto3 S3 client of this process for these settings, made once and shared by every ``ArtifactStore``
    (boto3's clients are thread-safe): making one took about 11 ms, and a new client's first call opened a new
    connection, together a third of a version's registration (``bench/results/registry_writes.md``). ``pid`` is
    in the key so that a forked process never shares its parent's connections."""
    return boto3.client(
        "s3",
        endpoint_url=endpoint_url,
        region_name=region,
        aws_access_key_id=access_key_id,
        aws_secret_access_key=secret_access_key,
        config=Config(
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            retries={"max_attempts": 3, "mode": "standard"},
            # Every read is checked against its sha256 (stream_to), so botocore's CRC check of
            # responses would only spend CPU; uploads keep its per-part checksums.
            response_checksum_validation="when_required",
            signature_version="s3v4",
            s3={"addressing_style": "path"},
        ),
    )


def artifact_key(sha256: str) -> str:
    """Return the content address of an artifact whose sha256 hex digest is ``sha256``."""
    return f"{ARTIFACT_PREFIX}{sha256[:2]}/{sha256}"


class ArtifactStore:
    """The artifact bucket, through the process's shared client for its settings (``_client``: an event hook
    registered on ``client`` is seen by every store; register it with a ``unique_id`` and unregister it after).

    Args:
        endpoint_url, bucket, region, access_key_id, secret_access_key: where
            and as whom to connect; default to the ``S3_*`` settings.
    """

    def __init__(
        self,
        *,
        endpoint_url: str | None = None,
        bucket: str | None = None,
        region: str | None = None,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
    ):
        self.bucket = bucket or settings.S3_BUCKET
        self.client = _client(
            endpoint_url or settings.S3_ENDPOINT_URL or None, region or settings.S3_REGION,
            access_key_id or settings.S3_ACCESS_KEY_ID, secret_access_key or settings.S3_SECRET_ACCESS_KEY,
            settings.S3_CONNECT_TIMEOUT, settings.S3_READ_TIMEOUT, os.getpid(),
        )

    def ensure_bucket(self) -> None:
        """Create the bucket when it is missing (local and test setups only).

        Raises:
            StorageError: S3 is unreachable or refuses.
        """
        try:
            self.client.head_bucket(Bucket=self.bucket)
            return
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in {"404", "NoSuchBucket", "NotFound"}:
                raise _wrap(exc, f"open bucket {self.bucket}") from exc
        except BotoCoreError as exc:
            raise _wrap(exc, f"open bucket {self.bucket}") from exc
        try:
            self.client.create_bucket(Bucket=self.bucket)
        except (BotoCoreError, ClientError) as exc:
            raise _wrap(exc, f"create bucket {self.bucket}") from exc

    def head_details(self, key: str) -> ObjectHead | None:
        """Return the size, ETag and encryption of the object at ``key``, or None when absent.

        Raises:
            StorageError: S3 is unreachable or refuses.
        """
        try:
            answer = self.client.head_object(Bucket=self.bucket, Key=key)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in {"404", "NoSuchKey", "NotFound"}:
                return None
            raise _wrap(exc, f"read {key}") from exc
        except BotoCoreError as exc:
            raise _wrap(exc, f"read {key}") from exc
        return ObjectHead(size=answer["ContentLength"], etag=answer.get("ETag", "").strip('"').lower(),
                          encryption=answer.get("ServerSideEncryption", ""))

    def open_ranged(self, key: str, size: int, *, prefetch_ends: bool = False) -> RangedObjectReader:
        """A read-only, seekable file over the object at ``key`` (``size`` bytes, from HEAD) that fetches
        only what is read, by ranged GETs of about 64 KiB (see :class:`RangedObjectReader`): reading
        a zip's central directory or a tar's headers costs a few small requests, not the object's
        size. It counts its requests and bytes (``requests``, ``bytes_read``).

        Args:
            prefetch_ends: fetch the first and the last block at once, in two concurrent requests
                (what an archive's format check reads first: its magic bytes, a zip's central
                directory, a tar's last header), so that their latencies overlap.

        Raises:
            StorageError: (with ``prefetch_ends``) S3 failed; retrying may help.
        """
        reader = RangedObjectReader(self, key, size)
        if prefetch_ends:
            reader.prefetch([0, max(0, size - reader.READAHEAD)])
        return reader

    def head(self, key: str) -> StoredObject | None:
        """Return the object at ``key`` with its size, or None when absent.

        Raises:
            StorageError: S3 is unreachable or refuses.
        """
        details = self.head_details(key)
        return None if details is None else StoredObject(key=key, size=details.size)

    def open_stream(self, key: str, size: int) -> StreamedObjectReader:
        """A forward-only file over one GET of the object at ``key`` (``size`` bytes) that hashes every
        byte as it arrives (``digest``, ``bytes_read``); see :class:`StreamedObjectReader`.

        Raises:
            StorageError: the object is missing or S3 could not be reached.
        """
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"]
        except (BotoCoreError, ClientError) as exc:
            raise _wrap(exc, f"read {key}") from exc
        return StreamedObjectReader(body, key, size)

    def put_artifact(self, path: Path, *, sha256: str, size: int, staged_key: str | None = None) -> StoredObject:
        """Store the file at ``path`` under its content address (or adopt a verified upload) and verify it.

        Idempotent: an object already stored under that address with the same
        size is verified and reused instead of uploaded again.

        Args:
            path: local file to upload.
            sha256: its hex digest, computed by the caller while receiving it.
            size: its length in bytes.
            staged_key: an object in the bucket that holds the same bytes as ``path``
                (a completed multipart upload). That object itself becomes the artifact:
                its key is unique to its upload and nothing else writes there, so gigabytes
                are neither uploaded again nor copied, and an upload never shares the bytes
                of another one that claimed the same sha256. It is checked by size here;
                its sha256 is the caller's to check.

        Returns:
            The stored object.

        Raises:
            StorageError: S3 is unreachable, refuses, or what it stored does not
                match ``sha256`` and ``size``.
        """
        key = artifact_key(sha256)
        if settings.S3_CREATE_BUCKET:
            self.ensure_bucket()
        if staged_key is not None:
            staged = self.head(staged_key)
            if staged is None or staged.size != size:
                raise StorageError(f"the uploaded object {staged_key} is not {size} bytes", retryable=False)
            return StoredObject(key=staged_key, size=size)
        existing = self.head(key)
        if existing is None or existing.size != size:
            try:
                self.client.upload_file(
                    str(path),
                    self.bucket,
                    key,
                    ExtraArgs={"Metadata": {"sha256": sha256}, "ContentType": "application/octet-stream"},
                    Config=TRANSFER_CONFIG,
                )
            except (BotoCoreError, ClientError) as exc:
                raise _wrap(exc, f"store {key}") from exc
            except Exception as exc:  # boto3's transfer manager wraps failures in its own types
                raise StorageError(f"S3 upload of {key} failed: {exc}", retryable=True) from exc
        self.verify(key, sha256=sha256, size=size)
        return StoredObject(key=key, size=size)

    def verify(self, key: str, *, sha256: str, size: int) -> None:
        """Stream the object back and check its size (bytes) and sha256, in constant memory.

        Raises:
            StorageError: the object is missing, unreadable, or differs.
        """
        digest, seen = self.stream_to(key)
        if seen != size or digest != sha256:
            raise StorageError(f"stored object {key} does not match: {seen} bytes, sha256 {digest}", retryable=False)

    def stream_to(self, key: str, sink: BinaryIO | None = None) -> tuple[str, int]:
        """Read the object at ``key`` front to back in 8 MiB chunks, hashing it and writing it to ``sink``.

        Reading, hashing and writing overlap: while one chunk is hashed, the next is read from the
        socket (one thread) and the previous one is written to ``sink`` (another); all three release
        the GIL on chunks this large. At most three chunks (24 MiB) are held at once, whatever the
        object's size.

        Args:
            key: the object to read.
            sink: a binary file to write the bytes to, or None to only hash them.

        Returns:
            ``(sha256 hex digest, size in bytes)`` of what was read.

        Raises:
            StorageError: the object is missing or reading failed (including a body shorter than
                its Content-Length).
            OSError: writing to ``sink`` failed.
        """
        digest = hashlib.sha256()
        seen = 0
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"]
        except (BotoCoreError, ClientError) as exc:
            raise _wrap(exc, f"read {key}") from exc
        with closing(body), ThreadPoolExecutor(1, thread_name_prefix="s3-read") as reader, \
                ThreadPoolExecutor(1, thread_name_prefix="artifact-write") as writer:
            written: Future | None = None
            try:
                ahead = reader.submit(body.read, CHUNK_BYTES)
                while chunk := ahead.result():
                    ahead = reader.submit(body.read, CHUNK_BYTES)
                    digest.update(chunk)
                    seen += len(chunk)
                    if sink is not None:
                        if written is not None:
                            written.result()
                        written = writer.submit(sink.write, chunk)
            except (BotoCoreError, ClientError) as exc:
                raise _wrap(exc, f"read {key}") from exc
            if written is not None:
                written.result()
        return digest.hexdigest(), seen

    def presigned_host_download_url(self, key: str) -> str:
        """A presigned GET URL for ``key`` as serving hosts reach the bucket: at
        ``settings.S3_HOST_ENDPOINT_URL`` when set, else at this store's own endpoint. For the download
        URLs sent to host agents. SigV4 signs the host name, so the URL is signed by a client for the
        endpoint that will be called (presigning makes no request)."""
        endpoint = settings.S3_HOST_ENDPOINT_URL
        if not endpoint or endpoint == self.client.meta.endpoint_url:
            return self.presigned_download_url(key)
        return ArtifactStore(endpoint_url=endpoint, bucket=self.bucket).presigned_download_url(key)

    def presigned_download_url(self, key: str, expires_in: int | None = None) -> str:
        """Return a presigned GET URL for ``key``, valid ``expires_in`` seconds (``S3_PRESIGN_SECONDS`` by default),
        at this store's endpoint."""
        return self.client.generate_presigned_url(
            "get_object",
            Params={"Bucket": self.bucket, "Key": key},
            ExpiresIn=expires_in or settings.S3_PRESIGN_SECONDS,
        )

    def delete(self, key: str) -> None:
        """Delete the object at ``key`` (absent is fine).

        Raises:
            StorageError: S3 is unreachable or refuses.
        """
        try:
            self.client.delete_object(Bucket=self.bucket, Key=key)
        except (BotoCoreError, ClientError) as exc:
            raise _wrap(exc, f"delete {key}") from exc

    # ------------------------------------------------------------------ multipart uploads

    def start_multipart(self, key: str, *, checksum_sha256: bool = False) -> StartedMultipart:
        """Open a multipart upload to ``key``.

        Args:
            key: the object the parts will make.
            checksum_sha256: declare SHA-256 as the upload's checksum algorithm, so parts may carry
                ``x-amz-checksum-sha256`` (S3 refuses such a part unless the upload declared it).

        Returns:
            The upload id and whether S3 computes its part ETags as MD5s (see ``StartedMultipart``).

        Raises:
            StorageError: S3 is unreachable or refuses.
        """
        if settings.S3_CREATE_BUCKET:
            self.ensure_bucket()
        extra = {"ChecksumAlgorithm": "SHA256"} if checksum_sha256 else {}
        try:
            answer = self.client.create_multipart_upload(
                Bucket=self.bucket, Key=key, ContentType="application/octet-stream", **extra
            )
        except (BotoCoreError, ClientError) as exc:
            raise _wrap(exc, f"start a multipart upload to {key}") from exc
        md5 = answer.get("ServerSideEncryption", "") not in _NON_MD5_ENCRYPTION and not answer.get(
            "SSECustomerAlgorithm")
        return StartedMultipart(upload_id=answer["UploadId"], etags_are_md5=md5)

    def presign_part(self, key: str, upload_id: str, number: int, expires_in: int, *, md5: str = "",
                     sha256: str = "") -> tuple[str, dict[str, str]]:
        """A URL that accepts ``PUT`` of part ``number`` (1-based) for ``expires_in`` seconds.

        Args:
            md5, sha256: the part's declared digests as hex ("" for none). Each one given is signed
                into the URL as ``Content-MD5`` / ``x-amz-checksum-sha256``: the client must send it
                with the part, and S3 (AWS, MinIO) refuses a part whose bytes do not match it.

        Returns:
            ``(url, headers)``: the headers the PUT must carry, as names to values.
        """
        params = {"Bucket": self.bucket, "Key": key, "UploadId": upload_id, "PartNumber": number}
        headers = {}
        if md5:
            params["ContentMD5"] = headers["Content-MD5"] = hex_to_base64(md5)
        if sha256:
            params["ChecksumSHA256"] = headers["x-amz-checksum-sha256"] = hex_to_base64(sha256)
        return self.client.generate_presigned_url("upload_part", Params=params, ExpiresIn=expires_in), headers

    def list_parts(self, key: str, upload_id: str) -> list[UploadedPart]:
        """Every part S3 holds for the upload, by number, following S3's pages of 1,000.

        Raises:
            StorageError: S3 is unreachable or refuses (``code`` ``NoSuchUpload`` when the
                upload was completed or aborted).
        """
        parts: list[UploadedPart] = []
        try:
            pages = self.client.get_paginator("list_parts").paginate(Bucket=self.bucket, Key=key, UploadId=upload_id)
            for page in pages:
                parts.extend(
                    UploadedPart(number=p["PartNumber"], size=p["Size"], etag=p["ETag"],
                                 checksum_sha256=p.get("ChecksumSHA256", ""))
                    for p in page.get("Parts", [])
                )
        except (BotoCoreError, ClientError) as exc:
            raise _wrap(exc, f"list the parts of {key}") from exc
        return sorted(parts, key=lambda part: part.number)

    def complete_multipart(self, key: str, upload_id: str, parts: list[UploadedPart]) -> None:
        """Join ``parts`` (in number order) into the object at ``key``; a part's SHA-256 checksum, where
        S3 listed one, is passed back as S3 requires for an upload with a checksum algorithm.

        Raises:
            StorageError: S3 is unreachable or refuses (``EntityTooSmall``: a part but the
                last is under 5 MiB; ``NoSuchUpload``: already completed or aborted).
        """
        try:
            self.client.complete_multipart_upload(
                Bucket=self.bucket, Key=key, UploadId=upload_id,
                MultipartUpload={"Parts": [
                    {"PartNumber": p.number, "ETag": p.etag,
                     **({"ChecksumSHA256": p.checksum_sha256} if p.checksum_sha256 else {})}
                    for p in parts
                ]},
            )
        except (BotoCoreError, ClientError) as exc:
            raise _wrap(exc, f"complete the multipart upload to {key}") from exc

    def abort_multipart(self, key: str, upload_id: str) -> None:
        """Abort the upload and free its parts; an upload already gone is fine.

        Raises:
            StorageError: S3 is unreachable or refuses for another reason.
        """
        try:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in {"NoSuchUpload", "404"}:
                raise _wrap(exc, f"abort the multipart upload to {key}") from exc
        except BotoCoreError as exc:
            raise _wrap(exc, f"abort the multipart upload to {key}") from exc

    def allow_browser_uploads(self, origins: list[str], max_age: int = 3600) -> None:
        """Set the bucket's CORS rules so pages served from ``origins`` may PUT parts to presigned
        URLs (and GET artifacts); ``max_age`` is how long, in seconds, a browser caches the preflight.

        Raises:
            StorageError: S3 is unreachable or refuses.
        """
        rule = {"AllowedOrigins": list(origins), "AllowedMethods": ["PUT", "GET", "HEAD"],
                "AllowedHeaders": ["*"], "ExposeHeaders": ["ETag"], "MaxAgeSeconds": max_age}
        try:
            self.client.put_bucket_cors(Bucket=self.bucket, CORSConfiguration={"CORSRules": [rule]})
        except (BotoCoreError, ClientError) as exc:
            raise _wrap(exc, f"set the CORS rules of {self.bucket}") from exc

    def list_objects(self, prefix: str, page_size: int = 1000) -> Iterator[ListedObject]:
        """Yield every object whose key starts with ``prefix``, in key order, ``page_size`` keys per S3 request.

        Memory stays constant however many objects there are.

        Raises:
            StorageError: S3 is unreachable or refuses.
        """
        paginator = self.client.get_paginator("list_objects_v2")
        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix, PaginationConfig={"PageSize": page_size}):
                for item in page.get("Contents", []):
                    yield ListedObject(key=item["Key"], size=item["Size"], last_modified=item["LastModified"])
        except (BotoCoreError, ClientError) as exc:
            raise _wrap(exc, f"list {prefix}") from exc

    def list_multipart_uploads(self, prefix: str) -> Iterator[PendingMultipartUpload]:
        """Yield the multipart uploads under ``prefix`` that were started and neither completed nor aborted.

        Raises:
            StorageError: S3 is unreachable or refuses.
        """
        paginator = self.client.get_paginator("list_multipart_uploads")
        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
                for item in page.get("Uploads", []):
                    yield PendingMultipartUpload(
                        key=item["Key"], upload_id=item["UploadId"], initiated=item["Initiated"]
                    )
        except (BotoCoreError, ClientError) as exc:
            raise _wrap(exc, f"list multipart uploads under {prefix}") from exc


