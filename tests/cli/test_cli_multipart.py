"""``modelyard register`` of a large artifact: straight to S3 in parts, resumable, against a live server."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import requests
from django.contrib.auth import get_user_model

from registry.models import ModelVersion, RegisteredModel, Upload
from registry.storage import ArtifactStore
from tests.factories import team_member, token_for
from tests.fixtures.services import wait_for
from tests.registry.conftest import VALID_CONFIG, MiB, make_large_archive
from tests.registry.uploading import PART, part_bytes, sha256_of

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
CLI = Path(sys.executable).parent / "modelyard"
MULTIPART = ["--multipart-threshold", "0", "--part-size", str(PART), "--parallel", "2"]


@pytest.fixture
def worker(s3_endpoint, start_celery_worker):
    return start_celery_worker("default", env={"MODELYARD_S3_ENDPOINT_URL": s3_endpoint})


@pytest.fixture
def cli(live_server, s3_endpoint, worker):
    user = team_member(get_user_model().objects.create_user(username="ci"))
    env = {**os.environ, "MODELYARD_URL": live_server.url, "MODELYARD_TOKEN": token_for(user)}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(CLI), *args], env=env, capture_output=True, text=True, timeout=180)

    RegisteredModel.objects.create(name="iris")
    return run


@pytest.fixture
def archive(tmp_path) -> Path:
    return make_large_archive(tmp_path / "iris.tar", weights_bytes=11 * MiB)


def test_a_large_file_goes_to_s3_in_parts_with_a_progress_bar_and_becomes_a_version(cli, archive):
    result = cli("register", "iris", str(archive), "--metadata", '{"commit": "abc123"}', *MULTIPART)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert (out["version"], out["sha256"]) == (1, sha256_of(archive))
    assert "3 parts of 5242880 bytes" in result.stderr and "uploading: 100%" in result.stderr
    version = ModelVersion.objects.get(model__name="iris", version=1)
    assert version.metadata == {"commit": "abc123"} and version.created_by.username == "ci"
    assert Upload.objects.get().status == "completed"


def test_a_directory_is_packed_and_uploaded_in_parts(cli, tmp_path):
    model_dir = tmp_path / "iris"
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "config.pbtxt").write_bytes(VALID_CONFIG)
    (model_dir / "1" / "model.py").write_text("class TritonPythonModel:\n    pass\n")
    (model_dir / "1" / "model.bin").write_bytes(os.urandom(6 * MiB))
    result = cli("register", "iris", str(model_dir), *MULTIPART)
    assert result.returncode == 0, result.stderr
    assert ModelVersion.objects.get(model__name="iris").artifact_filename == "iris.tar.gz"


def test_a_part_that_keeps_failing_exits_non_zero_and_resume_finishes_the_upload(cli, archive, monkeypatch):
    from registry import uploads

    real_presign = ArtifactStore.presign_part

    def broken_second_part(self, key, upload_id, number, expires_in, **digests):  # a fault S3 cannot be asked for
        url, headers = real_presign(self, key, upload_id, number, expires_in, **digests)
        return (url.replace("uploadId=", "uploadId=gone") if number == 2 else url), headers  # S3: NoSuchUpload

    monkeypatch.setattr(uploads.ArtifactStore, "presign_part", broken_second_part)
    failed = cli("register", "iris", str(archive), "--quiet", *MULTIPART)
    assert failed.returncode == 1
    upload = Upload.objects.get()
    assert "part 2 could not be uploaded after 3 attempts" in failed.stderr
    assert f"resume with --resume {upload.pk}" in failed.stderr
    assert upload.status == "open" and not ModelVersion.objects.exists()

    monkeypatch.setattr(uploads.ArtifactStore, "presign_part", real_presign)
    resumed = cli("register", "iris", str(archive), "--quiet", "--resume", str(upload.pk), *MULTIPART)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["version"] == 1
    assert Upload.objects.get().version.artifact_sha256 == sha256_of(archive)


def test_resume_skips_the_parts_s3_already_holds(cli, archive, api_client, live_server):
    body = api_client.post("/api/v1/models/iris/uploads/", {"filename": archive.name, "size": archive.stat().st_size,
                                                             "part_size": PART}, format="json").json()
    url = api_client.post(f"/api/v1/uploads/{body['id']}/parts/", {"part_numbers": [1]}, format="json").json()
    assert requests.put(url["parts"][0]["url"], data=part_bytes(archive, 1), timeout=30).status_code == 200
    Upload.objects.filter(pk=body["id"]).update(created_by=get_user_model().objects.get(username="ci"))

    resumed = cli("register", "iris", str(archive), "--resume", body["id"], *MULTIPART)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["sha256"] == sha256_of(archive)
    upload = Upload.objects.get(pk=body["id"])
    assert upload.verification == "part_etags"  # part 1 was declared on resume, its ETag matching
    assert upload.declared_parts.count() == 3


def test_resume_sends_again_a_part_s3_holds_other_bytes_of(cli, archive, api_client):
    body = api_client.post("/api/v1/models/iris/uploads/", {"filename": archive.name, "size": archive.stat().st_size,
                                                             "part_size": PART}, format="json").json()
    url = api_client.post(f"/api/v1/uploads/{body['id']}/parts/", {"part_numbers": [1]}, format="json").json()
    assert requests.put(url["parts"][0]["url"], data=os.urandom(PART), timeout=30).status_code == 200
    Upload.objects.filter(pk=body["id"]).update(created_by=get_user_model().objects.get(username="ci"))

    resumed = cli("register", "iris", str(archive), "--quiet", "--resume", body["id"], *MULTIPART)
    assert resumed.returncode == 0, resumed.stderr
    assert Upload.objects.get(pk=body["id"]).version.artifact_sha256 == sha256_of(archive)


def test_a_file_the_server_refuses_exits_non_zero_with_the_reason(cli, tmp_path):
    junk = tmp_path / "junk.tar"
    junk.write_bytes(os.urandom(6 * MiB))
    result = cli("register", "iris", str(junk), "--quiet", *MULTIPART)
    assert result.returncode == 1
    assert "the server refused the upload: artifact refused" in result.stderr
    wait_for(lambda: Upload.objects.get().status == "failed", timeout=5, what="the failed upload")
