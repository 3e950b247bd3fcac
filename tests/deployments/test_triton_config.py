"""Parsing, describing and rendering Triton model configs."""

import json
import tarfile

import pytest
from google.protobuf import json_format
from tritonclient.grpc.model_config_pb2 import ModelConfig

from demo.iris import build_iris_archive, build_iris_model_dir
from modelyard_agent.formats.triton_config import (
    ModelConfigError,
    describe_signature,
    parse_model_config,
    render_load_config,
)

MINIMAL_CONFIG = """
name: "scorer"
backend: "python"
max_batch_size: 0
input [ { name: "x" data_type: TYPE_FP32 dims: [ -1, 3 ] } ]
output [ { name: "y" data_type: TYPE_INT64 dims: [ -1 ] } ]
parameters { key: "threshold" value: { string_value: "0.5" } }
"""


@pytest.fixture(scope="module")
def iris_config_text(tmp_path_factory) -> str:
    model_dir = build_iris_model_dir(tmp_path_factory.mktemp("iris"))
    return (model_dir / "config.pbtxt").read_text()


def test_it_describes_the_signature_of_the_demo_model(iris_config_text):
    signature = describe_signature(parse_model_config(iris_config_text))

    assert signature == {
        "inputs": [{"name": "input", "data_type": "TYPE_FP32", "dims": [4]}],
        "outputs": [
            {"name": "label", "data_type": "TYPE_INT64", "dims": [1]},
            {"name": "probabilities", "data_type": "TYPE_FP32", "dims": [3]},
        ],
        "max_batch_size": 8,
        "backend": "python",
        "platform": "",
    }
    assert json.loads(json.dumps(signature)) == signature


def test_it_keeps_variable_dims_and_platform_models():
    platform_config = MINIMAL_CONFIG.replace('backend: "python"', 'platform: "onnxruntime_onnx"')

    signature = describe_signature(parse_model_config(platform_config))

    assert signature["inputs"][0]["dims"] == [-1, 3]
    assert (signature["backend"], signature["platform"]) == ("", "onnxruntime_onnx")


def test_the_demo_config_carries_no_host_specific_setting(iris_config_text):
    assert "EXECUTION_ENV_PATH" not in iris_config_text
    assert len(parse_model_config(iris_config_text).parameters) == 0


def test_it_rejects_text_that_is_not_a_model_config_with_the_position_of_the_mistake():
    with pytest.raises(ModelConfigError) as excinfo:
        parse_model_config("this is { not a config")

    assert "not a valid Triton model config" in str(excinfo.value)
    assert "1:1" in str(excinfo.value)


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("", "must name a backend"),
        ('name: "m" input [ { name: "x" data_type: TYPE_FP32 dims: [1] } ]', "must name a backend"),
        ('backend: "python" output [ { name: "y" data_type: TYPE_FP32 dims: [1] } ]', "at least one input"),
        ('backend: "python" input [ { name: "x" data_type: TYPE_FP32 dims: [1] } ]', "at least one output"),
        (
            'backend: "python" input [ { name: "x" dims: [1] } ] output [ { name: "y" data_type: TYPE_FP32 } ]',
            "input 'x' has no data_type",
        ),
        (
            'backend: "python" input [ { data_type: TYPE_FP32 } ] output [ { name: "y" data_type: TYPE_FP32 } ]',
            "input #1 has no name",
        ),
        (
            'backend: "python" max_batch_size: -1 input [ { name: "x" data_type: TYPE_FP32 } ] '
            'output [ { name: "y" data_type: TYPE_FP32 } ]',
            "max_batch_size must be 0 or more",
        ),
    ],
)
def test_it_says_what_an_incomplete_config_lacks(text, complaint):
    with pytest.raises(ModelConfigError, match=complaint):
        parse_model_config(text)


def test_it_renders_a_load_override_with_name_versions_and_host_parameters():
    rendered = render_load_config(
        MINIMAL_CONFIG,
        model_name="fraud-scorer",
        versions=[3, 2],
        parameters={"EXECUTION_ENV_PATH": "/opt/envs/py311"},
    )

    data = json.loads(rendered)
    assert data["name"] == "fraud-scorer"
    assert data["version_policy"] == {"specific": {"versions": ["2", "3"]}}
    assert data["parameters"] == {
        "threshold": {"string_value": "0.5"},
        "EXECUTION_ENV_PATH": {"string_value": "/opt/envs/py311"},
    }
    assert data["input"][0]["data_type"] == "TYPE_FP32"
    assert "max_batch_size" in rendered or data.get("max_batch_size", 0) == 0
    assert "dataType" not in rendered
    round_trip = json_format.Parse(rendered, ModelConfig())
    assert list(round_trip.version_policy.specific.versions) == [2, 3]


def test_it_replaces_a_version_policy_from_the_uploaded_config(iris_config_text):
    uploaded = iris_config_text + "\nversion_policy: { latest: { num_versions: 2 } }\n"

    data = json.loads(render_load_config(uploaded, model_name="iris", versions=[5]))

    assert data["version_policy"] == {"specific": {"versions": ["5"]}}
    assert data["max_batch_size"] == 8


@pytest.mark.parametrize("versions", [[], [0], [2, -1]])
def test_it_refuses_to_render_a_load_without_valid_versions(versions):
    with pytest.raises(ModelConfigError, match="version"):
        render_load_config(MINIMAL_CONFIG, model_name="m", versions=versions)


def test_the_demo_archive_holds_one_model_directory(tmp_path):
    archive = build_iris_archive(tmp_path / "iris.tar.gz", name="iris-demo")

    with tarfile.open(archive) as tar:
        names = sorted(tar.getnames())
    assert names == [
        "iris-demo",
        "iris-demo/1",
        "iris-demo/1/model.onnx",
        "iris-demo/1/model.py",
        "iris-demo/config.pbtxt",
    ]


def test_deployment_overrides_replace_instance_groups_and_batching_at_load():
    import json

    from modelyard_agent.formats.triton_config import render_load_config

    text = ('backend: "python"\nmax_batch_size: 4\ninstance_group [{ count: 1, kind: KIND_CPU }]\n'
            'input [{ name: "x", data_type: TYPE_FP32, dims: [4] }]\n'
            'output [{ name: "y", data_type: TYPE_INT64, dims: [1] }]\n')
    overrides = {"instance_group": [{"count": 3, "kind": "KIND_GPU", "gpus": [0, 1]}],
                 "dynamic_batching": {"max_queue_delay_microseconds": 500}, "max_batch_size": 16}
    loaded = json.loads(render_load_config(text, model_name="iris", versions=[2], overrides=overrides))
    assert loaded["instance_group"] == [{"count": 3, "kind": "KIND_GPU", "gpus": [0, 1]}]
    assert loaded["dynamic_batching"]["max_queue_delay_microseconds"] == "500"
    assert loaded["max_batch_size"] == 16
    assert [i["name"] for i in loaded["input"]] == ["x"]  # what the model computes is untouched
