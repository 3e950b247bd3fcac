"""Multipart uploads checked by the store's own digests instead of a read-back, on the real S3 stand-in.

moto, like AWS S3 without SSE-KMS/SSE-C, computes each part's ETag as the MD5 of the bytes it
received and the joined object's ETag as ``md5(part digests)-N``; it checks no ``Content-MD5`` or
``x-amz-checksum-sha256`` header (tests/../shared notes), so a part whose bytes differ from what
the client declared reaches the store here, and the ETag comparison is what refuses it.
"""

import base64
import hashlib
import json
import os
import tarfile
import zipfile
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
import requests

from audit.models import AuditEvent
from deployments.models import Deployment, ServingHost
from promotions.models import WebhookDelivery
from promotions.webhooks import create_webhook
from registry import integrity, tasks, uploads
from registry.enqueue import Job
from registry.models import ModelVersion, RegisteredModel, Upload
from registry.storage import ArtifactStore, composite_etag, hex_to_base64
from tests.registry.conftest import VALID_CONFIG, MiB, make_large_archive
from tests.registry.uploading import PART, part_bytes, put_parts, sha256_of, start, upload_object_left

pytestmark = pytest.mark.django_db


@pytest.fixture
def iris(db):
    return RegisteredModel.objects.create(name="iris")


def complete(api_client, upload_id: str, **body):
    return api_client.post(f"/api/v1/uploads/{upload_id}/complete/", body, format="json")


def upload_through_the_api(api_client, path: Path, *, sha256: str | None = None, **put) -> str:
    """Start, send every part (declared) and complete an upload of ``path``; return its id."""
    size = path.stat().st_size
    upload_id = start(api_client, path, sha256=sha256 or sha256_of(path)).json()["id"]
    put_parts(api_client, upload_id, path, list(range(1, -(-size // PART) + 1)), **put)
    assert complete(api_client, upload_id).status_code == 202
    return upload_id


class GetCounter:
    """Counts the GetObject requests a store's boto3 client makes and the body bytes they return, while it is
    entered (the client is the process's shared one: the hook goes when it exits)."""

    def __init__(self, store: ArtifactStore):
        self.requests = 0
        self.bytes = 0
        self.events = store.client.meta.events

    def __enter__(self) -> "GetCounter":
        self.events.register("after-call.s3.GetObject", self, unique_id=f"get-counter-{id(self)}")
        return self

    def __exit__(self, *exc) -> None:
        self.events.unregister("after-call.s3.GetObject", unique_id=f"get-counter-{id(self)}")

    def __call__(self, http_response, parsed, **kwargs):
        self.requests += 1
        self.bytes += int(parsed.get("ContentLength", 0))


def test_part_urls_are_signed_for_the_declared_md5_and_sha256_that_the_put_must_carry(
    api_client, s3_endpoint, iris, large_archive
):
    upload_id = start(api_client, large_archive).json()["id"]
    data = part_bytes(large_archive, 1)
    md5, sha256 = hashlib.md5(data).hexdigest(), hashlib.sha256(data).hexdigest()
    answer = api_client.post(f"/api/v1/uploads/{upload_id}/parts/",
                             {"parts": [{"part_number": 1, "md5": md5, "sha256": sha256}]}, format="json")
    assert answer.status_code == 200, answer.content
    (part,) = answer.json()["parts"]
    signed = parse_qs(urlsplit(part["url"]).query)["X-Amz-SignedHeaders"][0].split(";")
    assert {"content-md5", "x-amz-checksum-sha256"} <= set(signed)
    assert part["headers"] == {"Content-MD5": hex_to_base64(md5), "x-amz-checksum-sha256": hex_to_base64(sha256)}
    assert Upload.objects.get(pk=upload_id).declared_parts.get().md5 == md5


@pytest.mark.parametrize(("parts", "message"), [
    ([{"part_number": 1, "md5": "zz" * 16, "sha256": "0" * 64}], "md5"),
    ([{"part_number": 1, "md5": "0" * 32, "sha256": "0" * 63}], "sha256"),
    ([{"part_number": 4, "md5": "0" * 32, "sha256": "0" * 64}], "between 1 and 3"),
    ([{"part_number": 1, "md5": "0" * 32, "sha256": "0" * 64}] * 2, "once"),
])
def test_malformed_part_declarations_are_refused_and_record_nothing(api_client, s3_endpoint, iris, large_archive,
                                                                   parts, message):
    upload_id = start(api_client, large_archive).json()["id"]
    answer = api_client.post(f"/api/v1/uploads/{upload_id}/parts/", {"parts": parts}, format="json")
    assert answer.status_code == 400 and message in str(answer.json())
    assert not Upload.objects.get(pk=upload_id).declared_parts.exists()
    both = api_client.post(f"/api/v1/uploads/{upload_id}/parts/", {"parts": parts[:1], "part_numbers": [1]},
                           format="json")
    assert both.status_code == 400


def test_a_part_whose_bytes_differ_from_its_declared_md5_is_refused_at_completion_and_can_be_sent_again(
    api_client, s3_endpoint, iris, large_archive
):
    upload_id = start(api_client, large_archive, sha256=sha256_of(large_archive)).json()["id"]
    flipped = bytearray(part_bytes(large_archive, 2))
    flipped[1000] ^= 0xFF
    put_parts(api_client, upload_id, large_archive, [1, 2, 3], sent_instead={2: bytes(flipped)})

    refused = complete(api_client, upload_id)
    assert refused.status_code == 400, refused.content
    expected = hashlib.md5(bytes(flipped)).hexdigest()
    assert f"part 2: the store received bytes whose MD5 is {expected}" in refused.json()["detail"]
    assert Upload.objects.get(pk=upload_id).status == "open"  # nothing is lost: the parts stay

    put_parts(api_client, upload_id, large_archive, [2])
    assert complete(api_client, upload_id).status_code == 202
    done = uploads.verify_upload(upload_id)
    assert (done.status, done.verification, done.verification_note) == ("completed", "part_etags", "")
    assert done.version.artifact_sha256 == sha256_of(large_archive)


def test_the_worker_refuses_a_part_that_changed_after_the_client_completed(api_client, s3_endpoint, iris,
                                                                          large_archive):
    upload_id = upload_through_the_api(api_client, large_archive)
    upload = Upload.objects.get(pk=upload_id)
    other = os.urandom(PART)  # another client with the part URL, or a second send of other bytes
    ArtifactStore().client.upload_part(Bucket=ArtifactStore().bucket, Key=upload.staging_key,
                                       UploadId=upload.s3_upload_id, PartNumber=1, Body=other)

    failed = uploads.verify_upload(upload_id)
    assert failed.status == "failed"
    assert f"part 1: the store received bytes whose MD5 is {hashlib.md5(other).hexdigest()}" in failed.error
    assert not ModelVersion.objects.exists() and not upload_object_left(upload_id)


def test_parts_of_the_wrong_size_are_refused_even_when_the_total_is_right(api_client, s3_endpoint, iris,
                                                                          large_archive):
    upload_id = start(api_client, large_archive, sha256=sha256_of(large_archive)).json()["id"]
    data = large_archive.read_bytes()
    short, longer = data[PART:2 * PART - 1], data[2 * PART - 1:]  # part 2 one byte short, part 3 one longer
    api_parts = api_client.post(f"/api/v1/uploads/{upload_id}/parts/", {"parts": [
        {"part_number": n, "md5": hashlib.md5(b).hexdigest(), "sha256": hashlib.sha256(b).hexdigest()}
        for n, b in ((1, data[:PART]), (2, short), (3, longer))
    ]}, format="json").json()["parts"]
    for item, body in zip(api_parts, (data[:PART], short, longer), strict=True):
        assert requests.put(item["url"], data=body, headers=item["headers"], timeout=30).status_code == 200

    refused = complete(api_client, upload_id)
    assert refused.status_code == 400
    assert f"part 2 holds {PART - 1} bytes, not {PART}" in refused.json()["detail"]
    assert Upload.objects.get(pk=upload_id).status == "open"


@pytest.mark.parametrize(("replacement", "message"), [
    (lambda size: os.urandom(size), "the composite of the declared part MD5s"),
    (lambda size: os.urandom(size - 1), "the joined object holds"),
])
def test_a_joined_object_that_is_not_what_the_declared_parts_make_is_refused(
    api_client, s3_endpoint, iris, large_archive, monkeypatch, replacement, message
):
    # A store that joined something else: moto always joins what it holds, so the fault is injected
    # by writing other bytes over the object right after the real join.
    real_complete = ArtifactStore.complete_multipart

    def join_then_overwrite(self, key, upload_id, parts):
        real_complete(self, key, upload_id, parts)
        self.client.put_object(Bucket=self.bucket, Key=key, Body=replacement(sum(p.size for p in parts)))

    upload_id = upload_through_the_api(api_client, large_archive)
    monkeypatch.setattr(ArtifactStore, "complete_multipart", join_then_overwrite)
    failed = uploads.verify_upload(upload_id)
    assert failed.status == "failed"
    assert message in failed.error
    assert not ModelVersion.objects.exists() and not upload_object_left(upload_id)


def test_the_composite_etag_is_the_md5_of_the_part_digests_and_the_part_count(s3_endpoint):
    store = ArtifactStore()
    store.ensure_bucket()
    parts = [os.urandom(PART), os.urandom(1234)]
    started = store.start_multipart("tests/composite", checksum_sha256=True)
    for number, body in enumerate(parts, start=1):
        store.client.upload_part(Bucket=store.bucket, Key="tests/composite", UploadId=started.upload_id,
                                 PartNumber=number, Body=body)
    store.complete_multipart("tests/composite", started.upload_id, store.list_parts("tests/composite",
                                                                                      started.upload_id))
    assert store.head_details("tests/composite").etag == composite_etag([hashlib.md5(p).hexdigest() for p in parts])
    with pytest.raises(ValueError):
        composite_etag(["not-hex"])


def test_a_whole_file_sha256_that_does_not_match_makes_the_version_corrupt_and_undeployable(
    api_client, s3_endpoint, iris, large_archive, settings
):
    settings.WEBHOOK_ALLOW_PRIVATE = True
    hook = create_webhook(url="http://127.0.0.1:9/hook", events=["version.corrupt"])
    claimed = "0" * 64  # every part is what the client declared, but the whole-file digest is wrong
    upload_id = upload_through_the_api(api_client, large_archive, sha256=claimed)
    done = uploads.verify_upload(upload_id)
    assert done.status == "completed" and done.verification == "part_etags"
    version = done.version
    assert (version.status, version.artifact_sha256, version.sha256_verified_at) == ("ready", claimed, None)

    version = integrity.verify_version_bytes(version.pk)
    assert version.status == "corrupt"
    assert sha256_of(large_archive) in version.integrity_error
    event = AuditEvent.objects.get(action="version.corrupt")
    assert event.data["version"] == 1 and event.actor_label == "system"
    delivery = WebhookDelivery.objects.get(webhook=hook)
    assert (delivery.event, delivery.payload["version"]) == ("version.corrupt", 1)
    assert integrity.verify_version_bytes(version.pk).status == "corrupt"  # a repeat records nothing more
    assert AuditEvent.objects.filter(action="version.corrupt").count() == 1

    ServingHost.objects.create(name="gpu-0", runtime="triton", inference_url="http://gpu-0.internal:8000",
                               metrics_url="http://gpu-0.internal:8002/metrics")
    refused = api_client.post("/api/v1/deployments/", {"model": "iris", "version": 1, "hosts": ["gpu-0"]},
                              format="json")
    assert refused.status_code == 409 and "corrupt" in refused.json()["detail"]
    assert not Deployment.objects.exists()
    aliased = api_client.put("/api/v1/models/iris/aliases/production/", {"version": 1}, format="json")
    assert aliased.status_code == 409 and "corrupt" in aliased.json()["detail"]
    shown = api_client.get("/api/v1/models/iris/versions/1/").json()
    assert shown["status"] == "corrupt" and shown["integrity_error"] == version.integrity_error


def test_the_re_hash_marks_a_matching_version_verified(api_client, s3_endpoint, iris, large_archive, client, user):
    upload_id = upload_through_the_api(api_client, large_archive)
    version = uploads.verify_upload(upload_id).version
    assert version.sha256_verified_at is None
    client.force_login(user)
    assert "re-hash is pending" in client.get("/models/iris/versions/1/").content.decode()
    version = integrity.verify_version_bytes(version.pk)
    assert version.status == "ready" and version.sha256_verified_at is not None
    assert "checked by the server" in client.get("/models/iris/versions/1/").content.decode()


def queued(broker) -> list[tuple[str, list]]:
    """``[(task name, args)]`` of the messages waiting on the ``default`` queue (kombu keeps each as JSON)."""
    messages = [json.loads(raw) for raw in broker.lrange("default", 0, -1)]
    return [(m["headers"]["task"], json.loads(base64.b64decode(m["body"]))[0]) for m in messages]


def test_completing_an_upload_and_registering_its_version_queue_the_worker_tasks_by_name(
    api_client, s3_endpoint, iris, large_archive, broker, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        upload_id = upload_through_the_api(api_client, large_archive)
    assert queued(broker) == [("registry.verify_upload", [upload_id])]
    broker.flushdb()
    with django_capture_on_commit_callbacks(execute=True):
        version = uploads.verify_upload(upload_id).version
    assert queued(broker) == [("registry.verify_version_bytes", [version.pk])]
    assert {Job.VERIFY_UPLOAD, Job.VERIFY_VERSION_BYTES} == {tasks.verify_upload_task.name,
                                                            tasks.verify_version_bytes_task.name}


def test_two_uploads_claiming_one_digest_never_share_bytes(api_client, s3_endpoint, iris, large_archive, tmp_path):
    genuine = sha256_of(large_archive)
    impostor = make_large_archive(tmp_path / "iris.tar", weights_bytes=11 * MiB)  # other bytes, same claim
    first = uploads.verify_upload(upload_through_the_api(api_client, impostor, sha256=genuine)).version
    second = uploads.verify_upload(upload_through_the_api(api_client, large_archive, sha256=genuine)).version

    assert first.artifact_key == f"uploads/{Upload.objects.get(version=first).pk}"
    assert second.artifact_key == f"uploads/{Upload.objects.get(version=second).pk}"
    assert integrity.verify_version_bytes(first.pk).status == "corrupt"
    assert integrity.verify_version_bytes(second.pk).sha256_verified_at is not None


def _zip_of_a_model_dir(path: Path, weights_bytes: int) -> Path:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as archive:
        archive.writestr("iris/config.pbtxt", VALID_CONFIG)
        archive.writestr("iris/1/model.py", "class TritonPythonModel:\n    pass\n")
        archive.writestr("iris/1/model.bin", os.urandom(weights_bytes))
    return path


@pytest.mark.parametrize("kind", ["zip", "tar"])
def test_a_zip_or_plain_tar_becomes_a_version_without_its_body_being_read(api_client, s3_endpoint, iris, tmp_path,
                                                                          kind):
    size = 40 * MiB
    if kind == "zip":
        archive = _zip_of_a_model_dir(tmp_path / "iris.zip", size)
    else:
        archive = make_large_archive(tmp_path / "iris.tar", weights_bytes=size)
    upload_id = upload_through_the_api(api_client, archive)
    store = ArtifactStore()
    with GetCounter(store) as gets:
        done = uploads.verify_upload(upload_id, store=store)
    assert (done.status, done.verification) == ("completed", "part_etags"), done.error
    assert done.version.artifact_files == ["model.bin", "model.py"]
    # The head (first headers, config.pbtxt) and the tail (a zip's central directory, a tar's last
    # header and end-of-archive marker): two ranged GETs of 64 KiB, whatever the archive's size.
    assert (gets.requests, gets.bytes) == (2, 2 * 64 * 1024)
    assert archive.stat().st_size > 40 * MiB


def test_a_compressed_tar_is_read_once_and_its_sha256_checked_then(api_client, s3_endpoint, iris, tmp_path):
    archive = tmp_path / "iris.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        plain = make_large_archive(tmp_path / "inner.tar", weights_bytes=12 * MiB)
        with tarfile.open(plain) as inner:
            for member in inner.getmembers():
                tar.addfile(member, inner.extractfile(member))
    upload_id = upload_through_the_api(api_client, archive)
    store = ArtifactStore()
    with GetCounter(store) as gets:
        done = uploads.verify_upload(upload_id, store=store)
    assert done.status == "completed", done.error
    assert done.version.sha256_verified_at is not None  # hashed on the way, no re-hash needed
    # One 64 KiB ranged GET tells the kind from the first bytes; then one GET streams the object once.
    assert gets.requests == 2 and archive.stat().st_size <= gets.bytes <= archive.stat().st_size + 64 * 1024


def test_a_store_whose_etags_are_not_md5s_falls_back_to_the_read_back_and_says_so(
    api_client, s3_endpoint, iris, large_archive, settings
):
    settings.S3_ETAGS_ARE_MD5 = False
    upload_id = upload_through_the_api(api_client, large_archive, sha256="0" * 64)
    failed = uploads.verify_upload(upload_id)
    assert (failed.status, failed.verification) == ("failed", "read_back")
    assert "ETags are not MD5s" in failed.verification_note
    shown = api_client.get(f"/api/v1/uploads/{upload_id}/").json()
    assert shown["verification_note"] == failed.verification_note
    assert f"sha256 {sha256_of(large_archive)}, not the declared" in failed.error


def test_the_ranged_reader_returns_the_objects_bytes_and_fetches_the_head_and_tail_once_each(s3_endpoint):
    store = ArtifactStore()
    store.ensure_bucket()
    data = os.urandom(3 * MiB + 123)
    store.client.put_object(Bucket=store.bucket, Key="tests/ranged", Body=data)
    reader = store.open_ranged("tests/ranged", len(data))
    assert reader.read(512) == data[:512]
    reader.seek(-22, os.SEEK_END)
    assert reader.read(22) == data[-22:]
    reader.seek(-70_000, os.SEEK_END)  # reaches before the tail block: one more request
    assert reader.read(100) == data[-70_000:-69_900]
    reader.seek(0)
    assert reader.read(1000) == data[:1000]  # still held
    assert reader.requests == 3
    reader.seek(MiB)
    assert reader.read(2 * MiB) == data[MiB : 3 * MiB]  # a read larger than the read-ahead: one request
    assert reader.requests == 4 and reader.read(10**9) == data[3 * MiB :]
    assert reader.read(10) == b""


def test_prefetching_both_ends_fetches_each_block_once_and_serves_reads_from_them(s3_endpoint):
    store = ArtifactStore()
    store.ensure_bucket()
    data = os.urandom(MiB)
    store.client.put_object(Bucket=store.bucket, Key="tests/ends", Body=data)
    reader = store.open_ranged("tests/ends", len(data), prefetch_ends=True)
    assert reader.requests == 2
    assert reader.read(100) == data[:100]
    reader.seek(-100, os.SEEK_END)
    assert reader.read() == data[-100:] and reader.requests == 2
    small = store.open_ranged("tests/ends-small", 10, prefetch_ends=False)
    assert small.requests == 0


@pytest.mark.parametrize(("answer", "md5"), [
    ({}, True), ({"ServerSideEncryption": "AES256"}, True), ({"ServerSideEncryption": "aws:kms"}, False),
    ({"ServerSideEncryption": "aws:kms:dsse"}, False), ({"SSECustomerAlgorithm": "AES256"}, False),
])
def test_an_upload_that_aws_says_is_kms_or_customer_key_encrypted_is_known_to_have_no_md5_etags(
    s3_endpoint, settings, answer, md5
):
    # moto reports no encryption on CreateMultipartUpload, so AWS's answer is stubbed (botocore's Stubber).
    from botocore.stub import Stubber

    settings.S3_CREATE_BUCKET = False
    store = ArtifactStore()
    with Stubber(store.client) as stub:
        stub.add_response("create_multipart_upload", {"UploadId": "u-1", **answer},
                          {"Bucket": store.bucket, "Key": "uploads/x", "ContentType": "application/octet-stream",
                           "ChecksumAlgorithm": "SHA256"})
        started = store.start_multipart("uploads/x", checksum_sha256=True)
    assert (started.upload_id, started.etags_are_md5) == ("u-1", md5)


def test_a_bentoml_model_is_inspected_and_hashed_in_one_stream_with_its_signature(
    api_client, s3_endpoint, iris, bentoml_exports
):
    from tests.registry.format_builders import SIGNATURE

    bentomodel = bentoml_exports[0]
    upload_id = start(api_client, bentomodel, sha256=sha256_of(bentomodel), signature=SIGNATURE).json()["id"]
    put_parts(api_client, upload_id, bentomodel, list(range(1, -(-bentomodel.stat().st_size // PART) + 1)))
    assert complete(api_client, upload_id).status_code == 202
    store = ArtifactStore()
    with GetCounter(store) as gets:
        done = uploads.verify_upload(upload_id, store=store)
    assert (done.status, done.verification) == ("completed", "part_etags"), done.error
    version = done.version
    assert version.format == "bentomodel" and version.sha256_verified_at is not None
    assert [t["name"] for t in version.signature["inputs"]] == [t["name"] for t in SIGNATURE["inputs"]]
    assert gets.requests == 2  # the first bytes to tell the kind, then the one stream


def test_a_signature_for_a_triton_archive_is_refused_as_through_the_web_process(api_client, s3_endpoint, iris,
                                                                                large_archive):
    upload_id = start(api_client, large_archive, sha256=sha256_of(large_archive),
                      signature={"inputs": [], "outputs": []}).json()["id"]
    put_parts(api_client, upload_id, large_archive, [1, 2, 3])
    complete(api_client, upload_id)
    failed = uploads.verify_upload(upload_id)
    assert failed.status == "failed" and "apply to single-file uploads" in failed.error
