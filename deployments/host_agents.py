"""One host-agent interface over the serving runtimes: deploy a version, report in, unload a model.

The agent tasks (``deployments.tasks``) pick the adapter named by the host's ``runtime`` and call
only these three operations, so rollouts, locks, the reconciler and the pages above them are the
same for Triton and BentoML hosts. Each adapter reads its host-side paths from the settings.
"""

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from django.conf import settings

from deployments.choices import Runtime


def load_deadline(payload: dict) -> float:
    """Seconds one load may take: the host's deadline from the payload, else the agent's default."""
    return float(payload.get("load_deadline") or settings.AGENT_LOAD_TIMEOUT)


def unload_deadline(payload: dict) -> float:
    """Seconds one unload may take: the host's deadline from the payload, else the agent's default."""
    return float(payload.get("unload_deadline") or settings.AGENT_UNLOAD_TIMEOUT)


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


class TritonHostAgent:
    """Triton: a model repository on disk, explicit load/unload over HTTP (``deployments.agent``)."""

    def deploy(self, payload: dict, *, report: Callable[[str], None]) -> dict:
        from deployments.agent import deploy_triton_version

        return deploy_triton_version(payload, model_repository=Path(settings.AGENT_MODEL_REPOSITORY), report=report,
                                     load_timeout=load_deadline(payload), unload_timeout=unload_deadline(payload),
                                     grpc_url=settings.AGENT_TRITON_GRPC_URL)

    def heartbeat(self, request: dict) -> dict:
        from deployments.agent import collect_heartbeat

        return collect_heartbeat(inference_url=request["inference_url"], metrics_url=request.get("metrics_url", ""),
                                 model_repository=Path(settings.AGENT_MODEL_REPOSITORY), labels=settings.AGENT_LABELS)

    def unload(self, payload: dict) -> None:
        from deployments.runtimes.triton import TritonRuntime

        runtime = TritonRuntime(payload["inference_url"], load_timeout=unload_deadline(payload),
                                grpc_url=settings.AGENT_TRITON_GRPC_URL)
        versions = runtime.ready_versions(payload["model"])
        runtime.unload(payload["model"])
        runtime.wait_versions_gone(payload["model"], versions, timeout=unload_deadline(payload))


class BentoMLHostAgent:
    """BentoML: a locked Bento Store and blue/green ``bentoml serve`` processes behind nginx
    (``deployments.agent_bentoml``)."""

    def deploy(self, payload: dict, *, report: Callable[[str], None]) -> dict:
        from deployments.agent_bentoml import deploy_bentoml_version

        return deploy_bentoml_version(payload, root=Path(settings.AGENT_BENTOML_ROOT), report=report,
                                      load_timeout=load_deadline(payload), unload_timeout=unload_deadline(payload))

    def heartbeat(self, request: dict) -> dict:
        """Start nginx unless it runs (so a host serving nothing yet is online), tidy what a dead agent left
        (under each model's lock, skipping models being deployed), then report."""
        from deployments.agent_bentoml import collect_bentoml_heartbeat, front_for, tidy_models
        from deployments.runtimes.base import ServingRuntimeError
        from deployments.tasks import host_model_lock

        root = Path(settings.AGENT_BENTOML_ROOT)
        errors = []
        try:
            front_for(root, request["inference_url"]).ensure_running()
        except ServingRuntimeError as exc:
            errors.append(f"nginx: {exc.message}")
        tidied = tidy_models(root, request["inference_url"], lambda model: host_model_lock(request["host"], model))
        report = collect_bentoml_heartbeat(inference_url=request["inference_url"],
                                           root=root, labels=settings.AGENT_LABELS)
        report["tidied"] = tidied
        report["errors"] = errors + report["errors"]
        return report

    def unload(self, payload: dict) -> None:
        from deployments.agent_bentoml import unload_bentoml_model

        unload_bentoml_model(payload, root=Path(settings.AGENT_BENTOML_ROOT), timeout=unload_deadline(payload))


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
