"""Sending promotions work to Celery by task name: the bottom of ``promotions/``.

As in ``deployments.enqueue``: the services and the webhook sender queue work from here, so none of them
imports ``promotions.tasks`` (the Celery entry points, which import them). Callers publish inside
``transaction.on_commit``; a broker that is down raises ``kombu.exceptions.OperationalError``.
"""

from enum import StrEnum

from modelyard.celery import app


class Job(StrEnum):
    """The promotions app's task names (``promotions.tasks`` registers each under its value)."""

    EVALUATE_POLICY = "promotions.evaluate_policy"
    RUN_EVALUATION = "promotions.run_evaluation"
    DELIVER_WEBHOOK = "promotions.deliver_webhook"


def job(name: Job, *args: int | str | None) -> None:
    """Queue the promotions task ``name`` with positional ``args`` (JSON values: ids).

    Raises:
        kombu.exceptions.OperationalError: the broker does not take the message.
    """
    app.send_task(str(name), args=list(args))
