"""Single model files (ONNX, TorchScript, TensorRT plan) wrapped into Triton model directories."""

import hashlib
import json
import tarfile
import urllib.request

import pytest

from modelyard_agent.formats.archives import ArchiveLimits, inspect_triton_archive
from modelyard_agent.formats.triton_config import parse_model_config
from registry.models import ModelVersion, RegisteredModel
from registry.storage import ArtifactStore
from tests.registry.format_builders import (
    SIGNATURE,
    bucket_keys,
    upload,
    write_onnx,
    write_onnx_with_sequence_output,
    write_torchscript,
)

pytestmark = pytest.mark.django_db

LIMITS = ArchiveLimits(max_unpacked_bytes=1 << 30, max_compression_ratio=200, max_members=100)


@pytest.fixture
def model(db):
    return RegisteredModel.objects.create(name="double")


def stored_archive(version: ModelVersion, tmp_path):
    """Download the version's stored object to a file and return its path."""
    store = ArtifactStore()
    target = tmp_path / "stored.tar.gz"
    store.client.download_file(store.bucket, version.artifact_key, str(target))
    return target


def test_it_wraps_an_onnx_file_into_a_triton_model_directory_with_a_generated_config(
    api_client, s3_endpoint, model, tmp_path
):
    onnx_file = write_onnx(tmp_path / "double.onnx")
    answer = upload(api_client, "double", onnx_file)
    assert answer.status_code == 201, answer.content
    body = answer.json()
    assert body["format"] == "onnx"
    assert body["signature"]["inputs"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [-1, 4]}]
    assert body["signature"]["outputs"] == [{"name": "y", "data_type": "TYPE_FP32", "dims": [-1, 4]}]
    assert (body["signature"]["platform"], body["signature"]["max_batch_size"]) == ("onnxruntime_onnx", 0)

    version = ModelVersion.objects.get(model=model, version=1)
    config = parse_model_config(version.config_text)
    assert (config.name, config.platform) == ("double", "onnxruntime_onnx")
    assert version.artifact_files == ["model.onnx"] and version.artifact_filename == "double.onnx"
    stored = stored_archive(version, tmp_path)
    assert hashlib.sha256(stored.read_bytes()).hexdigest() == version.artifact_sha256
    layout = inspect_triton_archive(stored, LIMITS)
    assert (layout.model_root, layout.version_dir, layout.files) == ("double/", "1", ("model.onnx",))
    assert layout.config_text == version.config_text
    with tarfile.open(stored) as tar:
        assert tar.extractfile("double/1/model.onnx").read() == onnx_file.read_bytes()


def test_the_same_onnx_file_is_stored_once_under_one_content_address(api_client, s3_endpoint, model, tmp_path):
    onnx_file = write_onnx(tmp_path / "double.onnx")
    first = upload(api_client, "double", onnx_file).json()
    second = upload(api_client, "double", onnx_file).json()
    assert (first["version"], second["version"]) == (1, 2)
    assert first["artifact_sha256"] == second["artifact_sha256"]


def test_max_batch_size_takes_the_batch_dimension_out_of_the_onnx_shapes(api_client, s3_endpoint, model, tmp_path):
    answer = upload(api_client, "double", write_onnx(tmp_path / "double.onnx"), max_batch_size=8)
    assert answer.status_code == 201, answer.content
    signature = answer.json()["signature"]
    assert signature["max_batch_size"] == 8
    assert signature["inputs"][0]["dims"] == [4] and signature["outputs"][0]["dims"] == [4]


def test_a_signature_given_for_an_onnx_file_can_fix_its_open_dimensions(api_client, s3_endpoint, model, tmp_path):
    given = {"inputs": [{"name": "x", "data_type": "TYPE_FP32", "dims": [1, 4]}],
             "outputs": [{"name": "y", "data_type": "TYPE_FP32", "dims": [1, 4]}]}
    answer = upload(api_client, "double", write_onnx(tmp_path / "double.onnx"), signature=given)
    assert answer.status_code == 201, answer.content
    assert answer.json()["signature"]["inputs"][0]["dims"] == [1, 4]


def test_it_wraps_a_torchscript_file_with_the_signature_the_user_gives(api_client, s3_endpoint, model, tmp_path):
    answer = upload(api_client, "double", write_torchscript(tmp_path / "double.pt"), signature=SIGNATURE)
    assert answer.status_code == 201, answer.content
    body = answer.json()
    assert (body["format"], body["signature"]["platform"]) == ("torchscript", "pytorch_libtorch")
    assert body["signature"]["outputs"] == [{"name": "OUTPUT__0", "data_type": "TYPE_FP32", "dims": [-1, 4]}]
    layout = inspect_triton_archive(stored_archive(ModelVersion.objects.get(model=model), tmp_path), LIMITS)
    assert layout.files == ("model.pt",)


def test_it_wraps_a_tensorrt_plan_with_the_signature_the_user_gives(api_client, s3_endpoint, model, tmp_path):
    plan = tmp_path / "double.plan"
    plan.write_bytes(b"opaque engine bytes" * 10)
    answer = upload(api_client, "double", plan, signature=SIGNATURE, max_batch_size=4)
    assert answer.status_code == 201, answer.content
    body = answer.json()
    assert (body["format"], body["signature"]["platform"], body["signature"]["max_batch_size"]) == (
        "tensorrt_plan", "tensorrt_plan", 4,
    )


def _garbage(path):
    path.write_bytes(b"\x00\x01\x02 this is not a protobuf \xff\xfe" * 20)
    return path


def _text(path):
    path.write_text("just some text, not a model")
    return path


BAD_SINGLE_FILES = {
    "unknown suffix": ("model.h5", _garbage, {}, "the registry accepts"),
    "torchscript without a signature": (
        "model.pt", write_torchscript, {}, "does not say what its inputs and outputs are"),
    "tensorrt plan without a signature": ("model.plan", _garbage, {}, "pass signature as JSON"),
    "onnx of garbage bytes": ("model.onnx", _garbage, {}, "not an ONNX model"),
    "onnx of text": ("model.onnx", _text, {}, "not an ONNX model"),
    "onnx with a sequence output": ("model.onnx", write_onnx_with_sequence_output, {}, "not a tensor"),
    "onnx signature naming another input": (
        "model.onnx", write_onnx,
        {"signature": {"inputs": [{"name": "z", "data_type": "TYPE_FP32", "dims": [-1, 4]}],
                       "outputs": [{"name": "y", "data_type": "TYPE_FP32", "dims": [-1, 4]}]}},
        "which the ONNX file does not have",
    ),
    "onnx signature with another type": (
        "model.onnx", write_onnx,
        {"signature": {"inputs": [{"name": "x", "data_type": "TYPE_INT64", "dims": [-1, 4]}],
                       "outputs": [{"name": "y", "data_type": "TYPE_FP32", "dims": [-1, 4]}]}},
        "the ONNX file has TYPE_FP32",
    ),
    "onnx with a fixed batch dimension and max_batch_size": (
        "model.onnx", lambda p: write_onnx(p, batch=1), {"max_batch_size": 8}, "dynamic first dimension"),
    "torch.save weights without code": (
        "model.pt", lambda p: write_torchscript(p, with_code=False), {"signature": SIGNATURE}, "torch.jit.save"),
    "torchscript that is no zip": ("model.pt", _garbage, {"signature": SIGNATURE}, "not a TorchScript model"),
    "signature with an unknown data type": (
        "model.plan", _garbage,
        {"signature": {"inputs": [{"name": "a", "data_type": "float", "dims": [4]}], "outputs": SIGNATURE["outputs"]}},
        "not a Triton data type",
    ),
    "signature with a zero dim": (
        "model.plan", _garbage,
        {"signature": {"inputs": [{"name": "a", "data_type": "FP32", "dims": [0]}], "outputs": SIGNATURE["outputs"]}},
        "each -1 or above 0",
    ),
    "signature on a triton archive": ("model.tar.gz", _garbage, {"signature": SIGNATURE}, "declares them already"),
}


@pytest.mark.parametrize("case", sorted(BAD_SINGLE_FILES))
def test_it_refuses_a_bad_single_file_upload_and_leaves_nothing_behind(api_client, s3_endpoint, model, tmp_path, case):
    filename, write, fields, message = BAD_SINGLE_FILES[case]
    before = bucket_keys()
    answer = upload(api_client, "double", write(tmp_path / filename), **fields)
    assert answer.status_code == 400, answer.content
    assert message in answer.json()["detail"]
    assert not ModelVersion.objects.exists()
    assert bucket_keys() == before


def test_a_signature_that_is_not_json_is_refused_by_the_api(api_client, s3_endpoint, model, tmp_path):
    with open(write_onnx(tmp_path / "double.onnx"), "rb") as handle:
        answer = api_client.post("/api/v1/models/double/versions/", {"artifact": handle, "signature": "{nope"},
                                 format="multipart")
    assert answer.status_code == 400 and "signature" in answer.json()["fields"]
    assert not ModelVersion.objects.exists()


def test_the_unknown_suffix_message_lists_every_accepted_kind(api_client, s3_endpoint, model, tmp_path):
    detail = upload(api_client, "double", _garbage(tmp_path / "model.pkl")).json()["detail"]
    for suffix in (".tar.gz", ".zip", ".onnx", ".pt", ".plan", ".bentomodel", ".bento"):
        assert suffix in detail


@pytest.mark.integration
def test_a_wrapped_onnx_model_deploys_and_answers_on_a_real_triton(
    api_client, s3_endpoint, model, tmp_path, start_triton, triton_install
):
    """The config the registry generates, as Triton itself loads it. The installed Triton has no
    onnxruntime backend library, so ``tests/fixtures/onnxruntime_backend`` stands in for it as a
    Python-based backend under the name Triton derives from ``platform: "onnxruntime_onnx"``."""
    import numpy as np

    from deployments.models import ServingHost
    from deployments.services import start_deployment
    from deployments.targets import build_agent_payload
    from modelyard_agent.runtimes.triton import TritonRuntime
    from modelyard_agent.triton_host import deploy_triton_version
    from tests.fixtures.triton import REPO_ROOT

    backends = tmp_path / "backends"
    backends.mkdir()
    (backends / "python").symlink_to(triton_install.stack_dir / "triton" / "backends" / "python")
    (backends / "onnxruntime").symlink_to(REPO_ROOT / "tests" / "fixtures" / "onnxruntime_backend")
    triton = start_triton(extra_args=(f"--backend-directory={backends}",))
    ServingHost.objects.create(
        name="cpu-0", inference_url=triton.http_url,
        config_overrides={"parameters": {"EXECUTION_ENV_PATH": str(triton.execution_env)}},
    )
    answer = upload(api_client, "double", write_onnx(tmp_path / "double.onnx"), max_batch_size=8)
    assert answer.status_code == 201, answer.content

    deployment = start_deployment(model_name="double", version=1, host_names=["cpu-0"])
    target = deployment.targets.get()
    url = ArtifactStore().presigned_download_url(deployment.version.artifact_key)
    result = deploy_triton_version(build_agent_payload(target, download_url=url),
                                   model_repository=triton.model_repository)
    assert result["state"] == "ready", (result, triton.log_text()[-3000:])

    features = np.arange(12, dtype=np.float32).reshape(3, 4)
    output = TritonRuntime(triton.http_url).infer("double", {"x": features}, ["y"])
    assert output["y"].tolist() == (features * 2).tolist()
    with urllib.request.urlopen(f"{triton.http_url}/v2/models/double/config", timeout=10) as config:
        served = json.loads(config.read())
    assert (served["platform"], served["max_batch_size"]) == ("onnxruntime_onnx", 8)
