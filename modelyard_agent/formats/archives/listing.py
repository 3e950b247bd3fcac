"""Listing any archive under the member checks, without assuming a Triton layout."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from modelyard_agent.formats.archives.layout import MAX_CONFIG_BYTES
from modelyard_agent.formats.archives.limits import ArchiveError, ArchiveLimits, _reading
from modelyard_agent.formats.archives.members import _check_collisions, _Entry, _scan
from modelyard_agent.formats.archives.readers import Source, _open_reader, source_size


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
    path: Source, limits: ArchiveLimits, *, wanted=lambda parts: False, max_read_bytes: int = MAX_CONFIG_BYTES
) -> ArchiveListing:
    """Check every member of an archive and read a few small files from it, without extracting.

    The same checks as :func:`inspect_triton_archive` apply (escaping names, links, special files,
    duplicates, member count, unpacked size and compression ratio, truncation), but no Triton
    layout is assumed.

    Args:
        path: the archive file on local disk (tar, tar.gz, tar.xz or zip, detected from the content),
            or an open binary file over it (seekable, or a stream that can rewind its first block).
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
    path = path if hasattr(path, "read") else Path(path)
    entries: list[_Entry] = []
    contents: dict[str, bytes] = {}
    kept = 0
    archive_bytes = source_size(path)  # before the reader moves a file source
    with _open_reader(path) as reader:
        for entry in _scan(reader, limits, archive_bytes):
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
