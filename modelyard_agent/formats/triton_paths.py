"""Fields of a Triton model config that name files, kept inside the model's own directory.

A ``config.pbtxt`` can name files that Triton opens, reads or executes: the model file
(``default_model_filename``, ``cc_model_filenames``), label files, warm-up and initial-state data,
custom-op libraries, the backend library (``runtime``) and path-valued parameters of the model,
its repository agents and its execution accelerators. Triton joins a relative name to the version
or model directory and takes an absolute one as it is, so ``../../other-model/1/model.py`` or
``/etc/…`` would serve another team's code or weights, or anything on the host's disk. Every such
field must be a plain relative name; only a host's own ``config_overrides`` (for example
``EXECUTION_ENV_PATH``) may name host paths, and they are added after this check.

Which fields name files comes from Triton's ``model_config.proto`` (server repository,
``docs/user_guide/model_configuration.md``) and the backends' READMEs (python, onnxruntime, pytorch,
tensorrt). The registry checks an upload with these functions, and the host agent checks the
config again before it loads it.
"""

import re

from tritonclient.grpc.model_config_pb2 import ModelConfig

from modelyard_agent.formats.triton_config import ENSEMBLE_PLATFORM, ModelConfigError

# Parameters that name paths on the serving host: a host sets them, an upload never does.
HOST_PARAMETERS = frozenset({"EXECUTION_ENV_PATH"})
# Parameter keys that name files or directories in the backends' documentation (case-insensitive
# substrings): ``trt_engine_cache_path``, ``gpt_model_path``, ``tokenizer_dir``, ``model_filename`` …
_PATH_KEY = re.compile(r"path|dir|file|model|cache|library|engine|tokenizer", re.IGNORECASE)
# A value in URL form with a network scheme names no local file (``file:`` does).
_NETWORK_URL = re.compile(r"^(?!file:)[a-z][a-z0-9+.-]*://", re.IGNORECASE)
MAX_NAME_LENGTH = 1024

# The model file each backend looks for in the version directory when the config names none.
DEFAULT_MODEL_FILES = {
    "python": "model.py",
    "onnxruntime": "model.onnx",
    "onnxruntime_onnx": "model.onnx",
    "pytorch": "model.pt",
    "pytorch_libtorch": "model.pt",
    "tensorrt": "model.plan",
    "tensorrt_plan": "model.plan",
}


def check_relative_name(value: str, field: str, *, bare: bool = False) -> None:
    """Refuse a file name that could point outside the directory Triton joins it to.

    Args:
        value: the name as the config gives it.
        field: the config field, for the message (``default_model_filename``,
            ``parameters["engine_dir"]``).
        bare: the name must be a single file name without any directory (``runtime``).

    Raises:
        ModelConfigError: empty, too long (over ``MAX_NAME_LENGTH`` characters), absolute, with a
            ``..`` or ``.`` or empty component, a backslash, a NUL, a leading ``~`` or any ``$``
            (Triton's ``$$TRITON_MODEL_DIRECTORY`` substitution), or, with ``bare``, any ``/``.
    """
    problem = ""
    if not value:
        problem = "is empty"
    elif len(value) > MAX_NAME_LENGTH:
        problem = f"is longer than {MAX_NAME_LENGTH} characters"
    elif "\x00" in value or "\\" in value:
        problem = "holds a NUL or a backslash"
    elif value.startswith("/"):
        problem = "is an absolute path"
    elif value.startswith("~") or "$" in value:
        problem = "uses a home-directory or variable substitution"
    elif bare and "/" in value:
        problem = "must be a bare file name without a directory"
    elif any(part in ("", ".", "..") for part in value.split("/")):
        problem = "has a '..', '.' or empty path component"
    if problem:
        raise ModelConfigError(
            f"config.pbtxt {field} {value!r} {problem}: a config may name only files inside its own "
            "version directory, as plain relative names"
        )


def _looks_like_path(key: str, value: str) -> bool:
    if _NETWORK_URL.match(value):
        return False
    return bool(_PATH_KEY.search(key)) or "/" in value or "\\" in value or value.startswith(("~", "$", "."))


def _check_parameters(parameters, where: str) -> None:
    """``parameters`` maps names to strings (agents, accelerators) or to ModelParameter messages."""
    for key in sorted(parameters):
        value = parameters[key]
        text = value if isinstance(value, str) else value.string_value
        if text and _looks_like_path(key, text):
            check_relative_name(text, f"{where}[{key!r}]")


def check_confined_paths(cfg: ModelConfig, *, allow_host_parameters: bool = False) -> None:
    """Check every field of ``cfg`` that names a file (see the module docstring).

    Args:
        cfg: a parsed model config (``parse_model_config``).
        allow_host_parameters: True only for a config that already carries a host's own
            parameters (``HOST_PARAMETERS``), which the host chose; an upload never does.

    Raises:
        ModelConfigError: a file-naming field is not a plain relative name, or an upload sets a
            host parameter; the message names the field and the value.

    Reads only.
    """
    if not allow_host_parameters:
        for key in sorted(HOST_PARAMETERS & set(cfg.parameters)):
            raise ModelConfigError(
                f"config.pbtxt sets parameters[{key!r}], which names a path on the serving host: it is a "
                "per-host setting (the host's config_overrides), not part of a model version"
            )
    if cfg.runtime:
        check_relative_name(cfg.runtime, "runtime", bare=True)
    if cfg.default_model_filename:
        check_relative_name(cfg.default_model_filename, "default_model_filename")
    for capability in sorted(cfg.cc_model_filenames):
        check_relative_name(cfg.cc_model_filenames[capability], f"cc_model_filenames[{capability!r}]")
    for output in cfg.output:
        if output.label_filename:
            check_relative_name(output.label_filename, f"output {output.name!r} label_filename")
    for state in cfg.sequence_batching.state:
        for initial in state.initial_state:
            if initial.data_file:
                check_relative_name(initial.data_file, f"sequence_batching state {state.input_name!r} data_file")
    for warmup in cfg.model_warmup:
        for name in sorted(warmup.inputs):
            data_file = warmup.inputs[name].input_data_file
            if data_file:
                check_relative_name(data_file, f"model_warmup {warmup.name!r} input {name!r} input_data_file")
    for library in cfg.model_operations.op_library_filename:
        check_relative_name(library, "model_operations op_library_filename")
    parameters = {key: value for key, value in cfg.parameters.items()
                  if not (allow_host_parameters and key in HOST_PARAMETERS)}
    _check_parameters(parameters, "parameters")
    for agent in cfg.model_repository_agents.agents:
        _check_parameters(agent.parameters, f"model_repository_agents {agent.name!r} parameters")
    accelerators = cfg.optimization.execution_accelerators
    for kind, group in (("gpu", accelerators.gpu_execution_accelerator),
                        ("cpu", accelerators.cpu_execution_accelerator)):
        for accelerator in group:
            _check_parameters(accelerator.parameters, f"{kind}_execution_accelerator {accelerator.name!r} parameters")


def required_model_file(cfg: ModelConfig) -> str | None:
    """The file (or directory) the model's backend opens in its version directory.

    Returns:
        ``default_model_filename`` when set, else the backend's default (``model.py`` for the
        python backend, ``model.onnx``, ``model.pt``, ``model.plan``), or None for an ensemble, a
        backend this table does not know, or a config choosing files per compute capability.
    """
    if cfg.cc_model_filenames:
        return None
    if cfg.default_model_filename:
        return cfg.default_model_filename
    return DEFAULT_MODEL_FILES.get(cfg.backend) or DEFAULT_MODEL_FILES.get(cfg.platform)


def check_model_file_present(cfg: ModelConfig, files: list[str] | tuple[str, ...], version_dir: str) -> None:
    """Refuse a version directory that lacks the model file its config names.

    A python-backend version without its ``model.py`` leaves Triton 2.51 holding the version
    LOADING for ever (the stub fails to start, the load never ends; triton-inference-server #8766),
    and every later load or unload of that model waits behind it; other backends fail the load on
    the host. Either way the upload should be refused at once.

    Args:
        cfg: the parsed config.
        files: the version directory's regular files, relative to it, ``/``-separated.
        version_dir: the version directory's name in the upload (for the message), e.g. ``"1"``.

    Raises:
        ModelConfigError: the file (or a directory of that name, such as a SavedModel) is missing.
    """
    name = required_model_file(cfg)
    if name is None:
        return
    if name in files or any(path.startswith(f"{name}/") for path in files):
        return
    runtime = cfg.backend or cfg.platform
    raise ModelConfigError(
        f"version directory {version_dir + '/'!r} has no {name!r}, the model file the {runtime} backend loads "
        f"(config.pbtxt default_model_filename, default {DEFAULT_MODEL_FILES.get(runtime, name)!r})"
    )


def check_version_files(cfg: ModelConfig, files: list[str] | tuple[str, ...], version_dir: str) -> None:
    """The whole file check of one version: its config names no file outside its own directory and
    sets no host parameter (``check_confined_paths``), and, unless it is an ensemble, its version
    directory holds the model file its backend loads (``check_model_file_present``). Registration
    runs it on the upload, the host agent again on what it downloaded.

    Raises:
        ModelConfigError: as those two checks.
    """
    check_confined_paths(cfg)
    if cfg.platform != ENSEMBLE_PLATFORM:
        check_model_file_present(cfg, files, version_dir)
