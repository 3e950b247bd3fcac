"""S3's own digests of what it stores: part ETags (MD5s) and the composite ETag of a multipart object."""

import base64
import hashlib
import re

MD5_HEX = re.compile(r"[0-9a-f]{32}")


def composite_etag(part_md5s: list[str]) -> str:
    """The ETag S3 gives an object joined from parts with these MD5s: ``md5(d1 || d2 || …)-N``.

    That is the MD5 of the concatenated binary part digests, then ``-`` and the part count; S3
    documents it for multipart objects that are not SSE-KMS or SSE-C encrypted ("Checking object
    integrity", Amazon S3 User Guide), and MinIO and moto compute it the same way.

    Args:
        part_md5s: each part's MD5 as 32 hex digits, in part-number order.

    Returns:
        The ETag without quotes, e.g. ``"433e64d0b6599f52fa660e7b8a3635ee-2"`` for two parts.

    Raises:
        ValueError: a digest is not 32 hex digits, or the list is empty.
    """
    if not part_md5s:
        raise ValueError("a multipart object has at least one part")
    joined = b"".join(bytes.fromhex(d) if MD5_HEX.fullmatch(d) else _bad_md5(d) for d in part_md5s)
    return f"{hashlib.md5(joined, usedforsecurity=False).hexdigest()}-{len(part_md5s)}"


def _bad_md5(digest: str) -> bytes:
    raise ValueError(f"{digest!r} is not an MD5 hex digest")


def hex_to_base64(hex_digest: str) -> str:
    """A hex digest in the base64 form S3 headers carry (``Content-MD5``, ``x-amz-checksum-sha256``)."""
    return base64.b64encode(bytes.fromhex(hex_digest)).decode("ascii")
