"""BentoML models (.bentomodel) and Bentos (.bento) built and exported by BentoML itself."""

import hashlib
import io
import tarfile

import pytest

from deployments.models import Deployment, ServingHost
from registry.models import ModelVersion, RegisteredModel
from tests.registry.format_builders import SIGNATURE, bucket_keys, upload

pytestmark = pytest.mark.django_db


@pytest.fixture
def iris(db):
    return RegisteredModel.objects.create(name="iris")


def rewritten(source, target, member: str, data: bytes | None, mode: str = "w:xz"):
    """Copy the tar ``source`` to ``target`` with ``member`` replaced by ``data`` (None: left out)."""
    with tarfile.open(source) as src, tarfile.open(target, mode) as dst:
        for info in src.getmembers():
            if info.name.removeprefix("./") != member:
                dst.addfile(info, src.extractfile(info) if info.isfile() else None)
            elif data is not None:
                info.size = len(data)
                dst.addfile(info, io.BytesIO(data))
    return target


def model_yaml(bentomodel) -> bytes:
    with tarfile.open(bentomodel) as tar:
        return tar.extractfile("./model.yaml").read()


def test_it_registers_a_bentoml_model_as_uploaded_with_its_tag_and_methods(api_client, s3_endpoint, iris,
                                                                            bentoml_exports):
    bentomodel, _ = bentoml_exports
    answer = upload(api_client, "iris", bentomodel)
    assert answer.status_code == 201, answer.content
    body = answer.json()
    assert body["format"] == "bentomodel"
    assert body["artifact_sha256"] == hashlib.sha256(bentomodel.read_bytes()).hexdigest()
    bentoml_info = body["signature"]["bentoml"]
    assert bentoml_info["tag"].startswith("iris:") and bentoml_info["module"] == "bentoml.sklearn"
    assert bentoml_info["methods"] == [{"name": "predict", "batchable": True, "batch_dim": [0, 0]}]
    version = ModelVersion.objects.get(model=iris)
    assert version.config_text == model_yaml(bentomodel).decode()
    assert "model.yaml" in version.artifact_files and "saved_model.pkl" in version.artifact_files


def test_a_signature_given_with_a_bentoml_model_records_its_tensor_types(api_client, s3_endpoint, iris,
                                                                        bentoml_exports):
    answer = upload(api_client, "iris", bentoml_exports[0], signature=SIGNATURE)
    assert answer.status_code == 201, answer.content
    assert answer.json()["signature"]["inputs"] == SIGNATURE["inputs"]


def test_it_registers_a_bento_with_the_inputs_and_outputs_of_its_api(api_client, s3_endpoint, iris, bentoml_exports,
                                                                      client, user):
    answer = upload(api_client, "iris", bentoml_exports[1])
    assert answer.status_code == 201, answer.content
    signature = answer.json()["signature"]
    assert answer.json()["format"] == "bento"
    assert signature["inputs"] == [{"api": "classify", "name": "features", "data_type": "numpy-array", "dims": []}]
    assert signature["outputs"] == [{"api": "classify", "name": "output", "data_type": "numpy-array", "dims": []}]
    assert signature["bentoml"]["apis"] == [{"name": "classify", "route": "/classify", "batchable": False}]
    assert [tag.split(":")[0] for tag in signature["bentoml"]["models"]] == ["iris"]

    client.force_login(user)
    html = client.get("/models/iris/versions/1/").content.decode()
    assert "Bento archive (.bento)" in html and signature["bentoml"]["tag"] in html
    assert "classify: <code>features</code>" in html and "bento.yaml" in html


def _truncated(bentomodel, path):
    path.write_bytes(bentomodel.read_bytes()[: bentomodel.stat().st_size // 2])
    return path


def _garbage(bentomodel, path):
    path.write_bytes(b"not an archive at all")
    return path


def _yaml_with(field: str, value: str):
    def write(bentomodel, path):
        text = model_yaml(bentomodel).decode()
        lines = [f"{field}: {value}" if line.startswith(f"{field}:") else line for line in text.splitlines()]
        return rewritten(bentomodel, path, "model.yaml", "\n".join(lines).encode())
    return write


BAD_BENTOML = {
    "truncated": ("iris.bentomodel", _truncated, "truncated or corrupt"),
    "not an archive": ("iris.bentomodel", _garbage, "not a .tar.gz"),
    "missing model.yaml": (
        "iris.bentomodel", lambda b, p: rewritten(b, p, "model.yaml", None), "must hold model.yaml at its root"),
    "model.yaml that is no mapping": (
        "iris.bentomodel", lambda b, p: rewritten(b, p, "model.yaml", b"- a list\n"), "model.yaml is not valid"),
    "model.yaml without a module": (
        "iris.bentomodel", lambda b, p: rewritten(b, p, "model.yaml", model_yaml(b).replace(b"module:", b"modul:")),
        "model.yaml is not valid",
    ),
    "tag with upper-case letters": ("iris.bentomodel", _yaml_with("name", "Iris"), "upper-case"),
    "tag against BentoML's rules": ("iris.bentomodel", _yaml_with("version", "v1!"), "not a valid BentoML tag"),
    "tag of another model": ("iris.bentomodel", _yaml_with("name", "other"), "must be the same"),
    "gzip instead of xz": (
        "iris.bentomodel", lambda b, p: rewritten(b, p, "none", None, mode="w:gz"), "xz-compressed tar"),
    "bento without bento.yaml": ("iris.bento", lambda b, p: rewritten(b, p, "model.yaml", None),
                                 "must hold bento.yaml"),
}


@pytest.mark.parametrize("case", sorted(BAD_BENTOML))
def test_it_refuses_a_bad_bentoml_archive_and_leaves_nothing_behind(api_client, s3_endpoint, iris, bentoml_exports,
                                                                    tmp_path, case):
    filename, write, message = BAD_BENTOML[case]
    before = bucket_keys()
    answer = upload(api_client, "iris", write(bentoml_exports[0], tmp_path / filename))
    assert answer.status_code == 400, answer.content
    assert message in answer.json()["detail"]
    assert not ModelVersion.objects.exists()
    assert bucket_keys() == before


def test_it_refuses_a_bento_that_lacks_a_model_it_uses(api_client, s3_endpoint, iris, bentoml_exports, tmp_path):
    _, bento = bentoml_exports
    stripped = tmp_path / "iris.bento"
    with tarfile.open(bento) as src, tarfile.open(stripped, "w:xz") as dst:
        for info in src.getmembers():
            if not info.name.startswith("./models/"):
                dst.addfile(info, src.extractfile(info) if info.isfile() else None)
    answer = upload(api_client, "iris", stripped)
    assert answer.status_code == 400 and "uses models it does not hold" in answer.json()["detail"]
    assert not ModelVersion.objects.exists()


def test_it_refuses_a_bentoml_model_registered_under_another_name(api_client, s3_endpoint, bentoml_exports):
    RegisteredModel.objects.create(name="flowers")
    answer = upload(api_client, "flowers", bentoml_exports[0])
    assert answer.status_code == 400
    detail = answer.json()["detail"]
    assert "'iris:" in detail and "'flowers'" in detail


def test_a_triton_host_refuses_to_deploy_a_bentoml_model(api_client, s3_endpoint, iris, bentoml_exports):
    assert upload(api_client, "iris", bentoml_exports[0]).status_code == 201
    ServingHost.objects.create(name="gpu-0", inference_url="http://gpu-0.internal:8000")
    answer = api_client.post("/api/v1/deployments/", {"model": "iris", "version": 1, "hosts": ["gpu-0"]},
                             format="json")
    assert answer.status_code == 409, answer.content
    assert "BentoML model archive" in answer.json()["detail"] and "'gpu-0'" in answer.json()["detail"]
    assert not Deployment.objects.exists()


def test_the_demo_iris_bento_registers_with_its_classify_api_and_classifier(api_client, s3_endpoint, tmp_path):
    from demo.iris_bento import CLASSIFIER_NAME, build_iris_bento

    RegisteredModel.objects.create(name="iris-bento")
    answer = upload(api_client, "iris-bento", build_iris_bento(tmp_path))
    assert answer.status_code == 201, answer.content
    bentoml_info = answer.json()["signature"]["bentoml"]
    assert bentoml_info["tag"].startswith("iris-bento:") and bentoml_info["service"] == "service:IrisClassifier"
    assert bentoml_info["apis"] == [{"name": "classify", "route": "/classify", "batchable": False}]
    assert [tag.split(":")[0] for tag in bentoml_info["models"]] == [CLASSIFIER_NAME]
