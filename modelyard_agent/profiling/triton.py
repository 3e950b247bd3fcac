"""Profiling one Triton model version on its host, beside what the host serves.

The version is staged and loaded under a model name of the profile's own
(``profile_model_name``), so the copy has a repository directory, a config and instances apart from
the served model's, and every load and unload touches only the copy: clients of the served
versions keep their instances. For each config of the sweep the copy is loaded with that config
(instance count, dynamic batching, max batch size), the memory it takes is read from Triton's
gauges around the load, perf_analyzer measures each concurrency level, and the copy is unloaded.
When the sweep ends (or is cancelled, or runs out of its time budget) the copy's files are
removed.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from modelyard_agent import copies
from modelyard_agent.formats.names import PROFILE_INFIX
from modelyard_agent.formats.triton_config import (
    ModelConfigError,
    instance_groups_of,
    parse_model_config,
    render_load_config,
)
from modelyard_agent.profiling import perf_analyzer
from modelyard_agent.profiling.perf_analyzer import LoadGeneratorError, Stopped
from modelyard_agent.profiling.sweep import ProfileConfig, Sweep
from modelyard_agent.runtimes.base import ServingRuntimeError, StagingError
from modelyard_agent.runtimes.triton import TritonRuntime
from modelyard_agent.triton_host import memory_or_none
from modelyard_agent.triton_staging import AgentPaths, stage_version

logger = logging.getLogger(__name__)



def profile_model_name(model: str, profile_id: int) -> str:
    """The name a profile's copy of ``model`` is loaded under: ``<model>--profile-<id>`` (the model's
    name cut so that the whole stays within 63 characters). The registry refuses model names that
    hold ``--profile-``, so no served model can have it."""
    return copies.copy_name(model, PROFILE_INFIX, profile_id)


def profile_triton_version(
    payload: dict,
    *,
    paths: AgentPaths,
    perf_analyzer_binary: str,
    progress: Callable[[list[dict], str], None],
    should_stop: Callable[[], str | None],
    load_timeout: float = 600.0,
    unload_timeout: float = 120.0,
    grpc_url: str = "",
) -> dict:
    """Measure ``payload``'s version under each config of its sweep; never raises.

    Args:
        payload: a ``contract.ProfilePayload`` (model, version, artifact_url, sha256, size,
            config_text, parameters, sample_input, signature, inference_url, metrics_url, sweep).
        paths: the host's model repository and staging directory.
        perf_analyzer_binary: the perf_analyzer to run.
        progress: called after each measured level with all rows so far and the current step
            (for the profile's progress).
        should_stop: returns a reason to stop (a cancel) or None; asked about every 0.25 s.
        load_timeout, unload_timeout: seconds one load or unload of the copy may take.
        grpc_url: ``host:port`` of Triton's gRPC endpoint for loads and unloads (empty: HTTP).

    Returns:
        ``{"status": "succeeded" | "failed" | "cancelled", "rows": [...], "message": str,
        "details": {"stage_seconds", "seconds"}}``. Rows measured before a failure or a cancel are
        kept.
    """
    started = time.monotonic()
    sweep = Sweep.from_dict(payload["sweep"])
    deadline = started + sweep.time_budget_s
    name = profile_model_name(payload["model"], int(payload["profile_id"]))
    version = int(payload["version"])
    runtime = TritonRuntime(payload["inference_url"], load_timeout=load_timeout, grpc_url=grpc_url)
    rows: list[dict] = []
    details: dict = {"model_name": name}

    def result(status: str, message: str = "") -> dict:
        details["seconds"] = round(time.monotonic() - started, 3)
        return {"status": status, "rows": rows, "message": message, "details": details}

    try:
        binary = perf_analyzer.find_binary(perf_analyzer_binary, "perf_analyzer")
        max_batch_size = int(parse_model_config(payload["config_text"]).max_batch_size)
        groups = instance_groups_of(payload["config_text"])
    except (LoadGeneratorError, ModelConfigError) as exc:
        return result("failed", str(exc))
    progress(rows, "staging a profiling copy")
    try:
        stage_version({**payload, "model": name}, paths, timeout=load_timeout)
    except StagingError as exc:
        return result("failed", exc.message)
    details["stage_seconds"] = round(time.monotonic() - started, 3)
    workdir = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=paths.state_dir / "tmp"))
    try:
        input_args = perf_analyzer.write_input_data(workdir / "input.json", payload.get("sample_input"),
                                                    payload.get("signature") or {}, max_batch_size)
        for index, config in enumerate(sweep.configs, 1):
            if reason := should_stop() or ("the profile's time budget ran out" if time.monotonic() > deadline
                                           else None):
                raise Stopped(reason)
            progress(rows, f"config {index} of {len(sweep.configs)}: {config.label}")
            step = f"config {index} of {len(sweep.configs)}: {config.label}"
            _measure_config(runtime, payload, name, version, config, groups, sweep, binary, input_args, workdir,
                            deadline=deadline, should_stop=should_stop, unload_timeout=unload_timeout,
                            on_row=lambda row, step=step: (rows.append(row), progress(rows, step)))
        return result("succeeded")
    except Stopped as exc:
        cancelled = "time budget" not in exc.reason
        return result("cancelled" if cancelled else "failed",
                      exc.reason if cancelled else f"{exc.reason} after {len(rows)} of {sweep.runs} measurements "
                                                   f"(time_budget_s {sweep.time_budget_s})")
    finally:
        _remove_copy(runtime, paths, name, unload_timeout)
        shutil.rmtree(workdir, ignore_errors=True)


def _measure_config(runtime: TritonRuntime, payload: dict, name: str, version: int, config: ProfileConfig,
                    groups: list[dict], sweep: Sweep, binary: str, input_args: list[str], workdir: Path, *,
                    deadline: float, should_stop, unload_timeout: float, on_row) -> None:
    """Load the copy with ``config``, measure each concurrency level (``on_row`` gets each row as it is
    measured), unload it.

    A level perf_analyzer cannot stabilise is measured once more with windows twice as long
    (``perf_analyzer.measure``). A config Triton refuses to load gives one row with its ``error``; a
    level perf_analyzer cannot measure gives a row with its ``error``, and the sweep goes on.

    Raises:
        Stopped: cancelled, or past the deadline.
    """
    base = {"config": config.as_dict()}
    before = memory_or_none(payload.get("metrics_url"))
    try:
        runtime.load(name, render_load_config(
            payload["config_text"], model_name=name, versions=[version], parameters=payload.get("parameters") or {},
            overrides=config.config_overrides(groups)))
        if not runtime.is_version_ready(name, version):
            raise ServingRuntimeError(f"{name} version {version} is not READY after its load", retryable=False)
    except (ServingRuntimeError, ModelConfigError) as exc:
        on_row({**base, "concurrency": None, "error": f"did not load: {getattr(exc, 'message', exc)}"})
        return
    base["memory_bytes"], base["memory_kind"] = _delta(before, memory_or_none(payload.get("metrics_url")))
    try:
        for concurrency in sweep.concurrency:
            row = {**base, "concurrency": concurrency}
            try:
                row.update(perf_analyzer.measure(
                    binary, inference_url=payload["inference_url"], model=name, version=version,
                    concurrency=concurrency, measurement_interval_ms=sweep.measurement_interval_ms,
                    stability_percentage=sweep.stability_percentage, max_trials=sweep.max_trials,
                    csv_path=workdir / f"{config.key}-c{concurrency}.csv", input_args=input_args,
                    deadline=deadline, should_stop=should_stop))
            except LoadGeneratorError as exc:
                row["error"] = str(exc)
            on_row(row)
    finally:
        try:
            runtime.unload(name)
            runtime.wait_versions_gone(name, [version], timeout=unload_timeout)
        except ServingRuntimeError as exc:
            logger.warning("unloading profiling copy %s: %s", name, exc.message)


def profile_id_of(name: str) -> int | None:
    """The profile id a profile copy's name carries (``<model>--profile-<id>``), or None for any other name."""
    return copies.copy_id_of(name, PROFILE_INFIX)


def remove_stale_copies(runtime: TritonRuntime, paths: AgentPaths, active: set[int],
                        unload_timeout: float = 120.0) -> list[str]:
    """Unload and delete the profile copies no running profile owns (an agent killed mid-profile
    leaves its copy loaded and on disk).

    Args:
        runtime: the host's Triton.
        paths: the host's model repository and staging directory.
        active: the ids of the profiles this host's agent is running now.
        unload_timeout: seconds to wait for each copy to unload.

    Returns:
        The names of the copies removed.

    Raises:
        ServingRuntimeError: Triton's repository index cannot be read.
    """
    return copies.remove_stale_copies(runtime, paths, PROFILE_INFIX, active, unload_timeout)


def _remove_copy(runtime: TritonRuntime, paths: AgentPaths, name: str, unload_timeout: float) -> None:
    """Unload the profiling copy (when still loaded) and delete its repository directory and state."""
    copies.remove_copy(runtime, paths, name, unload_timeout)


def _delta(before, after) -> tuple[int | None, str | None]:
    """The memory a load added, bytes, and where: the GPUs' when Triton reports GPUs, else the host's
    CPU memory (noisier: the whole host's)."""
    if before is None or after is None:
        return None, None
    if before.gpu_bytes is not None and after.gpu_bytes is not None:
        return max(0, after.gpu_bytes - before.gpu_bytes), "gpu"
    if before.cpu_bytes is not None and after.cpu_bytes is not None:
        return max(0, after.cpu_bytes - before.cpu_bytes), "cpu"
    return None, None
