"""The host agent's Celery application, and how it reports to the orchestrator.

The bottom of the agent's worker side: ``modelyard_agent.coordination`` reads the broker URL from
this app, and ``modelyard_agent.worker`` registers its tasks on it. Reports go to the orchestrator
by task name (``contract.OrchestratorTask``), so the agent needs none of the orchestrator's code.
"""

from __future__ import annotations

from celery import Celery

from modelyard_agent import contract
from modelyard_agent.config import current as settings
from modelyard_agent.contract import OrchestratorTask

# A report must outlive a broker restart or failover: publishing it is retried for about two
# minutes (0, 0.5, 1, … then every 3 s) before the task gives up.
REPORT_RETRY_POLICY = {"max_retries": 45, "interval_start": 0, "interval_step": 0.5, "interval_max": 3}

# Not the process's current app: a process that also runs the orchestrator's app (its tests) keeps
# that one as the app its shared tasks bind to.
app = Celery("modelyard_agent", set_as_current=False)
app.conf.update(
    broker_url=settings().broker_url,
    task_ignore_result=True,
    task_serializer="json",
    accept_content=["json"],
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    task_time_limit=settings().task_time_limit,
    # A message a killed agent took but never acknowledged goes back to the queue after this many
    # seconds; longer than any task may run, so a live task is never handed out twice.
    broker_transport_options={"visibility_timeout": settings().visibility_timeout},
    broker_connection_retry_on_startup=True,
)


def report(task: OrchestratorTask, *args) -> None:
    """Send ``task`` with JSON ``args`` to the orchestrator's queue, retrying the publish for about two
    minutes (``REPORT_RETRY_POLICY``); raises the broker's error after that."""
    app.send_task(task.value, args=list(args), queue=contract.ORCHESTRATOR_QUEUE, retry=True,
                  retry_policy=REPORT_RETRY_POLICY)
