"""Whether a dispatched deployment target reached its host's agent, read from the broker's Redis: the claim
the agent sets when it starts the target (``modelyard_agent.claims``), its message waiting in the host's
queue, or a message of it that an agent's worker took and has not acknowledged (kombu's ``unacked`` hash,
where the messages a worker prefetched wait too).

An orchestrator worker killed after a rollout dispatched a target (``dispatched_at`` committed) and before
``tasks.dispatch_target`` sent it leaves the target pending with nothing on its way to the host, and that
task comes back only after the broker's visibility timeout (40 minutes by default). The reconciler finds
such targets (``unsent_targets``) and sends each again under a new claim (``tasks.resend_target``);
``dispatch_target`` asks ``reached_agent`` before it sends, so a dispatch handed out twice (its worker died
after the send and before its acknowledgement) never sends a target twice.
"""

import base64
import json
import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from deployments.choices import TargetState
from deployments.models import DeploymentTarget
from modelyard.celery import broker
from modelyard_agent.claims import claim_key, target_claim
from modelyard_agent.contract import host_queue

logger = logging.getLogger(__name__)

# kombu's Redis transport keeps each message a worker took and has not acknowledged here:
# {delivery tag: JSON [message, exchange, routing key]}.
UNACKED_KEY = "unacked"


def _claim_of(message: object) -> str | None:
    """The ``claim`` in the payload of one kombu message (a dict as kombu writes it to Redis), if any."""
    try:
        args = json.loads(base64.b64decode(message["body"]))[0]
        claim = args[0].get("claim")
    except (KeyError, IndexError, TypeError, ValueError, AttributeError):
        return None
    return claim if isinstance(claim, str) else None


def claims_on_the_way(host_name: str) -> set[str]:
    """The claims of the agent tasks waiting in ``host_name``'s queue or taken by any agent's worker and not
    acknowledged yet (one read of the queue and one of the ``unacked`` hash).

    Raises:
        redis.exceptions.RedisError: the broker cannot be reached.
    """
    client = broker()
    claims = set()
    for raw in client.lrange(host_queue(host_name), 0, -1):
        try:
            claims.add(_claim_of(json.loads(raw)))
        except ValueError:
            continue
    for raw in client.hvals(UNACKED_KEY):
        try:
            claims.add(_claim_of(json.loads(raw)[0]))
        except (ValueError, IndexError, KeyError, TypeError):
            continue
    claims.discard(None)
    return claims


def reached_agent(target: DeploymentTarget, on_the_way: set[str] | None = None) -> bool:
    """True when ``target``'s current dispatch reached its host's agent: the agent (or a cancel) claimed it, or
    its message waits in the host's queue or in an agent worker's hands.

    Args:
        target: a dispatched target (``dispatched_at`` set), with its host.
        on_the_way: ``claims_on_the_way`` of its host, when the caller read it already.

    Raises:
        redis.exceptions.RedisError: the broker cannot be reached.
    """
    key = claim_key(target.pk, target.dispatched_at)
    if target_claim(broker(), key) is not None:
        return True
    return key in (on_the_way if on_the_way is not None else claims_on_the_way(target.host.name))


def unsent_targets(*, now: datetime | None = None) -> list[tuple[int, datetime]]:
    """The pending targets dispatched more than ``DISPATCH_RESEND_AFTER`` seconds ago to an online host whose
    agent has not got them (``reached_agent``): their send was lost with the worker that was to make it.
    A host that is not online is left to ``reconcile.fail_stalled_targets``.

    Returns:
        ``[(target id, dispatched_at)]``, oldest dispatch first.

    Raises:
        redis.exceptions.RedisError: the broker cannot be reached.
    """
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.DISPATCH_RESEND_AFTER)
    waiting = (DeploymentTarget.objects.filter(state=TargetState.PENDING, dispatched_at__lt=cutoff)
               .select_related("host").order_by("dispatched_at"))
    unsent, read = [], {}
    for target in waiting:
        if not target.host.is_online(now=now):
            continue
        if target.host.name not in read:
            read[target.host.name] = claims_on_the_way(target.host.name)
        if not reached_agent(target, read[target.host.name]):
            unsent.append((target.pk, target.dispatched_at))
    return unsent
