"""Signals the deployments app sends for other apps to act on."""

from django.dispatch import Signal

# Sent inside the transaction of ``deployments.rollouts.set_status`` when a rollout reaches a terminal
# status. Keyword arguments: ``deployment`` (Deployment, status already updated), ``from_status`` and
# ``to_status`` (``DeploymentStatus`` values). Receivers that start work should do so on commit.
rollout_finished = Signal()
