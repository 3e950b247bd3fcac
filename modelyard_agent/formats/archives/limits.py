"""What an archive may hold, and how a refusal is reported: :class:`ArchiveError` and :class:`ArchiveLimits`."""

from __future__ import annotations

import lzma
import struct
import tarfile
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

# What the standard library's tar, zip, gzip, zlib, bz2 and lzma readers raise on damaged or hostile
# input. Only calls into those readers are wrapped, so a fault in this module's own logic still
# surfaces as itself.
_DECODER_ERRORS = (
    tarfile.TarError,
    zipfile.BadZipFile,
    EOFError,
    OSError,
    zlib.error,
    lzma.LZMAError,
    struct.error,
    ValueError,
    NotImplementedError,
)


class ArchiveError(ValueError):
    """A user-facing reason why an archive was refused (safe to show in an HTTP 400)."""


@dataclass(frozen=True)
class ArchiveLimits:
    """Bounds on what an archive may unpack to.

    Attributes:
        max_unpacked_bytes: the most bytes, in total, the regular files of an archive may declare
            or write.
        max_compression_ratio: the most unpacked bytes allowed per byte of archive file; beyond it
            the archive is treated as a bomb.
        max_members: the most members (files, directories, anything) an archive may hold.

    Raises:
        ValueError: from the constructor, when a limit is not a positive integer.
    """

    max_unpacked_bytes: int
    max_compression_ratio: int
    max_members: int

    def __post_init__(self) -> None:
        for name in ("max_unpacked_bytes", "max_compression_ratio", "max_members"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, not {value!r}")

    @classmethod
    def from_payload(cls, limits: dict | None) -> ArchiveLimits:
        """The limits a deploy payload carries (``archive_limits``, the registry's own), or
        ``DEFAULT_LIMITS`` for a payload without them (protocol 1).

        Raises:
            ValueError: a limit is missing or not a positive integer.
            TypeError: a key that is not a limit.
        """
        return cls(**limits) if limits else DEFAULT_LIMITS

    def as_payload(self) -> dict[str, int]:
        """The limits as a deploy payload carries them (``from_payload`` reads them back)."""
        return {"max_unpacked_bytes": self.max_unpacked_bytes, "max_compression_ratio": self.max_compression_ratio,
                "max_members": self.max_members}


# The registry's defaults (MODELYARD_MAX_UNPACKED_BYTES, _MAX_COMPRESSION_RATIO, _MAX_ARCHIVE_MEMBERS):
# 8 GiB unpacked, a ratio of 200, 10,000 members.
DEFAULT_LIMITS = ArchiveLimits(max_unpacked_bytes=8 * 1024**3, max_compression_ratio=200, max_members=10_000)


@contextmanager
def _reading() -> Iterator[None]:
    """Turn a decoder failure inside the block into ArchiveError."""
    try:
        yield
    except ArchiveError:
        raise
    except _DECODER_ERRORS as exc:
        detail = str(exc) or type(exc).__name__
        raise ArchiveError(f"archive is truncated or corrupt: {detail}") from exc


def _show(name: str) -> str:
    """A member name as it may appear in an error message: quoted, escaped, bounded in length."""
    if len(name) > 200:
        name = name[:200] + "..."
    return repr(name)
