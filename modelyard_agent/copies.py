"""Copies of a model version loaded beside what a Triton host serves, under a name of their own.

A performance profile (``profiling.triton``) and a replay (``replay.triton``) each load the version
they work on as ``<model><infix><id>`` (``formats.names.PROFILE_INFIX``, ``REPLAY_INFIX``): the copy
has a repository directory, a config and instances apart from the served model's, so loading and
unloading it never touches the served model's clients. The registry refuses model names that hold
an infix, so no served model can be mistaken for a copy. A copy is removed when its work ends, and
a heartbeat removes copies no running task owns (an agent killed mid-task leaves its copy behind).
"""

from __future__ import annotations

import logging
import shutil

from modelyard_agent.formats.triton_config import ModelConfigError, render_load_config
from modelyard_agent.runtimes.base import ServingRuntimeError, StagingError
from modelyard_agent.runtimes.triton import TritonRuntime
from modelyard_agent.triton_staging import AgentPaths, stage_version

logger = logging.getLogger(__name__)


def copy_name(model: str, infix: str, task_id: int) -> str:
    """``<model><infix><id>``, the model's name cut so that the whole stays within 63 characters."""
    suffix = f"{infix}{task_id}"
    return f"{model[:63 - len(suffix)].rstrip('-_')}{suffix}"


def copy_id_of(name: str, infix: str) -> int | None:
    """The task id a copy's name carries (``<model><infix><id>``), or None for any other name."""
    head, sep, tail = name.rpartition(infix)
    return int(tail) if sep and head and tail.isdigit() else None


def stage_and_load_copy(runtime: TritonRuntime, payload: dict, paths: AgentPaths, name: str, *,
                        load_timeout: float, overrides: dict | None = None) -> None:
    """Stage ``payload``'s version (a ``DeployPayload``-like dict: artifact, config_text, parameters) as
    model ``name`` and load it there, READY when this returns.

    Args:
        runtime: the host's Triton (itself, not the gateway).
        payload: the version to copy.
        paths: the host's model repository and staging directory.
        name: the copy's model name (``copy_name``).
        load_timeout: seconds the download and the load may each take.
        overrides: deployment ``config_overrides`` for this load (``{}``: the version's own config).

    Raises:
        StagingError: the artifact could not be fetched, checked or unpacked.
        ServingRuntimeError: Triton refused or failed the load, or the version is not READY after it.
        ModelConfigError: the config cannot be rendered with the overrides.
    """
    version = int(payload["version"])
    stage_version({**payload, "model": name}, paths, timeout=load_timeout)
    runtime.load(name, render_load_config(payload["config_text"], model_name=name, versions=[version],
                                          parameters=payload.get("parameters") or {}, overrides=overrides or {}))
    if not runtime.is_version_ready(name, version):
        raise ServingRuntimeError(f"{name} version {version} is not READY after its load", retryable=False)


def remove_copy(runtime: TritonRuntime, paths: AgentPaths, name: str, unload_timeout: float) -> None:
    """Unload the copy ``name`` (when still loaded) and delete its repository directory and state; never raises."""
    try:
        versions = runtime.ready_versions(name)
        if versions:
            runtime.unload(name)
            runtime.wait_versions_gone(name, versions, timeout=unload_timeout)
    except ServingRuntimeError as exc:
        logger.warning("copy %s may still be loaded: %s", name, exc.message)
    shutil.rmtree(paths.model_repository / name, ignore_errors=True)
    shutil.rmtree(paths.state_dir / "versions" / name, ignore_errors=True)


def remove_stale_copies(runtime: TritonRuntime, paths: AgentPaths, infix: str, active: set[int],
                        unload_timeout: float = 120.0) -> list[str]:
    """Unload and delete the copies named with ``infix`` whose id is not in ``active``.

    Args:
        runtime: the host's Triton.
        paths: the host's model repository and staging directory.
        infix: which copies (``PROFILE_INFIX``, ``REPLAY_INFIX``).
        active: the ids of the tasks of that kind this host's agent runs now.
        unload_timeout: seconds to wait for each copy to unload.

    Returns:
        The names of the copies removed.

    Raises:
        ServingRuntimeError: Triton's repository index cannot be read.
    """
    loaded = {entry.name for entry in runtime.repository_index()}
    on_disk = {path.name for path in paths.model_repository.iterdir()} if paths.model_repository.is_dir() else set()
    stale = sorted(name for name in loaded | on_disk
                   if (task := copy_id_of(name, infix)) is not None and task not in active)
    for name in stale:
        logger.warning("removing copy %s, which no running task owns", name)
        remove_copy(runtime, paths, name, unload_timeout)
    return stale


__all__ = ["ModelConfigError", "StagingError", "copy_id_of", "copy_name", "remove_copy", "remove_stale_copies",
           "stage_and_load_copy"]
