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
    def from_settings(cls) -> ArchiveLimits:
        """Build the limits from Django settings.

        Reads ``MAX_UNPACKED_BYTES`` (bytes), ``MAX_COMPRESSION_RATIO`` (unpacked bytes per
        archive byte) and ``MAX_ARCHIVE_MEMBERS`` (count).

        Returns:
            The limits; a new object on every call, so overridden settings take effect.

        Raises:
            ValueError: when a setting is not a positive integer.
            django.core.exceptions.ImproperlyConfigured: when Django settings are not configured.
        """
        from django.conf import settings

        return cls(
            max_unpacked_bytes=settings.MAX_UNPACKED_BYTES,
            max_compression_ratio=settings.MAX_COMPRESSION_RATIO,
            max_members=settings.MAX_ARCHIVE_MEMBERS,
        )


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
