"""Per-member checks: names that could escape the destination, junk, duplicates, size and ratio limits."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise
from typing import TYPE_CHECKING
from urllib.parse import unquote

from modelyard_agent.formats.archives.limits import ArchiveError, ArchiveLimits, _reading, _show
from modelyard_agent.formats.archives.readers import CHUNK_BYTES

if TYPE_CHECKING:
    from modelyard_agent.formats.archives.readers import _Reader

# Per-component limit of common Linux filesystems; a longer name would fail at write time instead.
MAX_COMPONENT_BYTES = 255
# Keeps the in-memory member list small and leaves room for the destination prefix under PATH_MAX.
MAX_PATH_BYTES = 1024
_DRIVE_PREFIX = re.compile(r"[A-Za-z]:")
_JUNK_NAMES = frozenset({"__MACOSX", "__pycache__", ".DS_Store"})


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


def _copy_member(reader, entry: _Entry, out, limits: ArchiveLimits, total_so_far: int, archive_bytes: int) -> int:
    """Stream one regular member through its decoder, counting the bytes it really produces.

    A header can lie: a zip member that declares fewer bytes than it unpacks to, or a wrong CRC,
    shows only once its data is decoded. This reads the data in ``CHUNK_BYTES`` chunks (into
    ``out`` when given, else discarding it), checks each chunk against the declared size and the
    running total against the unpacked-size and compression-ratio limits, and lets the decoder
    check its CRC at the end (``zipfile`` raises ``BadZipFile``; gzip and xz check their streams).

    Args:
        reader: the open archive reader.
        entry: a regular member from ``_scan``.
        out: a binary file to write the data to, or None to count only.
        limits: the archive bounds.
        total_so_far: bytes the archive's earlier members produced.
        archive_bytes: the archive's size on disk, for the ratio limit.

    Returns:
        The bytes produced (equal to ``entry.size``).

    Raises:
        ArchiveError: more or fewer bytes than declared, a bad CRC, a limit passed.
    """
    produced = 0
    with _reading():
        source = reader.open(entry.ref)
    try:
        while True:
            with _reading():
                chunk = source.read(CHUNK_BYTES)
            if not chunk:
                break
            produced += len(chunk)
            if produced > entry.size:
                raise ArchiveError(f"member {entry.shown} holds more data than its declared {entry.size} bytes")
            _check_declared_total(total_so_far + produced, limits, archive_bytes)
            if out is not None:
                out.write(chunk)
    finally:
        with _reading():
            source.close()
    if produced != entry.size:
        raise ArchiveError(
            f"archive is truncated or corrupt: member {entry.shown} holds {produced} of its declared {entry.size} bytes"
        )
    return produced


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
