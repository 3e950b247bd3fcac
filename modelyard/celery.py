"""The orchestrator's Celery application, for its workers and beat.

Orchestrator workers consume the ``default`` queue; the host agent of serving host ``<name>``
is an app of its own (``modelyard_agent.worker``) consuming ``host.<name>`` only.
"""

import os

from celery import Celery
from django.db import InterfaceError, OperationalError

from modelyard.errors import ServiceUnavailable

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "modelyard.settings")

# A database connection dropped or refused (a terminated backend, a PostgreSQL restart or failover).
# Tasks retry on these: Celery's Django fixup closes an unusable connection after each task, so the
# next try opens a fresh one; every task retried this way is idempotent.
DATABASE_ERRORS = (OperationalError, InterfaceError)

app = Celery("modelyard")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


def send_by_name(name: str, *args: int | str | None) -> None:
    """Queue the task registered as ``name`` on the ``default`` queue with positional ``args`` (JSON values:
    ids, ISO 8601 times), without importing the module that defines it: the bottom layer every app's
    enqueue module (``deployments.enqueue``, ``promotions.enqueue``, ``registry.enqueue``) sends through, so
    imports run one way.

    Raises:
        kombu.exceptions.OperationalError: the broker does not take the message.
    """
    app.send_task(str(name), args=list(args))


def broker(**options):
    """A client of the Redis that carries the tasks, the one both the orchestrator and the host
    agents reach (claims and locks live there too): ``redis.Redis``, with ``options`` passed on
    (``socket_timeout=`` seconds for a blocking read longer than redis-py's default of 5 s)."""
    import redis

    return redis.Redis.from_url(app.conf.broker_url, **options)


# How long a request waits for the task queue's Redis before it is answered 503.
BROKER_CHECK_TIMEOUT = 2.0


def require_broker(work: str) -> None:
    """Refuse ``work`` (words for a message: "the deployment") before anything is written when the task queue
    cannot take it: the broker's Redis does not answer a PING within ``BROKER_CHECK_TIMEOUT`` seconds. Nothing
    is checked when tasks run eagerly (no broker).

    Raises:
        ServiceUnavailable: the broker does not answer (HTTP 503 through the API, a form error on the pages).
    """
    import redis


    if app.conf.task_always_eager:
        return
    try:
        broker(socket_connect_timeout=BROKER_CHECK_TIMEOUT, socket_timeout=BROKER_CHECK_TIMEOUT).ping()
    except redis.RedisError as exc:
        raise ServiceUnavailable(f"the task queue (Redis) does not answer ({exc}), so {work} was not started and "
                                 "nothing was recorded; try again once it is back") from exc
