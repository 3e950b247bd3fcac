"""Every model format the registry accepts, and what it stores for each.

An upload is one of:

- a Triton model directory as a ``.tar.gz``/``.tgz``/``.tar.xz``/``.tar``/``.zip`` archive, an
  ensemble included (``triton.py``);
- a single model file, ONNX (``.onnx``), TorchScript (``.pt``) or a TensorRT plan (``.plan``),
  wrapped into a Triton model directory with a generated ``config.pbtxt`` (``single_file.py``);
- a BentoML model (``.bentomodel``) or Bento (``.bento``) as BentoML exports them (``bento.py``).

:func:`prepare_artifact` tells the kind apart by file name suffix and content, checks the upload and
returns a :class:`PreparedArtifact`: the file to store, its config, files and signature.
"""

from __future__ import annotations

from pathlib import Path
from typing import IO

from modelyard.errors import InvalidInput
from modelyard_agent.formats.archives import ArchiveLimits, detect_kind
from registry.choices import ArtifactFormat
from registry.formats import bento, single_file, triton
from registry.formats.prepared import PreparedArtifact

__all__ = ["ACCEPTED_KINDS", "ACCEPTED_SUFFIXES", "PreparedArtifact", "check_filename", "detect_format",
           "prepare_artifact", "prepare_stored_archive", "stored_archive_reading"]

# File name suffixes, longest first so ".tar.gz" wins over ".gz".
_SUFFIXES: tuple[tuple[str, str], ...] = (
    (".tar.gz", ArtifactFormat.TRITON_MODEL_DIR),
    (".tar.xz", ArtifactFormat.TRITON_MODEL_DIR),
    (".tgz", ArtifactFormat.TRITON_MODEL_DIR),
    (".txz", ArtifactFormat.TRITON_MODEL_DIR),
    (".tar", ArtifactFormat.TRITON_MODEL_DIR),
    (".zip", ArtifactFormat.TRITON_MODEL_DIR),
    (".onnx", ArtifactFormat.ONNX),
    (".pt", ArtifactFormat.TORCHSCRIPT),
    (".plan", ArtifactFormat.TENSORRT_PLAN),
    (".bentomodel", ArtifactFormat.BENTOML_MODEL),
    (".bento", ArtifactFormat.BENTO),
)
# What the upload page checks a chosen file's name against before it sends anything.
ACCEPTED_SUFFIXES: tuple[str, ...] = tuple(suffix for suffix, _kind in _SUFFIXES)
ACCEPTED_KINDS = (
    "a Triton model directory or ensemble as .tar.gz, .tgz, .tar.xz, .tar or .zip; "
    "an ONNX model (.onnx); a TorchScript model (.pt); a TensorRT plan (.plan); "
    "a BentoML model (.bentomodel) or Bento (.bento) as BentoML exports them"
)
_ARCHIVE_MAGICS = (b"\x1f\x8b", b"\xfd7zXZ\x00", b"PK\x03\x04", b"PK\x05\x06")
_USTAR = (257, b"ustar")


def check_filename(filename: str) -> str:
    """Tell from its name alone which kind of artifact a file will be, before any byte is sent.

    Returns:
        An ``ArtifactFormat`` value (see ``detect_format``).

    Raises:
        InvalidInput: the name's suffix is not one the registry accepts.
    """
    name = Path(filename or "").name.lower()
    for suffix, kind in _SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            return kind
    raise InvalidInput(f"cannot tell what kind of model {Path(filename or '').name!r} is from its name; "
                       f"the registry accepts {ACCEPTED_KINDS}")


def archive_limits() -> ArchiveLimits:
    """The registry's archive limits from the settings: ``MAX_UNPACKED_BYTES`` (bytes),
    ``MAX_COMPRESSION_RATIO`` (unpacked bytes per archive byte) and ``MAX_ARCHIVE_MEMBERS`` (count);
    read on every call, so overridden settings take effect.

    Raises:
        ValueError: a setting is not a positive integer.
    """
    from django.conf import settings

    return ArchiveLimits(max_unpacked_bytes=settings.MAX_UNPACKED_BYTES,
                         max_compression_ratio=settings.MAX_COMPRESSION_RATIO, max_members=settings.MAX_ARCHIVE_MEMBERS)


def detect_format(path: Path, filename: str) -> str:
    """Tell which kind of artifact an upload is.

    The file name's suffix decides; without a file name, an archive (by its magic bytes) is taken
    as a Triton model directory, as before single files were accepted.

    Args:
        path: the uploaded file on local disk.
        filename: the name the client gave the file (may be empty).

    Returns:
        An ``ArtifactFormat`` value; ``TRITON_MODEL_DIR`` stands for any Triton archive (whether it
        is an ensemble is known only once its config is read).

    Raises:
        InvalidInput: the suffix is not one the registry accepts, or a nameless upload is no archive.
    """
    name = Path(filename or "").name.lower()
    for suffix, kind in _SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            return kind
    if not name or "." not in name:
        with open(path, "rb") as handle:
            head = handle.read(512)
        offset, magic = _USTAR
        if head.startswith(_ARCHIVE_MAGICS) or head[offset : offset + len(magic)] == magic:
            return ArtifactFormat.TRITON_MODEL_DIR
    shown = repr(Path(filename).name) if filename else "the upload"
    raise InvalidInput(f"cannot tell what kind of model {shown} is; the registry accepts {ACCEPTED_KINDS}")


def prepare_artifact(
    path: Path, *, filename: str, model_name: str, signature=None, max_batch_size: int | None = None,
    limits: ArchiveLimits | None = None,
) -> PreparedArtifact:
    """Check an upload of any accepted kind and prepare what to store.

    Args:
        path: the uploaded file on local disk (non-empty, within the size limit).
        filename: the name the client gave it; its suffix picks the kind.
        model_name: the registered model's name; configs and tags must agree with it.
        signature: for single files (required for .pt and .plan, optional for .onnx, where it must
            agree with the file) and BentoML models without tensor types:
            ``{"inputs": [{"name", "data_type", "dims"}], "outputs": [...]}``.
        max_batch_size: for single files: 0 (default) takes the shapes as they are; above 0 the
            first dimension of every tensor is the batch dimension, at most this large.
        limits: archive bounds; defaults to the settings.

    Returns:
        The prepared artifact; use it in a ``with`` block so a generated archive is removed.

    Raises:
        InvalidInput: the kind is unknown, or the upload is not a valid, safe artifact of its kind
            (the message says what is wrong and what to pass instead).
        OSError: the upload cannot be read, or the generated archive cannot be written.
    """
    limits = limits or archive_limits()
    kind = detect_format(path, filename)
    if kind == ArtifactFormat.TRITON_MODEL_DIR:
        _refuse_single_file_options(signature, max_batch_size, "a Triton model directory's config.pbtxt")
        return triton.prepare_triton_archive(path, model_name=model_name, limits=limits)
    if kind in ArtifactFormat.bentoml_formats():
        if max_batch_size is not None:
            raise InvalidInput("max_batch_size applies to single-file uploads (.onnx, .pt, .plan) only")
        return bento.prepare_bentoml_archive(path, kind, model_name=model_name, limits=limits, signature=signature)
    return single_file.wrap_single_file(
        path, kind, model_name=model_name, signature=signature, max_batch_size=max_batch_size, limits=limits
    )


def _refuse_single_file_options(signature, max_batch_size, declared_by: str) -> None:
    if signature is not None or max_batch_size is not None:
        raise InvalidInput(
            f"signature and max_batch_size apply to single-file uploads (.onnx, .pt, .plan); {declared_by} "
            "declares them already"
        )


RANGED, STREAMED = "ranged", "streamed"


def stored_archive_reading(source: IO[bytes], filename: str) -> str | None:
    """How a stored upload's structure can be read without a local copy, from its name and first bytes.

    Returns:
        ``RANGED`` for a Triton model directory as a ``.zip`` (its central directory sits at the
        end) or a plain ``.tar`` (its headers are read from one to the next, skipping the data);
        ``STREAMED`` for one as a gzip- or xz-compressed tar, and for a BentoML model or Bento (an
        xz-compressed tar), each decompressed once, front to back; None for single model files
        (.onnx, .pt, .plan: their libraries read a file, and they are stored re-packed) and for
        content that does not match its name, which are read from a file.

    Raises:
        InvalidInput: the file name's kind is unknown.
        StorageError: (from ``source``) the store could not be read; retrying may help.
    """
    kind, content = check_filename(filename), detect_kind(source)
    if kind == ArtifactFormat.TRITON_MODEL_DIR and content in (("zip", None), ("tar", None)):
        return RANGED
    if kind == ArtifactFormat.TRITON_MODEL_DIR and content in (("tar", "gzip"), ("tar", "xz")):
        return STREAMED
    if kind in ArtifactFormat.bentoml_formats() and content == ("tar", "xz"):
        return STREAMED
    return None


def prepare_stored_archive(
    source: IO[bytes], *, filename: str, model_name: str, decode_members: bool, signature=None,
    max_batch_size: int | None = None, limits: ArchiveLimits | None = None,
) -> PreparedArtifact:
    """Check a stored archive (see :func:`stored_archive_reading`) through a file over the stored object.

    With a seekable file that fetches only what is read (``ArtifactStore.open_ranged``) and
    ``decode_members`` False, a zip's central directory or a plain tar's headers and its
    config.pbtxt are all that is read: a few ranged requests, whatever the object's size. Member
    sizes and CRCs are then the archive's claims; the host agent checks what they really unpack
    to when it extracts the version (and the object's sha256 before that). With a forward-only
    stream (``ArtifactStore.open_stream``) a compressed tar or a BentoML export is decompressed
    once, with no scratch file. The same rules as :func:`prepare_artifact` apply otherwise.

    Args:
        source: an open binary file over the stored object.
        filename: the name the client gave the file; its suffix picks the kind.
        model_name: the registered model's name.
        decode_members: whether to decode a zip's members to check their sizes and CRCs.
        signature, max_batch_size: as for :func:`prepare_artifact` (a BentoML model's tensor
            types; refused for a Triton model directory, whose config declares them).
        limits: archive bounds; defaults to the settings.

    Returns:
        The prepared artifact (``path`` None, ``is_original`` True).

    Raises:
        InvalidInput: the archive is not a valid, safe artifact of its kind.
        StorageError: (from ``source``) the store could not be read; retrying may help.
    """
    limits = limits or archive_limits()
    kind = check_filename(filename)
    if kind in ArtifactFormat.bentoml_formats():
        if max_batch_size is not None:
            raise InvalidInput("max_batch_size applies to single-file uploads (.onnx, .pt, .plan) only")
        return bento.prepare_bentoml_archive(source, kind, model_name=model_name, limits=limits, signature=signature)
    _refuse_single_file_options(signature, max_batch_size, "a Triton model directory's config.pbtxt")
    return triton.prepare_triton_archive(source, model_name=model_name, limits=limits, decode_members=decode_members)
