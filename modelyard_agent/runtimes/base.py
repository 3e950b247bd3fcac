"""What the runtime clients (``runtimes.triton``, ``runtimes.bentoml``, ``runtimes.nginx_process`` and the
nginx configs on it) share: their error types (a runtime call that failed, a version that could not be
staged) and the state of a model version.

The interface a host agent drives, whatever the runtime, is ``modelyard_agent.host_agents.HostAgent``
(deploy, heartbeat, unload); each runtime's client below it speaks that runtime's own protocol.
"""

import os
from dataclasses import dataclass
from pathlib import Path


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
        seconds: how long the call that failed ran, when the caller timed it (a model load: the on-demand
            loader reports a failed load's seconds too, ``modelyard_model_load_seconds{outcome="failed"}``);
            None otherwise.
    """

    def __init__(self, message: str, *, retryable: bool, timed_out: bool = False, seconds: float | None = None):
        super().__init__(message)
        self.message = message
        self.retryable = retryable
        self.timed_out = timed_out
        self.seconds = seconds

    def __repr__(self) -> str:
        return f"ServingRuntimeError({self.message!r}, retryable={self.retryable})"


class StagingError(Exception):
    """A version could not be placed in the model repository; the message says why.

    Attributes:
        retryable: True for network failures, False for bad content.
    """

    def __init__(self, message: str, *, retryable: bool = False):
        super().__init__(message)
        self.message = message
        self.retryable = retryable


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


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a sibling ``.<name>.partial`` file and a rename, so a reader (nginx
    reloading, a Lua worker reading routes) sees the old file or the new one, never half of one.

    Raises:
        OSError: the directory is not writable.
    """
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text)
    os.replace(partial, path)
