"""Read, check and rewrite Triton model configurations (``config.pbtxt``).

Uses Triton's own protobuf schema (``tritonclient.grpc.model_config_pb2``), so
what passes here is what Triton itself will parse. A load-time override is the
uploaded config with the deployment's model name, the versions to serve and
per-host parameters (such as EXECUTION_ENV_PATH) filled in, as protobuf JSON.
"""

from google.protobuf import json_format, text_format
from tritonclient.grpc.model_config_pb2 import DataType, ModelConfig

ENSEMBLE_PLATFORM = "ensemble"
# Triton's tensor data types, as written in config.pbtxt (TYPE_FP32, ...).
DATA_TYPE_NAMES = tuple(name for name in DataType.keys() if name != "TYPE_INVALID")


class ModelConfigError(ValueError):
    """A model configuration cannot be used; the message says why, in one sentence."""


def parse_model_config(text: str) -> ModelConfig:
    """Parse and check the text of a ``config.pbtxt``.

    Args:
        text: the protobuf text format of ``inference.ModelConfig``.

    Returns:
        The parsed ModelConfig.

    Raises:
        ModelConfigError: the text does not parse (the message gives line and
            column), names neither a backend nor a platform, declares no input or
            no output, or has an input/output without a name or data type, or a
            negative max_batch_size, or is an ensemble without steps.
    """
    cfg = ModelConfig()
    try:
        text_format.Parse(text, cfg)
    except text_format.ParseError as exc:
        raise ModelConfigError(f"config.pbtxt is not a valid Triton model config: {exc}") from exc
    if not cfg.backend and not cfg.platform:
        raise ModelConfigError('config.pbtxt must name a backend (e.g. backend: "python") or a platform')
    if cfg.max_batch_size < 0:
        raise ModelConfigError(f"config.pbtxt max_batch_size must be 0 or more, got {cfg.max_batch_size}")
    for kind, tensors in (("input", cfg.input), ("output", cfg.output)):
        if not tensors:
            raise ModelConfigError(f"config.pbtxt must declare at least one {kind}")
        for position, tensor in enumerate(tensors, start=1):
            if not tensor.name:
                raise ModelConfigError(f"config.pbtxt {kind} #{position} has no name")
            if tensor.data_type == DataType.TYPE_INVALID:
                raise ModelConfigError(f"config.pbtxt {kind} {tensor.name!r} has no data_type")
    if cfg.platform == ENSEMBLE_PLATFORM:
        if not cfg.ensemble_scheduling.step:
            raise ModelConfigError("config.pbtxt of an ensemble must list its steps in ensemble_scheduling")
        for position, step in enumerate(cfg.ensemble_scheduling.step, start=1):
            if not step.model_name:
                raise ModelConfigError(f"config.pbtxt ensemble step #{position} names no model")
    return cfg


def config_platform(text: str) -> str:
    """The ``platform`` a ``config.pbtxt`` names, without the checks of parse_model_config.

    Returns:
        The platform (``"ensemble"``, ``"onnxruntime_onnx"`` ...), or ``""`` when the config names
        none or does not parse at all.
    """
    cfg = ModelConfig()
    try:
        text_format.Parse(text, cfg)
    except text_format.ParseError:
        return ""
    return cfg.platform


def ensemble_steps(cfg: ModelConfig) -> list[tuple[str, int]]:
    """The composing models of an ensemble config.

    Args:
        cfg: a parsed ModelConfig (see parse_model_config).

    Returns:
        ``(model_name, model_version)`` per ``ensemble_scheduling.step``, in config order, repeats
        removed; ``model_version`` -1 means the newest version Triton has loaded. Empty for a model
        that is not an ensemble.
    """
    steps: list[tuple[str, int]] = []
    for step in cfg.ensemble_scheduling.step:
        key = (step.model_name, int(step.model_version))
        if key not in steps:
            steps.append(key)
    return steps


def build_model_config(
    *, name: str, platform: str, max_batch_size: int, inputs: list[dict], outputs: list[dict]
) -> str:
    """Write a ``config.pbtxt`` for a single-file model (ONNX, TorchScript, TensorRT plan).

    Args:
        name: the model name.
        platform: Triton's platform, e.g. ``onnxruntime_onnx``, ``pytorch_libtorch``, ``tensorrt_plan``.
        max_batch_size: 0 when ``dims`` are the full shapes; above 0, the most requests Triton may
            batch, and ``dims`` leave out the batch dimension.
        inputs, outputs: ``[{"name": str, "data_type": "TYPE_FP32", "dims": [int, ...]}]``; -1 in
            ``dims`` is a dimension of any size.

    Returns:
        The config in protobuf text format; it passes :func:`parse_model_config`.

    Raises:
        ModelConfigError: an unknown data type, or a config that parse_model_config refuses.
    """
    cfg = ModelConfig(name=name, platform=platform, max_batch_size=max_batch_size)
    for tensors, field in ((inputs, cfg.input), (outputs, cfg.output)):
        for tensor in tensors:
            if tensor["data_type"] not in DATA_TYPE_NAMES:
                raise ModelConfigError(f"tensor {tensor['name']!r} has an unknown data_type {tensor['data_type']!r}")
            field.add(name=tensor["name"], data_type=DataType.Value(tensor["data_type"]), dims=tensor["dims"])
    text = text_format.MessageToString(cfg)
    parse_model_config(text)
    return text


def _describe_tensors(tensors) -> list[dict]:
    return [
        {
            "name": tensor.name,
            "data_type": DataType.Name(tensor.data_type),
            "dims": [int(d) for d in tensor.dims],
        }
        for tensor in tensors
    ]


def describe_signature(cfg: ModelConfig) -> dict:
    """Summarise a model's tensors as JSON-serialisable data.

    Args:
        cfg: a parsed ModelConfig (see parse_model_config).

    Returns:
        ``{"inputs": [{"name", "data_type", "dims"}], "outputs": [...],
        "max_batch_size": int, "backend": str, "platform": str}``, where
        data_type is Triton's enum name (``"TYPE_FP32"``), dims are ints
        without the batch dimension (-1 means variable), and max_batch_size 0
        means the model takes no batch dimension.
    """
    return {
        "inputs": _describe_tensors(cfg.input),
        "outputs": _describe_tensors(cfg.output),
        "max_batch_size": int(cfg.max_batch_size),
        "backend": cfg.backend,
        "platform": cfg.platform,
    }


def render_load_config(
    config_text: str,
    *,
    model_name: str,
    versions: list[int],
    parameters: dict[str, str] | None = None,
    overrides: dict | None = None,
) -> str:
    """Build the config override JSON for a Triton repository load.

    Args:
        config_text: the model's ``config.pbtxt`` text.
        model_name: the name the model is loaded under on the host.
        versions: the version numbers to serve (positive ints, at least one);
            written as a ``specific`` version policy.
        parameters: extra model parameters, added or replaced as string values
            (per-host settings such as EXECUTION_ENV_PATH).
        overrides: a deployment's config overrides (see ``check_config_overrides``); each
            top-level field given replaces the uploaded config's field as a whole.

    Returns:
        The config as protobuf JSON with protobuf field names (``data_type``,
        ``max_batch_size``), which is what Triton's load API accepts.

    Raises:
        ModelConfigError: the text is not a usable config (see
            parse_model_config), a field names a file outside the model's directory or the
            config sets a host parameter (see ``triton_paths.check_confined_paths``), or versions
            is empty or holds a number below 1.
    """
    if not versions:
        raise ModelConfigError("at least one model version must be given to load")
    if any(int(v) < 1 for v in versions):
        raise ModelConfigError(f"model versions must be 1 or more, got {sorted(versions)}")
    # triton_paths reads this module's errors and platform names at import, so it is imported here.
    from modelyard_agent.formats.triton_paths import check_confined_paths

    cfg = parse_model_config(config_text)
    _apply_overrides(cfg, check_config_overrides(overrides))
    # Checked again here, on the host, before the host's own parameters (which may name host
    # paths) are added: a version registered before the rule, or a payload altered on the way,
    # must not point Triton at another model's files.
    check_confined_paths(cfg)
    cfg.name = model_name
    cfg.version_policy.Clear()
    cfg.version_policy.specific.versions.extend(sorted({int(v) for v in versions}))
    for key, value in (parameters or {}).items():
        cfg.parameters[key].string_value = str(value)
    return json_format.MessageToJson(cfg, preserving_proto_field_name=True, indent=None)


# The fields of ``inference.ModelConfig`` a deployment may override: scheduling and placement,
# never what the model computes (inputs, outputs, backend) nor anything that names files.
OVERRIDABLE_FIELDS = frozenset({"instance_group", "dynamic_batching", "max_batch_size"})
MAX_INSTANCE_COUNT = 64
# Overridable fields a deployment may remove (null): the batcher, so that a config measured without
# it (a performance card's) can be served as measured.
CLEARABLE_FIELDS = frozenset({"dynamic_batching"})


def check_config_overrides(overrides: dict | None) -> dict:
    """Check a deployment's config overrides against Triton's ModelConfig schema.

    Args:
        overrides: protobuf-JSON of a partial ModelConfig with only ``OVERRIDABLE_FIELDS``, e.g.
            ``{"instance_group": [{"count": 2, "kind": "KIND_GPU", "gpus": [0],
            "rate_limiter": {"resources": [{"name": "R1", "count": 4}]}}],
            "dynamic_batching": {"max_queue_delay_microseconds": 100}, "max_batch_size": 8}``.
            None or ``{}`` means none. ``"dynamic_batching": null`` turns off a batcher the
            uploaded config has.

    Returns:
        The overrides, normalised to protobuf-JSON with protobuf field names.

    Raises:
        ModelConfigError: not an object, an unknown or forbidden field, a value Triton's schema
            refuses, or an instance count outside 1..``MAX_INSTANCE_COUNT``.
    """
    if not overrides:
        return {}
    if not isinstance(overrides, dict):
        raise ModelConfigError("config_overrides must be a JSON object")
    unknown = set(overrides) - OVERRIDABLE_FIELDS
    if unknown:
        raise ModelConfigError(
            f"config_overrides may set only {', '.join(sorted(OVERRIDABLE_FIELDS))}; not {', '.join(sorted(unknown))}"
        )
    cleared = sorted(name for name, value in overrides.items() if value is None)
    if set(cleared) - CLEARABLE_FIELDS:
        raise ModelConfigError(f"config_overrides may set only {', '.join(sorted(CLEARABLE_FIELDS))} to null; "
                               f"not {', '.join(sorted(set(cleared) - CLEARABLE_FIELDS))}")
    cfg = ModelConfig()
    try:
        json_format.ParseDict({k: v for k, v in overrides.items() if v is not None}, cfg)
    except (json_format.ParseError, TypeError, ValueError) as exc:
        raise ModelConfigError(f"config_overrides do not fit Triton's model config: {exc}") from exc
    if cfg.max_batch_size < 0:
        raise ModelConfigError("config_overrides.max_batch_size must be 0 or more")
    for group in cfg.instance_group:
        if not 1 <= group.count <= MAX_INSTANCE_COUNT:
            raise ModelConfigError(f"an instance group's count must be 1 to {MAX_INSTANCE_COUNT}, got {group.count}")
    normalised = json_format.MessageToDict(cfg, preserving_proto_field_name=True)
    # MessageToDict drops fields at their default; keep an explicit max_batch_size of 0.
    if "max_batch_size" in overrides:
        normalised["max_batch_size"] = int(cfg.max_batch_size)
    return {**normalised, **dict.fromkeys(cleared)}


def instance_groups_of(config_text: str) -> list[dict]:
    """The ``instance_group`` entries of a ``config.pbtxt`` as protobuf JSON
    (``[{"count": n, "kind": ...}]``); ``[{"count": 1}]`` when it names none or does not parse
    (Triton's default is one instance per GPU, or one on the CPU)."""
    try:
        cfg = parse_model_config(config_text or "")
    except ModelConfigError:
        return [{"count": 1}]
    return [json_format.MessageToDict(g, preserving_proto_field_name=True) for g in cfg.instance_group] or [
        {"count": 1}]


def _apply_overrides(cfg: ModelConfig, overrides: dict) -> None:
    for field in overrides:
        cfg.ClearField(field)
    json_format.ParseDict({k: v for k, v in overrides.items() if v is not None}, cfg)


def sample_arrays(sample_input: dict, signature: dict) -> dict:
    """Turn a version's sample input into the numpy arrays of an inference request.

    Args:
        sample_input: ``{input name: nested list}`` (JSON), including the batch dimension
            when the model batches.
        signature: the version's signature (``describe_signature``): input names and data types.

    Returns:
        ``{input name: numpy array}`` with each input's Triton data type.

    Raises:
        ModelConfigError: not an object, an input the model does not declare or one it lacks,
            or values that do not convert to the input's data type or are not finite.
    """
    import numpy as np
    from tritonclient.utils import triton_to_np_dtype

    if not isinstance(sample_input, dict) or not sample_input:
        raise ModelConfigError("a sample input is a JSON object of input names to (nested) lists")
    declared = {i["name"]: i["data_type"] for i in signature.get("inputs", [])}
    unknown = set(sample_input) - set(declared)
    missing = set(declared) - set(sample_input)
    if unknown or missing:
        raise ModelConfigError(
            f"the sample input must give exactly the model's inputs {sorted(declared)}; "
            f"unknown {sorted(unknown)}, missing {sorted(missing)}"
        )
    arrays = {}
    for name, values in sample_input.items():
        dtype = triton_to_np_dtype(declared[name].removeprefix("TYPE_"))
        try:
            arrays[name] = np.asarray(values, dtype=dtype)
        except (TypeError, ValueError, OverflowError) as exc:
            raise ModelConfigError(
                f"input {name!r} must be {declared[name].removeprefix('TYPE_')} numbers: {exc}"
            ) from exc
        if arrays[name].dtype.kind == "f" and not np.isfinite(arrays[name]).all():
            raise ModelConfigError(f"input {name!r} holds a value that is not a finite number (NaN or ±infinity)")
    return arrays


def render_config_file(config_json: str) -> str:
    """The protobuf text form (a ``config.pbtxt``) of a load config from ``render_load_config``.

    Written into the model directory once a version serves, so that Triton loading the model
    from disk (a restart with models loaded at start, or an ensemble loading its composing
    models) gets the same versions, parameters and overrides as the agent's last load.
    """
    cfg = ModelConfig()
    json_format.Parse(config_json, cfg)
    return text_format.MessageToString(cfg)
