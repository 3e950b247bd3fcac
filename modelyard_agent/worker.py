"""The host agent's Celery application and its tasks.

It consumes its host's queue only (``contract.host_queue``), runs the ``contract.AgentTask`` tasks
and reports to the orchestrator by task name (``contract.OrchestratorTask``), so it needs none of
the orchestrator's code, no database and no S3 credentials. Start it with ``modelyard-agent``
(``modelyard_agent.cli``); its settings are ``modelyard_agent.config``.

Work on one model of a host runs under that (host, model) lock in the broker's Redis, so loads,
swaps and unloads of a model never overlap, while other models proceed side by side. While a
task works, a thread of its own keeps reporting the host in (``heartbeats_meanwhile``), and the
host's "working on" set in Redis says what the agent is busy with, so the orchestrator can tell
work a killed agent dropped from work still under way.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import redis
from celery import Task

from modelyard_agent import contract
from modelyard_agent.adapters.common import load_deadline
from modelyard_agent.app import app, report
from modelyard_agent.claims import CANCELLED, STARTED, SUPERSEDED, claim_target, target_claim
from modelyard_agent.config import current as settings
from modelyard_agent.contract import AgentTask, OrchestratorTask, TargetState, UnsupportedProtocol
from modelyard_agent.coordination import (
    acquire_or_take_over,
    agent_info,
    broker,
    host_job_lock,
    host_model_lock,
    release,
    working_on,
)
from modelyard_agent.host_agents import HostAgent, host_agent
from modelyard_agent.inference import InferenceRefused, infer
from modelyard_agent.profiling import control
from modelyard_agent.profiling.sweep import Sweep
from modelyard_agent.runtimes.base import ServingRuntimeError
from modelyard_agent.triton_host import ensure_version_ready

logger = logging.getLogger(__name__)

LOCK_RETRY_SECONDS = 5

__all__ = ["app"]


def _report(target_id: int, state: str, message: str = "", details: dict | None = None) -> None:
    report(OrchestratorTask.TARGET_REPORT, target_id, state, message, details or {})


@contextmanager
def heartbeats_meanwhile(payload: dict) -> Iterator[None]:
    """Keep reporting the host in, from a thread of its own, while this task works.

    A load can take as long as the host's deadline, and the heartbeat requests queued for the
    host wait behind busy agent processes; without this the host would look offline to every
    team for that long. The thread sends a report every ``heartbeat_interval`` seconds (the first
    after one interval) and stops when the block ends. Does nothing for a payload that lacks the
    host's endpoints.

    Args:
        payload: an agent payload with ``host``, ``inference_url``, ``metrics_url``, ``runtime``.
    """
    if not payload.get("host") or not payload.get("inference_url"):
        yield
        return
    request = {key: payload.get(key, "") for key in ("host", "inference_url", "metrics_url", "runtime")}
    done = threading.Event()
    interval = settings().heartbeat_interval

    def beat() -> None:
        while not done.wait(interval):
            try:
                _send_heartbeat(request)
            except Exception:  # a missed beat is logged; the next one may get through
                logger.exception("heartbeat of %s during a long task failed", request["host"])

    thread = threading.Thread(target=beat, name=f"heartbeat-{payload['host']}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=interval)


def _refused(payload: dict) -> str | None:
    """Why this agent will not act on ``payload`` (a newer protocol, a malformed one, or one for a host
    of another runtime than this agent's ``--runtime``), else None."""
    try:
        contract.check_protocol(payload)
    except (UnsupportedProtocol, ValueError) as exc:
        return str(exc)
    runtime = payload.get("runtime") or contract.Runtime.TRITON
    if runtime != settings().runtime:
        return (f"this agent runs with --runtime {settings().runtime}, but host {payload.get('host')!r} is "
                f"registered as a {runtime} host: fix the host's runtime or the agent's --runtime")
    return None


def _stood_down(target_id: int, held: str | None) -> bool:
    """Act on a claim another side holds: a cancelled target is reported cancelled; a superseded one
    (sent again under a new claim after an agent restart) is left to that newer message. Returns
    True when the target must not be started; False for no claim yet, or this message's own."""
    if held == CANCELLED:  # cancelled while it waited in the queue or for the lock
        logger.info("target %s was cancelled while queued; not starting it", target_id)
        _report(target_id, TargetState.CANCELLED, "the rollout was cancelled before this host started")
        return True
    if held == SUPERSEDED:
        logger.info("target %s was sent again since this message; leaving it to the newer one", target_id)
        return True
    return False


def _lock_or_retry(task: Task, lock: redis.lock.Lock, give_up: Callable[[], None] | None = None) -> bool:
    """Hold ``lock`` for ``task`` (taking it over from an earlier delivery of the same task), or retry the
    task in ``LOCK_RETRY_SECONDS`` while another holds it. With ``give_up``, a task that has waited
    ``lock_wait`` seconds calls it and returns False instead of retrying again.

    Raises:
        celery.exceptions.Retry: the lock is held elsewhere (Celery's retry, raised by ``task.retry``).
    """
    if acquire_or_take_over(lock, task.request.id):
        return True
    if give_up is not None and task.request.retries * LOCK_RETRY_SECONDS >= settings().lock_wait:
        give_up()
        return False
    raise task.retry(countdown=LOCK_RETRY_SECONDS)


@contextmanager
def _under_model_lock(task: Task, agent_task: AgentTask, payload: dict, *, load_deadline: float | None = None,
                      beats: bool = True) -> Iterator[None]:
    """Run the body as ``task``'s work on one model: under the (host, model) lock (taken over from an
    earlier delivery of the task, or the task retried in ``LOCK_RETRY_SECONDS`` while another holds it),
    recorded as work under way for the heartbeat (``coordination.working_on``), with heartbeats sent
    meanwhile unless ``beats`` is False; the lock is released however the body ends.

    Args:
        load_deadline: seconds the work may keep the lock (``coordination.host_model_lock``).

    Raises:
        celery.exceptions.Retry: the lock is held elsewhere.
    """
    lock = host_model_lock(payload["host"], payload["model"], load_deadline)
    _lock_or_retry(task, lock)
    try:
        with working_on(agent_task, payload, task.request.id), (
                heartbeats_meanwhile(payload) if beats else nullcontext()):
            yield
    finally:
        release(lock, f"before the {agent_task.value} task ended")


@app.task(name=AgentTask.DEPLOY.value, acks_late=True, bind=True, max_retries=None)
def deploy_version_on_host(self, payload: dict) -> None:
    """Stage, load and cut over one model version, reporting each step.

    Runs under the (host, model) lock; when another deployment holds it, the task is retried
    every ``LOCK_RETRY_SECONDS`` until the lock frees or ``lock_wait`` passes. Before acting it
    claims the target (``modelyard_agent.claims``): a target whose rollout was cancelled while this
    task waited in the queue is reported cancelled and never started. A payload of a newer
    protocol is reported failed, naming the upgrade. Safe to run twice: staging skips a version
    dir already built from the same sha256 and loading an already-served version is a no-op swap.
    """
    target_id = payload["target_id"]
    if refusal := _refused(payload):
        logger.error("target %s refused: %s", target_id, refusal)
        _report(target_id, TargetState.FAILED, refusal)
        return
    claim = payload.get("claim") or str(target_id)
    if _stood_down(target_id, target_claim(broker(), claim)):
        return
    lock = host_model_lock(payload.get("host", ""), payload["model"], payload.get("load_deadline"))
    if not _lock_or_retry(self, lock, give_up=lambda: _report(target_id, TargetState.FAILED, (
            f"{payload['model']} stayed locked on this host by another deployment for {settings().lock_wait:g} s"))):
        return
    held = claim_target(broker(), claim, STARTED)
    if held != STARTED:
        release(lock, f"for a {held} target")
        _stood_down(target_id, held)
        return
    try:
        with working_on(AgentTask.DEPLOY, payload, self.request.id), heartbeats_meanwhile(payload):
            result = host_agent(payload.get("runtime")).deploy(payload, report=lambda state: _report(target_id, state))
    except Exception as exc:  # the orchestrator must hear of every failure, not only the foreseen ones
        logger.exception("deploying target %s failed", target_id)
        _report(target_id, TargetState.FAILED, f"host agent error: {exc}")
        return
    finally:
        release(lock, "before the deployment ended")
    if result["state"] == TargetState.READY:
        _report(target_id, TargetState.READY, details=result["details"])
    else:
        _report(target_id, TargetState.FAILED, result["error"], details=result["details"])


@app.task(name=AgentTask.HEARTBEAT.value, acks_late=True)
def report_heartbeat(request: dict) -> None:
    """Report the runtime's liveness, loaded (or, on BentoML, served) models, GPUs, free disk and
    the agent itself (``contract.HeartbeatReport``)."""
    _send_heartbeat(request)


def _send_heartbeat(request: dict, errors: list[str] = ()) -> None:
    beat = host_agent(settings().runtime).heartbeat(request)  # this host's runtime, whatever was registered
    beat["agent"] = agent_info(request["host"])
    beat["errors"] = [*errors, *beat.get("errors", [])]
    if refusal := _refused(request):
        beat["errors"] = [refusal, *beat.get("errors", [])]
    report(OrchestratorTask.HOST_HEARTBEAT, request["host"], beat)


@app.task(name=AgentTask.UNLOAD.value, acks_late=True, bind=True, max_retries=None)
def unload_model_on_host(self, payload: dict) -> None:
    """Stop serving a model (Triton unload, or BentoML's nginx route and processes) under the
    (host, model) lock and wait until it is gone; a payload of a newer protocol is refused (logged)."""
    if refusal := _refused(payload):
        logger.error("unload of %s refused: %s", payload.get("model"), refusal)
        return
    try:
        with _under_model_lock(self, AgentTask.UNLOAD, payload):
            host_agent(payload.get("runtime")).unload(payload)
    except ServingRuntimeError as exc:
        logger.error("unloading %s from %s failed: %s", payload["model"], payload["host"], exc.message)
        if exc.retryable and self.request.retries < 5:
            raise self.retry(countdown=LOCK_RETRY_SECONDS) from exc


@app.task(name=AgentTask.ROUTE.value, acks_late=True, bind=True, max_retries=None)
def route_model_on_host(self, payload: dict) -> None:
    """Set a model's canary split on the host's gateway (``contract.RoutePayload``) under the (host, model)
    lock, then report the host in, so the orchestrator sees the route the gateway holds. A refused
    route is logged and shows in that heartbeat's errors; a gateway that does not answer is retried."""
    if refusal := _refused(payload):
        logger.error("route of %s refused: %s", payload.get("model"), refusal)
        return
    errors = []
    try:
        with _under_model_lock(self, AgentTask.ROUTE, payload, beats=False):
            host_agent(payload.get("runtime")).route(payload)
    except ServingRuntimeError as exc:
        logger.error("route of %s on %s failed: %s", payload["model"], payload["host"], exc.message)
        if exc.retryable and self.request.retries < 5:
            raise self.retry(countdown=LOCK_RETRY_SECONDS) from exc
        errors.append(f"route of {payload['model']}: {exc.message}")
    _send_heartbeat({key: payload.get(key, "") for key in ("host", "inference_url", "metrics_url", "runtime")},
                    errors=errors)


@app.task(name=AgentTask.KEYS.value, acks_late=True, bind=True, max_retries=None)
def set_inference_keys_on_host(self, payload: dict) -> None:
    """Set the inference keys the host's front accepts (``contract.KeysPayload``), then report the host in. A
    refused payload is logged and shows in that heartbeat's errors; a front that does not answer is retried."""
    if refusal := _refused(payload):
        logger.error("inference keys refused: %s", refusal)
        return
    errors = []
    try:
        host_agent(payload.get("runtime")).set_inference_keys(payload)
    except ServingRuntimeError as exc:
        logger.error("inference keys on %s failed: %s", payload["host"], exc.message)
        if exc.retryable and self.request.retries < 5:
            raise self.retry(countdown=LOCK_RETRY_SECONDS) from exc
        errors.append(f"inference keys: {exc.message}")
    except ValueError as exc:  # a malformed payload: nothing to retry
        logger.error("inference keys on %s refused: %s", payload["host"], exc)
        errors.append(f"inference keys: {exc}")
    _send_heartbeat({key: payload.get(key, "") for key in ("host", "inference_url", "metrics_url", "runtime")},
                    errors=errors)


@app.task(name=AgentTask.CHECK_ENSEMBLE.value, acks_late=True, bind=True, max_retries=None)
def check_ensemble_on_host(self, payload: dict) -> bool:
    """Make sure an ensemble version is READY after one of its composing models changed.

    Reloads it with its config when it is not (under the (host, model) lock). Returns whether it
    was READY, or became so; False for a payload of a newer protocol (logged).
    """
    if refusal := _refused(payload):
        logger.error("ensemble check of %s refused: %s", payload.get("model"), refusal)
        return False
    with _under_model_lock(self, AgentTask.CHECK_ENSEMBLE, payload, load_deadline=payload.get("load_deadline")):
        return ensure_version_ready(payload, load_timeout=load_deadline(payload), grpc_url=settings().triton_grpc_url)


@app.task(name=AgentTask.INFER.value, acks_late=False)
def infer_on_host(payload: dict) -> None:
    """Run one "Try it" request on this host's runtime and push the ``contract.InferReply`` onto the
    payload's reply list. Not acknowledged late: a request whose agent died is not run twice (the
    web tier has stopped waiting by then)."""
    if refusal := _refused(payload):
        reply = {"ok": False, "error": refusal, "retryable": False}
    else:
        try:
            reply = {"ok": True, **infer(
                runtime=payload.get("runtime") or contract.Runtime.TRITON, inference_url=payload["inference_url"],
                model=payload["model"], version=int(payload["version"]), pin_version=bool(payload.get("pin_version")),
                inputs=payload["inputs"], signature=payload.get("signature") or {},
                timeout=float(payload.get("timeout") or 10))}
        except InferenceRefused as exc:
            reply = {"ok": False, "error": exc.message, "retryable": exc.retryable}
    client = broker()
    client.rpush(payload["reply_to"], json.dumps(reply))
    client.expire(payload["reply_to"], contract.REPLY_SECONDS)


@dataclass(frozen=True)
class HostJob:
    """A whole-host job an agent runs beside what the host serves (a profile, a replay): what differs
    between kinds, for ``_run_host_job``.

    Attributes:
        kind: ``"profile"`` or ``"replay"``: its lock (``coordination.host_job_lock``) and its stop flag
            (``profiling.control``).
        task: the agent task that runs it; id_key: the payload field naming the job (``profile_id``).
        report_task: where its reports go (with ``contract.JobStatus`` statuses).
        empty: the fields of a report that measured nothing.
        budget: the payload's time budget, seconds.
        run: runs the job on the host agent with ``(agent, payload, send, should_stop)``, where ``send``
            reports progress; returns the final report. Never raises, as ``HostAgent.profile``.
    """

    kind: str
    task: AgentTask
    id_key: str
    report_task: OrchestratorTask
    empty: dict
    budget: Callable[[dict], float]
    run: Callable[[HostAgent, dict, Callable[[dict], None], Callable[[], str | None]], dict]


def _at_most_once_a_second(send: Callable[[dict], None]) -> Callable[[dict, bool], None]:
    """``send`` throttled to one report a second; a call with ``now=True`` always goes through."""
    last_sent = [0.0]

    def throttled(progress: dict, now: bool = False) -> None:
        if now or time.monotonic() - last_sent[0] >= 1.0:
            last_sent[0] = time.monotonic()
            send(progress)

    return throttled


def _run_profile(agent: HostAgent, payload: dict, send: Callable[[dict], None], should_stop) -> dict:
    throttled = _at_most_once_a_second(send)
    return agent.profile(payload, should_stop=should_stop, progress=lambda rows, step: throttled(
        {"status": contract.JobStatus.RUNNING, "rows": list(rows), "step": step}, now=not rows))


def _run_replay(agent: HostAgent, payload: dict, send: Callable[[dict], None], should_stop) -> dict:
    throttled = _at_most_once_a_second(send)
    return agent.replay(payload, should_stop=should_stop, progress=throttled)


PROFILE = HostJob(kind="profile", task=AgentTask.PROFILE, id_key="profile_id",
                  report_task=OrchestratorTask.PROFILE_REPORT, empty={"rows": []},
                  budget=lambda payload: float(Sweep.from_dict(payload["sweep"]).time_budget_s), run=_run_profile)
REPLAY = HostJob(kind="replay", task=AgentTask.REPLAY, id_key="replay_id",
                 report_task=OrchestratorTask.REPLAY_REPORT,
                 empty={"done": 0, "total": 0, "summary": {}},
                 budget=lambda payload: float(payload.get("time_budget_s") or 3600), run=_run_replay)


def _run_host_job(task: Task, payload: dict, job: HostJob) -> None:
    """Run one whole-host job: refuse a payload this agent must not act on, report a job stopped before it
    started as cancelled, take the host's lock of its kind (retried every ``LOCK_RETRY_SECONDS`` up to
    ``lock_wait``, then failed), run it while reporting the host in, and report the outcome. A stop the
    orchestrator asks for (``profiling.control``) is seen within a quarter of a second; an unforeseen
    error is reported as the job's failure, never swallowed."""
    job_id = int(payload[job.id_key])

    def send(progress: dict) -> None:
        report(job.report_task, job_id, progress)

    def fail(message: str) -> None:
        send({"status": contract.JobStatus.FAILED, **job.empty, "message": message})

    if refusal := _refused(payload):
        logger.error("%s %s refused: %s", job.kind, job_id, refusal)
        fail(refusal)
        return
    client = broker()
    if control.stop_requested(client, job_id, job.kind):
        send({"status": contract.JobStatus.CANCELLED, **job.empty, "message": "cancelled before it started"})
        return
    lock = host_job_lock(job.kind, payload["host"], job.budget(payload))
    if not _lock_or_retry(task, lock, give_up=lambda: fail(
            f"another {job.kind} held this host for {settings().lock_wait:g} s")):
        return

    def should_stop() -> str | None:
        try:
            return f"the {job.kind} was cancelled" if control.stop_requested(client, job_id, job.kind) else None
        except redis.exceptions.RedisError:
            return None  # the broker is away for a moment; the time budget still bounds the run

    try:
        with working_on(job.task, payload, task.request.id), heartbeats_meanwhile(payload):
            result = job.run(host_agent(payload.get("runtime")), payload, send, should_stop)
    except Exception as exc:  # the orchestrator must hear of every failure
        logger.exception("%s %s failed", job.kind, job_id)
        result = {"status": contract.JobStatus.FAILED, **job.empty, "message": f"host agent error: {exc}"}
    finally:
        release(lock, f"before the {job.kind} ended")
    send(result)


@app.task(name=AgentTask.PROFILE.value, acks_late=True, bind=True, max_retries=None)
def profile_version_on_host(self, payload: dict) -> None:
    """Measure a model version's performance card on this host (``modelyard_agent.profiling``), under the
    host's profile lock (``_run_host_job``). Reports ``running`` with the rows measured so far after each
    step (at most once a second), then the outcome (``contract.ProfileReport``)."""
    _run_host_job(self, payload, PROFILE)


@app.task(name=AgentTask.REPLAY.value, acks_late=True, bind=True, max_retries=None)
def replay_version_on_host(self, payload: dict) -> None:
    """Replay a model's captured requests against a candidate version on this host (``modelyard_agent.replay``),
    under the host's replay lock (``_run_host_job``). Reports ``running`` with the summary so far at most once
    a second, then the outcome (``contract.ReplayReport``). The candidate's copy is always removed."""
    _run_host_job(self, payload, REPLAY)
