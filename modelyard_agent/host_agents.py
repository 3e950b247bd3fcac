"""One host-agent interface over the serving runtimes: deploy a version, report in, unload a model.

The agent tasks (``modelyard_agent.worker``) pick the adapter named by the host's ``runtime``
(``modelyard_agent.adapters.triton``, ``modelyard_agent.adapters.bentoml``) and call only these
operations, so rollouts, locks, the reconciler and the pages above them are the same for Triton and
BentoML hosts. Each adapter reads its host-side paths from the agent's settings
(``modelyard_agent.config``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from modelyard_agent.adapters.bentoml import BentoMLHostAgent
from modelyard_agent.adapters.triton import TritonHostAgent
from modelyard_agent.contract import Runtime


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

    def route(self, payload: dict) -> dict:
        """Set a model's traffic split on the host's gateway (``contract.RoutePayload``); returns the route.
        Raises ServingRuntimeError where the runtime has no such split."""
        ...

    def set_inference_keys(self, payload: dict) -> dict:
        """Make the host's front accept the keys of ``contract.KeysPayload``; returns ``{model: [digest, ...]}`` as
        it now holds the models named. Raises ServingRuntimeError where the front cannot check keys."""
        ...

    def profile(self, payload: dict, *, progress: Callable[[list[dict], str], None],
                should_stop: Callable[[], str | None]) -> dict:
        """Measure ``payload``'s version (``contract.ProfilePayload``) beside what the host serves; never
        raises. Returns ``{"status", "rows", "message", "details"}`` (``contract.ProfileReport``)."""
        ...

    def replay(self, payload: dict, *, progress: Callable[[dict], None],
               should_stop: Callable[[], str | None]) -> dict:
        """Replay captured requests against ``payload``'s candidate (``contract.ReplayPayload``) beside what
        the host serves; never raises. Returns a ``contract.ReplayReport``."""
        ...


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
