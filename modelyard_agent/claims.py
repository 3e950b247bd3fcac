"""Who gets a deployment target first: the host agent that starts it, or a cancel that stops it.

A target dispatched to a host's queue can wait there behind other work. Cancelling its rollout must
then keep the agent from ever starting it, and the agent has no database to ask. Both sides instead
race for one key in the broker's Redis with ``SET NX``: the first to set it decides, and the other
reads the winner. A cancel that comes second leaves the target to finish (it had started); an agent
that comes second reports the target cancelled and touches nothing on its host.

Keys expire after ``CLAIM_SECONDS``, far longer than a target may wait in a queue
(``MODELYARD_DISPATCH_TIMEOUT``, after which the reconciler fails it anyway).
"""

from datetime import datetime

import redis

STARTED = "started"
CANCELLED = "cancelled"
# The orchestrator sent the target again under a new claim (its agent was restarted and dropped
# it): a message of the old dispatch that the broker hands out again must not act.
SUPERSEDED = "superseded"
CLAIM_SECONDS = 7 * 24 * 3600


def claim_key(target_id: int, dispatched_at: datetime) -> str:
    """The claim's name for one dispatch of a deployment target: its id and dispatch time in
    microseconds, so no claim outlives its target (ids restart with a new database)."""
    return f"{target_id}:{int(dispatched_at.timestamp() * 1_000_000)}"


def _key(claim: str) -> str:
    return f"modelyard:target-claim:{claim}"


def claim_target(broker: redis.Redis, key: str, claim: str) -> str:
    """Set the target's claim to ``claim`` unless one is set already; return the claim that holds.

    Args:
        broker: the Redis that carries the tasks, which the orchestrator and the agents both reach.
        key: ``claim_key(target)``, which the agent finds in its payload as ``claim``.
        claim: ``STARTED`` (the host agent, before it acts) or ``CANCELLED`` (a cancel, before it
            marks the target cancelled).

    Returns:
        ``claim`` when it won, else the claim set before it. Claiming again what one holds
        already returns it (a redelivered agent task carries on).

    Raises:
        redis.exceptions.RedisError: the broker cannot be reached (the caller's task retries).
    """
    if broker.set(_key(key), claim, nx=True, ex=CLAIM_SECONDS):
        return claim
    held = broker.get(_key(key))
    return held.decode() if held is not None else claim


def target_claim(broker: redis.Redis, key: str) -> str | None:
    """The claim set under ``key`` in ``broker``, or None while nobody has claimed it (reads only)."""
    held = broker.get(_key(key))
    return held.decode() if held is not None else None


def supersede(broker: redis.Redis, key: str) -> None:
    """Mark the claim ``key`` superseded, whatever it held: its dispatch was sent again under a new
    claim, and an agent that gets the old message reports nothing and touches nothing.

    Raises:
        redis.exceptions.RedisError: the broker cannot be reached.
    """
    broker.set(_key(key), SUPERSEDED, ex=CLAIM_SECONDS)
