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

The package is split by topic: :mod:`.limits` (errors and bounds), :mod:`.readers` (tar and zip
readers), :mod:`.members` (per-member checks), :mod:`.layout` (the Triton model directory),
:mod:`.extract` (extraction), :mod:`.listing` (any archive) and :mod:`.digest` (file hashing).
"""

from modelyard_agent.formats.archives.digest import sha256_file
from modelyard_agent.formats.archives.extract import extract_version_dir
from modelyard_agent.formats.archives.layout import TritonModelLayout, inspect_triton_archive
from modelyard_agent.formats.archives.limits import DEFAULT_LIMITS, ArchiveError, ArchiveLimits
from modelyard_agent.formats.archives.listing import ArchiveListing, scan_archive
from modelyard_agent.formats.archives.readers import detect_kind

__all__ = [
    "DEFAULT_LIMITS",
    "ArchiveError",
    "ArchiveLimits",
    "ArchiveListing",
    "TritonModelLayout",
    "detect_kind",
    "extract_version_dir",
    "inspect_triton_archive",
    "scan_archive",
    "sha256_file",
]
