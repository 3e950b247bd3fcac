"""Stopping a profile (or a replay, ``kind="replay"``): a flag in the broker's Redis that the orchestrator
sets and the agent polls.

The agent has no database to ask whether a profile was cancelled. The orchestrator sets
``modelyard:profile-stop:<id>``; the agent checks it before it starts and about every quarter of a
second while it measures (``profiling.perf_analyzer.run``), stops the load generator, removes its
copy and reports the profile ``cancelled``. The flag expires after ``STOP_SECONDS``.
"""

import redis

STOP_SECONDS = 7 * 24 * 3600


KINDS = ("profile", "replay")


def _key(task_id: int, kind: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"no stop flag for {kind!r}")
    return f"modelyard:{kind}-stop:{int(task_id)}"


def request_stop(broker: redis.Redis, profile_id: int, kind: str = "profile") -> None:
    """Ask the agent running (or about to run) profile (or replay) ``profile_id`` to stop.

    Raises:
        redis.exceptions.RedisError: the broker cannot be reached.
    """
    broker.set(_key(profile_id, kind), "1", ex=STOP_SECONDS)


def stop_requested(broker: redis.Redis, profile_id: int, kind: str = "profile") -> bool:
    """Whether a stop was asked for profile (or replay) ``profile_id``.

    Raises:
        redis.exceptions.RedisError: the broker cannot be reached.
    """
    return bool(broker.exists(_key(profile_id, kind)))
