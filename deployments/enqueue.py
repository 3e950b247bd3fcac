"""Sending work to Celery by task name: the bottom of ``deployments/``.

Every module of the app that starts background work sends it from here, by name, so none of them
imports ``deployments.tasks`` (the Celery entry points, which import the services they run): imports run
one way, services → enqueue, and tasks → services. Orchestrator tasks go to the ``default`` queue
(``CELERY_TASK_DEFAULT_QUEUE``); agent tasks go to ``host.<name>`` with the orchestrator's protocol
stamped on the payload (``modelyard_agent.contract``).

Callers that publish after a commit wrap the call in ``transaction.on_commit``; a broker that is down
raises ``kombu.exceptions.OperationalError`` from the publish.
"""

from enum import StrEnum

from modelyard.celery import app, send_by_name
from modelyard_agent.contract import PROTOCOL_VERSION, AgentTask, host_queue


class Job(StrEnum):
    """The orchestrator's own task names (``deployments.tasks`` registers each under its value)."""

    DISPATCH_TARGET = "deployments.dispatch_target"
    RESEND_TARGET = "deployments.resend_target"
    ADVANCE_ROLLOUT = "deployments.advance_rollout"
    FOLLOW_ALIAS = "deployments.follow_alias"
    DISPATCH_PROFILE = "deployments.dispatch_profile"
    DISPATCH_REPLAY = "deployments.dispatch_replay"


#: Queue the task ``name`` (a ``Job``) with positional ``args``; see ``modelyard.celery.send_by_name``.
job = send_by_name


def send_to_host(host: str, task: AgentTask, payload: dict, **options) -> None:
    """Send ``task`` with ``payload`` (stamped with this orchestrator's protocol) to ``host``'s agent.

    Args:
        host: the serving host's name; its agent consumes ``host.<name>``.
        task: the agent task (``modelyard_agent.contract.AgentTask``).
        payload: the task's payload (``contract.DeployPayload``, ``UnloadPayload`` …).
        options: Celery publishing options (``expires`` in seconds …).

    Raises:
        kombu.exceptions.OperationalError: the broker does not take the message.
    """
    app.send_task(str(task), args=[{**payload, "protocol": PROTOCOL_VERSION}], queue=host_queue(host), **options)
