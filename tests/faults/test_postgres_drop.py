"""A PostgreSQL connection dropped inside a task: the worker's backend is terminated
(``pg_terminate_backend``) while it verifies a multipart upload; the task retries on a new
connection and registers exactly one version."""

import threading

import pytest
from django.db import connection

from audit.models import AuditEvent
from registry.models import ModelVersion, RegisteredModel, Upload
from tests.fixtures.services import wait_for
from tests.registry.conftest import MiB, make_large_archive
from tests.registry.uploading import put_parts, start

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


WORKER_APPLICATION_NAME = "modelyard-fault-worker"


def terminate_backend_running(statement_part: str, stop: threading.Event) -> list[int]:
    """Terminate the worker's backend (by its application name) once its last statement contains
    ``statement_part``; poll ``pg_stat_activity`` until then or until ``stop`` is set. Runs in its
    own thread, on its own connection, closed on return. Returns the terminated pids."""
    try:
        with connection.cursor() as cursor:
            while not stop.is_set():
                cursor.execute(
                    "SELECT pg_terminate_backend(pid), pid FROM pg_stat_activity WHERE datname = current_database() "
                    "AND application_name = %s AND query LIKE %s", [WORKER_APPLICATION_NAME, f"%{statement_part}%"])
                pids = [pid for _, pid in cursor.fetchall()]
                if pids:
                    return pids
                stop.wait(0.002)
        return []
    finally:
        connection.close()


def test_a_verification_whose_database_connection_is_killed_retries_and_registers_one_version(
    api_client, s3_endpoint, start_celery_worker, tmp_path
):
    archive = make_large_archive(tmp_path / "iris.tar", weights_bytes=11 * MiB)
    RegisteredModel.objects.create(name="iris")
    # libpq names the worker's connections, so the test can tell its backend from its own.
    worker = start_celery_worker("default", env={"MODELYARD_S3_ENDPOINT_URL": s3_endpoint,
                                                 "PGAPPNAME": WORKER_APPLICATION_NAME})
    upload_id = start(api_client, archive).json()["id"]
    put_parts(api_client, upload_id, archive, [1, 2, 3])

    killed: list[int] = []
    stop = threading.Event()
    # The task's first statement reads the upload row; joining and reading the parts in S3 follow,
    # then the writes: the connection dies in between.
    killer = threading.Thread(target=lambda: killed.extend(terminate_backend_running('"registry_upload"', stop)),
                              daemon=True)
    killer.start()
    assert api_client.post(f"/api/v1/uploads/{upload_id}/complete/", {}, format="json").status_code == 202
    killer.join(timeout=30)
    stop.set()
    assert killed, "the worker's database backend was never seen"

    wait_for(lambda: Upload.objects.get(pk=upload_id).status != "verifying", timeout=90,
             what="the verification to finish after the dropped connection")
    upload = Upload.objects.get(pk=upload_id)
    assert (upload.status, upload.version.version) == ("completed", 1), worker.log_text()[-3000:]
    assert ModelVersion.objects.filter(model__name="iris").count() == 1
    assert AuditEvent.objects.filter(action="version.registered").count() == 1
    assert "lost its database connection" in worker.log_text()  # the first try did fail
