"""Progressive rollouts: a promotion policy that ramps a canary through steps of traffic.

A policy with ``ramp_steps`` (for example ``[5, 25, 50, 100]``, percents of the requests that name no
version) judges the candidate alias's version while it runs as a canary (``deployments.canaries``)
beside the version the target alias names. Its gates read each version's own metrics (Triton labels
every series with the version), so the canary is judged on the requests it answered. At each
evaluation whose gates pass, the canary moves to the next step above its percent now; the last step
(100) promotes it (a plain rollout of it on the hosts it reached) and moves the target alias, as a
policy without steps does. A failed gate holds the canary at its step, or, with
``ramp_on_failure = "rollback"``, rolls it back to each host's stable version. Dry runs say what they
would do and change nothing; a policy that needs approval waits for it before each step.

The canary is the newest active traffic canary of the candidate's version; the policy does not start
one (start it with ``canary_percent`` at the first step, or any percent).
"""

from __future__ import annotations

import math

from deployments.canaries import promote_canary, set_traffic
from deployments.choices import CanaryState
from deployments.models import Deployment
from deployments.rollouts import rollback_rollout
from modelyard.errors import InvalidInput

MAX_STEPS = 20
FAILURE_ACTIONS = ("hold", "rollback")


def check_ramp_steps(value) -> list[float]:
    """``value`` as a policy's ramp: percents strictly increasing, each above 0 and at most 100, ending at
    100; empty for no ramp.

    Raises:
        InvalidInput: anything else (the message says what).
    """
    if value in (None, []):
        return []
    if not isinstance(value, list) or not value or len(value) > MAX_STEPS:
        raise InvalidInput(f"ramp_steps must be a list of 1 to {MAX_STEPS} percents, such as [5, 25, 50, 100]")
    steps = []
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int | float) or not math.isfinite(item) \
                or not 0 < item <= 100:
            raise InvalidInput(f"each of ramp_steps must be a percent above 0 and at most 100, got {item!r}")
        steps.append(float(item))
    if any(b <= a for a, b in zip(steps, steps[1:], strict=False)):
        raise InvalidInput(f"ramp_steps must increase, got {value!r}")
    if steps[-1] != 100:
        raise InvalidInput("ramp_steps must end at 100 (the step that promotes the canary)")
    return steps


def check_failure_action(value) -> str:
    """``value`` as what a ramp does when a gate fails: ``hold`` or ``rollback``.

    Raises:
        InvalidInput: another value.
    """
    if value not in FAILURE_ACTIONS:
        raise InvalidInput(f"ramp_on_failure must be one of {', '.join(FAILURE_ACTIONS)}, got {value!r}")
    return value


def next_step(steps: list[float], percent: float | None) -> float | None:
    """The first step above ``percent`` (a canary's share now), or None when it is at the last one."""
    return next((step for step in steps if step > (percent or 0)), None)


def active_canary(model, version):
    """The newest active traffic canary of ``version`` (a ModelVersion) of ``model``, or None."""
    return (Deployment.objects.filter(model=model, version=version, canary_state=CanaryState.ACTIVE)
            .order_by("-created_at", "-id").first())


def take_step(deployment_id: int, to: float, *, actor) -> dict:
    """Move canary ``deployment_id`` to ``to`` percent, or promote it at 100.

    Returns:
        ``{"deployment", "to", "promotion"}``: the promotion rollout's id at 100, else None.

    Raises:
        Conflict: the canary is no longer active (promoted, rolled back, cancelled).
    """
    if to >= 100:
        return {"deployment": deployment_id, "to": 100.0, "promotion": promote_canary(deployment_id, actor=actor).pk}
    set_traffic(deployment_id, canary_percent=to, actor=actor)
    return {"deployment": deployment_id, "to": to, "promotion": None}


def roll_back(deployment_id: int, *, actor) -> list[int]:
    """Roll canary ``deployment_id`` back to each host's stable version; returns the rollback rollouts' ids.

    Raises:
        Conflict: it was rolled back already, or a later rollout moved its hosts.
    """
    return [d.pk for d in rollback_rollout(deployment_id, actor=actor)]
