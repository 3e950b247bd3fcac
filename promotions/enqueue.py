"""Sending promotions work to Celery by task name: the bottom of ``promotions/``.

As in ``deployments.enqueue``: the services and the webhook sender queue work from here, so none of them
imports ``promotions.tasks`` (the Celery entry points, which import them). Callers publish inside
``transaction.on_commit``; a broker that is down raises ``kombu.exceptions.OperationalError``.
"""

from enum import StrEnum

from modelyard.celery import send_by_name


class Job(StrEnum):
    """The promotions app's task names (``promotions.tasks`` registers each under its value)."""

    EVALUATE_POLICY = "promotions.evaluate_policy"
    RUN_EVALUATION = "promotions.run_evaluation"
    DELIVER_WEBHOOK = "promotions.deliver_webhook"


#: Queue the task ``name`` (a ``Job``) with positional ``args``; see ``modelyard.celery.send_by_name``.
job = send_by_name
