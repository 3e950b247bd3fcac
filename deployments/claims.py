"""Who gets a deployment target first: the host agent that starts it, or a cancel that stops it.

A target dispatched to a host's queue can wait there behind other work. Cancelling its rollout must
then keep the agent from ever starting it, and the agent has no database to ask. Both sides instead
race for one key in the broker's Redis with ``SET NX``: the first to set it decides, and the other
reads the winner. A cancel that comes second leaves the target to finish (it had started); an agent
that comes second reports the target cancelled and touches nothing on its host.

Keys expire after ``CLAIM_SECONDS``, far longer than a target may wait in a queue
(``MODELYARD_DISPATCH_TIMEOUT``, after which the reconciler fails it anyway).
"""

import redis

STARTED = "started"
CANCELLED = "cancelled"
CLAIM_SECONDS = 7 * 24 * 3600


def claim_key(target) -> str:
    """The claim's name for one dispatch of a DeploymentTarget: its id and dispatch time in
    microseconds, so no claim outlives its target (ids restart with a new database)."""
    return f"{target.pk}:{int(target.dispatched_at.timestamp() * 1_000_000)}"


def _broker() -> redis.Redis:
    """The Redis that carries the tasks: the one both the orchestrator and the host agents reach."""
    from modelyard.celery import app

    return redis.Redis.from_url(app.conf.broker_url)


def _key(claim: str) -> str:
    return f"modelyard:target-claim:{claim}"


def claim_target(key: str, claim: str) -> str:
    """Set the target's claim to ``claim`` unless one is set already; return the claim that holds.

    Args:
        key: ``claim_key(target)``, which the agent finds in its payload as ``claim``.
        claim: ``STARTED`` (the host agent, before it acts) or ``CANCELLED`` (a cancel, before it
            marks the target cancelled).

    Returns:
        ``claim`` when it won, else the claim set before it. Claiming again what one holds
        already returns it (a redelivered agent task carries on).

    Raises:
        redis.exceptions.RedisError: the broker cannot be reached (the caller's task retries).
    """
    client = _broker()
    if client.set(_key(key), claim, nx=True, ex=CLAIM_SECONDS):
        return claim
    held = client.get(_key(key))
    return held.decode() if held is not None else claim


def target_claim(key: str) -> str | None:
    """The claim set under ``key``, or None while nobody has claimed it (reads only)."""
    held = _broker().get(_key(key))
    return held.decode() if held is not None else None
