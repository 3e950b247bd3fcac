"""Multipart uploads verified by a real Celery worker on the ``default`` queue, as in production."""

import pytest

from registry.models import ModelVersion, RegisteredModel, Upload
from tests.fixtures.services import wait_for
from tests.registry.uploading import put_parts, sha256_of, start, upload_object_left

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_a_worker_verifies_a_completed_upload_and_the_client_sees_the_version(
    api_client, s3_endpoint, start_celery_worker, large_archive
):
    RegisteredModel.objects.create(name="iris")
    worker = start_celery_worker("default", env={"MODELYARD_S3_ENDPOINT_URL": s3_endpoint})
    upload_id = start(api_client, large_archive).json()["id"]
    put_parts(api_client, upload_id, large_archive, [1, 2, 3])
    for _ in range(2):  # a client that retries its completion request
        assert api_client.post(f"/api/v1/uploads/{upload_id}/complete/", {}, format="json").status_code == 202

    wait_for(lambda: api_client.get(f"/api/v1/uploads/{upload_id}/").json()["status"] != "verifying",
             timeout=60, what="the worker to verify the upload")
    body = api_client.get(f"/api/v1/uploads/{upload_id}/").json()
    assert (body["status"], body["version"]) == ("completed", 1), worker.log_text()[-3000:]
    assert body["sha256"] == sha256_of(large_archive)
    assert ModelVersion.objects.filter(model__name="iris").count() == 1
    version = ModelVersion.objects.get(model__name="iris")
    assert version.artifact_key == f"uploads/{upload_id}" and upload_object_left(upload_id)  # adopted, not copied


def test_a_worker_registers_then_marks_corrupt_a_version_whose_whole_sha256_is_wrong(
    api_client, s3_endpoint, start_celery_worker, large_archive
):
    RegisteredModel.objects.create(name="iris")
    worker = start_celery_worker("default", env={"MODELYARD_S3_ENDPOINT_URL": s3_endpoint})
    upload_id = start(api_client, large_archive, sha256="f" * 64).json()["id"]
    put_parts(api_client, upload_id, large_archive, [1, 2, 3])  # every part as declared
    api_client.post(f"/api/v1/uploads/{upload_id}/complete/", {}, format="json")

    wait_for(lambda: Upload.objects.get(pk=upload_id).status != "verifying", timeout=60, what="the verification")
    assert Upload.objects.get(pk=upload_id).status == "completed"
    # The worker's background re-hash (queued when the version committed) finds the bytes differ.
    wait_for(lambda: ModelVersion.objects.get().status == "corrupt", timeout=60, what="the re-hash")
    assert "re-hashing" not in worker.log_text()  # found on the first try
    assert sha256_of(large_archive) in ModelVersion.objects.get().integrity_error


def test_a_worker_fails_an_upload_read_back_whose_bytes_are_not_what_was_declared(
    api_client, s3_endpoint, start_celery_worker, large_archive
):
    RegisteredModel.objects.create(name="iris")
    start_celery_worker("default", env={"MODELYARD_S3_ENDPOINT_URL": s3_endpoint})
    upload_id = start(api_client, large_archive, sha256="f" * 64).json()["id"]
    put_parts(api_client, upload_id, large_archive, [1, 2, 3], digests=False)  # an older client
    api_client.post(f"/api/v1/uploads/{upload_id}/complete/", {}, format="json")

    wait_for(lambda: Upload.objects.get(pk=upload_id).status != "verifying", timeout=60, what="the verification")
    failed = Upload.objects.get(pk=upload_id)
    assert failed.status == "failed" and "not the declared" in failed.error
    assert not ModelVersion.objects.exists()
    # The worker marks the upload FAILED first and deletes its staging object just after.
    wait_for(lambda: not upload_object_left(upload_id), timeout=30, what="the staging object to be deleted")
