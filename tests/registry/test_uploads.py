"""Direct-to-S3 multipart uploads through the API, with real presigned PUTs to the S3 stand-in.

Verification (what the ``registry.verify_upload`` task runs) is called in-process here;
tests/registry/test_upload_worker.py runs it in a real Celery worker.
"""

import errno
import hashlib
import io
import os
import re

import pytest
import requests
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from audit.models import AuditEvent
from registry import uploads
from registry.models import ModelVersion, RegisteredModel, Upload
from registry.storage import CHUNK_BYTES, ArtifactStore, StorageError
from tests.factories import team_member, token_for
from tests.registry.uploading import (
    PART,
    bucket_keys,
    open_multipart_ids,
    put_parts,
    sha256_of,
    start,
    upload_object_left,
)

pytestmark = pytest.mark.django_db

GiB = 1024**3


@pytest.fixture
def iris(db):
    return RegisteredModel.objects.create(name="iris")


def client_for(username: str, *, staff: bool = False) -> APIClient:
    user = team_member(get_user_model().objects.create_user(username=username, is_staff=staff), "maintainer")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token_for(user)}")
    return client


def test_a_large_artifact_goes_straight_to_s3_in_parts_and_becomes_a_version(
    api_client, s3_endpoint, iris, large_archive
):
    created = start(api_client, large_archive, metadata={"run": "42"}, tags={"team": "vision"},
                    source_commit="abc123")
    assert created.status_code == 201, created.content
    body = created.json()
    assert (body["status"], body["part_size"], body["part_count"], body["parts"]) == ("open", PART, 3, [])
    put_parts(api_client, body["id"], large_archive, [1, 2, 3])
    shown = api_client.get(f"/api/v1/uploads/{body['id']}/").json()
    assert [(p["part_number"], p["size"]) for p in shown["parts"]] == [
        (1, PART), (2, PART), (3, large_archive.stat().st_size - 2 * PART)]

    completed = api_client.post(f"/api/v1/uploads/{body['id']}/complete/",
                                {"sha256": sha256_of(large_archive)}, format="json")
    assert completed.status_code == 202, completed.content
    assert completed.json()["status"] == "verifying"
    uploads.verify_upload(body["id"])

    done = api_client.get(f"/api/v1/uploads/{body['id']}/").json()
    assert (done["status"], done["version"], done["error"]) == ("completed", 1, "")
    version = ModelVersion.objects.get(model=iris, version=1)
    assert version.artifact_sha256 == sha256_of(large_archive)
    assert version.artifact_size == large_archive.stat().st_size
    assert (version.metadata, version.tags, version.source_commit) == ({"run": "42"}, {"team": "vision"}, "abc123")
    assert version.artifact_filename == "iris.tar" and version.created_by.username == "engineer"
    assert version.artifact_key == f"uploads/{body['id']}" in bucket_keys()  # the verified upload, not a copy
    actions = set(AuditEvent.objects.values_list("action", flat=True))
    assert {"upload.started", "version.registered"} <= actions


def test_a_failed_part_can_be_sent_again_and_the_upload_then_completes(api_client, s3_endpoint, iris, large_archive):
    upload_id = start(api_client, large_archive).json()["id"]
    put_parts(api_client, upload_id, large_archive, [1, 3])  # part 2 "failed" on the way

    refused = api_client.post(f"/api/v1/uploads/{upload_id}/complete/", {}, format="json")
    assert refused.status_code == 400
    assert "parts 2 of 3 have not been uploaded" in refused.json()["detail"]
    resumed = api_client.get(f"/api/v1/uploads/{upload_id}/").json()
    assert resumed["status"] == "open" and [p["part_number"] for p in resumed["parts"]] == [1, 3]

    put_parts(api_client, upload_id, large_archive, [2])
    assert api_client.post(f"/api/v1/uploads/{upload_id}/complete/", {}, format="json").status_code == 202
    uploads.verify_upload(upload_id)
    assert Upload.objects.get(pk=upload_id).version.artifact_sha256 == sha256_of(large_archive)


def test_completing_while_the_task_queue_is_down_is_a_503_and_the_upload_stays_open(
        api_client, s3_endpoint, iris, large_archive, queue_down):
    from modelyard.celery import app

    upload_id = start(api_client, large_archive).json()["id"]
    put_parts(api_client, upload_id, large_archive, [1, 2, 3])
    refused = api_client.post(f"/api/v1/uploads/{upload_id}/complete/", {}, format="json")
    assert refused.status_code == 503 and "the upload's verification was not started" in refused.json()["detail"]
    assert api_client.get(f"/api/v1/uploads/{upload_id}/").json()["status"] == "open"
    app.conf.broker_url = queue_down  # the queue is back: completing again goes on as usual
    assert api_client.post(f"/api/v1/uploads/{upload_id}/complete/", {}, format="json").status_code == 202


def test_a_part_sent_twice_replaces_the_first_copy(api_client, s3_endpoint, iris, large_archive):
    upload_id = start(api_client, large_archive).json()["id"]
    urls = api_client.post(f"/api/v1/uploads/{upload_id}/parts/", {"part_numbers": [1]}, format="json").json()
    requests.put(urls["parts"][0]["url"], data=b"x" * PART, timeout=30)  # a corrupted first try
    put_parts(api_client, upload_id, large_archive, [1, 2, 3])
    api_client.post(f"/api/v1/uploads/{upload_id}/complete/", {"sha256": sha256_of(large_archive)}, format="json")
    assert uploads.verify_upload(upload_id).status == "completed"


def test_completing_twice_is_harmless_and_registers_one_version(api_client, s3_endpoint, iris, large_archive):
    upload_id = start(api_client, large_archive).json()["id"]
    put_parts(api_client, upload_id, large_archive, [1, 2, 3])
    for _ in range(2):
        answer = api_client.post(f"/api/v1/uploads/{upload_id}/complete/", {}, format="json")
        assert (answer.status_code, answer.json()["status"]) == (202, "verifying")
    uploads.verify_upload(upload_id)
    uploads.verify_upload(upload_id)
    again = api_client.post(f"/api/v1/uploads/{upload_id}/complete/", {}, format="json")
    assert (again.status_code, again.json()["status"], again.json()["version"]) == (202, "completed", 1)
    assert ModelVersion.objects.filter(model=iris).count() == 1


def test_aborting_frees_the_parts_is_audited_and_closes_the_upload(api_client, s3_endpoint, iris, large_archive):
    upload_id = start(api_client, large_archive).json()["id"]
    put_parts(api_client, upload_id, large_archive, [1])
    s3_upload_id = Upload.objects.get(pk=upload_id).s3_upload_id
    assert s3_upload_id in open_multipart_ids()

    aborted = api_client.delete(f"/api/v1/uploads/{upload_id}/")
    assert (aborted.status_code, aborted.json()["status"]) == (200, "aborted")
    assert s3_upload_id not in open_multipart_ids()
    assert api_client.delete(f"/api/v1/uploads/{upload_id}/").status_code == 200
    assert AuditEvent.objects.filter(action="upload.aborted", object_id=upload_id).count() == 1
    late = api_client.post(f"/api/v1/uploads/{upload_id}/parts/", {"part_numbers": [2]}, format="json")
    assert late.status_code == 409 and "aborted" in late.json()["detail"]
    assert api_client.post(f"/api/v1/uploads/{upload_id}/complete/", {}, format="json").status_code == 409


def test_parts_that_add_up_to_another_size_than_declared_fail_the_upload(api_client, s3_endpoint, iris,
                                                                        large_archive):
    declared = large_archive.stat().st_size + 100  # still three parts, but the last one is short
    upload_id = start(api_client, large_archive, size=declared).json()["id"]
    put_parts(api_client, upload_id, large_archive, [1, 2, 3])
    answer = api_client.post(f"/api/v1/uploads/{upload_id}/complete/", {}, format="json")
    assert answer.status_code == 202
    assert answer.json()["status"] == "failed"
    assert f"but {declared} bytes in 3 parts were declared" in answer.json()["error"]
    assert not ModelVersion.objects.exists()
    assert not upload_object_left(upload_id)
    assert Upload.objects.get(pk=upload_id).s3_upload_id not in open_multipart_ids()


def test_a_client_that_declares_no_part_digests_is_read_back_and_a_wrong_sha256_fails_the_upload(
    api_client, s3_endpoint, iris, large_archive
):
    before = bucket_keys()
    upload_id = start(api_client, large_archive, sha256="0" * 64).json()["id"]
    put_parts(api_client, upload_id, large_archive, [1, 2, 3], digests=False)
    api_client.post(f"/api/v1/uploads/{upload_id}/complete/", {}, format="json")
    uploads.verify_upload(upload_id)

    failed = api_client.get(f"/api/v1/uploads/{upload_id}/").json()
    assert failed["status"] == "failed" and f"sha256 {sha256_of(large_archive)}, not the declared" in failed["error"]
    assert (failed["verification"], failed["verification_note"]) == (
        "read_back", "the client declared no digests for parts 1, 2, 3")
    assert not ModelVersion.objects.exists()
    assert bucket_keys() == before


def test_a_sha256_given_at_completion_must_agree_with_the_declared_one(api_client, s3_endpoint, iris,
                                                                       large_archive):
    upload_id = start(api_client, large_archive, sha256=sha256_of(large_archive)).json()["id"]
    answer = api_client.post(f"/api/v1/uploads/{upload_id}/complete/", {"sha256": "1" * 64}, format="json")
    assert answer.status_code == 400 and "differs from" in answer.json()["detail"]
    assert Upload.objects.get(pk=upload_id).status == "open"


def test_an_archive_the_registry_refuses_fails_the_upload_with_the_reason(api_client, s3_endpoint, iris, tmp_path):
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not an archive" * 1000)
    upload_id = start(api_client, junk).json()["id"]
    put_parts(api_client, upload_id, junk, [1])
    api_client.post(f"/api/v1/uploads/{upload_id}/complete/", {}, format="json")
    uploads.verify_upload(upload_id)
    failed = Upload.objects.get(pk=upload_id)
    assert failed.status == "failed" and "artifact refused" in failed.error
    assert not ModelVersion.objects.exists() and not upload_object_left(upload_id)


@pytest.mark.parametrize(("fields", "message"), [
    ({"size": 0}, "size"),
    ({"size": 2 * GiB + 1}, "the limit is"),
    ({"part_size": 5 * 1024**2 - 1}, "part_size must be between"),
    ({"part_size": 5 * GiB + 1}, "part_size must be between"),
    ({"size": 49 * GiB, "part_size": PART}, "more than 10000 parts"),
    ({"sha256": "xyz"}, "64 hexadecimal digits"),
    ({"filename": "../"}, "filename"),
    ({"filename": "model.exe"}, "cannot tell what kind of model"),
    ({"tags": {"team": 3}}, "tag"),
    ({"metrics": {"accuracy": "high"}}, "metrics"),
    ({"ci_run_url": "file:///etc/passwd"}, "ci_run_url"),
])
def test_bad_sizes_part_sizes_and_fields_are_refused_before_anything_is_opened(api_client, s3_endpoint, iris,
                                                                               settings, fields, message):
    # A limit above 49 GiB, so that the part count is what refuses the 49 GiB upload.
    settings.MAX_ARTIFACT_BYTES = 50 * GiB if fields.get("size") == 49 * GiB else 2 * GiB
    base = {"filename": "iris.tar", "size": 20 * 1024**2, "part_size": PART}
    open_before = open_multipart_ids()
    answer = api_client.post("/api/v1/models/iris/uploads/", {**base, **fields}, format="json")
    assert answer.status_code == 400
    assert message in str(answer.json())
    assert not Upload.objects.exists() and open_multipart_ids() == open_before


def test_part_numbers_outside_the_upload_are_refused(api_client, s3_endpoint, iris, large_archive):
    upload_id = start(api_client, large_archive).json()["id"]
    for numbers, message in (([0], "between 1 and 3"), ([4], "between 1 and 3"), ([], "")):
        answer = api_client.post(f"/api/v1/uploads/{upload_id}/parts/", {"part_numbers": numbers}, format="json")
        assert answer.status_code == 400 and message in str(answer.json())


def test_an_upload_for_an_unknown_model_is_404(api_client, s3_endpoint, large_archive):
    assert start(api_client, large_archive, model="nope").status_code == 404


def test_only_the_creator_or_staff_can_see_or_act_on_an_upload(api_client, s3_endpoint, iris, large_archive, client):
    upload_id = start(api_client, large_archive).json()["id"]
    outsider, admin = client_for("outsider"), client_for("admin", staff=True)
    for answer in (
        outsider.get(f"/api/v1/uploads/{upload_id}/"),
        outsider.post(f"/api/v1/uploads/{upload_id}/parts/", {"part_numbers": [1]}, format="json"),
        outsider.post(f"/api/v1/uploads/{upload_id}/complete/", {}, format="json"),
        outsider.delete(f"/api/v1/uploads/{upload_id}/"),
    ):
        assert answer.status_code == 404
    assert client.get(f"/api/v1/uploads/{upload_id}/").status_code in (401, 403)
    assert Upload.objects.get(pk=upload_id).status == "open"
    assert admin.get(f"/api/v1/uploads/{upload_id}/").status_code == 200
    assert admin.delete(f"/api/v1/uploads/{upload_id}/").json()["status"] == "aborted"


def test_expired_open_uploads_are_aborted_by_the_sweep_and_fresh_ones_are_kept(api_client, s3_endpoint, iris,
                                                                               large_archive):
    from django.utils import timezone

    from registry.tasks import expire_uploads_task

    stale_id = start(api_client, large_archive).json()["id"]
    fresh_id = start(api_client, large_archive).json()["id"]
    put_parts(api_client, stale_id, large_archive, [1])
    Upload.objects.filter(pk=stale_id).update(expires_at=timezone.now() - timezone.timedelta(seconds=1))

    assert expire_uploads_task() == 1
    stale, fresh = Upload.objects.get(pk=stale_id), Upload.objects.get(pk=fresh_id)
    assert (stale.status, fresh.status) == ("aborted", "open")
    assert "expired" in stale.error and stale.s3_upload_id not in open_multipart_ids()
    assert AuditEvent.objects.get(action="upload.aborted").actor_label == "system"


def test_the_store_lists_more_parts_than_one_page_of_s3s_answer(s3_endpoint):
    store = ArtifactStore()
    key = "uploads/many-parts"
    upload_id = store.start_multipart(key).upload_id
    for number in range(1, 1003):
        store.client.upload_part(Bucket=store.bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=b"p")
    parts = store.list_parts(key, upload_id)
    store.abort_multipart(key, upload_id)
    assert [p.number for p in parts] == list(range(1, 1003)) and {p.size for p in parts} == {1}




def test_the_store_streams_an_object_of_several_chunks_into_a_file_while_hashing_it(s3_endpoint, tmp_path):
    store = ArtifactStore()
    store.ensure_bucket()
    data = os.urandom(2 * CHUNK_BYTES + 12345)
    store.client.put_object(Bucket=store.bucket, Key="tests/streamed", Body=data)
    with (tmp_path / "copy").open("wb") as sink:
        assert store.stream_to("tests/streamed", sink) == (hashlib.sha256(data).hexdigest(), len(data))
    assert (tmp_path / "copy").read_bytes() == data
    assert store.stream_to("tests/streamed") == (hashlib.sha256(data).hexdigest(), len(data))


def test_a_file_that_cannot_be_written_stops_the_stream_with_its_error(s3_endpoint):
    class FullDisk(io.RawIOBase):
        def writable(self) -> bool:
            return True

        def write(self, data) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

    store = ArtifactStore()
    store.ensure_bucket()
    store.client.put_object(Bucket=store.bucket, Key="tests/streamed", Body=os.urandom(2 * CHUNK_BYTES))
    with pytest.raises(OSError, match="No space left"):
        store.stream_to("tests/streamed", FullDisk())


def test_reading_an_object_that_is_not_there_is_a_storage_error(s3_endpoint):
    store = ArtifactStore()
    store.ensure_bucket()
    with pytest.raises(StorageError) as raised:
        store.stream_to("tests/absent")
    assert raised.value.code == "NoSuchKey" and not raised.value.retryable


def test_the_upload_page_explains_the_sample_input_and_names_the_suffixes_it_checks_before_sending(
    client, user, iris
):
    from registry.formats import ACCEPTED_SUFFIXES, check_filename

    client.force_login(user)
    page = client.get("/models/iris/upload/").content.decode()
    assert '<textarea name="sample_input"' in page
    assert "the smoke inference" in page and '"Try it" starts from it' in page
    suffixes = re.search(r'data-accepted-suffixes="([^"]+)"', page).group(1).split()
    assert tuple(suffixes) == ACCEPTED_SUFFIXES
    for suffix in suffixes:  # the page's list is the server's: each names a kind check_filename takes
        assert check_filename(f"model{suffix}")
