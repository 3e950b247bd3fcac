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
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from importlib import metadata

import redis
from celery import Celery
from celery.signals import worker_ready

from modelyard_agent import contract
from modelyard_agent.claims import CANCELLED, STARTED, SUPERSEDED, claim_target, target_claim
from modelyard_agent.config import current as settings
from modelyard_agent.contract import AgentTask, OrchestratorTask, TargetState, UnsupportedProtocol
from modelyard_agent.host_agents import host_agent, load_deadline
from modelyard_agent.runtimes.base import ServingRuntimeError

logger = logging.getLogger(__name__)

LOCK_RETRY_SECONDS = 5
# A report must outlive a broker restart or failover: publishing it is retried for about two
# minutes (0, 0.5, 1, … then every 3 s) before the task gives up.
REPORT_RETRY_POLICY = {"max_retries": 45, "interval_start": 0, "interval_step": 0.5, "interval_max": 3}

# Not the process's current app: a process that also runs the orchestrator's app (its tests) keeps
# that one as the app its shared tasks bind to.
app = Celery("modelyard_agent", set_as_current=False)
app.conf.update(
    broker_url=settings().broker_url,
    task_ignore_result=True,
    task_serializer="json",
    accept_content=["json"],
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    task_time_limit=settings().task_time_limit,
    # A message a killed agent took but never acknowledged goes back to the queue after this many
    # seconds; longer than any task may run, so a live task is never handed out twice.
    broker_transport_options={"visibility_timeout": settings().visibility_timeout},
    broker_connection_retry_on_startup=True,
)


def agent_version() -> str:
    """The installed ``modelyard-agent`` distribution's version, or ``unknown`` when it is not installed."""
    try:
        return metadata.version("modelyard-agent")
    except metadata.PackageNotFoundError:
        return "unknown"


def _broker() -> redis.Redis:
    """A client of the broker's Redis (claims, locks and the working set live there), one connection
    pool per broker URL and process: a task asks it several times."""
    return _client(app.conf.broker_url)


@cache
def _client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url)  # redis-py's pool reconnects in a forked worker process


def _report(target_id: int, state: str, message: str = "", details: dict | None = None) -> None:
    app.send_task(OrchestratorTask.TARGET_REPORT.value, args=[target_id, state, message, details or {}],
                  queue=contract.ORCHESTRATOR_QUEUE, retry=True, retry_policy=REPORT_RETRY_POLICY)


def host_model_lock(host: str, model: str, load_deadline: float | None = None) -> redis.lock.Lock:
    """The per-(host, model) lock: one load, swap or unload of a model on a host at a time.

    Held in the broker's Redis, so it spans every agent process of the host; it expires after
    three load deadlines (the host's, when longer than the agent's default), so a SIGKILLed holder
    cannot block the model forever. Other models on the host take locks of their own, so they
    never wait for this one.
    """
    seconds = max(float(load_deadline or 0), settings().load_deadline)
    return _broker().lock(_lock_key(host, model), timeout=3 * seconds)


def _lock_key(host: str, model: str) -> str:
    return f"modelyard:lock:{host}:{model}"


def _working_key(host: str) -> str:
    return f"modelyard:agent:{host}:working"


def _started_key(host: str) -> str:
    return f"modelyard:agent:{host}:started"


@contextmanager
def working_on(task: str, payload: dict, task_id: str | None) -> Iterator[None]:
    """Record in the broker's Redis that this agent works on ``payload`` for the block's length.

    Heartbeats report the set (``AgentInfo.working_on``); an entry a SIGKILLed process left behind
    is dropped when the agent starts again (``_forget_dropped_work``). Broker errors are logged
    and never fail the work itself.
    """
    host, field = payload.get("host", ""), task_id or f"{task}:{payload.get('model')}"
    entry = {"task": task, "model": payload.get("model"), "since": time.time()}
    for key in ("target_id", "profile_id", "replay_id"):
        if key in payload:
            entry[key] = payload[key]
    try:
        _broker().hset(_working_key(host), field, json.dumps(entry))
    except redis.exceptions.RedisError as exc:
        logger.warning("could not record work on %s: %s", entry["model"], exc)
    try:
        yield
    finally:
        try:
            _broker().hdel(_working_key(host), field)
        except redis.exceptions.RedisError as exc:
            logger.warning("could not clear the record of work on %s: %s", entry["model"], exc)


@worker_ready.connect
def _forget_dropped_work(**_) -> None:
    """A starting agent holds no work yet: what the set lists was dropped by a killed predecessor.

    Releases the (host, model) locks that work held (each under its task id), clears the set and
    records the start time, which heartbeats report (``AgentInfo.started_at``): the orchestrator
    sends again a target dispatched before then that this agent does not work on. One agent runs
    per host; a second one started beside it would take the first one's work for dropped.
    """
    host = settings().host
    if not host:
        return
    client = _broker()
    for task_id, raw in client.hgetall(_working_key(host)).items():
        model = json.loads(raw).get("model")
        lock = _lock_key(host, model)
        if client.get(lock) == task_id:
            client.delete(lock)
            logger.warning("released %s, held by task %s of the agent before this one", lock, task_id.decode())
    client.delete(_working_key(host))
    client.set(_started_key(host), f"{time.time():.6f}")


def agent_info(host: str) -> dict:
    """This agent's ``contract.AgentInfo``: version, protocol, start time (unix seconds, None when
    unknown) and the work under way (oldest first)."""
    client = _broker()
    try:
        rows = [json.loads(value) for value in client.hvals(_working_key(host))]
        started = client.get(_started_key(host))
    except redis.exceptions.RedisError as exc:
        logger.warning("could not read what the agent works on: %s", exc)
        rows, started = [], None
    return {"version": agent_version(), "protocol": contract.PROTOCOL_VERSION,
            "started_at": float(started) if started else None,
            "working_on": sorted(rows, key=lambda row: row.get("since", 0))}


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


def _release(lock: redis.lock.Lock, during: str) -> None:
    """Release the (host, model) lock; one that expired, or a broker that cannot be reached (the
    lock then expires by itself), is only logged, so the work's outcome is still reported."""
    try:
        lock.release()
    except redis.exceptions.LockError:
        logger.warning("%s expired %s", lock.name, during)
    except redis.exceptions.RedisError as exc:
        logger.warning("could not release %s %s (%s); it expires by itself", lock.name, during, exc)


def _acquire_or_take_over(lock: redis.lock.Lock, task_id: str | None) -> bool:
    """Take the lock, or take it over from an earlier delivery of this very task.

    A worker killed mid-deployment leaves the lock held under its task id until it expires; the
    broker hands the unacknowledged message out again with the same id, and that redelivery may
    carry on at once instead of waiting out the lock (each step is idempotent).
    """
    token = (task_id or "").encode() or None
    if lock.acquire(blocking=False, token=token):
        return True
    if token and lock.redis.get(lock.name) == token:
        lock.local.token = token
        lock.reacquire()
        logger.warning("took over %s from an earlier delivery of task %s", lock.name, task_id)
        return True
    return False


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
    if _stood_down(target_id, target_claim(_broker(), claim)):
        return
    lock = host_model_lock(payload.get("host", ""), payload["model"], payload.get("load_deadline"))
    if not _acquire_or_take_over(lock, self.request.id):
        lock_wait = settings().lock_wait
        if self.request.retries * LOCK_RETRY_SECONDS >= lock_wait:
            _report(target_id, TargetState.FAILED,
                    f"{payload['model']} stayed locked on this host by another deployment for {lock_wait:g} s")
            return
        raise self.retry(countdown=LOCK_RETRY_SECONDS)
    held = claim_target(_broker(), claim, STARTED)
    if held != STARTED:
        _release(lock, f"for a {held} target")
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
        _release(lock, "before the deployment ended")
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
    report = host_agent(settings().runtime).heartbeat(request)  # this host's runtime, whatever was registered
    report["agent"] = agent_info(request["host"])
    report["errors"] = [*errors, *report.get("errors", [])]
    if refusal := _refused(request):
        report["errors"] = [refusal, *report.get("errors", [])]
    app.send_task(OrchestratorTask.HOST_HEARTBEAT.value, args=[request["host"], report],
                  queue=contract.ORCHESTRATOR_QUEUE, retry=True, retry_policy=REPORT_RETRY_POLICY)


@app.task(name=AgentTask.UNLOAD.value, acks_late=True, bind=True, max_retries=None)
def unload_model_on_host(self, payload: dict) -> None:
    """Stop serving a model (Triton unload, or BentoML's nginx route and processes) under the
    (host, model) lock and wait until it is gone; a payload of a newer protocol is refused (logged)."""
    if refusal := _refused(payload):
        logger.error("unload of %s refused: %s", payload.get("model"), refusal)
        return
    lock = host_model_lock(payload["host"], payload["model"])
    if not _acquire_or_take_over(lock, self.request.id):
        raise self.retry(countdown=LOCK_RETRY_SECONDS)
    try:
        with working_on(AgentTask.UNLOAD, payload, self.request.id), heartbeats_meanwhile(payload):
            host_agent(payload.get("runtime")).unload(payload)
    except ServingRuntimeError as exc:
        logger.error("unloading %s from %s failed: %s", payload["model"], payload["host"], exc.message)
        if exc.retryable and self.request.retries < 5:
            raise self.retry(countdown=LOCK_RETRY_SECONDS) from exc
    finally:
        _release(lock, "before the unload ended")


@app.task(name=AgentTask.ROUTE.value, acks_late=True, bind=True, max_retries=None)
def route_model_on_host(self, payload: dict) -> None:
    """Set a model's canary split on the host's gateway (``contract.RoutePayload``) under the (host, model)
    lock, then report the host in, so the orchestrator sees the route the gateway holds. A refused
    route is logged and shows in that heartbeat's errors; a gateway that does not answer is retried."""
    if refusal := _refused(payload):
        logger.error("route of %s refused: %s", payload.get("model"), refusal)
        return
    lock = host_model_lock(payload["host"], payload["model"])
    if not _acquire_or_take_over(lock, self.request.id):
        raise self.retry(countdown=LOCK_RETRY_SECONDS)
    errors = []
    try:
        with working_on(AgentTask.ROUTE, payload, self.request.id):
            host_agent(payload.get("runtime")).route(payload)
    except ServingRuntimeError as exc:
        logger.error("route of %s on %s failed: %s", payload["model"], payload["host"], exc.message)
        if exc.retryable and self.request.retries < 5:
            raise self.retry(countdown=LOCK_RETRY_SECONDS) from exc
        errors.append(f"route of {payload['model']}: {exc.message}")
    finally:
        _release(lock, "before the route was set")
    _send_heartbeat({key: payload.get(key, "") for key in ("host", "inference_url", "metrics_url", "runtime")},
                    errors=errors)


@app.task(name=AgentTask.CHECK_ENSEMBLE.value, acks_late=True, bind=True, max_retries=None)
def check_ensemble_on_host(self, payload: dict) -> bool:
    """Make sure an ensemble version is READY after one of its composing models changed.

    Reloads it with its config when it is not (under the (host, model) lock). Returns whether it
    was READY, or became so; False for a payload of a newer protocol (logged).
    """
    from modelyard_agent.triton_host import ensure_version_ready

    if refusal := _refused(payload):
        logger.error("ensemble check of %s refused: %s", payload.get("model"), refusal)
        return False
    lock = host_model_lock(payload["host"], payload["model"], payload.get("load_deadline"))
    if not _acquire_or_take_over(lock, self.request.id):
        raise self.retry(countdown=LOCK_RETRY_SECONDS)
    try:
        with working_on(AgentTask.CHECK_ENSEMBLE, payload, self.request.id), heartbeats_meanwhile(payload):
            return ensure_version_ready(payload, load_timeout=load_deadline(payload),
                                        grpc_url=settings().triton_grpc_url)
    finally:
        _release(lock, "during the ensemble check")


@app.task(name=AgentTask.INFER.value, acks_late=False)
def infer_on_host(payload: dict) -> None:
    """Run one "Try it" request on this host's runtime and push the ``contract.InferReply`` onto the
    payload's reply list. Not acknowledged late: a request whose agent died is not run twice (the
    web tier has stopped waiting by then)."""
    from modelyard_agent.inference import InferenceRefused, infer

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
    client = _broker()
    client.rpush(payload["reply_to"], json.dumps(reply))
    client.expire(payload["reply_to"], contract.REPLY_SECONDS)


def _profile_lock(host: str, budget_seconds: float) -> redis.lock.Lock:
    """The host's profile lock: one profile at a time on a host (each load copy and load generator
    competes with serving for the host's devices). Expires after twice the profile's budget."""
    return _broker().lock(f"modelyard:profile-lock:{host}", timeout=2 * budget_seconds + 600)


def _report_profile(profile_id: int, report: dict) -> None:
    app.send_task(OrchestratorTask.PROFILE_REPORT.value, args=[profile_id, report],
                  queue=contract.ORCHESTRATOR_QUEUE, retry=True, retry_policy=REPORT_RETRY_POLICY)


@app.task(name=AgentTask.PROFILE.value, acks_late=True, bind=True, max_retries=None)
def profile_version_on_host(self, payload: dict) -> None:
    """Measure a model version's performance card on this host (``modelyard_agent.profiling``).

    Runs under the host's profile lock (a second profile waits for it, retried every
    ``LOCK_RETRY_SECONDS`` up to ``lock_wait``). Reports ``running`` with the rows measured so far
    after each step (at most once a second), then the outcome. A stop requested by the
    orchestrator (``profiling.control``) is seen within a quarter of a second and reported
    ``cancelled``; a profile stopped before it started reports ``cancelled`` and touches nothing.
    """
    from modelyard_agent.profiling import control
    from modelyard_agent.profiling.sweep import Sweep

    profile_id = int(payload["profile_id"])
    if refusal := _refused(payload):
        logger.error("profile %s refused: %s", profile_id, refusal)
        _report_profile(profile_id, {"status": contract.ProfileStatus.FAILED, "rows": [], "message": refusal})
        return
    client = _broker()
    if control.stop_requested(client, profile_id):
        _report_profile(profile_id, {"status": contract.ProfileStatus.CANCELLED, "rows": [],
                                     "message": "cancelled before it started"})
        return
    budget = float(Sweep.from_dict(payload["sweep"]).time_budget_s)
    lock = _profile_lock(payload["host"], budget)
    if not _acquire_or_take_over(lock, self.request.id):
        if self.request.retries * LOCK_RETRY_SECONDS >= settings().lock_wait:
            _report_profile(profile_id, {"status": contract.ProfileStatus.FAILED, "rows": [], "message": (
                f"another profile held this host for {settings().lock_wait:g} s")})
            return
        raise self.retry(countdown=LOCK_RETRY_SECONDS)
    last_sent = [0.0]

    def progress(rows: list[dict], step: str) -> None:
        if time.monotonic() - last_sent[0] >= 1.0 or not rows:
            last_sent[0] = time.monotonic()
            _report_profile(profile_id, {"status": contract.ProfileStatus.RUNNING, "rows": list(rows), "step": step})

    def should_stop() -> str | None:
        try:
            return "the profile was cancelled" if control.stop_requested(client, profile_id) else None
        except redis.exceptions.RedisError:
            return None  # the broker is away for a moment; the deadline still bounds the run

    try:
        with working_on(AgentTask.PROFILE, payload, self.request.id), heartbeats_meanwhile(payload):
            result = host_agent(payload.get("runtime")).profile(payload, progress=progress, should_stop=should_stop)
    except Exception as exc:  # the orchestrator must hear of every failure
        logger.exception("profile %s failed", profile_id)
        result = {"status": contract.ProfileStatus.FAILED, "rows": [], "message": f"host agent error: {exc}"}
    finally:
        _release(lock, "before the profile ended")
    _report_profile(profile_id, result)


def _replay_lock(host: str, budget_seconds: float) -> redis.lock.Lock:
    """The host's replay lock: one replay at a time on a host (each sends requests to the serving version).
    Expires after twice the replay's budget."""
    return _broker().lock(f"modelyard:replay-lock:{host}", timeout=2 * budget_seconds + 600)


def _report_replay(replay_id: int, report: dict) -> None:
    app.send_task(OrchestratorTask.REPLAY_REPORT.value, args=[replay_id, report],
                  queue=contract.ORCHESTRATOR_QUEUE, retry=True, retry_policy=REPORT_RETRY_POLICY)


@app.task(name=AgentTask.REPLAY.value, acks_late=True, bind=True, max_retries=None)
def replay_version_on_host(self, payload: dict) -> None:
    """Replay a model's captured requests against a candidate version on this host (``modelyard_agent.replay``).

    Runs under the host's replay lock (a second replay waits for it, retried every ``LOCK_RETRY_SECONDS``
    up to ``lock_wait``). Reports ``running`` with the summary so far at most once a second, then the
    outcome (``contract.ReplayReport``). A stop requested by the orchestrator (``profiling.control``,
    kind ``replay``) is seen within a quarter of a second and reported ``cancelled``; a replay stopped
    before it started reports ``cancelled`` and touches nothing. The candidate's copy is always removed.
    """
    from modelyard_agent.profiling import control

    replay_id = int(payload["replay_id"])
    empty = {"done": 0, "total": 0, "summary": {}}
    if refusal := _refused(payload):
        logger.error("replay %s refused: %s", replay_id, refusal)
        _report_replay(replay_id, {"status": contract.ReplayStatus.FAILED, **empty, "message": refusal})
        return
    client = _broker()
    if control.stop_requested(client, replay_id, "replay"):
        _report_replay(replay_id, {"status": contract.ReplayStatus.CANCELLED, **empty,
                                   "message": "cancelled before it started"})
        return
    lock = _replay_lock(payload["host"], float(payload.get("time_budget_s") or 3600))
    if not _acquire_or_take_over(lock, self.request.id):
        if self.request.retries * LOCK_RETRY_SECONDS >= settings().lock_wait:
            _report_replay(replay_id, {"status": contract.ReplayStatus.FAILED, **empty, "message": (
                f"another replay held this host for {settings().lock_wait:g} s")})
            return
        raise self.retry(countdown=LOCK_RETRY_SECONDS)
    last_sent = [0.0]

    def progress(report: dict) -> None:
        if time.monotonic() - last_sent[0] >= 1.0:
            last_sent[0] = time.monotonic()
            _report_replay(replay_id, report)

    def should_stop() -> str | None:
        try:
            return "the replay was cancelled" if control.stop_requested(client, replay_id, "replay") else None
        except redis.exceptions.RedisError:
            return None  # the broker is away for a moment; the time budget still bounds the run

    try:
        with working_on(AgentTask.REPLAY, payload, self.request.id), heartbeats_meanwhile(payload):
            result = host_agent(payload.get("runtime")).replay(payload, progress=progress, should_stop=should_stop)
    except Exception as exc:  # the orchestrator must hear of every failure
        logger.exception("replay %s failed", replay_id)
        result = {"status": contract.ReplayStatus.FAILED, **empty, "message": f"host agent error: {exc}"}
    finally:
        _release(lock, "before the replay ended")
    _report_replay(replay_id, result)
