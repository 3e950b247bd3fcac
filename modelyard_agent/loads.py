"""What the on-demand loader (``modelyard_agent.residency``) says of each load and eviction it runs: one record
when it ends, with when it started and ended, and the message held requests get when a load failed.

The record goes to the logger ``modelyard_agent.loads`` at INFO, as ``"<action> <model> <outcome>: <started> to
<ended> (<seconds> s)"`` (action ``load`` or ``eviction``, outcome ``done`` or ``failed``, times in Unix seconds
with microseconds), and carries them in the record's ``args`` (action, model, outcome, started, ended, seconds).
With one loading thread, loads and evictions never overlap, so these records say what a cold request waited for:
its model's load, and what the loader was doing when it came (``bench/on_demand.py`` subtracts them from each
cold wait; the ``modelyard_model_load_seconds`` histogram has the durations but not when each load ran).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

from modelyard_agent.runtimes.base import ServingRuntimeError

logger = logging.getLogger(__name__)


@contextmanager
def recorded(action: str, model: str) -> Iterator[None]:
    """Held around one load (``action`` "load") or eviction ("eviction": the unload and the wait for its versions to
    be gone) of ``model``; logs its record when the block ends (outcome "failed" when it raised, which it
    re-raises)."""
    started, outcome = time.time(), "failed"
    try:
        yield
        outcome = "done"
    finally:
        ended = time.time()
        logger.info("%s %s %s: %.6f to %.6f (%.3f s)", action, model, outcome, started, ended, ended - started)


def load_failure_message(model: str, exc: BaseException) -> str:
    """What held requests for ``model`` are answered when its load failed with ``exc``: Triton's or the
    gateway's own message, or the kind of error and its text (a lock whose Redis does not answer)."""
    if isinstance(exc, ServingRuntimeError):
        return exc.message
    if isinstance(exc, TimeoutError):
        return str(exc)
    return f"the host agent could not load {model}: {type(exc).__name__}: {exc}"
