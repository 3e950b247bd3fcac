"""Stopping a profile: a flag in the broker's Redis that the orchestrator sets and the agent polls.

The agent has no database to ask whether a profile was cancelled. The orchestrator sets
``modelyard:profile-stop:<id>``; the agent checks it before it starts and about every quarter of a
second while it measures (``profiling.perf_analyzer.run``), stops the load generator, removes its
copy and reports the profile ``cancelled``. The flag expires after ``STOP_SECONDS``.
"""

import redis

STOP_SECONDS = 7 * 24 * 3600


def _key(profile_id: int) -> str:
    return f"modelyard:profile-stop:{int(profile_id)}"


def request_stop(broker: redis.Redis, profile_id: int) -> None:
    """Ask the agent running (or about to run) profile ``profile_id`` to stop.

    Raises:
        redis.exceptions.RedisError: the broker cannot be reached.
    """
    broker.set(_key(profile_id), "1", ex=STOP_SECONDS)


def stop_requested(broker: redis.Redis, profile_id: int) -> bool:
    """Whether a stop was asked for profile ``profile_id``.

    Raises:
        redis.exceptions.RedisError: the broker cannot be reached.
    """
    return bool(broker.exists(_key(profile_id)))
