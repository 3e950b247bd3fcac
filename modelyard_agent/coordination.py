"""What the host agent's processes coordinate through the broker's Redis.

- the per-(host, model) lock (``host_model_lock``): one load, swap or unload of a model on a host
  at a time, across every agent process of the host; and the per-host job locks
  (``host_job_lock``): one profile and one replay at a time;
- the host's "working on" set (``working_on``, read by ``agent_info``), which heartbeats report so
  the orchestrator can tell work a killed agent dropped from work still under way;
- the agent's start time, recorded when its worker is ready (``_forget_dropped_work``).

Every key is under ``modelyard:lock:``, ``modelyard:agent:``, ``modelyard:profile-lock:`` or
``modelyard:replay-lock:`` (``contract.host_broker_patterns`` lists them for a deleted host).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from importlib import metadata

import redis
from celery.signals import worker_ready

from modelyard_agent import contract
from modelyard_agent.app import app
from modelyard_agent.config import current as settings

logger = logging.getLogger(__name__)

# The locks of whole-host jobs, by job kind: one of each kind runs on a host at a time.
JOB_LOCK_PREFIXES = {"profile": "modelyard:profile-lock:", "replay": "modelyard:replay-lock:"}


def agent_version() -> str:
    """The installed ``modelyard-agent`` distribution's version, or ``unknown`` when it is not installed."""
    try:
        return metadata.version("modelyard-agent")
    except metadata.PackageNotFoundError:
        return "unknown"


def broker() -> redis.Redis:
    """A client of the broker's Redis (claims, locks and the working set live there), one connection
    pool per broker URL and process: a task asks it several times."""
    return _client(app.conf.broker_url)


# Seconds a broker call may take to connect and to answer: a Redis that hangs (rather than refusing) fails the
# call, so a lock taken around an on-demand load fails that load, not the loader (redis-py before 6 waits forever).
BROKER_CONNECT_TIMEOUT_S = 5.0
BROKER_SOCKET_TIMEOUT_S = 10.0


@cache
def _client(url: str) -> redis.Redis:
    # redis-py's pool reconnects in a forked worker process
    return redis.Redis.from_url(url, socket_connect_timeout=BROKER_CONNECT_TIMEOUT_S,
                                socket_timeout=BROKER_SOCKET_TIMEOUT_S)


def host_model_lock(host: str, model: str, load_deadline: float | None = None) -> redis.lock.Lock:
    """The per-(host, model) lock: one load, swap or unload of a model on a host at a time.

    Held in the broker's Redis, so it spans every agent process of the host; it expires after
    three load deadlines (the host's, when longer than the agent's default), so a SIGKILLed holder
    cannot block the model forever. Other models on the host take locks of their own, so they
    never wait for this one.
    """
    seconds = max(float(load_deadline or 0), settings().load_deadline)
    return broker().lock(lock_key(host, model), timeout=3 * seconds)


def lock_key(host: str, model: str) -> str:
    """The broker key of the (host, model) lock."""
    return f"modelyard:lock:{host}:{model}"


def working_key(host: str) -> str:
    """The broker hash of the host's work under way: task id -> JSON entry (``working_on``)."""
    return f"modelyard:agent:{host}:working"


def started_key(host: str) -> str:
    """The broker key holding the agent's start time (unix seconds, as text)."""
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
        broker().hset(working_key(host), field, json.dumps(entry))
    except redis.exceptions.RedisError as exc:
        logger.warning("could not record work on %s: %s", entry["model"], exc)
    try:
        yield
    finally:
        try:
            broker().hdel(working_key(host), field)
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
    client = broker()
    for task_id, raw in client.hgetall(working_key(host)).items():
        model = json.loads(raw).get("model")
        lock = lock_key(host, model)
        if client.get(lock) == task_id:
            client.delete(lock)
            logger.warning("released %s, held by task %s of the agent before this one", lock, task_id.decode())
    client.delete(working_key(host))
    client.set(started_key(host), f"{time.time():.6f}")


def agent_info(host: str) -> dict:
    """This agent's ``contract.AgentInfo``: version, protocol, start time (unix seconds, None when
    unknown) and the work under way (oldest first)."""
    client = broker()
    try:
        rows = [json.loads(value) for value in client.hvals(working_key(host))]
        started = client.get(started_key(host))
    except redis.exceptions.RedisError as exc:
        logger.warning("could not read what the agent works on: %s", exc)
        rows, started = [], None
    return {"version": agent_version(), "protocol": contract.PROTOCOL_VERSION,
            "started_at": float(started) if started else None,
            "working_on": sorted(rows, key=lambda row: row.get("since", 0))}


def release(lock: redis.lock.Lock, during: str) -> None:
    """Release the (host, model) lock; one that expired, or a broker that cannot be reached (the
    lock then expires by itself), is only logged, so the work's outcome is still reported."""
    try:
        lock.release()
    except redis.exceptions.LockError:
        logger.warning("%s expired %s", lock.name, during)
    except redis.exceptions.RedisError as exc:
        logger.warning("could not release %s %s (%s); it expires by itself", lock.name, during, exc)


def acquire_or_take_over(lock: redis.lock.Lock, task_id: str | None) -> bool:
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


def host_job_lock(kind: str, host: str, budget_seconds: float) -> redis.lock.Lock:
    """The host's lock for a whole-host job of ``kind`` (``"profile"`` or ``"replay"``): one at a time on a
    host, since each load copy and load generator competes with serving for the host's devices. Expires
    after twice the job's budget (seconds) plus ten minutes, so a SIGKILLed holder cannot block the host.

    Raises:
        KeyError: an unknown kind.
    """
    return broker().lock(f"{JOB_LOCK_PREFIXES[kind]}{host}", timeout=2 * budget_seconds + 600)
