"""Safe inspection and extraction of uploaded Triton model archives.

An upload is a ``.tar.gz``, ``.tgz``, ``.tar.xz``, ``.tar`` or ``.zip`` archive of one Triton model
directory: ``config.pbtxt`` plus exactly one numeric version directory (``1/``, ``3/`` ...) holding the
model files (only an ensemble's version directory may be empty). The model directory is either the
archive root or the one top-level directory of the archive. :func:`scan_archive` lists any archive
(a BentoML export, a TorchScript zip) under the same checks without assuming a Triton layout.

Archives come from users, so every member is distrusted: names that could escape the destination
(absolute paths, ``..``, backslashes, control characters, percent-encoded forms of those), links and
special files, duplicates, and sizes or compression ratios that betray an archive bomb are refused
with an :class:`ArchiveError` whose message names the member. Low-level decoder failures of a
truncated or corrupt archive are reported as :class:`ArchiveError` too, never as ``EOFError``,
``zlib.error``, ``BadZipFile`` or ``tarfile.ReadError``.

Work is single-pass and constant-memory in the archive's data: a compressed tar is decompressed once,
front to back, and never seeked backwards; member data is copied in fixed-size chunks.
"""

from __future__ import annotations

import gzip
import hashlib
import lzma
import os
import re
import shutil
import stat
import struct
import tarfile
import unicodedata
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import IO
from urllib.parse import unquote

from deployments.runtimes.triton_config import ENSEMBLE_PLATFORM, config_platform

__all__ = [
    "ArchiveError",
    "ArchiveLimits",
    "ArchiveListing",
    "TritonModelLayout",
    "extract_version_dir",
    "inspect_triton_archive",
    "scan_archive",
    "sha256_file",
]

CONFIG_NAME = "config.pbtxt"
MAX_CONFIG_BYTES = 1 << 20
CHUNK_BYTES = 1 << 20
# Per-component limit of common Linux filesystems; a longer name would fail at write time instead.
MAX_COMPONENT_BYTES = 255
# Keeps the in-memory member list small and leaves room for the destination prefix under PATH_MAX.
MAX_PATH_BYTES = 1024
# Triton stores model versions as signed 64-bit integers.
MAX_VERSION = 2**63 - 1
# A tar writer pads its output to a whole record (10 KiB by default) after the end-of-archive
# marker; anything far beyond that is not padding.
MAX_TRAILING_BYTES = 1 << 20

_NOT_AN_ARCHIVE = "not a .tar.gz, .tar.xz, .tar or .zip archive"
_GZIP_MAGIC = b"\x1f\x8b"
_XZ_MAGIC = b"\xfd7zXZ\x00"
_ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")
_USTAR_MAGIC = b"ustar"
_USTAR_MAGIC_OFFSET = 257
_DRIVE_PREFIX = re.compile(r"[A-Za-z]:")
_JUNK_NAMES = frozenset({"__MACOSX", "__pycache__", ".DS_Store"})
_ZIP_METHODS = frozenset({zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA})
_ZIP_ENCRYPTED_FLAG = 0x1

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


@dataclass(frozen=True)
class TritonModelLayout:
    """Where the Triton model sits inside an accepted archive.

    Attributes:
        kind: ``"tar"`` (plain, gzip- or xz-compressed) or ``"zip"``.
        model_root: archive-internal prefix of the model directory: ``""`` when the model directory
            is the archive root, else ``"<top-level directory>/"``.
        config_text: the contents of ``config.pbtxt``, decoded as UTF-8 (at most 1 MiB).
        version_dir: the name of the numeric version directory, e.g. ``"1"``.
        files: paths of the regular files in the version directory, relative to it, ``/``-separated
            and sorted; ignored junk (``__pycache__``, macOS metadata) is not listed.
        unpacked_bytes: declared size of those files plus ``config.pbtxt``, in bytes.
    """

    kind: str
    model_root: str
    config_text: str
    version_dir: str
    files: tuple[str, ...]
    unpacked_bytes: int


@dataclass(frozen=True)
class _Entry:
    """One archive member that passed the per-member checks."""

    parts: tuple[str, ...]
    is_dir: bool
    size: int
    ignored: bool
    shown: str
    ref: object

    @property
    def path(self) -> str:
        return "/".join(self.parts)


def inspect_triton_archive(path: Path, limits: ArchiveLimits) -> TritonModelLayout:
    """Check an uploaded archive and describe the Triton model inside it, without extracting.

    The format is detected from the content, not the file name. The archive is read once, front
    to back; only ``config.pbtxt`` is decompressed into memory (at most 1 MiB).

    Args:
        path: the archive file on local disk.
        limits: member count, unpacked size (bytes) and compression-ratio bounds.

    Returns:
        The layout of the model: its root inside the archive, the config text, the version
        directory and the files in it.

    Raises:
        ArchiveError: the file is not a tar, tar.gz or zip archive; it is truncated or corrupt; a
            member is unsafe (escaping path, link, special file, duplicate); a limit is exceeded;
            or the content is not one Triton model directory with one version directory.
        OSError: ``path`` cannot be opened (for example, it does not exist).

    Reads only; calling it again on the same file gives the same answer.
    """
    path = Path(path)
    archive_bytes = path.stat().st_size
    entries: list[_Entry] = []
    junk_parents: set[tuple[str, ...]] = set()
    configs: dict[tuple[str, ...], bytes | None] = {}
    with _open_reader(path) as reader:
        for entry in _scan(reader, limits, archive_bytes):
            if entry.ignored:
                junk_parents.add(_kept_prefix(entry.parts))
                continue
            entries.append(entry)
            if _is_config_candidate(entry, configs):
                if entry.size > MAX_CONFIG_BYTES:
                    configs[entry.parts] = None
                else:
                    with _reading():
                        configs[entry.parts] = reader.read_head(entry.ref, MAX_CONFIG_BYTES + 1)
        with _reading():
            reader.finish()
        kind = reader.kind
    _check_collisions(entries)
    return _plan_layout(kind, entries, configs, junk_parents)


@dataclass(frozen=True)
class ArchiveListing:
    """What :func:`scan_archive` found in an archive that passed the per-member checks.

    Attributes:
        kind: ``"tar"`` or ``"zip"``.
        compression: ``"gzip"``, ``"xz"`` or None (a plain tar, or a zip).
        members: ``(path, is_dir, declared size in bytes)`` of every member, ``/``-separated,
            sorted by path; junk (``__pycache__``, macOS metadata) is left out.
        contents: the bytes of the regular files the caller asked for, by path.
    """

    kind: str
    compression: str | None
    members: tuple[tuple[str, bool, int], ...]
    contents: dict[str, bytes]

    @property
    def files(self) -> tuple[str, ...]:
        """Paths of the regular files, sorted."""
        return tuple(path for path, is_dir, _ in self.members if not is_dir)


def scan_archive(
    path: Path, limits: ArchiveLimits, *, wanted=lambda parts: False, max_read_bytes: int = MAX_CONFIG_BYTES
) -> ArchiveListing:
    """Check every member of an archive and read a few small files from it, without extracting.

    The same checks as :func:`inspect_triton_archive` apply (escaping names, links, special files,
    duplicates, member count, unpacked size and compression ratio, truncation), but no Triton
    layout is assumed.

    Args:
        path: the archive file on local disk (tar, tar.gz, tar.xz or zip, detected from the content).
        limits: member count, unpacked size (bytes) and compression-ratio bounds.
        wanted: called with a regular file's path components; True keeps that file's bytes.
        max_read_bytes: the most bytes one kept file may hold; at most four such files' worth
            (``4 * max_read_bytes``) is kept in memory in all.

    Returns:
        The listing of members and the kept files' bytes.

    Raises:
        ArchiveError: the file is not an archive, is truncated or corrupt, holds an unsafe member,
            exceeds a limit, or a kept file is larger than ``max_read_bytes``.
        OSError: ``path`` cannot be opened.

    Reads only.
    """
    path = Path(path)
    entries: list[_Entry] = []
    contents: dict[str, bytes] = {}
    kept = 0
    with _open_reader(path) as reader:
        for entry in _scan(reader, limits, path.stat().st_size):
            if entry.ignored:
                continue
            entries.append(entry)
            if entry.is_dir or not wanted(entry.parts):
                continue
            kept += entry.size
            if entry.size > max_read_bytes or kept > 4 * max_read_bytes:
                raise ArchiveError(f"member {entry.shown} is larger than {max_read_bytes} bytes")
            with _reading():
                contents[entry.path] = reader.read_head(entry.ref, max_read_bytes + 1)
        with _reading():
            reader.finish()
        kind, compression = reader.kind, reader.compression
    _check_collisions(entries)
    members = tuple(sorted((entry.path, entry.is_dir, entry.size) for entry in entries))
    return ArchiveListing(kind=kind, compression=compression, members=members, contents=contents)


def extract_version_dir(path: Path, layout: TritonModelLayout, dest: Path, limits: ArchiveLimits) -> int:
    """Extract the regular files of the version directory into a new directory.

    ``dest`` receives the contents of the version directory (``dest/model.onnx`` for the member
    ``<model_root>1/model.onnx``). Files are written 0o644 and directories 0o755 whatever the
    archive says; links are never followed or created; data is streamed in 1 MiB chunks. Every
    member is checked again while reading, so an archive replaced since :func:`inspect_triton_archive`
    is refused rather than trusted.

    Args:
        path: the archive file on local disk, as given to :func:`inspect_triton_archive`.
        layout: what :func:`inspect_triton_archive` returned for this archive.
        dest: the directory to create; it must not exist yet, and its parent must.
        limits: the same bounds as for inspection; the bytes actually written are checked against
            ``max_unpacked_bytes`` as they are written.

    Returns:
        The number of bytes written, in total.

    Raises:
        ArchiveError: anything wrong with the archive, including data that outgrows its declared
            size, a running total over ``max_unpacked_bytes``, truncation, or content that no
            longer matches ``layout``. ``dest`` has been removed completely.
        FileExistsError: ``dest`` already exists; it is left untouched.
        FileNotFoundError: the parent of ``dest`` or the archive does not exist.
        OSError: a local write failed (for example, the disk is full); ``dest`` has been removed.
            Kept apart from ArchiveError because a retry may succeed and the upload is not at fault.

    Not idempotent by itself: a second call with the same ``dest`` raises FileExistsError, so a
    caller that retries extracts into a fresh directory (or removes the old one first).
    """
    path = Path(path)
    dest = Path(dest)
    archive_bytes = path.stat().st_size
    os.mkdir(dest, 0o755)
    try:
        os.chmod(dest, 0o755)
        return _extract_into(path, layout, dest, limits, archive_bytes)
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise


def sha256_file(path: Path, chunk_size: int = 1 << 20) -> tuple[str, int]:
    """Hash a file with SHA-256 in constant memory.

    Args:
        path: the file to read.
        chunk_size: bytes read per step; memory use is bounded by it.

    Returns:
        ``(hex digest, size in bytes)``.

    Raises:
        ValueError: ``chunk_size`` is not positive.
        OSError: the file cannot be read.
    """
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, not {chunk_size}")
    digest = hashlib.sha256()
    size = 0
    buffer = bytearray(chunk_size)
    view = memoryview(buffer)
    with open(path, "rb") as handle:
        while count := handle.readinto(buffer):
            digest.update(view[:count])
            size += count
    return digest.hexdigest(), size


# --- Reading members ------------------------------------------------------------------------------


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

    def __init__(self, path: Path, compression: str | None) -> None:
        self.compression = compression
        self._raw = open(path, "rb")
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
        self._raw.close()


class _ZipReader:
    """Members of a zip archive, in central-directory order."""

    kind = "zip"
    compression = None

    def __init__(self, path: Path) -> None:
        self._zip = zipfile.ZipFile(path)

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


def _open_reader(path: Path) -> closing[_Reader]:
    """Detect the format from the content and open a reader for it."""
    with open(path, "rb") as handle:
        head = handle.read(tarfile.BLOCKSIZE)
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


def _open_compressed_tar(path: Path, compression: str) -> _TarReader:
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


def _first_decompressed_block(path: Path, compression: str) -> bytes | None:
    opener = gzip.open if compression == "gzip" else lzma.open
    try:
        with opener(path, "rb") as stream:
            return stream.read(tarfile.BLOCKSIZE)
    except _DECODER_ERRORS:
        return None


def _scan(reader: _Reader, limits: ArchiveLimits, archive_bytes: int) -> Iterator[_Entry]:
    """Yield every member that passes the per-member checks, enforcing the limits as it goes.

    Junk members are yielded with ``ignored=True`` after the same checks, so a link or an escaping
    path is refused wherever it hides.
    """
    members = reader.members()
    count = 0
    declared = 0
    while True:
        with _reading():
            item = next(members, None)
        if item is None:
            return
        raw_name, ref = item
        count += 1
        if count > limits.max_members:
            raise ArchiveError(f"archive holds more than {limits.max_members} members")
        shown = _show(raw_name)
        parts = _checked_parts(raw_name, shown)
        with _reading():
            is_dir, size = reader.describe(ref, shown)
        if not parts:
            if is_dir:
                continue  # the archive root itself, written as "./" by `tar -C dir .`
            raise ArchiveError(f"member {shown} has an empty name")
        if not is_dir:
            declared += size
            _check_declared_total(declared, limits, archive_bytes)
        yield _Entry(parts=parts, is_dir=is_dir, size=size, ignored=_is_junk(parts), shown=shown, ref=ref)


# Below this many unpacked bytes no archive is a threat, whatever its ratio: a few MiB of
# text or zero-padded weights compress far past 200:1 and are still harmless.
RATIO_FLOOR_BYTES = 16 * 1024 * 1024

def _check_declared_total(declared: int, limits: ArchiveLimits, archive_bytes: int) -> None:
    if declared > limits.max_unpacked_bytes:
        raise ArchiveError(
            f"archive unpacks to more than {limits.max_unpacked_bytes} bytes, the limit for one model version"
        )
    if declared > RATIO_FLOOR_BYTES and declared > limits.max_compression_ratio * archive_bytes:
        raise ArchiveError(
            f"archive would unpack to at least {declared} bytes from {archive_bytes} bytes, above the "
            f"{limits.max_compression_ratio}:1 compression-ratio limit; refused as a likely archive bomb"
        )


# --- Member names ---------------------------------------------------------------------------------


def _show(name: str) -> str:
    """A member name as it may appear in an error message: quoted, escaped, bounded in length."""
    if len(name) > 200:
        name = name[:200] + "..."
    return repr(name)


def _checked_parts(raw: str, shown: str) -> tuple[str, ...]:
    """Split a member name into path components, refusing any name that could escape ``dest``."""
    problem = _path_problem(raw)
    if problem:
        raise ArchiveError(f"member {shown} {problem}")
    # Decode twice, as a web server or an S3 key might: "%252e%252e" -> "%2e%2e" -> "..".
    text = raw
    for _ in range(2):
        decoded = unquote(text)
        if decoded == text:
            break
        problem = _path_problem(decoded)
        if problem:
            raise ArchiveError(
                f"member {shown} hides a path escape in percent-encoding: decoded as {_show(decoded)}, it {problem}"
            )
        text = decoded
    parts = tuple(part for part in raw.split("/") if part not in ("", "."))
    if len("/".join(parts).encode("utf-8")) > MAX_PATH_BYTES:
        raise ArchiveError(f"member {shown} has a path longer than {MAX_PATH_BYTES} bytes")
    for part in parts:
        if len(part.encode("utf-8")) > MAX_COMPONENT_BYTES:
            raise ArchiveError(f"member {shown} has a path component longer than {MAX_COMPONENT_BYTES} bytes")
    return parts


def _path_problem(text: str) -> str | None:
    """Why ``text`` is not a safe relative path, or None when it is."""
    if "\x00" in text:
        return "contains a NUL byte"
    for char in text:
        code = ord(char)
        if code < 0x20 or 0x7F <= code < 0xA0:
            return "contains a control character"
        if 0xD800 <= code <= 0xDFFF:
            return "has a name that is not valid UTF-8"
    if text.startswith(("/", "\\")) or _DRIVE_PREFIX.match(text):
        return "is an absolute path"
    if "\\" in text:
        return "contains a backslash"
    if ".." in text.split("/"):
        return "climbs out of the archive with a '..' component"
    return None


def _is_junk(parts: tuple[str, ...]) -> bool:
    """macOS metadata and Python bytecode caches: never part of a model, never extracted."""
    return len(_kept_prefix(parts)) < len(parts)


def _kept_prefix(parts: tuple[str, ...]) -> tuple[str, ...]:
    """The components before the first junk one: the directory a junk member was found in."""
    for depth, part in enumerate(parts):
        if part in _JUNK_NAMES or part.startswith("._"):
            return parts[:depth]
    return parts


def _fold(part: str) -> str:
    """The form under which two names land on the same file of a case-insensitive filesystem."""
    return unicodedata.normalize("NFC", part).casefold()


def _check_collisions(entries: list[_Entry]) -> None:
    """Refuse duplicate paths, paths equal but for case or Unicode form, and files used as directories.

    Sorting by folded component tuples puts equal paths next to each other and every path right
    after the entries it lies under, so comparing neighbours is enough.
    """
    keyed = sorted(((tuple(_fold(part) for part in entry.parts), entry) for entry in entries), key=lambda t: t[0])
    for (key, entry), (next_key, next_entry) in pairwise(keyed):
        if key == next_key:
            if entry.is_dir != next_entry.is_dir:
                raise ArchiveError(f"member {_show(entry.path)} is both a file and a directory")
            if entry.parts == next_entry.parts:
                raise ArchiveError(f"member {_show(entry.path)} appears more than once")
            raise ArchiveError(
                f"members {_show(entry.path)} and {_show(next_entry.path)} differ only in letter case or "
                "Unicode form and would overwrite each other on some filesystems"
            )
        if not entry.is_dir and next_key[: len(key)] == key:
            raise ArchiveError(
                f"member {_show(entry.path)} is a file, but {_show(next_entry.path)} is stored inside it"
            )


# --- Model layout ---------------------------------------------------------------------------------


def _is_numeric(name: str) -> bool:
    return name.isascii() and name.isdigit()


def _is_config_candidate(entry: _Entry, configs: dict[tuple[str, ...], bytes | None]) -> bool:
    """Whether to keep this member's bytes: it may turn out to be the model's config.pbtxt.

    The model directory is the root or the single top-level directory, so only the first
    ``config.pbtxt`` at depth one and at depth two can matter; any other copy makes the layout
    invalid anyway. Keeping at most two bounds memory at 2 MiB.
    """
    if entry.is_dir or entry.parts[-1] != CONFIG_NAME or len(entry.parts) > 2:
        return False
    return not any(len(parts) == len(entry.parts) for parts in configs)


def _plan_layout(
    kind: str,
    entries: list[_Entry],
    configs: dict[tuple[str, ...], bytes | None],
    junk_parents: set[tuple[str, ...]],
) -> TritonModelLayout:
    if not entries:
        raise ArchiveError("archive holds no files")
    root = _model_root(entries)
    prefix = "".join(f"{part}/" for part in root)
    where = f"model directory {prefix!r}" if prefix else "archive root"
    below = [(entry.parts[len(root) :], entry) for entry in entries if len(entry.parts) > len(root)]

    for name in sorted({rel[0] for rel, _ in below}):
        if name != CONFIG_NAME and not _is_numeric(name):
            raise ArchiveError(
                f"unexpected entry {prefix + name!r} in the {where}: a model directory holds only "
                f"{CONFIG_NAME} and one numeric version directory"
            )

    config_entries = [(rel, entry) for rel, entry in below if rel[0] == CONFIG_NAME]
    if not config_entries:
        raise ArchiveError(f"no {CONFIG_NAME} in the {where}")
    if any(entry.is_dir or len(rel) > 1 for rel, entry in config_entries):
        raise ArchiveError(f"{prefix + CONFIG_NAME!r} must be a file, not a directory")
    config_entry = config_entries[0][1]

    # A version directory that holds only junk still counts, so that it is reported as empty.
    names_below = {rel[0] for rel, _ in below}
    names_below.update(
        parent[len(root)] for parent in junk_parents if len(parent) > len(root) and parent[: len(root)] == root
    )
    versions = sorted((name for name in names_below if _is_numeric(name)), key=int)
    for version in versions:
        if version != str(int(version)) or not 0 < int(version) <= MAX_VERSION:
            raise ArchiveError(
                f"version directory {prefix + version!r} must be a positive integer without leading zeros, such as 1"
            )
    if not versions:
        raise ArchiveError(f"no version directory in the {where}: it needs exactly one, such as 1/")
    if len(versions) > 1:
        raise ArchiveError(f"found version directories {', '.join(versions)}: an archive holds exactly one")
    version = versions[0]

    files: list[tuple[str, int]] = []
    for rel, entry in below:
        if rel[0] != version:
            continue
        if len(rel) == 1 and not entry.is_dir:
            raise ArchiveError(f"{prefix + version!r} is a file; the version directory must be a directory")
        if not entry.is_dir:
            files.append(("/".join(rel[1:]), entry.size))

    config_bytes = configs.get(config_entry.parts)
    if config_bytes is None or len(config_bytes) > MAX_CONFIG_BYTES:
        raise ArchiveError(f"{prefix + CONFIG_NAME!r} is larger than {MAX_CONFIG_BYTES} bytes (1 MiB)")
    try:
        config_text = config_bytes.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ArchiveError(f"{prefix + CONFIG_NAME!r} is not valid UTF-8 text (byte {exc.start})") from None
    # An ensemble has no model files of its own: Triton only needs its version directory to exist.
    if not files and config_platform(config_text) != ENSEMBLE_PLATFORM:
        raise ArchiveError(f"version directory {prefix + version + '/'!r} holds no files")

    files.sort()
    return TritonModelLayout(
        kind=kind,
        model_root=prefix,
        config_text=config_text,
        version_dir=version,
        files=tuple(name for name, _ in files),
        unpacked_bytes=sum(size for _, size in files) + config_entry.size,
    )


def _model_root(entries: list[_Entry]) -> tuple[str, ...]:
    """``()`` when the model directory is the archive root, else ``(top-level directory,)``."""
    tops = {entry.parts[0] for entry in entries}
    if len(tops) != 1:
        return ()
    (top,) = tops
    if top == CONFIG_NAME or _is_numeric(top):
        # A lone "1/" is a version directory without its config, not a model directory.
        return ()
    if any(len(entry.parts) == 1 and not entry.is_dir for entry in entries):
        return ()
    return (top,)


# --- Extraction -----------------------------------------------------------------------------------


def _extract_into(path: Path, layout: TritonModelLayout, dest: Path, limits: ArchiveLimits, archive_bytes: int) -> int:
    prefix = (*(part for part in layout.model_root.split("/") if part), layout.version_dir)
    expected = set(layout.files)
    written: set[str] = set()
    made_dirs: set[tuple[str, ...]] = set()
    total = 0
    with _open_reader(path) as reader:
        if reader.kind != layout.kind:
            raise ArchiveError(f"archive changed since it was inspected: it is now a {reader.kind} archive")
        for entry in _scan(reader, limits, archive_bytes):
            if entry.ignored or entry.is_dir or entry.parts[: len(prefix)] != prefix:
                continue
            rel_parts = entry.parts[len(prefix) :]
            rel = "/".join(rel_parts)
            if rel not in expected:
                raise ArchiveError(f"archive changed since it was inspected: member {entry.shown} is new")
            if rel in written:
                raise ArchiveError(f"member {entry.shown} appears more than once")
            written.add(rel)
            parent = _make_parents(dest, rel_parts[:-1], made_dirs)
            total += _write_member(reader, entry, parent / rel_parts[-1], limits, total)
        with _reading():
            reader.finish()
    missing = sorted(expected - written)
    if missing:
        raise ArchiveError(f"archive changed since it was inspected: member {_show(missing[0])} is gone")
    return total


def _make_parents(dest: Path, dir_parts: tuple[str, ...], made_dirs: set[tuple[str, ...]]) -> Path:
    current = dest
    for depth, part in enumerate(dir_parts, start=1):
        current = current / part
        if dir_parts[:depth] not in made_dirs:
            # mkdir fails on anything already there, so an unexpected link is never followed.
            os.mkdir(current, 0o755)
            os.chmod(current, 0o755)
            made_dirs.add(dir_parts[:depth])
    return current


def _write_member(reader: _Reader, entry: _Entry, target: Path, limits: ArchiveLimits, total_so_far: int) -> int:
    """Copy one member to ``target`` in chunks; return the bytes written."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    written = 0
    with os.fdopen(os.open(target, flags, 0o644), "wb") as out:
        os.fchmod(out.fileno(), 0o644)
        with _reading():
            source = reader.open(entry.ref)
        try:
            while True:
                with _reading():
                    chunk = source.read(CHUNK_BYTES)
                if not chunk:
                    break
                written += len(chunk)
                if written > entry.size:
                    raise ArchiveError(f"member {entry.shown} holds more data than its declared {entry.size} bytes")
                if total_so_far + written > limits.max_unpacked_bytes:
                    raise ArchiveError(
                        f"archive unpacks to more than {limits.max_unpacked_bytes} bytes, "
                        "the limit for one model version"
                    )
                out.write(chunk)
        finally:
            with _reading():
                source.close()
    if written != entry.size:
        raise ArchiveError(
            f"archive is truncated or corrupt: member {entry.shown} holds {written} of its declared {entry.size} bytes"
        )
    return written
