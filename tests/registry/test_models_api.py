"""The registry API as CI uses it: models and versions, with real S3 (the stand-in server)."""

import io
import json
import tarfile

import pytest
from django.test import override_settings

from audit.models import AuditEvent
from registry.models import ModelVersion, RegisteredModel
from registry.storage import ArtifactStore, artifact_key
from tests.registry.conftest import VALID_CONFIG, make_tar

pytestmark = pytest.mark.django_db


def bucket_keys() -> set[str]:
    store = ArtifactStore()
    answer = store.client.list_objects_v2(Bucket=store.bucket)
    return {item["Key"] for item in answer.get("Contents", [])}


def upload(api_client, name: str, path, metadata=None):
    with open(path, "rb") as fh:
        data = {"artifact": fh}
        if metadata is not None:
            data["metadata"] = metadata
        return api_client.post(f"/api/v1/models/{name}/versions/", data, format="multipart")


def test_it_creates_lists_and_shows_a_model(api_client):
    created = api_client.post(
        "/api/v1/models/", {"name": "iris", "description": "flowers", "tags": {"team": "ml"}}, format="json"
    )
    assert created.status_code == 201, created.content
    assert created.json()["name"] == "iris"
    listing = api_client.get("/api/v1/models/").json()
    assert [m["name"] for m in listing["results"]] == ["iris"]
    detail = api_client.get("/api/v1/models/iris/").json()
    assert detail["tags"] == {"team": "ml"} and detail["latest_version"] is None
    assert AuditEvent.objects.filter(action="model.created", actor_label="engineer").count() == 1


def test_it_refuses_a_second_model_with_the_same_name(api_client):
    assert api_client.post("/api/v1/models/", {"name": "iris"}, format="json").status_code == 201
    again = api_client.post("/api/v1/models/", {"name": " iris "}, format="json")
    assert again.status_code == 409
    assert "already exists" in again.json()["detail"]


@pytest.mark.parametrize("name", ["Iris", "iris/v1", "../iris", "iris..x", "-iris", "iris:1", "a" * 64, "", "ir%2fis"])
def test_it_refuses_a_model_name_triton_or_bentoml_would_reject(api_client, name):
    answer = api_client.post("/api/v1/models/", {"name": name}, format="json")
    assert answer.status_code == 400
    assert answer.json()["detail"] if "detail" in answer.json() else answer.json()["name"]
    assert not RegisteredModel.objects.exists()


def test_it_requires_a_token(client, db):
    assert client.get("/api/v1/models/").status_code in (401, 403)


def test_it_registers_a_version_in_s3_with_its_size_and_sha256(api_client, s3_endpoint, iris_archive):
    import hashlib

    api_client.post("/api/v1/models/", {"name": "iris"}, format="json")
    answer = upload(api_client, "iris", iris_archive, metadata=json.dumps({"commit": "abc123"}))
    assert answer.status_code == 201, answer.content
    body = answer.json()
    expected_sha = hashlib.sha256(iris_archive.read_bytes()).hexdigest()
    assert (body["version"], body["status"]) == (1, "ready")
    assert body["artifact_sha256"] == expected_sha
    assert body["artifact_size"] == iris_archive.stat().st_size
    assert body["metadata"] == {"commit": "abc123"}
    assert [i["name"] for i in body["signature"]["inputs"]] == ["input"]
    assert artifact_key(expected_sha) in bucket_keys()
    second = upload(api_client, "iris", iris_archive)
    assert second.json()["version"] == 2
    listing = api_client.get("/api/v1/models/iris/versions/").json()
    assert [v["version"] for v in listing["results"]] == [2, 1]
    assert api_client.get("/api/v1/models/iris/versions/1/").json()["artifact_sha256"] == expected_sha


def _tar_with_link(path):
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo("iris/config.pbtxt")
        info.size = len(VALID_CONFIG)
        tar.addfile(info, io.BytesIO(VALID_CONFIG))
        link = tarfile.TarInfo("iris/1/model.py")
        link.type = tarfile.SYMTYPE
        link.linkname = "/etc/passwd"
        tar.addfile(link)
    return path


BAD_ARTIFACTS = {
    "not an archive": lambda p: (p.write_bytes(b"just some text, not an archive"), p)[1],
    "dot-dot member": lambda p: make_tar(p, {"config.pbtxt": VALID_CONFIG, "1/../../evil.py": b"x"}),
    "absolute member": lambda p: make_tar(p, {"config.pbtxt": VALID_CONFIG, "/1/model.py": b"x"}),
    "link member": _tar_with_link,
    "missing config": lambda p: make_tar(p, {"1/model.py": b"x"}),
    "invalid config": lambda p: make_tar(p, {"config.pbtxt": b"name: {{{ nonsense", "1/model.py": b"x"}),
    "config of another model": lambda p: make_tar(
        p, {"config.pbtxt": VALID_CONFIG.replace(b'"iris"', b'"other"'), "1/model.py": b"x"}
    ),
}


@pytest.mark.parametrize("kind", sorted(BAD_ARTIFACTS))
def test_it_refuses_a_bad_artifact_and_leaves_nothing_behind(api_client, s3_endpoint, tmp_path, kind):
    api_client.post("/api/v1/models/", {"name": "iris"}, format="json")
    before = bucket_keys()
    artifact = BAD_ARTIFACTS[kind](tmp_path / "artifact.tar.gz")
    answer = upload(api_client, "iris", artifact)
    assert answer.status_code == 400, answer.content
    assert answer.json()["detail"]
    assert not ModelVersion.objects.exists()
    assert bucket_keys() == before


def test_it_refuses_metadata_that_is_not_a_json_object(api_client, s3_endpoint, iris_archive):
    api_client.post("/api/v1/models/", {"name": "iris"}, format="json")
    answer = upload(api_client, "iris", iris_archive, metadata="[1, 2]")
    assert answer.status_code == 400
    assert "metadata" in answer.json()["fields"]
    assert not ModelVersion.objects.exists()


def test_it_refuses_a_sample_input_that_does_not_fit_the_model(api_client, s3_endpoint, iris_archive):
    """The smoke inference of every rollout sends it, so a wrong one is refused at registration."""
    api_client.post("/api/v1/models/", {"name": "iris"}, format="json")
    wrong_name = upload(api_client, "iris", iris_archive, metadata='{"sample_input": {"INPUT": [[1, 2, 3, 4]]}}')
    assert wrong_name.status_code == 400 and "exactly the model's inputs" in wrong_name.json()["detail"]
    assert not ModelVersion.objects.exists()
    right = upload(api_client, "iris", iris_archive, metadata='{"sample_input": {"input": [[5.1, 3.5, 1.4, 0.2]]}}')
    assert right.status_code == 201, right.content


def test_a_deleted_version_is_a_404_that_names_it(api_client, s3_endpoint, iris_archive):
    api_client.post("/api/v1/models/", {"name": "iris"}, format="json")
    assert upload(api_client, "iris", iris_archive).status_code == 201
    assert api_client.delete("/api/v1/models/iris/versions/1/").status_code == 204
    answer = api_client.get("/api/v1/models/iris/versions/1/")
    assert answer.status_code == 404 and "'iris' has no version 1" in answer.json()["detail"]


def test_it_answers_404_for_a_version_of_an_unknown_model(api_client, iris_archive):
    assert upload(api_client, "nope", iris_archive).status_code == 404
    assert api_client.get("/api/v1/models/nope/versions/").status_code == 404


def test_it_answers_503_and_writes_no_version_when_s3_is_down(api_client, iris_archive):
    from tests.fixtures.services import free_port

    api_client.post("/api/v1/models/", {"name": "iris"}, format="json")
    with override_settings(S3_ENDPOINT_URL=f"http://127.0.0.1:{free_port()}", S3_CONNECT_TIMEOUT=1):
        answer = upload(api_client, "iris", iris_archive)
    assert answer.status_code == 503
    assert "could not be stored" in answer.json()["detail"]
    assert not ModelVersion.objects.exists()
    assert RegisteredModel.objects.get(name="iris").next_version == 1


def test_the_version_page_shows_signature_files_config_and_a_working_download(api_client, client, user, s3_endpoint,
                                                                              iris_archive):
    import requests

    api_client.post("/api/v1/models/", {"name": "iris"}, format="json")
    upload(api_client, "iris", iris_archive, metadata=json.dumps({"commit": "abc123"}))
    client.force_login(user)
    page = client.get("/models/iris/versions/1/").content.decode()
    assert "<code>input</code>" in page and "TYPE_FP32" in page
    assert "1/model.onnx" in page and "1/model.py" in page
    assert 'backend: &quot;python&quot;' in page and "abc123" in page
    download = client.get("/models/iris/versions/1/download")
    assert download.status_code == 302
    fetched = requests.get(download["Location"], timeout=10)
    assert fetched.status_code == 200 and fetched.content == iris_archive.read_bytes()
    assert client.get("/models/iris/versions/9/").status_code == 404


def test_a_version_carries_lineage_and_tags_and_versions_are_searchable_by_them(api_client, client, user,
                                                                                 s3_endpoint, iris_archive):
    api_client.post("/api/v1/models/", {"name": "iris"}, format="json")
    with open(iris_archive, "rb") as fh:
        answer = api_client.post("/api/v1/models/iris/versions/", {
            "artifact": fh, "source_commit": "ABC123def", "ci_run_url": "https://ci.example.com/runs/42",
            "training_data_uri": "s3://datasets/iris/2026-11", "metrics": json.dumps({"accuracy": 0.97}),
            "tags": json.dumps({"stage": "candidate"}),
        }, format="multipart")
    assert answer.status_code == 201, answer.content
    body = answer.json()
    assert (body["source_commit"], body["metrics"], body["tags"]) == ("abc123def", {"accuracy": 0.97},
                                                                      {"stage": "candidate"})
    upload(api_client, "iris", iris_archive)
    assert [v["version"] for v in api_client.get("/api/v1/models/iris/versions/?source_commit=abc1").json()[
        "results"]] == [1]
    assert [v["version"] for v in api_client.get("/api/v1/models/iris/versions/?tag=stage%3Dcandidate").json()[
        "results"]] == [1]
    client.force_login(user)
    page = client.get("/models/iris/versions/1/").content.decode()
    assert "abc123def" in page and "https://ci.example.com/runs/42" in page and "accuracy" in page


@pytest.mark.parametrize("field,value", [
    ("source_commit", "not-a-commit"), ("ci_run_url", "javascript:alert(1)"), ("metrics", '{"accuracy": "high"}'),
    ("tags", '{"stage": 3}'),
])
def test_it_refuses_bad_lineage_and_writes_no_version(api_client, s3_endpoint, iris_archive, field, value):
    api_client.post("/api/v1/models/", {"name": "iris"}, format="json")
    with open(iris_archive, "rb") as fh:
        answer = api_client.post("/api/v1/models/iris/versions/", {"artifact": fh, field: value}, format="multipart")
    assert answer.status_code == 400, answer.content
    assert not ModelVersion.objects.exists()
