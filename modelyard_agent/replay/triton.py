"""One replay on a Triton host: captured requests sent to the version that serves and to a candidate's copy.

The candidate is staged and loaded under a name of the replay's own (``replay_model_name``:
``<model>--replay-<id>``, ``modelyard_agent.copies``), so the served model's instances and clients are
never touched. The captured requests (``replay.captures``, newest first, at most ``max_requests``) are
sent to Triton itself, not through the gateway (so they are neither captured again nor counted as
client traffic), each to ``/v2/models/<model>/versions/<serving>/infer`` and to the copy, with the
captured body and its Content-Type and Inference-Header-Content-Length headers. One request is in
flight at a time and at most ``pace`` captured requests start per second, so serving keeps its
capacity; which side goes first alternates, so neither side's latency gains from the other warming a
cache. The two answers are compared (``replay.compare``) and each side's round trip is measured on
the host, in milliseconds. The copy is unloaded and deleted when the replay ends, however it ends.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from modelyard_agent import copies
from modelyard_agent.formats.names import REPLAY_INFIX
from modelyard_agent.formats.triton_config import ModelConfigError
from modelyard_agent.replay.captures import CapturedRequest, read_captured
from modelyard_agent.replay.compare import (
    RequestComparison,
    ResponseError,
    Summary,
    Tolerances,
    compare_outputs,
    decode_response,
)
from modelyard_agent.runtimes.base import ServingRuntimeError, StagingError
from modelyard_agent.runtimes.triton import RawAnswer, RawInferClient, TritonRuntime
from modelyard_agent.triton_staging import AgentPaths

logger = logging.getLogger(__name__)

DEFAULT_REQUEST_TIMEOUT = 10.0
POLL_SECONDS = 0.25


class _Stopped(Exception):
    def __init__(self, reason: str, cancelled: bool):
        super().__init__(reason)
        self.reason, self.cancelled = reason, cancelled


def replay_model_name(model: str, replay_id: int) -> str:
    """The name a replay's copy of the candidate is loaded under: ``<model>--replay-<id>``."""
    return copies.copy_name(model, REPLAY_INFIX, replay_id)


def replay_id_of(name: str) -> int | None:
    """The replay id a replay copy's name carries, or None for any other name."""
    return copies.copy_id_of(name, REPLAY_INFIX)


def remove_stale_replay_copies(runtime: TritonRuntime, paths: AgentPaths, active: set[int],
                               unload_timeout: float = 120.0) -> list[str]:
    """Unload and delete the replay copies no running replay owns (``copies.remove_stale_copies``).

    Raises:
        ServingRuntimeError: Triton's repository index cannot be read.
    """
    return copies.remove_stale_copies(runtime, paths, REPLAY_INFIX, active, unload_timeout)


def replay_triton_version(
    payload: dict,
    *,
    paths: AgentPaths,
    triton_url: str,
    capture_dir: Path,
    progress: Callable[[dict], None],
    should_stop: Callable[[], str | None],
    load_timeout: float = 600.0,
    unload_timeout: float = 120.0,
    grpc_url: str = "",
) -> dict:
    """Replay ``payload``'s captured requests against its serving version and its candidate; never raises.

    Args:
        payload: a ``contract.ReplayPayload``.
        paths: the host's model repository and staging directory.
        triton_url: Triton's own HTTP URL (the gateway's upstream, or ``inference_url`` without a gateway).
        capture_dir: the model's capture directory on this host.
        progress: called with a ``contract.ReplayReport`` (status ``running``) after each request; the
            caller decides how often to send it on.
        should_stop: returns a reason to stop (a cancel) or None; asked before each request and every
            quarter of a second while waiting for the pace.
        load_timeout, unload_timeout: seconds the copy's load or unload may take.
        grpc_url: ``host:port`` of Triton's gRPC endpoint for the copy's load and unload (empty: HTTP).

    Returns:
        A ``contract.ReplayReport``: ``succeeded`` once every request was sent (whatever the agreement),
        ``cancelled``, or ``failed`` (nothing captured, the serving version not READY, the copy did not
        load, the time budget ran out, no request the serving version answered) with the summary so far.
    """
    started = time.monotonic()
    model, serving, candidate = payload["model"], int(payload["serving"]), int(payload["version"])
    name = replay_model_name(model, int(payload["replay_id"]))
    summary = Summary()
    details: dict = {"copy": name, "serving_failures": {}}
    state = {"done": 0, "total": 0}

    def report(status: str, message: str = "", step: str = "") -> dict:
        details["seconds"] = round(time.monotonic() - started, 3)
        body = {"status": status, "done": state["done"], "total": state["total"], "summary": summary.as_dict(),
                "details": dict(details)}
        if message:
            body["message"] = message
        if step:
            body["step"] = step
        return body

    try:
        tolerances = Tolerances.from_dict(payload.get("tolerances"))
        pace = float(payload.get("pace") or 20.0)
        if pace <= 0:
            raise ValueError(f"pace must be above 0 requests/s; got {pace!r}")
    except (TypeError, ValueError) as exc:
        return report("failed", f"bad replay settings: {exc}")
    read = read_captured(capture_dir, model=model, limit=max(1, int(payload.get("max_requests") or 1)))
    details.update(captured=len(read.requests), unreadable_lines=read.unreadable, capture_files=read.files)
    if not read.requests:
        return report("failed", f"no captured requests of {model} on this host ({capture_dir}): turn capture on "
                                "for the model and let it serve for a while")
    state["total"] = len(read.requests)
    runtime = TritonRuntime(triton_url, load_timeout=load_timeout, grpc_url=grpc_url)
    try:
        ready = runtime.ready_versions(model)
    except ServingRuntimeError as exc:
        return report("failed", f"Triton: {exc.message}")
    if serving not in ready:
        return report("failed", f"{model} v{serving} is not READY on this host (READY: {ready}); the replay compares "
                                "against the version the host serves")
    progress(report("running", step="staging the candidate's copy"))
    try:
        copies.stage_and_load_copy(runtime, payload, paths, name, load_timeout=load_timeout)
    except (StagingError, ServingRuntimeError, ModelConfigError) as exc:
        copies.remove_copy(runtime, paths, name, unload_timeout)
        return report("failed", f"the candidate's copy did not load: {getattr(exc, 'message', exc)}")
    details["stage_seconds"] = round(time.monotonic() - started, 3)
    timeout = float(payload.get("request_timeout") or DEFAULT_REQUEST_TIMEOUT)
    client = RawInferClient(triton_url, timeout=timeout)
    deadline = started + float(payload.get("time_budget_s") or 3600)
    try:
        began = time.monotonic()
        for index, request in enumerate(read.requests):
            _wait_until(began + index / pace, deadline, should_stop)
            _replay_one(client, request, model, serving, name, candidate, tolerances, summary, details,
                        candidate_first=bool(index % 2))
            state["done"] = index + 1
            progress(report("running", step=f"request {index + 1} of {state['total']}"))
    except _Stopped as exc:
        if exc.cancelled:
            return report("cancelled", exc.reason)
        return report("failed", f"{exc.reason} after {state['done']} of {state['total']} requests "
                                f"(time_budget_s {payload.get('time_budget_s')})")
    finally:
        client.close()
        copies.remove_copy(runtime, paths, name, unload_timeout)
    if not summary.compared:
        return report("failed", f"the serving version answered none of the {state['total']} captured requests "
                                f"(failures: {details['serving_failures']})")
    return report("succeeded")


def _wait_until(moment: float, deadline: float, should_stop: Callable[[], str | None]) -> None:
    """Sleep until ``moment`` (monotonic seconds), asking ``should_stop`` every quarter of a second.

    Raises:
        _Stopped: a stop was asked, or the deadline passed.
    """
    while True:
        if reason := should_stop():
            raise _Stopped(reason, cancelled=True)
        now = time.monotonic()
        if now > deadline:
            raise _Stopped("the replay's time budget ran out", cancelled=False)
        if now >= moment:
            return
        time.sleep(min(POLL_SECONDS, moment - now))


def _send(client: RawInferClient, model: str, version: int, request: CapturedRequest) -> RawAnswer | str:
    try:
        return client.infer(model, version, request.body, request.headers())
    except ServingRuntimeError as exc:
        return exc.message


def _replay_one(client: RawInferClient, request: CapturedRequest, model: str, serving: int, copy: str,
                candidate: int, tolerances: Tolerances, summary: Summary, details: dict, *,
                candidate_first: bool) -> None:
    """Send one captured request to both sides and count the verdict in ``summary``.

    A request the serving version does not answer with 200 and a readable response cannot be judged:
    it is skipped and counted under ``details["serving_failures"]`` by status. A candidate that fails
    where the serving version answered disagrees.
    """
    if candidate_first:
        other = _send(client, copy, candidate, request)
        reference = _send(client, model, serving, request)
    else:
        reference = _send(client, model, serving, request)
        other = _send(client, copy, candidate, request)
    failures = details["serving_failures"]
    if isinstance(reference, str) or reference.status != 200:
        key = "unreachable" if isinstance(reference, str) else str(reference.status)
        failures[key] = failures.get(key, 0) + 1
        summary.skip()
        return
    try:
        served = decode_response(reference.body, reference.header_length)
    except ResponseError:
        failures["unreadable"] = failures.get("unreadable", 0) + 1
        summary.skip()
        return
    if isinstance(other, str):
        summary.add(request.id, RequestComparison(False, reason=f"the candidate did not answer: {other}"), served,
                    None, serving_ms=reference.latency_ms)
        return
    if other.status != 200:
        text = other.body[:300].decode(errors="replace")
        summary.add(request.id, RequestComparison(False, reason=f"the candidate answered {other.status}: {text}"),
                    served, None, serving_ms=reference.latency_ms, candidate_ms=other.latency_ms)
        return
    try:
        answered = decode_response(other.body, other.header_length)
    except ResponseError as exc:
        summary.add(request.id, RequestComparison(False, reason=f"the candidate's response: {exc}"), served, None,
                    serving_ms=reference.latency_ms, candidate_ms=other.latency_ms)
        return
    summary.add(request.id, compare_outputs(served, answered, tolerances), served, answered,
                serving_ms=reference.latency_ms, candidate_ms=other.latency_ms)
