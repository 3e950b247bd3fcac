"""Checking a multipart upload's parts against what the store received, without reading them back.

The client declares each part's MD5 and SHA-256 before it sends the part (``UploadPart`` rows).
The store computes each part's ETag from the bytes it received; where ETags are MD5s (AWS S3
without SSE-KMS or SSE-C, MinIO without encryption, moto), a declared MD5 that equals the ETag
shows the part arrived as the client read it. Once joined, the object's ETag must be the
composite of the declared MD5s (``registry.storage.composite_etag``) and its size the declared
size. Where that cannot be relied on, :func:`plan_verification` says so and why, and the upload
is streamed back and hashed instead.
"""

from registry.choices import UploadVerification
from registry.models import Upload
from registry.storage import MD5_HEX, UploadedPart, composite_etag


def expected_part_size(upload: Upload, number: int, count: int) -> int:
    """The bytes part ``number`` (1-based) of ``count`` must hold: ``part_size``, the last one the rest."""
    return upload.part_size if number < count else upload.size - upload.part_size * (count - 1)


def declared_md5s(upload: Upload) -> dict[int, str]:
    """The MD5 hex digest the client declared per part number."""
    return dict(upload.declared_parts.values_list("number", "md5"))


def plan_verification(upload: Upload, parts: list[UploadedPart], declared: dict[int, str]) -> tuple[str, str]:
    """How the upload's bytes can be checked: by the store's ETags, or only by reading them back.

    Args:
        upload: the upload, with its declared ``sha256`` and ``etags_are_md5``.
        parts: what ListParts reports, every part present.
        declared: :func:`declared_md5s` of the upload.

    Returns:
        ``(UploadVerification value, why it is READ_BACK or "")``.
    """
    if not upload.sha256:
        return UploadVerification.READ_BACK, "the client declared no sha256 of the whole file"
    if not upload.etags_are_md5:
        return UploadVerification.READ_BACK, ("the store encrypts the object (SSE-KMS, SSE-C or "
                                              "MODELYARD_S3_ETAGS_ARE_MD5=false), so its ETags are not MD5s")
    undeclared = [p.number for p in parts if p.number not in declared]
    if undeclared:
        return UploadVerification.READ_BACK, f"the client declared no digests for parts {_few(undeclared)}"
    other = [p for p in parts if not MD5_HEX.fullmatch(p.etag_hex)]
    if other:
        return UploadVerification.READ_BACK, (f"the store's ETag of part {other[0].number} ({other[0].etag}) is "
                                              "not an MD5 digest")
    return UploadVerification.PART_ETAGS, ""


def part_problems(upload: Upload, parts: list[UploadedPart], declared: dict[int, str], *, by_etag: bool) -> list[str]:
    """What is wrong with the parts the store holds, as sentences naming the part; [] when nothing is.

    Each part must hold its expected size (:func:`expected_part_size`); with ``by_etag``, its ETag
    must equal the MD5 the client declared for it.
    """
    count = max((p.number for p in parts), default=0)
    problems = []
    for part in parts:
        expected = expected_part_size(upload, part.number, count)
        if part.size != expected:
            problems.append(f"part {part.number} holds {part.size} bytes, not {expected}")
        if by_etag and part.number in declared and part.etag_hex != declared[part.number]:
            problems.append(f"part {part.number}: the store received bytes whose MD5 is {part.etag_hex}, "
                            f"but {declared[part.number]} was declared")
    return problems


def composite_problem(upload: Upload, declared: dict[int, str], etag: str, size: int) -> str:
    """Why the joined object is not what the declared parts make, or "" when it is.

    Args:
        etag: the joined object's ETag (HEAD, without quotes).
        size: its size in bytes (HEAD).
    """
    if size != upload.size:
        return f"the joined object holds {size} bytes, but {upload.size} were declared"
    expected = composite_etag([declared[n] for n in sorted(declared)])
    if etag != expected:
        return f"the joined object's ETag is {etag}, not {expected}, the composite of the declared part MD5s"
    return ""


def _few(numbers: list[int]) -> str:
    return ", ".join(map(str, numbers[:20])) + (" …" if len(numbers) > 20 else "")
