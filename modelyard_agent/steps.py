"""The skeleton both runtimes' deployments share: report each step, time it, say how it ended.

A deployment on a host moves through ``contract.TargetState`` steps (staging, loading, verifying,
cutting over). ``DeploySteps`` reports each step as it starts (the agent turns that into a target
report), records how long it took into ``details`` (``<step>_seconds``), and builds the one result
shape every ``HostAgent.deploy`` returns.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from modelyard_agent.contract import TargetState

logger = logging.getLogger(__name__)


class DeploySteps:
    """The progress of one deployment of ``model`` version ``version`` on this host.

    Args:
        model, version: what is being deployed (for log lines).
        report: called with each step's ``TargetState`` value as the step starts.
        details: what the result's ``details`` start with.

    Attributes:
        details: step durations (``stage_seconds``, ``load_seconds``, ``smoke_seconds``,
            ``cutover_seconds``: seconds, 3 decimals) and whatever the runtime adds.
    """

    def __init__(self, model: str, version: int, report: Callable[[str], None], details: dict | None = None):
        self.model, self.version, self._report = model, version, report
        self.details: dict = dict(details or {})
        self._started = time.monotonic()

    def begin(self, step: TargetState) -> None:
        """Report ``step`` and start timing it."""
        self._report(step.value)
        self._started = time.monotonic()

    def done(self, key: str) -> None:
        """Record the seconds since the last ``begin`` as ``details[key]``."""
        self.details[key] = round(time.monotonic() - self._started, 3)

    def failed(self, message: str, *, retryable: bool = False) -> dict:
        """The result of a deployment that failed (logged): ``{"state": "failed", "error", "retryable", "details"}``."""
        logger.warning("deploy %s v%s failed: %s", self.model, self.version, message)
        return {"state": TargetState.FAILED.value, "error": message, "retryable": retryable, "details": self.details}

    def ready(self) -> dict:
        """The result of a deployment whose version serves now: ``{"state": "ready", "details"}``."""
        return {"state": TargetState.READY.value, "details": self.details}
