"""What every host adapter reads alike: the load and unload deadlines of a payload, the payload sent to
the runtime itself rather than through the host's gateway, and the jobs the agent runs now."""

from __future__ import annotations

from modelyard_agent.config import current as settings
from modelyard_agent.coordination import agent_info


def load_deadline(payload: dict) -> float:
    """Seconds one load may take: the host's deadline from the payload, else the agent's default."""
    return float(payload.get("load_deadline") or settings().load_deadline)


def unload_deadline(payload: dict) -> float:
    """Seconds one unload may take: the host's deadline from the payload, else the agent's default."""
    return float(payload.get("unload_deadline") or settings().unload_deadline)


def direct(payload: dict) -> dict:
    """``payload`` with ``inference_url`` replaced by Triton's own URL when a gateway stands in front of it:
    loads, unloads, indexes and profiles go to Triton, not through the gateway (which refuses them)."""
    return {**payload, "inference_url": settings().triton_url} if settings().triton_url else payload


def running_profiles(host: str) -> set[int]:
    """The ids of the profiles this host's agent runs now (its working set in the broker's Redis)."""
    return running_tasks(host, "profile_id")


def running_tasks(host: str, key: str) -> set[int]:
    """The ids under ``key`` (``profile_id``, ``replay_id``) of the work this host's agent runs now."""

    return {int(entry[key]) for entry in agent_info(host)["working_on"] if entry.get(key)}


