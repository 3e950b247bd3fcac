"""Finding the one Triton model directory in an archive: its root, config.pbtxt and version directory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from modelyard_agent.formats.archives.limits import ArchiveError, ArchiveLimits, _reading
from modelyard_agent.formats.archives.members import _check_collisions, _copy_member, _Entry, _kept_prefix, _scan
from modelyard_agent.formats.archives.readers import Source, _open_reader, source_size
from modelyard_agent.formats.triton_config import ENSEMBLE_PLATFORM, config_platform

CONFIG_NAME = "config.pbtxt"
MAX_CONFIG_BYTES = 1 << 20
# Triton stores model versions as signed 64-bit integers.
MAX_VERSION = 2**63 - 1


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


def inspect_triton_archive(path: Source, limits: ArchiveLimits, *, decode_members: bool = True) -> TritonModelLayout:
    """Check an uploaded archive and describe the Triton model inside it, without extracting.

    The format is detected from the content, not the file name. The archive is read once, front
    to back; only ``config.pbtxt`` is decompressed into memory (at most 1 MiB). A zip's members are
    decoded (and discarded) to check their sizes and CRCs against what they really unpack to,
    unless ``decode_members`` is False.

    Args:
        path: the archive file on local disk, or an open seekable binary file.
        limits: member count, unpacked size (bytes) and compression-ratio bounds.
        decode_members: False reads a zip's central directory and a plain tar's headers only
            (with a file that fetches what is read, a few ranged requests): sizes and CRCs are
            then the archive's claims, checked again by :func:`extract_version_dir`, which
            counts what each member really unpacks to.

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
    path = path if hasattr(path, "read") else Path(path)
    archive_bytes = source_size(path)
    entries: list[_Entry] = []
    junk_parents: set[tuple[str, ...]] = set()
    configs: dict[tuple[str, ...], bytes | None] = {}
    produced = 0
    with _open_reader(path) as reader:
        for entry in _scan(reader, limits, archive_bytes):
            if decode_members and reader.kind == "zip" and not entry.is_dir:
                # A zip's sizes and CRCs are claims of its central directory: decode each member to
                # count what it really unpacks to (a tar's data is exactly its header's size, and a
                # compressed tar's stream is decoded and checked as it is read anyway).
                produced += _copy_member(reader, entry, None, limits, produced, archive_bytes)
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
