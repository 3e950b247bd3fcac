"""TritonRuntime against a real tritonserver serving the demo iris model."""

import shutil
import socket
import time
from pathlib import Path

import numpy as np
import pytest

from demo.iris import build_iris_model_dir, expected_labels, sample_input
from modelyard_agent.formats.triton_config import render_load_config
from modelyard_agent.runtimes.base import ServingRuntimeError
from modelyard_agent.runtimes.triton import TritonRuntime

pytestmark = pytest.mark.integration

MODEL = "iris"


def put_iris(repository: Path, tmp_path: Path, versions: list[int], broken: list[int] = ()) -> Path:
    """Write the iris model into ``repository`` with the given version folders."""
    good = build_iris_model_dir(tmp_path / "good", name=MODEL)
    bad = build_iris_model_dir(tmp_path / "bad", name=MODEL, broken=True)
    model_dir = repository / MODEL
    model_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(good / "config.pbtxt", model_dir / "config.pbtxt")
    for version in versions:
        source = bad if version in broken else good
        shutil.copytree(source / "1", model_dir / str(version))
    return model_dir


def load_config(server, versions: list[int]) -> str:
    config_text = (server.model_repository / MODEL / "config.pbtxt").read_text()
    return render_load_config(
        config_text,
        model_name=MODEL,
        versions=versions,
        parameters={"EXECUTION_ENV_PATH": str(server.execution_env)},
    )


def load_iris(server, tmp_path: Path, versions: list[int]) -> None:
    """iris with ``versions`` ready on ``server`` (a ``module_triton``): written and loaded, unless the module's
    test before left just those versions ready."""
    runtime = TritonRuntime(server.http_url, load_timeout=120)
    if runtime.ready_versions(MODEL) == sorted(versions):
        return
    shutil.rmtree(server.model_repository / MODEL, ignore_errors=True)
    put_iris(server.model_repository, tmp_path, versions=versions)
    runtime.load(MODEL, load_config(server, versions))


def predicted_labels(runtime: TritonRuntime, version: int | None = None) -> list[int]:
    result = runtime.infer(MODEL, {"input": sample_input()}, ["label"], version=version)
    return [int(label) for label in result["label"].reshape(-1)]


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_it_reports_a_live_server_its_version_and_its_repository(start_triton, tmp_path):
    # A server of its own: Triton's index keeps the models a shared server once loaded, as UNAVAILABLE.
    triton_server = start_triton()
    put_iris(triton_server.model_repository, tmp_path, versions=[1])
    runtime = TritonRuntime(triton_server.http_url, timeout=10)

    assert runtime.is_live() is True
    assert runtime.server_version() == "2.51.0"
    [entry] = runtime.repository_index()
    assert (entry.name, entry.version) == (MODEL, None)
    assert runtime.ready_versions(MODEL) == []


def test_it_serves_the_models_own_predictions_once_a_version_is_loaded(triton_server, tmp_path):
    put_iris(triton_server.model_repository, tmp_path, versions=[1, 2])
    runtime = TritonRuntime(triton_server.http_url, timeout=30)

    runtime.load(MODEL, load_config(triton_server, [1]))

    assert runtime.is_version_ready(MODEL, 1) is True
    assert runtime.is_version_ready(MODEL, 2) is False
    assert runtime.ready_versions(MODEL) == [1]
    result = runtime.infer(MODEL, {"input": sample_input()}, ["label", "probabilities"], version=1)
    assert result["label"].dtype == np.int64
    assert result["label"].reshape(-1).tolist() == expected_labels()
    assert result["probabilities"].shape == (len(sample_input()), 3)
    assert result["probabilities"].sum(axis=1) == pytest.approx(1.0, abs=1e-5)


def test_it_moves_serving_from_one_version_to_the_next(triton_server, tmp_path):
    put_iris(triton_server.model_repository, tmp_path, versions=[1, 2])
    runtime = TritonRuntime(triton_server.http_url, timeout=30)
    runtime.load(MODEL, load_config(triton_server, [1, 2]))
    assert runtime.ready_versions(MODEL) == [1, 2]

    runtime.load(MODEL, load_config(triton_server, [2]))
    runtime.wait_versions_gone(MODEL, [1], timeout=30)

    assert runtime.ready_versions(MODEL) == [2]
    assert predicted_labels(runtime, version=2) == expected_labels()
    # Triton answers 503 for a version that is not ready: it may be loading, so a retry may help.
    with pytest.raises(ServingRuntimeError, match="version 1 is not at ready state"):
        predicted_labels(runtime, version=1)


def test_it_keeps_the_old_version_serving_when_load_fails(triton_server, tmp_path):
    put_iris(triton_server.model_repository, tmp_path, versions=[1, 2], broken=[2])
    runtime = TritonRuntime(triton_server.http_url, timeout=30)
    runtime.load(MODEL, load_config(triton_server, [1]))

    with pytest.raises(ServingRuntimeError) as excinfo:
        runtime.load(MODEL, load_config(triton_server, [2]))

    error = excinfo.value
    assert error.retryable is False
    assert "load failed for model 'iris': version 2" in error.message
    assert "Protobuf parsing failed" in error.message
    assert runtime.ready_versions(MODEL) == [1]
    assert predicted_labels(runtime) == expected_labels()


def test_it_unloads_every_version_of_a_model(triton_server, tmp_path):
    put_iris(triton_server.model_repository, tmp_path, versions=[1])
    runtime = TritonRuntime(triton_server.http_url, timeout=30)
    runtime.load(MODEL, load_config(triton_server, [1]))

    runtime.unload(MODEL)
    runtime.wait_versions_gone(MODEL, [1], timeout=30)

    assert runtime.ready_versions(MODEL) == []
    assert runtime.is_version_ready(MODEL, 1) is False


def test_it_gives_up_waiting_while_a_version_keeps_serving(triton_server, tmp_path):
    put_iris(triton_server.model_repository, tmp_path, versions=[1])
    runtime = TritonRuntime(triton_server.http_url, timeout=30)
    runtime.load(MODEL, load_config(triton_server, [1]))

    with pytest.raises(ServingRuntimeError) as excinfo:
        runtime.wait_versions_gone(MODEL, [1], timeout=0.3, poll=0.1)

    assert excinfo.value.retryable is True
    assert "[1]" in excinfo.value.message


def test_it_refuses_an_unknown_model_without_suggesting_a_retry(triton_server):
    runtime = TritonRuntime(triton_server.http_url, timeout=10)

    with pytest.raises(ServingRuntimeError) as excinfo:
        runtime.infer("no-such-model", {"input": sample_input()}, ["label"])

    assert excinfo.value.retryable is False
    assert "no-such-model" in excinfo.value.message


def test_it_runs_two_servers_side_by_side_with_their_own_repositories(start_triton, tmp_path):
    first = start_triton()
    second = start_triton()
    put_iris(first.model_repository, tmp_path, versions=[1])

    assert first.http_url != second.http_url
    assert [entry.name for entry in TritonRuntime(first.http_url).repository_index()] == [MODEL]
    assert TritonRuntime(second.http_url).repository_index() == []


def test_it_reports_a_closed_port_as_a_retryable_error():
    runtime = TritonRuntime(f"http://127.0.0.1:{closed_port()}", timeout=2)

    assert runtime.is_live() is False
    with pytest.raises(ServingRuntimeError) as excinfo:
        runtime.load(MODEL, "{}")
    assert excinfo.value.retryable is True and excinfo.value.timed_out is False
    assert "cannot reach Triton" in excinfo.value.message


def test_it_gives_up_on_a_server_that_never_answers_within_the_timeout():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        runtime = TritonRuntime(f"http://127.0.0.1:{listener.getsockname()[1]}", timeout=0.5)

        started = time.monotonic()
        with pytest.raises(ServingRuntimeError) as excinfo:
            runtime.repository_index()

    assert excinfo.value.retryable is True and excinfo.value.timed_out is True
    assert "did not answer within 0.5 s" in excinfo.value.message
    assert time.monotonic() - started < 5
