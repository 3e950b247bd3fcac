"""Celery tasks of the promotions app: thin wrappers around ``promotions.evaluations`` and ``promotions.webhooks``,
run on orchestrator workers."""

from celery import shared_task

from modelyard.errors import NotFound
from promotions import webhooks
from promotions.enqueue import Job
from promotions.evaluations import evaluate, evaluate_scheduled


@shared_task(name=Job.EVALUATE_POLICY.value, acks_late=True)
def evaluate_policy(policy_id: int) -> str | None:
    """Beat's task: evaluate a policy now (nothing when it was paused or deleted); returns the decision."""
    evaluation = evaluate_scheduled(policy_id)
    return evaluation.decision if evaluation is not None else None


@shared_task(name=Job.RUN_EVALUATION.value, acks_late=True)
def run_evaluation(evaluation_id: int) -> str | None:
    """Make a queued ("run now") evaluation; idempotent once decided. Returns the decision, or None
    when the evaluation was deleted (with its policy) before a worker got to it."""
    try:
        return evaluate(evaluation_id).decision
    except NotFound:
        return None


@shared_task(name=Job.DELIVER_WEBHOOK.value, acks_late=True, bind=True, max_retries=None)
def deliver_webhook(self, delivery_id: int) -> None:
    """One attempt at a webhook delivery; retried with backoff until delivered or out of attempts."""
    retry_in = webhooks.attempt_delivery(delivery_id)
    if retry_in is not None:
        raise self.retry(countdown=retry_in)
