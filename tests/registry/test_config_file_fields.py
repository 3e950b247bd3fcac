"""Config fields that name files stay inside their version directory, and a version has its model file.

Every field of a Triton model config that Triton opens as a file is checked at registration (400,
nothing stored) and again on the host (``tests/deployments/test_agent_config_checks.py``).
"""

import pytest

from accounts.models import Team
from modelyard_agent.formats.triton_config import ModelConfigError, parse_model_config, render_load_config
from modelyard_agent.formats.triton_paths import check_confined_paths
from registry.models import ModelVersion
from tests.factories import team_member
from tests.registry.conftest import VALID_CONFIG
from tests.registry.format_builders import bucket_keys, ensemble_config, upload, write_triton_dir

pytestmark = pytest.mark.django_db

BASE = VALID_CONFIG.decode()
MODEL_PY = {"model.py": b"class TritonPythonModel:\n    pass\n"}
OUTSIDE = "../../other-team-model/1/model.py"

# One config per field that names a file, each pointing outside the version directory.
FIELDS = {
    "default_model_filename": f'default_model_filename: "{OUTSIDE}"',
    "cc_model_filenames": f'cc_model_filenames {{ key: "8.0" value: "{OUTSIDE}" }}',
    "runtime": 'runtime: "../../../opt/evil/libtriton_evil.so"',
    "parameters (path-valued key)": 'parameters { key: "engine_dir" value: { string_value: "/srv/other/engines" } }',
    "parameters (value shaped like a path)": f'parameters {{ key: "weights" value: {{ string_value: "{OUTSIDE}" }} }}',
    "parameters (substitution)": (
        'parameters { key: "tokenizer_dir" value: { string_value: "$$TRITON_MODEL_DIRECTORY/../x" } }'
    ),
    "parameters (host parameter)": (
        'parameters { key: "EXECUTION_ENV_PATH" value: { string_value: "/opt/envs/other" } }'
    ),
    "label_filename": None,  # set on the output below
    "model_warmup input_data_file": (
        'model_warmup [ { name: "w" batch_size: 1 inputs { key: "input" value: '
        '{ data_type: TYPE_FP32 dims: [ 4 ] input_data_file: "/etc/shadow" } } } ]'
    ),
    "model_operations op_library_filename": 'model_operations { op_library_filename: "/tmp/custom_ops.so" }',
    "model_repository_agents parameters": (
        'model_repository_agents { agents [ { name: "checksum" parameters { key: "MD5:file" value: "~/x" } } ] }'
    ),
    "gpu_execution_accelerator parameters": (
        'optimization { execution_accelerators { gpu_execution_accelerator [ { name: "tensorrt" '
        'parameters { key: "trt_engine_cache_path" value: "/var/cache/other" } } ] } }'
    ),
    "cpu_execution_accelerator parameters": (
        'optimization { execution_accelerators { cpu_execution_accelerator [ { name: "openvino" '
        'parameters { key: "cache" value: "..\\\\..\\\\x" } } ] } }'
    ),
    "sequence_batching initial_state data_file": (
        'sequence_batching { state [ { input_name: "IN_STATE" output_name: "OUT_STATE" data_type: TYPE_FP32 '
        'dims: [ 1 ] initial_state [ { data_type: TYPE_FP32 dims: [ 1 ] name: "zero" data_file: "../../s" } ] } ] }'
    ),
}


def config_with(field: str) -> str:
    if field == "label_filename":
        return BASE.replace('dims: [ 1 ] } ]', f'dims: [ 1 ] label_filename: "{OUTSIDE}" }} ]')
    return BASE + FIELDS[field] + "\n"


@pytest.mark.parametrize("field", sorted(FIELDS))
def test_the_checker_refuses_every_field_that_names_a_file_outside_the_version_directory(field):
    with pytest.raises(ModelConfigError, match="plain relative names|per-host setting"):
        check_confined_paths(parse_model_config(config_with(field)))


@pytest.mark.parametrize("field", sorted(FIELDS))
def test_registration_refuses_each_such_field_with_a_400_and_stores_nothing(api_client, s3_endpoint, tmp_path, field):
    assert api_client.post("/api/v1/models/", {"name": "iris"}, format="json").status_code == 201
    before = bucket_keys()
    archive = write_triton_dir(tmp_path / "iris.tar.gz", config_with(field), MODEL_PY)
    answer = upload(api_client, "iris", archive)
    assert answer.status_code == 400, answer.content
    detail = str(answer.json())
    assert "config.pbtxt" in detail and ("plain relative names" in detail or "per-host setting" in detail)
    assert not ModelVersion.objects.filter(model__name="iris").exists()
    assert bucket_keys() == before


@pytest.mark.parametrize("config", [
    BASE + 'default_model_filename: "net/model.py"\n',
    BASE + 'parameters { key: "tokenizer_dir" value: { string_value: "tokenizer" } }\n',
    BASE + 'parameters { key: "endpoint" value: { string_value: "https://example.invalid/v1" } }\n',
    BASE + 'parameters { key: "max_tokens" value: { string_value: "4096" } }\n',
    BASE + 'runtime: "model.py"\n',
])
def test_plain_relative_names_and_values_that_are_not_paths_pass(config):
    check_confined_paths(parse_model_config(config))


def test_only_the_hosts_own_parameters_may_name_host_paths():
    rendered = render_load_config(BASE, model_name="iris", versions=[1],
                                  parameters={"EXECUTION_ENV_PATH": "/opt/envs/py311"})
    assert "/opt/envs/py311" in rendered
    with pytest.raises(ModelConfigError, match="default_model_filename"):
        render_load_config(config_with("default_model_filename"), model_name="iris", versions=[1],
                           parameters={"EXECUTION_ENV_PATH": "/opt/envs/py311"})


def test_a_python_backend_version_without_its_model_file_is_refused_naming_the_file(api_client, s3_endpoint, tmp_path):
    assert api_client.post("/api/v1/models/", {"name": "iris"}, format="json").status_code == 201
    archive = write_triton_dir(tmp_path / "iris.tar.gz", BASE, {"model.onnx": b"weights"})
    answer = upload(api_client, "iris", archive)
    assert answer.status_code == 400
    assert "'model.py'" in str(answer.json()) and "python backend" in str(answer.json())

    named = write_triton_dir(tmp_path / "named.tar.gz", BASE + 'default_model_filename: "serve.py"\n', MODEL_PY)
    answer = upload(api_client, "iris", named)
    assert answer.status_code == 400 and "'serve.py'" in str(answer.json())
    assert not ModelVersion.objects.filter(model__name="iris").exists()

    assert upload(api_client, "iris", write_triton_dir(tmp_path / "ok.tar.gz", BASE, MODEL_PY)).status_code == 201


def test_an_ensemble_composes_only_models_of_its_own_team(api_client, user, s3_endpoint, tmp_path):
    other = Team.objects.create(name="other-team")
    team_member(user, "owner", team=other)
    assert api_client.post("/api/v1/models/", {"name": "secret", "team": "other-team"},
                           format="json").status_code == 201
    assert upload(api_client, "secret", write_triton_dir(
        tmp_path / "secret.tar.gz", BASE.replace('"iris"', '"secret"'), MODEL_PY)).status_code == 201
    assert api_client.post("/api/v1/models/", {"name": "pipeline", "team": "default"},
                           format="json").status_code == 201
    answer = upload(api_client, "pipeline", write_triton_dir(
        tmp_path / "pipeline.tar.gz", ensemble_config("pipeline", [("secret", 1)])))
    assert answer.status_code == 400
    assert "its team does not have" in str(answer.json()) and "'secret' version 1" in str(answer.json())
    assert not ModelVersion.objects.filter(model__name="pipeline").exists()
