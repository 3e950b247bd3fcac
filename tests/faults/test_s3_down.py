"""The S3 endpoint down during an upload: no version row, a clear 503, and a retry that works once
S3 is back."""

import pytest

from audit.choices import AuditAction
from audit.models import AuditEvent
from demo.iris import build_iris_archive
from registry import storage
from registry.models import ModelVersion, RegisteredModel

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


@pytest.fixture
def iris(api_client, tmp_path):
    assert api_client.post("/api/v1/models/", {"name": "iris"}, format="json").status_code == 201
    return build_iris_archive(tmp_path / "iris.tar.gz")


def upload(api_client, archive):
    with open(archive, "rb") as fh:
        return api_client.post("/api/v1/models/iris/versions/", {"artifact": fh}, format="multipart")


def assert_nothing_registered():
    assert not ModelVersion.objects.exists()
    assert RegisteredModel.objects.get(name="iris").next_version == 1  # no number was used up
    assert not AuditEvent.objects.filter(action=AuditAction.VERSION_REGISTERED).exists()


def test_an_upload_while_s3_is_down_is_a_503_that_registers_nothing_and_works_once_s3_is_back(
    api_client, iris, restartable_s3
):
    restartable_s3.stop()
    answer = upload(api_client, iris)
    assert answer.status_code == 503
    assert "could not be stored" in answer.json()["detail"] and "unreachable" in answer.json()["detail"]
    assert_nothing_registered()

    restartable_s3.start()
    retried = upload(api_client, iris)
    assert retried.status_code == 201, retried.content
    assert retried.json()["version"] == 1
    assert storage.ArtifactStore().head(ModelVersion.objects.get().artifact_key) is not None


def test_s3_going_down_between_storing_and_verifying_the_artifact_registers_nothing(api_client, iris, restartable_s3):
    # The process's one S3 client, which the upload's store uses too: S3 stops right after it stored the object.
    events = storage.ArtifactStore().client.meta.events
    events.register("after-call.s3.PutObject", lambda **_: restartable_s3.stop(), unique_id="stop-s3-after-the-put")
    try:
        answer = upload(api_client, iris)
    finally:
        events.unregister("after-call.s3.PutObject", unique_id="stop-s3-after-the-put")
    assert answer.status_code == 503
    assert "could not be stored" in answer.json()["detail"]
    assert_nothing_registered()

    restartable_s3.start()
    retried = upload(api_client, iris)
    assert retried.status_code == 201, retried.content
    assert retried.json()["version"] == 1
