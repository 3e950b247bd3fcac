"""Reading the members of a plain, gzip- or xz-compressed tar or of a zip, in one forward pass.

A source is a path on disk or an open, seekable binary file (for instance one that fetches only the
ranges read from an object store); a file is read but neither closed nor rewound afterwards.
"""

from __future__ import annotations

import gzip
import lzma
import os
import stat
import tarfile
import zipfile
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import IO

from modelyard_agent.formats.archives.limits import _DECODER_ERRORS, ArchiveError, _reading, _show

CHUNK_BYTES = 1 << 20
# A tar writer pads its output to a whole record (10 KiB by default) after the end-of-archive
# marker; anything far beyond that is not padding.
MAX_TRAILING_BYTES = 1 << 20

_NOT_AN_ARCHIVE = "not a .tar.gz, .tar.xz, .tar or .zip archive"
_GZIP_MAGIC = b"\x1f\x8b"
_XZ_MAGIC = b"\xfd7zXZ\x00"
_ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")
_USTAR_MAGIC = b"ustar"
_USTAR_MAGIC_OFFSET = 257
_ZIP_METHODS = frozenset({zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA})
_ZIP_ENCRYPTED_FLAG = 0x1


class _HeaderTap:
    """Read-only file wrapper that remembers the result of the latest small read.

    tarfile reads each header as one 512-byte block and silently stops at a block that is not a
    valid header. Remembering that last block lets the end-of-archive marker be checked without
    seeking backwards, which on a gzip stream would mean decompressing everything again.
    """

    def __init__(self, raw: IO[bytes]) -> None:
        self._raw = raw
        self.last_read: bytes | None = None

    def read(self, size: int = -1) -> bytes:
        data = self._raw.read(size)
        self.last_read = data if len(data) <= tarfile.BLOCKSIZE else None
        return data

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self._raw.seek(offset, whence)

    def tell(self) -> int:
        return self._raw.tell()


class _TarReader:
    """Members of a plain, gzip- or xz-compressed tar, in one forward pass."""

    kind = "tar"

    def __init__(self, source: Source, compression: str | None) -> None:
        self.compression = compression
        self._owns_raw = not hasattr(source, "read")
        if self._owns_raw:
            self._raw = open(source, "rb")
        else:
            self._raw = source
            source.seek(0)
        self._stream: gzip.GzipFile | lzma.LZMAFile | None = None
        try:
            if compression == "gzip":
                self._stream = gzip.GzipFile(fileobj=self._raw, mode="rb")
            elif compression == "xz":
                self._stream = lzma.LZMAFile(self._raw, mode="rb")
            self._tap = _HeaderTap(self._stream or self._raw)
            self._tar = tarfile.TarFile(fileobj=self._tap, mode="r")
        except BaseException:
            self.close()
            raise

    def members(self) -> Iterator[tuple[str, tarfile.TarInfo]]:
        for info in self._tar:
            yield info.name, info

    def describe(self, info: tarfile.TarInfo, shown: str) -> tuple[bool, int]:
        """Return ``(is_dir, declared size in bytes)``, refusing anything but files and directories."""
        if info.issym():
            raise ArchiveError(f"member {shown} is a symbolic link; links are not allowed")
        if info.islnk():
            raise ArchiveError(f"member {shown} is a hard link; links are not allowed")
        if info.ischr() or info.isblk():
            raise ArchiveError(f"member {shown} is a device file; only regular files and directories are allowed")
        if info.isfifo():
            raise ArchiveError(f"member {shown} is a FIFO; only regular files and directories are allowed")
        if info.issparse():
            raise ArchiveError(f"member {shown} is a sparse file; only regular files and directories are allowed")
        if info.isdir():
            return True, 0
        if info.isreg():
            if info.size < 0:
                raise ArchiveError(f"archive is truncated or corrupt: member {shown} has a negative size")
            return False, info.size
        raise ArchiveError(f"member {shown} has an unsupported tar type {info.type!r}")

    def open(self, info: tarfile.TarInfo) -> IO[bytes]:
        stream = self._tar.extractfile(info)
        if stream is None:
            raise ArchiveError(f"archive is truncated or corrupt: member {_show(info.name)} has no data")
        return stream

    def read_head(self, info: tarfile.TarInfo, limit: int) -> bytes:
        with self.open(info) as stream:
            return stream.read(limit)

    def finish(self) -> None:
        """Check the end-of-archive marker and, when compressed, the rest of the stream and its checksum."""
        block = self._tap.last_read
        if block is None or len(block) != tarfile.BLOCKSIZE or block.count(0) != tarfile.BLOCKSIZE:
            raise ArchiveError("archive is truncated or corrupt: the tar end-of-archive marker is missing")
        if self._stream is None:
            return
        trailing = 0
        while chunk := self._stream.read(CHUNK_BYTES):
            trailing += len(chunk)
            if trailing > MAX_TRAILING_BYTES:
                raise ArchiveError(
                    f"archive holds more than {MAX_TRAILING_BYTES} bytes after the end of the tar archive"
                )

    def close(self) -> None:
        tar = getattr(self, "_tar", None)
        if tar is not None:
            tar.close()
        if self._stream is not None:
            self._stream.close()
        if self._owns_raw:
            self._raw.close()


class _ZipReader:
    """Members of a zip archive, in central-directory order."""

    kind = "zip"
    compression = None

    def __init__(self, source: Source) -> None:
        if hasattr(source, "read"):
            source.seek(0)
        self._zip = zipfile.ZipFile(source)

    def members(self) -> Iterator[tuple[str, zipfile.ZipInfo]]:
        for info in self._zip.infolist():
            # orig_filename is the name as stored: ZipInfo.filename is already cut at a NUL byte.
            yield info.orig_filename, info

    def describe(self, info: zipfile.ZipInfo, shown: str) -> tuple[bool, int]:
        """Return ``(is_dir, declared size in bytes)``, refusing anything but files and directories."""
        file_type = stat.S_IFMT(info.external_attr >> 16)
        if file_type == stat.S_IFLNK:
            raise ArchiveError(f"member {shown} is a symbolic link; links are not allowed")
        if file_type in (stat.S_IFCHR, stat.S_IFBLK):
            raise ArchiveError(f"member {shown} is a device file; only regular files and directories are allowed")
        if file_type == stat.S_IFIFO:
            raise ArchiveError(f"member {shown} is a FIFO; only regular files and directories are allowed")
        if file_type not in (0, stat.S_IFREG, stat.S_IFDIR):
            raise ArchiveError(f"member {shown} is not a regular file or directory (mode {file_type:#o})")
        if info.flag_bits & _ZIP_ENCRYPTED_FLAG:
            raise ArchiveError(f"member {shown} is encrypted; encrypted archives are not supported")
        is_dir = info.orig_filename.endswith("/") or file_type == stat.S_IFDIR
        if is_dir:
            if info.file_size:
                raise ArchiveError(f"member {shown} is a directory entry that carries data")
            return True, 0
        if info.compress_type not in _ZIP_METHODS:
            raise ArchiveError(f"member {shown} uses an unsupported compression method ({info.compress_type})")
        return False, info.file_size

    def open(self, info: zipfile.ZipInfo) -> IO[bytes]:
        return self._zip.open(info)

    def read_head(self, info: zipfile.ZipInfo, limit: int) -> bytes:
        with self.open(info) as stream:
            return stream.read(limit)

    def finish(self) -> None:
        """Nothing to check: the central directory was read whole when the archive was opened."""

    def close(self) -> None:
        self._zip.close()

_Reader = _TarReader | _ZipReader
Source = Path | IO[bytes]


def _head(source: Source) -> bytes:
    """The first tar block of ``source`` (a path or a seekable file, left at its start)."""
    if hasattr(source, "read"):
        source.seek(0)
        head = source.read(tarfile.BLOCKSIZE)
        source.seek(0)
        return head
    with open(source, "rb") as handle:
        return handle.read(tarfile.BLOCKSIZE)


def source_size(source: Source) -> int:
    """The size in bytes of ``source``: a path's on disk, or a seekable file's (left at its start)."""
    if hasattr(source, "read"):
        size = source.seek(0, os.SEEK_END)
        source.seek(0)
        return size
    return Path(source).stat().st_size


def detect_kind(source: Source) -> tuple[str, str | None] | None:
    """Tell an archive's format from its first 512 bytes alone.

    Returns:
        ``("tar", "gzip" | "xz" | None)`` or ``("zip", None)``; None when the magic bytes say
        nothing (a prefixed zip, a pre-POSIX tar, or no archive).
    """
    head = _head(source)
    if head.startswith(_GZIP_MAGIC):
        return "tar", "gzip"
    if head.startswith(_XZ_MAGIC):
        return "tar", "xz"
    if head.startswith(_ZIP_MAGICS):
        return "zip", None
    if head[_USTAR_MAGIC_OFFSET : _USTAR_MAGIC_OFFSET + len(_USTAR_MAGIC)] == _USTAR_MAGIC:
        return "tar", None
    return None


def _open_reader(path: Source) -> closing[_Reader]:
    """Detect the format from the content and open a reader for it."""
    head = _head(path)
    if head.startswith(_GZIP_MAGIC):
        return closing(_open_compressed_tar(path, "gzip"))
    if head.startswith(_XZ_MAGIC):
        return closing(_open_compressed_tar(path, "xz"))
    if head.startswith(_ZIP_MAGICS):
        with _reading():
            return closing(_ZipReader(path))
    if head[_USTAR_MAGIC_OFFSET : _USTAR_MAGIC_OFFSET + len(_USTAR_MAGIC)] == _USTAR_MAGIC:
        with _reading():
            return closing(_TarReader(path, compression=None))
    # Zips with a prefix (self-extracting stubs) and pre-POSIX tars have no magic at offset 0.
    with _reading():
        looks_like_zip = zipfile.is_zipfile(path)
    if looks_like_zip:
        with _reading():
            return closing(_ZipReader(path))
    try:
        return closing(_TarReader(path, compression=None))
    except _DECODER_ERRORS:
        raise ArchiveError(_NOT_AN_ARCHIVE) from None


def _open_compressed_tar(path: Source, compression: str) -> _TarReader:
    try:
        return _TarReader(path, compression=compression)
    except tarfile.ReadError as exc:
        first_block = _first_decompressed_block(path, compression)
        if first_block is not None and len(first_block) == tarfile.BLOCKSIZE:
            # The compression layer decoded a whole block, so the data inside is simply not a tar.
            raise ArchiveError(f"{_NOT_AN_ARCHIVE}: the {compression} data does not hold a tar archive") from exc
        raise ArchiveError(f"archive is truncated or corrupt: {exc}") from exc
    except _DECODER_ERRORS as exc:
        raise ArchiveError(f"archive is truncated or corrupt: {str(exc) or type(exc).__name__}") from exc


def _first_decompressed_block(path: Source, compression: str) -> bytes | None:
    opener = gzip.open if compression == "gzip" else lzma.open
    if hasattr(path, "read"):
        path.seek(0)
    try:
        with opener(path, "rb") as stream:
            return stream.read(tarfile.BLOCKSIZE)
    except _DECODER_ERRORS:
        return None
