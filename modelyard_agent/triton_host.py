"""Host-side work of a Triton host agent: stage a model version, load it, cut over.

Runs on the serving host. It needs no database or S3 credentials: everything
comes in the payload built by ``deployments.targets.build_agent_payload``.

Layout on the host::

    <repo>/<model>/<version>/...              Triton model repository (immutable version dirs)
    <repo>/<model>/config.pbtxt               the config of the last load that served (versions, parameters)
    <staging dir>/                            agent state, same file system as the repository
                                              (default <repo-parent>/.<repo-name>.modelyard/)
        tmp/                                  downloads and extractions in progress
        versions/<model>/<version>/sha256     what a staged version dir was built from
        versions/<model>/<version>/config.pbtxt

The rolling swap follows Triton's explicit model control (docs/architecture.md): load the
new version beside the old ones with ``version_policy: specific``, check that
exact version is READY, load again with only the new version, then wait until
the old versions are really gone, since unload is asynchronous.
"""

import hashlib
import logging
import os
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import requests

from modelyard_agent.config import default_staging_dir
from modelyard_agent.contract import TargetState
from modelyard_agent.formats.archives import ArchiveError, ArchiveLimits, extract_version_dir, inspect_triton_archive
from modelyard_agent.formats.names import NAME_PATTERN
from modelyard_agent.formats.triton_config import (
    ModelConfigError,
    parse_model_config,
    render_config_file,
    render_load_config,
    sample_arrays,
)
from modelyard_agent.formats.triton_paths import check_version_files
from modelyard_agent.runtimes.base import ServingRuntimeError, StagingError
from modelyard_agent.runtimes.triton import MemoryInUse, TritonRuntime, read_memory_in_use
from modelyard_agent.steps import DeploySteps

logger = logging.getLogger(__name__)

DOWNLOAD_CHUNK_BYTES = 1024 * 1024
DISK_MARGIN_BYTES = 64 * 1024 * 1024
BYTECODE_CACHE = "__pycache__"


@dataclass(frozen=True)
class AgentPaths:
    """Where the agent keeps the model repository and its own state.

    Attributes:
        model_repository: Triton's model repository.
        staging_dir: downloads in progress and what each staged version was built from; on the
            repository's file system. None: ``config.default_staging_dir`` (beside the repository).
    """

    model_repository: Path
    staging_dir: Path | None = None

    @property
    def state_dir(self) -> Path:
        return self.staging_dir or default_staging_dir(self.model_repository.resolve())

    def version_dir(self, model: str, version: int) -> Path:
        return self.model_repository / model / str(version)

    def version_state(self, model: str, version: int) -> Path:
        return self.state_dir / "versions" / model / str(version)


def _download(url: str, dest: Path, *, sha256: str, size: int, timeout: float) -> None:
    """Stream ``url`` into ``dest`` checking size (bytes) and sha256 as it goes."""
    digest = hashlib.sha256()
    seen = 0
    try:
        with requests.get(url, stream=True, timeout=(5, timeout)) as answer:
            if answer.status_code != 200:
                raise StagingError(
                    f"artifact download failed: HTTP {answer.status_code}", retryable=answer.status_code >= 500
                )
            with dest.open("wb") as out:
                for chunk in answer.iter_content(DOWNLOAD_CHUNK_BYTES):
                    seen += len(chunk)
                    if seen > size:
                        raise StagingError(f"artifact download is larger than the registered {size} bytes")
                    digest.update(chunk)
                    out.write(chunk)
    except requests.RequestException as exc:
        raise StagingError(f"artifact download failed: {exc}", retryable=True) from exc
    if seen != size:
        raise StagingError(f"artifact download has {seen} bytes; the registry recorded {size}", retryable=True)
    if digest.hexdigest() != sha256:
        raise StagingError(f"artifact sha256 {digest.hexdigest()} does not match the registered {sha256}")


def stage_version(payload: dict, paths: AgentPaths, *, timeout: float = 600.0) -> bool:
    """Place the version's files at ``<repo>/<model>/<version>/``, atomically.

    Idempotent: a version dir already staged from the same sha256 is kept.
    The archive is downloaded and extracted in the agent's state dir (same
    file system) and renamed into place, so Triton never sees a partial dir.

    Args:
        payload: the agent payload (model, version, artifact_url, sha256, size, config_text).
        paths: the agent's directories.
        timeout: seconds allowed between bytes of the download.

    Returns:
        True when files were placed, False when the version was already staged.

    Raises:
        StagingError: download failed, content differs from the registry's
            record, the archive is unsafe, the disk is too full, or the
            repository holds a different dir under that version number.
    """
    model, version, sha256 = payload["model"], int(payload["version"]), payload["sha256"]
    if not NAME_PATTERN.match(str(model)) or version < 1:
        # The name becomes a directory of the model repository: hold it to the registry's grammar here too.
        raise StagingError(f"model {model!r} version {version} cannot name a model repository directory")
    target = paths.version_dir(model, version)
    state = paths.version_state(model, version)
    marker = state / "sha256"
    if target.exists():
        if marker.exists() and marker.read_text().strip() == sha256:
            return False
        raise StagingError(
            f"the model repository already holds {model}/{version} with other content; "
            "version directories are never edited in place"
        )
    tmp_root = paths.state_dir / "tmp"
    tmp_root.mkdir(parents=True, exist_ok=True)
    work = tmp_root / uuid.uuid4().hex
    work.mkdir()
    try:
        archive = work / "artifact"
        _download(payload["artifact_url"], archive, sha256=sha256, size=int(payload["size"]), timeout=timeout)
        limits = ArchiveLimits.from_payload(payload.get("archive_limits"))
        try:
            layout = inspect_triton_archive(archive, limits)
        except ArchiveError as exc:
            raise StagingError(f"artifact refused: {exc}") from exc
        _check_files_named(payload["config_text"], layout.files, layout.version_dir)
        free = shutil.disk_usage(tmp_root).free
        if free < layout.unpacked_bytes + DISK_MARGIN_BYTES:
            raise StagingError(
                f"not enough disk: {layout.unpacked_bytes} bytes to unpack, {free} bytes free", retryable=True
            )
        unpacked = work / "version"
        try:
            extract_version_dir(archive, layout, unpacked, limits)
        except ArchiveError as exc:
            raise StagingError(f"artifact refused: {exc}") from exc
        _block_bytecode_caches(unpacked)
        state.mkdir(parents=True, exist_ok=True)
        (state / "config.pbtxt").write_text(payload["config_text"])
        target.parent.mkdir(parents=True, exist_ok=True)
        model_config = target.parent / "config.pbtxt"
        if not model_config.exists():
            staged_config = work / "config.pbtxt"
            staged_config.write_text(payload["config_text"])
            os.replace(staged_config, model_config)
        os.rename(unpacked, target)
        marker.write_text(sha256)
        return True
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _check_files_named(config_text: str, files: tuple[str, ...], version_dir: str) -> None:
    """Check again, on the host, what registration checked: the config names no file outside the
    model's directory and the version directory holds the model file its backend loads.

    Raises:
        StagingError: (not retryable) with the config checker's message.
    """
    try:
        check_version_files(parse_model_config(config_text), files, version_dir)
    except ModelConfigError as exc:
        raise StagingError(f"artifact refused: {exc}") from exc


def _block_bytecode_caches(version_dir: Path) -> None:
    """Keep Python from writing ``__pycache__`` directories into a staged version directory.

    Triton reloads every version of a model whose directory changed since its last load. A
    python-backend stub importing ``model.py`` writes ``__pycache__/`` beside it during the first
    load, so the cut-over (a load of the new version alone) would start a second, unverified
    instance of the version the smoke inference just checked, at the cost of a whole load.
    Setting PYTHONDONTWRITEBYTECODE for tritonserver does not stop the stub (Triton 2.51), so the
    defence is in the directory: an empty file named ``__pycache__`` beside each Python source
    makes the interpreter skip writing bytecode (it compiles from source instead), and the
    version directory stays as staged.

    Args:
        version_dir: the extracted version directory, before it is renamed into place.
    """
    for directory in {source.parent for source in version_dir.rglob("*.py")}:
        cache = directory / BYTECODE_CACHE
        if not cache.exists():
            cache.touch()


def _config_text_for(paths: AgentPaths, model: str, version: int, fallback: str) -> str:
    saved = paths.version_state(model, version) / "config.pbtxt"
    return saved.read_text() if saved.exists() else fallback


def deploy_triton_version(
    payload: dict,
    *,
    model_repository: Path,
    report: Callable[[str], None] = lambda state: None,
    load_timeout: float = 600.0,
    unload_timeout: float = 120.0,
    grpc_url: str = "",
    staging_dir: Path | None = None,
    keep: Callable[[list[int]], list[int]] | None = None,
    before_cutover: Callable[[list[int]], None] | None = None,
) -> dict:
    """Stage one model version on this host and make it the one Triton serves.

    Old versions keep serving until the new one is READY; a failed load
    leaves them serving (and reloads them should Triton have dropped them).

    Args:
        payload: built by ``build_agent_payload`` (model, version, artifact_url,
            sha256, size in bytes, config_text, parameters, inference_url).
        model_repository: the host's Triton model repository.
        report: called with "staging", "loading", "verifying" (smoke inference, when the
            payload has a sample input) and "cutting_over" as the work proceeds.
        load_timeout: the host's load deadline: seconds allowed for one Triton load call. Past it
            the load is abandoned (``_abandon_load``) and the old versions keep serving.
        unload_timeout: the host's unload deadline: seconds to wait for replaced versions to unload. Past it the
            new version still counts as served (``details["unload_error"]`` says what is still unloading).
        grpc_url: ``host:port`` of Triton's gRPC endpoint for loads and unloads (see
            ``TritonRuntime``); empty: over HTTP.
        staging_dir: see ``AgentPaths``.
        keep: given the versions that were READY before (the new one aside), returns those to keep
            loaded beside the new one (a canary's stable version); default none: the new one alone.
        before_cutover: called with the kept versions once the new version is READY and verified,
            before any other version unloads (the gateway routes requests away from those first).
            An exception it raises fails the deployment and restores the versions from before.

    Returns:
        ``{"state": "ready", "details": {...}}`` or
        ``{"state": "failed", "error": "...", "retryable": bool, "details": {...}}``;
        details hold ``previous_versions`` and step durations in seconds.
    """
    paths = AgentPaths(Path(model_repository), Path(staging_dir) if staging_dir else None)
    model, version = payload["model"], int(payload["version"])
    parameters = payload.get("parameters") or {}
    runtime = TritonRuntime(payload["inference_url"], load_timeout=load_timeout, grpc_url=grpc_url)
    steps = DeploySteps(model, version, report)
    details, failed = steps.details, steps.failed

    def config_for(versions: list[int], text_version: int) -> str:
        text = _config_text_for(paths, model, text_version, payload["config_text"])
        return render_load_config(text, model_name=model, versions=sorted(versions), parameters=parameters,
                                  overrides=payload.get("config_overrides"))

    steps.begin(TargetState.STAGING)
    try:
        details["staged"] = stage_version(payload, paths, timeout=load_timeout)
    except StagingError as exc:
        return failed(exc.message, retryable=exc.retryable)
    steps.done("stage_seconds")

    steps.begin(TargetState.LOADING)
    try:
        ready_before = runtime.ready_versions(model)
        previous = [v for v in ready_before if v != version]
    except ServingRuntimeError as exc:
        return failed(f"Triton is not reachable: {exc.message}", retryable=exc.retryable)
    details["previous_versions"] = previous
    before = memory_or_none(payload.get("metrics_url"))
    try:
        runtime.load(model, config_for(previous + [version], version))
        if not runtime.is_version_ready(model, version):
            raise ServingRuntimeError(
                f"Triton answered the load of {model} version {version} but that version is not READY",
                retryable=False,
            )
    except ServingRuntimeError as exc:
        if exc.timed_out:
            # A redeployment of the version that already serves (a repair) keeps it too.
            return failed(_abandon_load(runtime, model, version, ready_before, config_for, deadline=load_timeout))
        _restore(runtime, model, previous, config_for)
        return failed(f"Triton could not load {model} version {version}: {exc.message}", retryable=exc.retryable)
    steps.done("load_seconds")
    details["footprint_bytes"] = _footprint(before, memory_or_none(payload.get("metrics_url")))

    if payload.get("sample_input"):
        steps.begin(TargetState.VERIFYING)
        problem = _smoke_test(runtime, model, version, payload)
        if problem:
            _restore(runtime, model, previous, config_for, failed_version=version)
            return failed(f"smoke inference on {model} version {version} failed: {problem}")
        steps.done("smoke_seconds")

    kept = sorted(set(keep(previous)) & set(previous)) if keep else []
    details["kept_versions"] = kept
    if before_cutover is not None:
        try:
            before_cutover(kept)
        except ServingRuntimeError as exc:
            _restore(runtime, model, previous, config_for, failed_version=version)
            return failed(f"could not route {model} to version {version} before the cut-over: {exc.message}",
                          retryable=exc.retryable)
    leaving = [v for v in previous if v not in kept]
    if leaving:
        steps.begin(TargetState.CUTTING_OVER)
        try:
            runtime.load(model, config_for(kept + [version], version))
        except ServingRuntimeError as exc:
            if exc.timed_out:
                return failed(f"cut-over to {model} version {version} did not finish within the host's deadline: "
                              f"{exc.message}; Triton finishes it on its own, and the reconciler checks the result")
            return failed(f"cut-over to {model} version {version} failed: {exc.message}", retryable=exc.retryable)
        try:
            runtime.wait_versions_gone(model, leaving, timeout=unload_timeout)
            steps.done("cutover_seconds")
        except ServingRuntimeError as exc:
            # The new version serves (READY, and Triton took the config that drops the others): what is left is
            # the unload of the versions leaving, which Triton finishes on its own. Reported as a failure, it
            # made the control plane hold the old version as served and redeploy it once Triton unloaded it.
            details["unload_error"] = f"{exc.message}; Triton finishes their unload on its own"
    _write_model_config(paths, model, config_for(kept + [version], version))
    return steps.ready()


def _write_model_config(paths: AgentPaths, model: str, config_json: str) -> None:
    """Make ``<repo>/<model>/config.pbtxt`` the config Triton serves the model with now (atomic rename).

    Triton reads it when it loads the model without a config override: after a restart, or when
    loading an ensemble makes it load the ensemble's composing models from the repository.
    """
    model_dir = paths.model_repository / model
    staged = model_dir / ".config.pbtxt.new"
    staged.write_text(render_config_file(config_json))
    os.replace(staged, model_dir / "config.pbtxt")


def _smoke_test(runtime: TritonRuntime, model: str, version: int, payload: dict) -> str:
    """Send the version's sample input to exactly that version; return what went wrong, or ""."""
    try:
        arrays = sample_arrays(payload["sample_input"], payload.get("signature") or {})
        outputs = [o["name"] for o in (payload.get("signature") or {}).get("outputs", [])]
        runtime.infer(model, arrays, outputs, version=version)
    except ModelConfigError as exc:
        return str(exc)
    except ServingRuntimeError as exc:
        return exc.message
    return ""


# Seconds to hand Triton the request that undoes an abandoned load. Triton holds it behind the
# load still in progress (explicit model control serialises a model's loads and unloads) and
# carries it out when that load ends, whether or not the agent is still waiting for the answer.
UNDO_REQUEST_SECONDS = 2.0


def _abandon_load(runtime: TritonRuntime, model: str, version: int, previous: list[int], config_for, *,
                  deadline: float) -> str:
    """Give up on a load that passed the host's deadline, leaving the old versions serving.

    Triton cannot cancel a load in progress, and while one runs it holds every other load or unload
    of that model (a python-backend stub that never starts keeps a version LOADING for ever,
    triton-inference-server #8766). So the agent asks for the state it wants, the previous versions
    alone (or no version, when none served), and does not wait: Triton applies the request when the
    stuck load ends, so the abandoned version never stays READY beside the old ones. Other models
    on the host are not affected.

    Args:
        runtime: the host's Triton.
        model, version: the model and the version whose load passed its deadline.
        previous: the versions READY before the load (``version`` itself too, when it was), which
            keep serving.
        config_for: ``(versions, text_version) -> load config JSON``.
        deadline: the host's load deadline, seconds (for the message).

    Returns:
        The failure message: Triton's own state and reason for the version, what was asked of
        Triton, and which versions serve now.
    """
    quick = TritonRuntime(runtime.inference_url, timeout=5.0, load_timeout=UNDO_REQUEST_SECONDS,
                          grpc_url=runtime.grpc_url)
    try:
        entry = next((e for e in quick.repository_index() if e.name == model and e.version == version), None)
        state = f"{entry.state or 'no state'} ({entry.reason or 'Triton gives no reason'})" if entry else "not listed"
    except ServingRuntimeError as exc:
        state = f"unknown ({exc.message})"
    try:
        if previous:
            quick.load(model, config_for(previous, max(previous)))
        else:
            quick.unload(model)
        undo = "its unload was handed to Triton"
    except ServingRuntimeError as exc:
        undo = ("its unload is queued behind that load in Triton" if exc.timed_out
                else f"asking Triton to unload it failed ({exc.message})")
    try:
        serving = [v for v in previous if quick.is_version_ready(model, v)]
    except ServingRuntimeError:
        serving = []
    if serving:
        kept = f"version {', '.join(map(str, serving))} keeps serving" if len(serving) == 1 else \
            f"versions {', '.join(map(str, serving))} keep serving"
    elif previous:
        kept = f"versions {previous} no longer answer as READY"
    else:
        kept = f"no earlier version of {model} served here"
    logger.error("abandoned the load of %s v%s after %g s: Triton reports it %s", model, version, deadline, state)
    return (f"Triton did not finish loading {model} version {version} within the host's load deadline of "
            f"{deadline:g} s and reports it {state}; {undo}, and {kept}")


def _restore(runtime: TritonRuntime, model: str, previous: list[int], config_for, failed_version=None) -> None:
    """Make sure the versions that served before a failed load still serve, and only they (a
    loaded but failed ``failed_version`` is dropped); with none, unload the model so Triton does
    not keep a failed, UNAVAILABLE entry for it."""
    if not previous:
        try:
            runtime.unload(model)
        except ServingRuntimeError as exc:
            logger.warning("could not unload failed model %s: %s", model, exc.message)
        return
    try:
        if failed_version is None and all(runtime.is_version_ready(model, v) for v in previous):
            return
        runtime.load(model, config_for(previous, max(previous)))
    except ServingRuntimeError as exc:
        logger.error("could not restore %s versions %s: %s", model, previous, exc.message)


def memory_or_none(metrics_url: str | None) -> MemoryInUse | None:
    """Triton's memory gauges (``read_memory_in_use``), or None without a metrics URL or when they
    cannot be read (logged): a footprint that cannot be measured is left unknown, never a failure."""
    if not metrics_url:
        return None
    try:
        return read_memory_in_use(metrics_url)
    except ServingRuntimeError as exc:
        logger.info("memory not measured: %s", exc.message)
        return None


def _footprint(before: MemoryInUse | None, after: MemoryInUse | None) -> dict:
    """The memory a new version added while loaded beside the old ones, in bytes.

    A delta of the server's memory gauges around the load (DESIGN.md: the measured
    footprint that placement uses next time); None where a gauge is missing.
    """
    if before is None or after is None:
        return {"gpu": None, "cpu": None}

    def delta(a, b):
        return max(0, b - a) if a is not None and b is not None else None

    return {"gpu": delta(before.gpu_bytes, after.gpu_bytes), "cpu": delta(before.cpu_bytes, after.cpu_bytes)}


def collect_heartbeat(*, inference_url: str, metrics_url: str, model_repository: Path, labels: dict) -> dict:
    """What a host agent reports about its host; never raises.

    Returns:
        ``{"runtime_live": bool, "runtime_version": str | None, "models": [{"name", "version",
        "state", "reason" (only when Triton gives one)}], "gpus": [{"gpu_uuid", "memory_used", "memory_total"} (bytes)],
        "disk_free_bytes": int | None, "labels": {...}, "errors": [str]}``.
    """
    runtime = TritonRuntime(inference_url, timeout=5.0)
    report: dict = {"runtime_live": runtime.is_live(), "runtime_version": None, "models": [], "gpus": [],
                    "disk_free_bytes": None, "labels": labels, "errors": []}
    if report["runtime_live"]:
        try:
            report["runtime_version"] = runtime.server_version()
            report["models"] = [
                {"name": m.name, "version": m.version, "state": m.state, **({"reason": m.reason} if m.reason else {})}
                for m in runtime.repository_index()
            ]
        except ServingRuntimeError as exc:
            report["errors"].append(exc.message)
    if metrics_url:
        try:
            report["gpus"] = list(read_memory_in_use(metrics_url).gpus)
        except ServingRuntimeError as exc:
            report["errors"].append(exc.message)
    try:
        report["disk_free_bytes"] = shutil.disk_usage(model_repository).free
    except OSError as exc:
        report["errors"].append(f"model repository {model_repository}: {exc}")
    return report


def ensure_version_ready(payload: dict, *, load_timeout: float, grpc_url: str = "") -> bool:
    """Reload ``payload``'s model version on Triton if it is not READY (e.g. an ensemble whose
    composing model was swapped); the version directory is already staged on this host.

    Args:
        payload: built by ``build_agent_payload`` (model, version, config_text, parameters,
            config_overrides, inference_url).
        load_timeout: seconds allowed for the load call.

    Returns:
        True when the version is READY afterwards.
    """
    model, version = payload["model"], int(payload["version"])
    runtime = TritonRuntime(payload["inference_url"], load_timeout=load_timeout, grpc_url=grpc_url)
    try:
        if runtime.is_version_ready(model, version):
            return True
        logger.warning("%s v%s is not READY after a composing model changed; reloading it", model, version)
        runtime.load(model, render_load_config(
            payload["config_text"], model_name=model, versions=[version],
            parameters=payload.get("parameters") or {}, overrides=payload.get("config_overrides"),
        ))
        return runtime.is_version_ready(model, version)
    except ServingRuntimeError as exc:
        logger.error("could not reload %s v%s: %s", model, version, exc.message)
        return False
