"""The rolling swap of a Triton host agent: make a staged version the one Triton serves (load it beside the
old ones, verify it, cut over), give up on a load past its deadline, and reload a version that stopped
being READY.

Runs on the serving host. It needs no database or S3 credentials: everything
comes in the payload built by ``deployments.targets.build_agent_payload``. Staging the version's files
first is ``triton_staging``.

The rolling swap follows Triton's explicit model control (docs/architecture.md): load the
new version beside the old ones with ``version_policy: specific``, check that
exact version is READY, load again with only the new version, then wait until
the old versions are really gone, since unload is asynchronous.
"""

import logging
import os
from collections.abc import Callable
from pathlib import Path

from modelyard_agent.contract import TargetState
from modelyard_agent.formats.triton_config import (
    ModelConfigError,
    render_config_file,
    render_load_config,
    sample_arrays,
)
from modelyard_agent.runtimes.base import ServingRuntimeError, StagingError
from modelyard_agent.runtimes.triton import MemoryInUse, TritonRuntime, read_memory_in_use
from modelyard_agent.steps import DeploySteps
from modelyard_agent.triton_staging import AgentPaths, stage_version, staged_config_text

logger = logging.getLogger(__name__)


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
        text = staged_config_text(paths, model, text_version, payload["config_text"])
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


def stage_on_demand(payload: dict, *, model_repository: Path, versions: list[int],
                    report: Callable[[str], None] = lambda state: None, load_timeout: float = 600.0,
                    staging_dir: Path | None = None) -> dict:
    """Stage ``payload``'s version of a model registered on demand that is not resident: its files go into the
    model repository and its ``config.pbtxt`` names ``versions`` (the new one, with a canary's stable version
    beside it), so the loader's next load from disk serves them; Triton is not asked to load anything.

    Args:
        payload: as ``deploy_triton_version``.
        versions: the versions the model serves from now on, ``payload``'s among them.

    Returns:
        As ``deploy_triton_version``: ready with ``details["resident"]`` False, or failed (a download or a
        config that does not parse; nothing in the repository changed then).
    """
    paths = AgentPaths(Path(model_repository), Path(staging_dir) if staging_dir else None)
    model, version = payload["model"], int(payload["version"])
    steps = DeploySteps(model, version, report)
    steps.begin(TargetState.STAGING)
    try:
        steps.details["staged"] = stage_version(payload, paths, timeout=load_timeout)
        text = staged_config_text(paths, model, version, payload["config_text"])
        config = render_load_config(text, model_name=model, versions=sorted(versions),
                                    parameters=payload.get("parameters") or {},
                                    overrides=payload.get("config_overrides"))
    except StagingError as exc:
        return steps.failed(exc.message, retryable=exc.retryable)
    except ModelConfigError as exc:
        return steps.failed(f"the config of {model} version {version} does not parse: {exc}")
    _write_model_config(paths, model, config)
    steps.done("stage_seconds")
    steps.details.update(resident=False, previous_versions=[], kept_versions=sorted(set(versions) - {version}))
    return steps.ready()
