"""A replay on a real Triton: captured requests sent to the serving version and to a candidate's copy."""

import time

import pytest
import requests

from modelyard_agent.formats.triton_config import render_load_config
from modelyard_agent.replay.captures import read_captured
from modelyard_agent.replay.triton import remove_stale_replay_copies, replay_id_of, replay_triton_version
from modelyard_agent.runtimes.triton import TritonRuntime
from modelyard_agent.triton_staging import AgentPaths, stage_version
from tests.deployments.triton_host import agent_payload, artifacts, gateway_in_front
from tests.fixtures.replay_models import (
    binary_request,
    build_threshold_archive,
    inputs_with_share_above,
    json_request,
    record_captures,
)

pytestmark = pytest.mark.integration
__all__ = ["artifacts"]  # fixture

MODEL = "thr"


@pytest.fixture
def serving(triton_server, artifacts, tmp_path):
    """``thr`` v1 (the plain threshold model) READY on a real Triton, and a payload builder for candidates."""
    root, base_url = artifacts
    paths = AgentPaths(triton_server.model_repository)
    runtime = TritonRuntime(triton_server.http_url, load_timeout=120)
    archive = build_threshold_archive(root / "thr-1.tar.gz", name=MODEL, version=1)
    payload = agent_payload(archive, base_url, triton_server, model=MODEL, version=1)
    stage_version(payload, paths)
    runtime.load(MODEL, render_load_config(payload["config_text"], model_name=MODEL, versions=[1],
                                           parameters=payload["parameters"]))
    assert runtime.ready_versions(MODEL) == [1]

    def candidate(replay_id: int, flip_above=None, split=5.0, **fields) -> dict:
        built = build_threshold_archive(root / f"thr-2-{replay_id}.tar.gz", name=MODEL, version=2,
                                        flip_above=flip_above, split=split)
        return {**agent_payload(built, base_url, triton_server, model=MODEL, version=2), "replay_id": replay_id,
                "serving": 1, "tolerances": {"atol": 1e-5, "rtol": 1e-3, "argmax_outputs": []},
                "max_requests": 1000, "pace": 1000.0, "time_budget_s": 600, **fields}

    return triton_server, paths, runtime, candidate, tmp_path / "capture" / MODEL


def run(server, paths, payload, capture_dir, reports=None, should_stop=lambda: None):
    return replay_triton_version(payload, paths=paths, triton_url=server.http_url, capture_dir=capture_dir,
                                 progress=(reports.append if reports is not None else lambda report: None),
                                 should_stop=should_stop, load_timeout=120, unload_timeout=60)


def test_a_candidate_that_flips_a_known_share_is_reported_at_that_share_and_its_copy_is_removed(serving):
    server, paths, runtime, candidate, capture_dir = serving
    rows = inputs_with_share_above(1000, 0.2, 7.0, seed=1)
    ids = record_captures(server.http_url, MODEL, 1, rows, capture_dir)
    reports = []
    result = run(server, paths, candidate(41, flip_above=7.0), capture_dir, reports)
    assert result["status"] == "succeeded", result.get("message")
    summary = result["summary"]
    assert result["done"] == result["total"] == summary["compared"] == 1000 and summary["skipped"] == 0
    assert abs((1 - summary["agreement_rate"]) - 0.2) <= 0.01
    assert summary["disagreed_outputs"] == {"label": 200}
    worst = summary["worst"][0]
    assert worst["id"] in ids and worst["serving"]["label"]["data"] != worst["candidate"]["label"]["data"]
    assert summary["latency_ms"]["serving"]["count"] == 1000 and summary["latency_ms"]["candidate"]["p95"] > 0
    assert reports[0]["step"] == "staging the candidate's copy" and reports[-1]["done"] == 1000
    assert runtime.ready_versions("thr--replay-41") == []
    assert not (server.model_repository / "thr--replay-41").exists()
    assert runtime.ready_versions(MODEL) == [1]  # the served model was never touched


def test_what_the_gateway_captured_of_real_client_traffic_is_replayed_and_a_known_share_found(serving):
    """The whole chain: clients send through a real gateway, nginx captures in its log phase, the replay
    reads the gateway's capture directory. 15 % of the inputs lie where the candidate answers otherwise."""
    server, paths, _, candidate, _ = serving
    rows = inputs_with_share_above(400, 0.15, 7.0, seed=3)
    with gateway_in_front(server) as front:
        front.set_route(MODEL, stable=1)  # what the agent keeps while capture is on: each line names its version
        front.set_capture(MODEL, fraction=1.0, max_bytes=64 << 20, retention_seconds=3600)
        with requests.Session() as client:
            for index, row in enumerate(rows):
                body, headers = binary_request(row) if index % 3 == 0 else json_request(row)
                answer = client.post(f"{front.url}/v2/models/{MODEL}/infer", data=body, headers=headers, timeout=30)
                assert answer.status_code == 200, answer.text[:300]
        capture_dir = front.capture_directory(MODEL)
        deadline = time.monotonic() + 10
        while (len(read_captured(capture_dir, model=MODEL, limit=1000).requests) < len(rows)
               and time.monotonic() < deadline):
            time.sleep(0.05)
        lines = read_captured(capture_dir, model=MODEL, limit=1000).requests
        assert len(lines) == len(rows) and {line.version for line in lines} == {1}
        result = run(server, paths, candidate(48, flip_above=7.0, max_requests=1000), capture_dir)
    assert result["status"] == "succeeded", result.get("message")
    summary = result["summary"]
    assert summary["compared"] == len(rows) and summary["skipped"] == 0
    assert abs((1 - summary["agreement_rate"]) - 0.15) <= 0.01
    assert summary["disagreed_outputs"] == {"label": 60}


def test_an_identical_candidate_agrees_on_every_request_json_and_binary(serving):
    server, paths, _, candidate, capture_dir = serving
    record_captures(server.http_url, MODEL, 1, inputs_with_share_above(60, 0.5, 5.0), capture_dir, binary_every=2)
    result = run(server, paths, candidate(42, max_requests=40), capture_dir)
    assert result["status"] == "succeeded" and result["summary"]["agreement_rate"] == 1.0
    assert result["summary"]["compared"] == 40 and result["details"]["captured"] == 40
    assert result["summary"]["differences"]["max"] == 0.0


def test_argmax_over_the_scores_judges_by_class_where_floats_differ(serving):
    server, paths, _, candidate, capture_dir = serving
    record_captures(server.http_url, MODEL, 1, inputs_with_share_above(20, 0.5, 5.0), capture_dir)
    # A split moved by 0.01 changes every score a little but the class of no input (none lies that close).
    exact = run(server, paths, candidate(43, split=5.01, tolerances={"atol": 0, "rtol": 0}), capture_dir)
    assert exact["summary"]["agreement_rate"] == 0.0 and exact["summary"]["disagreed_outputs"] == {"scores": 20}
    by_class = run(server, paths, candidate(48, split=5.01, tolerances={"atol": 0, "rtol": 0,
                                                                         "argmax_outputs": ["scores"]}), capture_dir)
    assert by_class["summary"]["agreement_rate"] == 1.0
    assert 0 < by_class["summary"]["differences"]["max"] < 0.01


def test_a_cancel_stops_the_replay_and_still_removes_the_copy(serving):
    server, paths, runtime, candidate, capture_dir = serving
    record_captures(server.http_url, MODEL, 1, inputs_with_share_above(30, 0.5, 5.0), capture_dir)
    asked = []

    def stop():
        asked.append(1)
        return "the replay was cancelled" if len(asked) > 5 else None

    result = run(server, paths, candidate(44, pace=5.0), capture_dir, should_stop=stop)
    assert result["status"] == "cancelled" and result["message"] == "the replay was cancelled"
    assert 0 < result["done"] < 30
    assert runtime.ready_versions("thr--replay-44") == []


def test_no_capture_and_a_serving_version_not_ready_fail_with_a_reason_and_load_nothing(serving):
    server, paths, runtime, candidate, capture_dir = serving
    empty = run(server, paths, candidate(45), capture_dir)
    assert empty["status"] == "failed" and "no captured requests of thr" in empty["message"]
    record_captures(server.http_url, MODEL, 1, inputs_with_share_above(3, 0.5, 5.0), capture_dir)
    wrong = run(server, paths, candidate(46, serving=7), capture_dir)
    assert wrong["status"] == "failed" and "thr v7 is not READY" in wrong["message"]
    assert [e.name for e in runtime.repository_index() if replay_id_of(e.name) is not None] == []


def test_a_candidate_that_does_not_load_fails_and_leaves_no_copy(serving):
    server, paths, runtime, candidate, capture_dir = serving
    record_captures(server.http_url, MODEL, 1, inputs_with_share_above(3, 0.5, 5.0), capture_dir)
    payload = candidate(47)
    payload["config_text"] = payload["config_text"].replace('backend: "python"', 'backend: "nonexistent"')
    result = run(server, paths, payload, capture_dir)
    assert result["status"] == "failed" and "did not load" in result["message"]
    assert not (server.model_repository / "thr--replay-47").exists()


def test_a_replay_copy_no_running_replay_owns_is_removed_by_the_heartbeats_sweep(serving):
    server, paths, runtime, candidate, _ = serving
    for replay_id in (8, 9):
        payload = candidate(replay_id)
        name = f"thr--replay-{replay_id}"
        stage_version({**payload, "model": name}, paths)
        runtime.load(name, render_load_config(payload["config_text"], model_name=name, versions=[2],
                                              parameters=payload["parameters"]))
    assert remove_stale_replay_copies(runtime, paths, active={9}) == ["thr--replay-8"]
    assert runtime.ready_versions("thr--replay-8") == [] and runtime.ready_versions("thr--replay-9") == [2]
    assert runtime.ready_versions(MODEL) == [1]
