"""The Celery application shared by orchestrator workers, host agents and beat.

Orchestrator workers consume the ``default`` queue; the host agent of serving
host ``<name>`` consumes ``host.<name>`` only.
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "modelyard.settings")

app = Celery("modelyard")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
