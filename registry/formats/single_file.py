"""Single model files (ONNX, TorchScript, TensorRT plan) wrapped into a Triton model directory.

The stored artifact is a ``.tar.gz`` of ``<model>/config.pbtxt`` and ``<model>/1/model.<ext>``; the
config is generated from the tensors the ONNX file declares or the signature the user gives.
Generation is deterministic (fixed timestamps and modes), so the same upload gets the same sha256.
"""

from __future__ import annotations

import gzip
import io
import re
import shutil
import tarfile
import tempfile
from pathlib import Path

from modelyard.errors import InvalidInput
from modelyard_agent.formats.archives import ArchiveError, ArchiveLimits, scan_archive
from modelyard_agent.formats.triton_config import (
    DATA_TYPE_NAMES,
    ModelConfigError,
    build_model_config,
    describe_signature,
    parse_model_config,
)
from registry.choices import ArtifactFormat
from registry.formats.prepared import PreparedArtifact

__all__ = ["parse_signature", "read_onnx_tensors", "wrap_single_file"]

PLATFORMS = {
    ArtifactFormat.ONNX: "onnxruntime_onnx",
    ArtifactFormat.TORCHSCRIPT: "pytorch_libtorch",
    ArtifactFormat.TENSORRT_PLAN: "tensorrt_plan",
}
MODEL_FILES = {
    ArtifactFormat.ONNX: "model.onnx",
    ArtifactFormat.TORCHSCRIPT: "model.pt",
    ArtifactFormat.TENSORRT_PLAN: "model.plan",
}
MAX_TENSORS = 256
MAX_RANK = 32
MAX_TENSOR_NAME = 256
# Fast compression: model weights barely compress, and this runs in the request.
_GZIP_LEVEL = 1
_SIGNATURE_HELP = (
    'pass signature as JSON: {"inputs": [{"name": "input", "data_type": "TYPE_FP32", "dims": [-1, 4]}], '
    '"outputs": [{"name": "output", "data_type": "TYPE_FP32", "dims": [-1, 3]}]} (dims -1: any size)'
)
_NAME_PROBLEM = re.compile(r"[\x00-\x1f\x7f]")

# ONNX TensorProto element types and the Triton data types they are served as.
_ONNX_TO_TRITON = {
    "FLOAT": "TYPE_FP32", "DOUBLE": "TYPE_FP64", "FLOAT16": "TYPE_FP16", "BFLOAT16": "TYPE_BF16",
    "INT8": "TYPE_INT8", "INT16": "TYPE_INT16", "INT32": "TYPE_INT32", "INT64": "TYPE_INT64",
    "UINT8": "TYPE_UINT8", "UINT16": "TYPE_UINT16", "UINT32": "TYPE_UINT32", "UINT64": "TYPE_UINT64",
    "BOOL": "TYPE_BOOL", "STRING": "TYPE_STRING",
}


def wrap_single_file(
    path: Path, kind: str, *, model_name: str, signature, max_batch_size: int | None, limits: ArchiveLimits
) -> PreparedArtifact:
    """Check one model file and wrap it into a Triton model directory archive.

    Args:
        path: the uploaded file on local disk.
        kind: ``ArtifactFormat.ONNX``, ``TORCHSCRIPT`` or ``TENSORRT_PLAN``.
        model_name: the config's ``name``.
        signature: see :func:`parse_signature`; required for TorchScript and TensorRT plans; for ONNX
            it must agree with the file (and may fix dimensions the file leaves open).
        max_batch_size: None or 0: dims as they are; above 0: every tensor's first dimension is the
            batch dimension (it must be of any size in an ONNX file) and is left out of ``dims``.
        limits: archive bounds (a TorchScript file is a zip archive).

    Returns:
        A PreparedArtifact whose ``path`` is a generated ``.tar.gz`` in a temporary directory.

    Raises:
        InvalidInput: the file is not of its kind, the signature is missing or invalid, or it
            disagrees with the ONNX file.
        OSError: the file cannot be read or the archive cannot be written.
    """
    batch = _check_max_batch_size(max_batch_size)
    given = parse_signature(signature) if signature is not None else None
    if kind == ArtifactFormat.ONNX:
        inputs, outputs = _onnx_signature(path, given, batch)
    else:
        label = "TorchScript" if kind == ArtifactFormat.TORCHSCRIPT else "TensorRT plan"
        if given is None:
            raise InvalidInput(f"a {label} file does not say what its inputs and outputs are: {_SIGNATURE_HELP}")
        if kind == ArtifactFormat.TORCHSCRIPT:
            _check_torchscript(path, limits)
        inputs, outputs = given
    try:
        config_text = build_model_config(
            name=model_name, platform=PLATFORMS[kind], max_batch_size=batch, inputs=inputs, outputs=outputs
        )
    except ModelConfigError as exc:
        raise InvalidInput(str(exc)) from exc
    workdir = Path(tempfile.mkdtemp(prefix="modelyard-wrap-"))
    try:
        archive = _write_model_dir(workdir / f"{model_name}.tar.gz", model_name, config_text, path, MODEL_FILES[kind])
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    return PreparedArtifact(
        format=kind,
        path=archive,
        is_original=False,
        config_text=config_text,
        files=(MODEL_FILES[kind],),
        signature=describe_signature(parse_model_config(config_text)),
        workdir=workdir,
    )


def parse_signature(signature) -> tuple[list[dict], list[dict]]:
    """Check a user-given signature.

    Args:
        signature: ``{"inputs": [...], "outputs": [...]}``, each tensor ``{"name": str, "data_type":
            "TYPE_FP32" (or "FP32"), "dims": [int, ...]}``; a dim is -1 (any size) or 1 and more.

    Returns:
        ``(inputs, outputs)`` with data types as Triton's ``TYPE_*`` names.

    Raises:
        InvalidInput: the signature is malformed; the message names the tensor and field.
    """
    if not isinstance(signature, dict) or set(signature) - {"inputs", "outputs"}:
        raise InvalidInput(f"signature must be a JSON object with inputs and outputs only: {_SIGNATURE_HELP}")
    parsed = []
    for kind in ("inputs", "outputs"):
        tensors = signature.get(kind)
        if not isinstance(tensors, list) or not tensors or len(tensors) > MAX_TENSORS:
            raise InvalidInput(f"signature {kind} must be a list of 1 to {MAX_TENSORS} tensors: {_SIGNATURE_HELP}")
        clean = [_parse_tensor(tensor, kind, position) for position, tensor in enumerate(tensors, start=1)]
        names = [tensor["name"] for tensor in clean]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise InvalidInput(f"signature {kind} name {repeated[0]!r} more than once")
        parsed.append(clean)
    return parsed[0], parsed[1]


def _parse_tensor(tensor, kind: str, position: int) -> dict:
    where = f"signature {kind} #{position}"
    if not isinstance(tensor, dict) or set(tensor) != {"name", "data_type", "dims"}:
        raise InvalidInput(f"{where} must have exactly name, data_type and dims: {_SIGNATURE_HELP}")
    name, data_type, dims = tensor["name"], tensor["data_type"], tensor["dims"]
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_TENSOR_NAME or _NAME_PROBLEM.search(name):
        raise InvalidInput(f"{where} name must be a non-empty string of at most {MAX_TENSOR_NAME} printable characters")
    type_name = data_type.upper() if isinstance(data_type, str) else ""
    type_name = type_name if type_name.startswith("TYPE_") else f"TYPE_{type_name}"
    if type_name not in DATA_TYPE_NAMES:
        raise InvalidInput(
            f"{where} ({name!r}) data_type {data_type!r} is not a Triton data type; use one of "
            + ", ".join(DATA_TYPE_NAMES)
        )
    if (
        not isinstance(dims, list) or not dims or len(dims) > MAX_RANK
        or not all(isinstance(d, int) and not isinstance(d, bool) and (d == -1 or 0 < d < 2**63) for d in dims)
    ):
        raise InvalidInput(f"{where} ({name!r}) dims must be a list of 1 to {MAX_RANK} integers, each -1 or above 0")
    return {"name": name, "data_type": type_name, "dims": dims}


def _check_max_batch_size(max_batch_size) -> int:
    if max_batch_size is None:
        return 0
    if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int) or not 0 <= max_batch_size < 2**31:
        raise InvalidInput(f"max_batch_size must be an integer from 0 up, not {max_batch_size!r}")
    return max_batch_size


# --- ONNX -----------------------------------------------------------------------------------------


def read_onnx_tensors(path: Path) -> tuple[list[dict], list[dict]]:
    """Read the inputs and outputs an ONNX file declares, with their full shapes.

    Args:
        path: an ONNX model file (protobuf); weights in external data files are not supported.

    Returns:
        ``(inputs, outputs)``, each ``[{"name", "data_type": "TYPE_*", "dims": [int] or None}]``; a
        dimension without a fixed size is -1; ``dims`` is None when the file gives no shape at all.
        Graph inputs that are initializers (weights) are left out.

    Memory: onnx parses the whole file, weights included: about twice the file's size at peak
    (a 100 MB file: about 200 MiB, 4.5 s including writing the wrapped archive).

    Raises:
        InvalidInput: the file is not an ONNX model, keeps weights in external files, or has a
            non-tensor input or output (sequences and maps: Triton's onnxruntime backend serves
            tensors only) or a type Triton cannot serve.
    """
    import onnx
    from google.protobuf.message import DecodeError

    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, ValueError, RuntimeWarning, OSError) as exc:
        raise InvalidInput(f"the file is not an ONNX model: {exc}") from exc
    graph = model.graph
    if model.ir_version <= 0 or not graph.output or not graph.node:
        raise InvalidInput("the file is not an ONNX model: it holds no graph with nodes and outputs")
    if any(init.data_location == onnx.TensorProto.EXTERNAL for init in graph.initializer):
        raise InvalidInput(
            "the ONNX model keeps its weights in external data files; save it as one file "
            "(onnx.save_model(model, path, save_as_external_data=False))"
        )
    weights = {init.name for init in graph.initializer}
    inputs = [_onnx_tensor(value, "input") for value in graph.input if value.name not in weights]
    if not inputs:
        raise InvalidInput("the ONNX model declares no inputs")
    return inputs, [_onnx_tensor(value, "output") for value in graph.output]


def _onnx_tensor(value, kind: str) -> dict:
    import onnx

    if value.type.WhichOneof("value") != "tensor_type":
        raise InvalidInput(
            f"ONNX {kind} {value.name!r} is a {value.type.WhichOneof('value') or 'value of no type'}, not a tensor; "
            "Triton's onnxruntime backend serves tensors only (for a scikit-learn classifier, convert "
            "with options={id(model): {'zipmap': False}})"
        )
    tensor_type = value.type.tensor_type
    onnx_type = onnx.TensorProto.DataType.Name(tensor_type.elem_type)
    if onnx_type not in _ONNX_TO_TRITON:
        raise InvalidInput(f"ONNX {kind} {value.name!r} has element type {onnx_type}, which Triton cannot serve")
    dims = None
    if tensor_type.HasField("shape"):
        dims = [int(d.dim_value) if d.HasField("dim_value") and d.dim_value > 0 else -1 for d in tensor_type.shape.dim]
    return {"name": value.name, "data_type": _ONNX_TO_TRITON[onnx_type], "dims": dims}


def _onnx_signature(path: Path, given, batch: int) -> tuple[list[dict], list[dict]]:
    """The tensors to declare: the file's, with the batch dimension taken out, checked against ``given``."""
    found = read_onnx_tensors(path)
    declared = []
    for kind, tensors in zip(("inputs", "outputs"), found, strict=True):
        declared.append([_without_batch(tensor, kind, batch, forced=given is not None) for tensor in tensors])
    if given is None:
        return declared[0], declared[1]
    for kind, in_file, in_signature in zip(("inputs", "outputs"), declared, given, strict=True):
        _check_against_file(kind, {t["name"]: t for t in in_file}, in_signature)
    by_name = {t["name"] for t in given[0]}
    missing = [t["name"] for t in declared[0] if t["name"] not in by_name]
    if missing:
        raise InvalidInput(f"the signature leaves out ONNX inputs {missing}; every input must be declared")
    return given


def _without_batch(tensor: dict, kind: str, batch: int, *, forced: bool) -> dict:
    dims = tensor["dims"]
    if dims is None:
        if forced:
            return tensor
        raise InvalidInput(
            f"ONNX {kind[:-1]} {tensor['name']!r} has no shape in the file; {_SIGNATURE_HELP}"
        )
    if batch:
        if not dims or dims[0] != -1:
            raise InvalidInput(
                f"max_batch_size {batch} makes the first dimension of every tensor the batch dimension, but ONNX "
                f"{kind[:-1]} {tensor['name']!r} has shape {dims}; export it with a dynamic first dimension or "
                "leave max_batch_size at 0"
            )
        dims = dims[1:]
    if not dims:
        raise InvalidInput(
            f"ONNX {kind[:-1]} {tensor['name']!r} is a scalar once the batch dimension is taken out; "
            "Triton needs at least one dimension per tensor"
        )
    return {**tensor, "dims": dims}


def _check_against_file(kind: str, in_file: dict[str, dict], in_signature: list[dict]) -> None:
    for tensor in in_signature:
        name = tensor["name"]
        actual = in_file.get(name)
        if actual is None:
            raise InvalidInput(
                f"the signature names {kind[:-1]} {name!r}, which the ONNX file does not have; it has "
                + ", ".join(repr(n) for n in in_file)
            )
        if actual["data_type"] != tensor["data_type"]:
            raise InvalidInput(
                f"the signature gives {kind[:-1]} {name!r} as {tensor['data_type']}; the ONNX file has "
                f"{actual['data_type']}"
            )
        file_dims = actual["dims"]
        if file_dims is not None and (
            len(file_dims) != len(tensor["dims"])
            or any(f != -1 and f != s for f, s in zip(file_dims, tensor["dims"], strict=True))
        ):
            raise InvalidInput(
                f"the signature gives {kind[:-1]} {name!r} dims {tensor['dims']}; the ONNX file has {file_dims} "
                "(without the batch dimension when max_batch_size is above 0)"
            )


# --- TorchScript ----------------------------------------------------------------------------------


def _check_torchscript(path: Path, limits: ArchiveLimits) -> None:
    """Refuse anything but the zip archive that ``torch.jit.save`` writes."""
    try:
        listing = scan_archive(path, limits)
    except ArchiveError as exc:
        raise InvalidInput(f"the file is not a TorchScript model (torch.jit.save writes a zip archive): {exc}") from exc
    if listing.kind != "zip":
        raise InvalidInput("the file is not a TorchScript model: torch.jit.save writes a zip archive, not a tar")
    split = [tuple(name.split("/")) for name in listing.files]
    roots = {parts[0] for parts in split if len(parts) == 2 and parts[1] == "data.pkl"}
    if not roots:
        raise InvalidInput("the file is not a TorchScript model: the zip holds no <name>/data.pkl")
    if not any(parts[0] in roots and (parts[1:] == ("constants.pkl",) or parts[1] == "code") for parts in split):
        raise InvalidInput(
            "the file holds PyTorch weights without TorchScript code (torch.save output); Triton's pytorch "
            "backend needs a scripted or traced module saved with torch.jit.save"
        )


# --- The generated model directory ----------------------------------------------------------------


def _write_model_dir(target: Path, model_name: str, config_text: str, model_file: Path, member: str) -> Path:
    """Write ``<model>/config.pbtxt``, ``<model>/1/`` and ``<model>/1/<member>`` as a deterministic tar.gz."""
    with open(target, "wb") as raw, gzip.GzipFile(
        filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=_GZIP_LEVEL
    ) as compressed, tarfile.open(fileobj=compressed, mode="w", format=tarfile.PAX_FORMAT) as tar:
        config = config_text.encode("utf-8")
        tar.addfile(_info(f"{model_name}/config.pbtxt", len(config)), io.BytesIO(config))
        version_dir = _info(f"{model_name}/1", 0)
        version_dir.type, version_dir.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(version_dir)
        with open(model_file, "rb") as data:
            tar.addfile(_info(f"{model_name}/1/{member}", model_file.stat().st_size), data)
    return target


def _info(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime, info.uname, info.gname = size, 0o644, 0, "", ""
    return info
