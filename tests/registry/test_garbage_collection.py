"""Garbage collection of the artifact bucket against the real S3 endpoint (moto's server)."""

import hashlib
import threading
import uuid
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from audit.choices import AuditAction
from audit.models import AuditEvent
from registry.choices import ArtifactFormat, UploadStatus, VersionStatus
from registry.gc import collect_garbage
from registry.models import ModelVersion, RegisteredModel, Upload
from registry.storage import ArtifactStore
from registry.versions import register_version


@pytest.fixture
def store(s3_endpoint) -> ArtifactStore:
    """A bucket of this test's own, so collecting never touches another test's objects."""
    bucket = ArtifactStore(bucket=f"gc-{uuid.uuid4().hex[:12]}")
    bucket.ensure_bucket()
    return bucket


def keys(store: ArtifactStore) -> set[str]:
    return {item.key for item in store.list_objects("")}


def stored(store: ArtifactStore, tmp_path, content: bytes) -> str:
    path = tmp_path / hashlib.sha256(content).hexdigest()
    path.write_bytes(content)
    return store.put_artifact(path, sha256=path.name, size=len(content)).key


def version_of(model: RegisteredModel, number: int, key: str, status=VersionStatus.READY) -> ModelVersion:
    return ModelVersion.objects.create(
        model=model, version=number, status=status, format=ArtifactFormat.TRITON_MODEL_DIR, artifact_key=key,
        artifact_sha256=key.rsplit("/", 1)[-1], artifact_size=1,
    )


@pytest.mark.django_db
def test_unreferenced_old_objects_go_and_referenced_ones_survive(store, tmp_path):
    model = RegisteredModel.objects.create(name="iris")
    live, deleted, orphan = (stored(store, tmp_path, data) for data in (b"live", b"deleted", b"orphan"))
    version_of(model, 1, live)
    version_of(model, 2, deleted, status=VersionStatus.DELETED)

    report = collect_garbage(grace_seconds=0, store=store)

    assert keys(store) == {live}
    assert sorted(report.deleted_keys) == sorted([deleted, orphan])
    assert (report.scanned, report.kept_referenced, report.bytes_freed) == (3, 1, len(b"deleted") + len(b"orphan"))
    event = AuditEvent.objects.get(action=AuditAction.ARTIFACTS_COLLECTED)
    assert event.data["deleted"] == 2 and event.actor_label == "system"
    again = collect_garbage(grace_seconds=0, store=store)
    assert again.deleted_keys == [] and keys(store) == {live}
    assert AuditEvent.objects.filter(action=AuditAction.ARTIFACTS_COLLECTED).count() == 1


@pytest.mark.django_db
def test_an_unreferenced_object_younger_than_the_grace_period_survives(store, tmp_path):
    young = stored(store, tmp_path, b"just stored")
    report = collect_garbage(grace_seconds=3600, store=store)
    assert keys(store) == {young} and report.kept_young == 1 and report.deleted_keys == []


@pytest.mark.django_db
def test_content_shared_by_a_deleted_and_a_live_version_survives(store, tmp_path):
    shared = stored(store, tmp_path, b"same bytes")
    version_of(RegisteredModel.objects.create(name="iris"), 1, shared, status=VersionStatus.DELETED)
    version_of(RegisteredModel.objects.create(name="iris-copy"), 1, shared)
    collect_garbage(grace_seconds=0, store=store)
    assert keys(store) == {shared}


@pytest.mark.django_db
def test_a_dry_run_reports_what_it_would_delete_and_deletes_nothing(store, tmp_path):
    orphan = stored(store, tmp_path, b"orphan")
    report = collect_garbage(dry_run=True, grace_seconds=0, store=store)
    assert report.deleted_keys == [orphan] and keys(store) == {orphan}
    assert "would delete 1" in report.summary()
    assert not AuditEvent.objects.filter(action=AuditAction.ARTIFACTS_COLLECTED).exists()


@pytest.mark.django_db(transaction=True)
def test_an_object_whose_registration_has_not_committed_yet_survives(store, iris_archive):
    """The race: the object is stored (or found and reused) but the version row is not committed."""
    if connection.vendor != "postgresql":
        pytest.skip("the collector's lock against registrations is a PostgreSQL advisory lock")
    model = RegisteredModel.objects.create(name="iris")
    stored_it, commit_it, outcome = threading.Event(), threading.Event(), {}

    class SlowToCommit(ArtifactStore):
        def put_artifact(self, *args, **kwargs):
            result = super().put_artifact(*args, **kwargs)
            stored_it.set()
            commit_it.wait(timeout=60)
            return result

    def register():
        try:
            outcome["version"] = register_version(
                model=model, artifact_path=iris_archive, store=SlowToCommit(bucket=store.bucket)
            )
        finally:
            connection.close()

    thread = threading.Thread(target=register)
    thread.start()
    assert stored_it.wait(timeout=60)
    report = collect_garbage(grace_seconds=0, store=store)
    commit_it.set()
    thread.join(timeout=60)

    key = outcome["version"].artifact_key
    assert report.kept_in_use == 1 and report.deleted_keys == []
    assert keys(store) == {key}
    assert collect_garbage(grace_seconds=0, store=store).deleted_keys == []  # committed: referenced now


@pytest.mark.django_db
def test_staging_objects_and_unfinished_uploads_go_when_their_upload_is_finished_or_unknown(store):
    model = RegisteredModel.objects.create(name="iris")

    def upload_row(key: str, status: str, upload_id: str = "") -> Upload:
        return Upload.objects.create(
            model=model, filename="m.tar.gz", size=4, part_size=4, staging_key=key, s3_upload_id=upload_id or key,
            status=status, expires_at=timezone.now() + timedelta(hours=1),
        )

    for key in ("uploads/open", "uploads/completed", "uploads/unknown", "uploads/adopted"):
        store.client.put_object(Bucket=store.bucket, Key=key, Body=b"part")
    upload_row("uploads/open", UploadStatus.OPEN)
    upload_row("uploads/completed", UploadStatus.COMPLETED)
    upload_row("uploads/adopted", UploadStatus.COMPLETED)
    version_of(model, 1, "uploads/adopted")  # a verified upload that became the version's artifact
    running = store.client.create_multipart_upload(Bucket=store.bucket, Key="uploads/running")["UploadId"]
    abandoned = store.client.create_multipart_upload(Bucket=store.bucket, Key="uploads/abandoned")["UploadId"]
    upload_row("uploads/running", UploadStatus.VERIFYING, upload_id=running)
    upload_row("uploads/abandoned", UploadStatus.ABORTED, upload_id=abandoned)

    report = collect_garbage(grace_seconds=0, store=store)

    assert keys(store) == {"uploads/open", "uploads/adopted"}
    assert sorted(report.deleted_keys) == ["uploads/completed", "uploads/unknown"]
    assert report.aborted_uploads == ["uploads/abandoned"]
    pending = store.client.list_multipart_uploads(Bucket=store.bucket).get("Uploads", [])
    assert [u["UploadId"] for u in pending] == [running]


@pytest.mark.django_db
def test_the_command_prints_the_report_and_honours_dry_run(store, tmp_path, settings, capsys):
    settings.S3_BUCKET = store.bucket
    orphan = stored(store, tmp_path, b"orphan")
    call_command("collect_garbage", "--dry-run", "--grace-seconds", "0")
    assert f"would delete {orphan}" in capsys.readouterr().out and keys(store) == {orphan}
    call_command("collect_garbage", "--grace-seconds", "0")
    assert "deleted 1" in capsys.readouterr().out and keys(store) == set()


@pytest.mark.django_db
def test_collection_is_scheduled_as_a_celery_task(store, tmp_path, settings):
    from modelyard.celery import app
    from registry.tasks import collect_garbage_task

    entry = settings.CELERY_BEAT_SCHEDULE["collect-garbage"]
    assert entry["task"] == "registry.collect_garbage" == collect_garbage_task.name
    assert entry["schedule"] == settings.GC_INTERVAL and "registry.collect_garbage" in app.tasks
    settings.S3_BUCKET, settings.GC_GRACE_SECONDS = store.bucket, 0
    orphan = stored(store, tmp_path, b"orphan")
    assert collect_garbage_task.apply().get()["deleted_keys"] == [orphan]
    assert keys(store) == set()
