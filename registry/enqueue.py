"""Sending registry work to Celery by task name: the bottom of ``registry/``.

As in ``deployments.enqueue`` and ``promotions.enqueue``: the multipart uploads queue their verification and
the re-hash from here, so ``registry.uploads`` does not import ``registry.tasks`` (the Celery entry points,
which import ``registry.uploads``). Callers publish inside ``transaction.on_commit``; a broker that is down
raises ``kombu.exceptions.OperationalError``.
"""

from enum import StrEnum

from modelyard.celery import send_by_name


class Job(StrEnum):
    """The registry app's task names (``registry.tasks`` registers each under its value)."""

    VERIFY_UPLOAD = "registry.verify_upload"
    VERIFY_VERSION_BYTES = "registry.verify_version_bytes"


#: Queue the task ``name`` (a ``Job``) with positional ``args``; see ``modelyard.celery.send_by_name``.
job = send_by_name
