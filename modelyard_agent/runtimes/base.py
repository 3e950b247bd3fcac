"""The interface every serving runtime adapter offers, and its one error type.

A host agent picks the adapter from the host's ``runtime`` field and only talks
to this interface, so Triton and other runtimes are interchangeable to it.
"""

from dataclasses import dataclass
from typing import Protocol

import numpy as np


class ServingRuntimeError(Exception):
    """A serving runtime call failed.

    Attributes:
        message: what went wrong; for a refusal, the runtime's own error text.
        retryable: True when retrying may help (connection refused, timeout,
            runtime busy or unavailable); False when the runtime answered and
            refused the request (bad model, unknown model, bad input).
        timed_out: True when the runtime was reached but did not answer within the
            call's timeout (a load still running on the server, say), as opposed to one
            that could not be reached at all.
    """

    def __init__(self, message: str, *, retryable: bool, timed_out: bool = False):
        super().__init__(message)
        self.message = message
        self.retryable = retryable
        self.timed_out = timed_out

    def __repr__(self) -> str:
        return f"ServingRuntimeError({self.message!r}, retryable={self.retryable})"


@dataclass(frozen=True)
class ModelVersionState:
    """One row of a runtime's model repository index.

    Attributes:
        name: model name.
        version: model version, or None for a model that has never been loaded.
        state: the runtime's state word, e.g. ``READY``, ``LOADING``,
            ``UNLOADING``, ``UNAVAILABLE``; empty when the runtime gives none.
        reason: why the version is in that state (e.g. ``unloaded`` or a load
            error); empty when none is given.
    """

    name: str
    version: int | None
    state: str
    reason: str


class ServingRuntime(Protocol):
    """Operations a host agent needs from a serving runtime.

    Every method raises ServingRuntimeError on failure; none retries by itself.
    """

    def is_live(self) -> bool:
        """Return True when the runtime answers its liveness check."""
        ...

    def server_version(self) -> str:
        """Return the runtime's version string."""
        ...

    def repository_index(self) -> list[ModelVersionState]:
        """Return the state of every model version the runtime knows."""
        ...

    def ready_versions(self, model: str) -> list[int]:
        """Return the READY versions of ``model``, ascending."""
        ...

    def load(self, model: str, config_json: str) -> None:
        """Load (or reload) ``model`` with the given configuration; blocks until done."""
        ...

    def unload(self, model: str) -> None:
        """Ask the runtime to unload every version of ``model`` (may finish later)."""
        ...

    def is_version_ready(self, model: str, version: int) -> bool:
        """Return True when ``version`` of ``model`` can serve requests."""
        ...

    def wait_versions_gone(self, model: str, versions: list[int], timeout: float, poll: float = 0.05) -> None:
        """Block until none of ``versions`` of ``model`` is serving or unloading."""
        ...

    def infer(
        self,
        model: str,
        inputs: dict[str, np.ndarray],
        outputs: list[str],
        version: int | None = None,
    ) -> dict[str, np.ndarray]:
        """Run one inference request and return the requested outputs by name."""
        ...
