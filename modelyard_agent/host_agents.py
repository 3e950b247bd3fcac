"""One host-agent interface over the serving runtimes: deploy a version, report in, unload a model.

The agent tasks (``modelyard_agent.worker``) pick the adapter named by the host's ``runtime`` and
call only these operations, so rollouts, locks, the reconciler and the pages above them are the
same for Triton and BentoML hosts. Each adapter reads its host-side paths from the agent's
settings (``modelyard_agent.config``).
"""

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from modelyard_agent.config import current as settings
from modelyard_agent.contract import Runtime


def load_deadline(payload: dict) -> float:
    """Seconds one load may take: the host's deadline from the payload, else the agent's default."""
    return float(payload.get("load_deadline") or settings().load_deadline)


def unload_deadline(payload: dict) -> float:
    """Seconds one unload may take: the host's deadline from the payload, else the agent's default."""
    return float(payload.get("unload_deadline") or settings().unload_deadline)


class HostAgent(Protocol):
    """What a host agent does on its host, whatever runtime serves there."""

    def deploy(self, payload: dict, *, report: Callable[[str], None]) -> dict:
        """Stage ``payload``'s version and make it the one served; never raises.

        Returns ``{"state": "ready" | "failed", "error"?, "retryable"?, "details": {...}}``.
        """
        ...

    def heartbeat(self, request: dict) -> dict:
        """Report liveness, served models (``[{"name", "version", "state"}]``), GPUs, free disk; never raises."""
        ...

    def unload(self, payload: dict) -> None:
        """Stop serving ``payload["model"]`` and wait until it is gone; raises ServingRuntimeError."""
        ...

    def profile(self, payload: dict, *, progress: Callable[[list[dict], str], None],
                should_stop: Callable[[], str | None]) -> dict:
        """Measure ``payload``'s version (``contract.ProfilePayload``) beside what the host serves; never
        raises. Returns ``{"status", "rows", "message", "details"}`` (``contract.ProfileReport``)."""
        ...


class TritonHostAgent:
    """Triton: a model repository on disk, explicit load and unload over gRPC (over HTTP without a gRPC
    address), ``modelyard_agent.triton_host``."""

    def deploy(self, payload: dict, *, report: Callable[[str], None]) -> dict:
        from modelyard_agent.triton_host import deploy_triton_version

        return deploy_triton_version(payload, model_repository=Path(settings().model_repository), report=report,
                                     load_timeout=load_deadline(payload), unload_timeout=unload_deadline(payload),
                                     grpc_url=settings().triton_grpc_url, staging_dir=settings().staging_dir)

    def heartbeat(self, request: dict) -> dict:
        """Remove profile copies no running profile owns (``profiling.triton.remove_stale_copies``), then
        report."""
        from modelyard_agent.profiling.triton import remove_stale_copies
        from modelyard_agent.runtimes.base import ServingRuntimeError
        from modelyard_agent.runtimes.triton import TritonRuntime
        from modelyard_agent.triton_host import AgentPaths, collect_heartbeat

        errors = []
        if request.get("inference_url"):
            try:
                remove_stale_copies(TritonRuntime(request["inference_url"], timeout=5.0,
                                                  grpc_url=settings().triton_grpc_url),
                                    AgentPaths(Path(settings().model_repository), settings().staging_dir),
                                    running_profiles(request["host"]))
            except ServingRuntimeError as exc:
                errors.append(f"profile copies: {exc.message}")
        report = collect_heartbeat(inference_url=request["inference_url"], metrics_url=request.get("metrics_url", ""),
                                   model_repository=Path(settings().model_repository), labels=settings().labels)
        report["errors"] = report["errors"] + errors
        return report

    def unload(self, payload: dict) -> None:
        from modelyard_agent.runtimes.triton import TritonRuntime

        runtime = TritonRuntime(payload["inference_url"], load_timeout=unload_deadline(payload),
                                grpc_url=settings().triton_grpc_url)
        versions = runtime.ready_versions(payload["model"])
        runtime.unload(payload["model"])
        runtime.wait_versions_gone(payload["model"], versions, timeout=unload_deadline(payload))

    def profile(self, payload: dict, *, progress, should_stop) -> dict:
        from modelyard_agent.profiling.triton import profile_triton_version
        from modelyard_agent.triton_host import AgentPaths

        return profile_triton_version(
            payload, paths=AgentPaths(Path(settings().model_repository), settings().staging_dir),
            perf_analyzer_binary=settings().perf_analyzer, progress=progress, should_stop=should_stop,
            load_timeout=load_deadline(payload), unload_timeout=unload_deadline(payload),
            grpc_url=settings().triton_grpc_url)


class BentoMLHostAgent:
    """BentoML: a locked Bento Store and blue/green ``bentoml serve`` processes behind nginx
    (``modelyard_agent.bentoml_host``)."""

    def deploy(self, payload: dict, *, report: Callable[[str], None]) -> dict:
        from modelyard_agent.bentoml_host import deploy_bentoml_version

        return deploy_bentoml_version(payload, root=Path(settings().bentoml_root), report=report,
                                      load_timeout=load_deadline(payload), unload_timeout=unload_deadline(payload))

    def heartbeat(self, request: dict) -> dict:
        """Start nginx unless it runs (so a host serving nothing yet is online), tidy what a dead agent left
        (under each model's lock, skipping models being deployed), then report."""
        from modelyard_agent.bentoml_host import collect_bentoml_heartbeat, front_for, tidy_models
        from modelyard_agent.runtimes.base import ServingRuntimeError
        from modelyard_agent.worker import host_model_lock

        root = Path(settings().bentoml_root)
        errors = []
        try:
            front_for(root, request["inference_url"]).ensure_running()
        except ServingRuntimeError as exc:
            errors.append(f"nginx: {exc.message}")
        tidied = tidy_models(root, request["inference_url"], lambda model: host_model_lock(request["host"], model))
        from modelyard_agent.profiling.bentoml import stop_stale_instances

        stop_stale_instances(root, running_profiles(request["host"]))
        report = collect_bentoml_heartbeat(inference_url=request["inference_url"],
                                           root=root, labels=settings().labels)
        report["tidied"] = tidied
        report["errors"] = errors + report["errors"]
        return report

    def unload(self, payload: dict) -> None:
        from modelyard_agent.bentoml_host import unload_bentoml_model

        unload_bentoml_model(payload, root=Path(settings().bentoml_root), timeout=unload_deadline(payload))

    def profile(self, payload: dict, *, progress, should_stop) -> dict:
        from modelyard_agent.profiling.bentoml import profile_bentoml_version

        return profile_bentoml_version(payload, root=Path(settings().bentoml_root), wrk_binary=settings().wrk,
                                       progress=progress, should_stop=should_stop,
                                       load_timeout=load_deadline(payload), unload_timeout=unload_deadline(payload))


def running_profiles(host: str) -> set[int]:
    """The ids of the profiles this host's agent runs now (its working set in the broker's Redis)."""
    from modelyard_agent.worker import agent_info

    return {int(entry["profile_id"]) for entry in agent_info(host)["working_on"] if entry.get("profile_id")}


_AGENTS: dict[str, HostAgent] = {Runtime.TRITON: TritonHostAgent(), Runtime.BENTOML: BentoMLHostAgent()}


def host_agent(runtime: str | None) -> HostAgent:
    """The adapter for a host's ``runtime`` (a ``Runtime`` value; missing means Triton, as payloads
    queued before runtimes were sent).

    Raises:
        ValueError: an unknown runtime.
    """
    try:
        return _AGENTS[runtime or Runtime.TRITON]
    except KeyError as exc:
        raise ValueError(f"no host agent for runtime {runtime!r}") from exc
