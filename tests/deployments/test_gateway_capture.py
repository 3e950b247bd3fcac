"""Request capture in a Triton host's gateway: real nginx (log phase, Lua) in front of a real tritonserver."""

import json
import os
import struct
import tempfile
import time
from pathlib import Path

import pytest
import requests

from modelyard_agent import capture
from modelyard_agent.replay.captures import CapturedRequest, read_captured
from modelyard_agent.runtimes.base import ServingRuntimeError
from modelyard_agent.runtimes.gateway import TritonGateway
from tests.deployments.test_gateway import BODY
from tests.deployments.test_triton_runtime import MODEL, load_iris
from tests.deployments.triton_host import artifacts, gateway_in_front
from tests.fixtures.services import free_port, wait_for

pytestmark = pytest.mark.integration
__all__ = ["artifacts"]  # fixture

WEEK = 7 * 86400


@pytest.fixture
def gateway(module_triton, tmp_path):
    """iris versions 1 and 2 on a real Triton and a running gateway in front of it."""
    load_iris(module_triton, tmp_path, versions=[1, 2])
    with gateway_in_front(module_triton) as front:
        yield front


def captured(gateway) -> list[CapturedRequest]:
    """What the replay would read of the gateway's capture of MODEL (every request, newest first)."""
    return read_captured(gateway.capture_directory(MODEL), model=MODEL, limit=1 << 20).requests


def settle(gateway, count: int) -> list[CapturedRequest]:
    """The captured requests once ``count`` are on disk (the log phase runs just after each answer)."""
    for _ in range(200):
        rows = captured(gateway)
        if len(rows) >= count:
            return rows
        time.sleep(0.02)
    return captured(gateway)


def binary_request() -> tuple[bytes, int]:
    """A KServe v2 binary-tensor request: a JSON header naming the input's binary_data_size, then the raw FP32
    bytes; returns (body, JSON header length) for the Inference-Header-Content-Length header."""
    raw = struct.pack("<8f", 5.1, 3.5, 1.4, 0.2, 6.7, 3.0, 5.2, 2.3)
    header = json.dumps({"inputs": [{"name": "input", "shape": [2, 4], "datatype": "FP32",
                                     "parameters": {"binary_data_size": len(raw)}}],
                         "outputs": [{"name": "label"}]}).encode()
    return header + raw, len(header)


def test_capture_is_off_by_default_and_writes_nothing(gateway):
    with requests.Session() as session:
        for _ in range(20):
            assert session.post(f"{gateway.url}/v2/models/{MODEL}/infer", json=BODY, timeout=30).status_code == 200
    assert gateway.capture() == {}
    assert not gateway.capture_directory(MODEL).exists()


def test_at_fraction_one_every_client_request_is_captured_with_its_exact_bytes(gateway):
    gateway.set_route(MODEL, stable=1)
    gateway.set_capture(MODEL, fraction=1.0, max_bytes=1 << 20, retention_seconds=WEEK)
    sent = []
    with requests.Session() as session:
        for n in range(10):
            body = json.dumps({**BODY, "id": f"json-{n}"}).encode()
            answer = session.post(f"{gateway.url}/v2/models/{MODEL}/infer", data=body, timeout=30,
                                  headers={"Content-Type": "application/json"})
            assert answer.status_code == 200
            sent.append((body, "application/json", None, 1))
        body, header_length = binary_request()
        answer = session.post(f"{gateway.url}/v2/models/{MODEL}/versions/2/infer", data=body, timeout=30,
                              headers={"Content-Type": "application/octet-stream",
                                       "Inference-Header-Content-Length": str(header_length)})
        assert answer.status_code == 200, answer.text
        sent.append((body, "application/octet-stream", header_length, 2))
    rows = settle(gateway, len(sent))
    assert len(rows) == len(sent)
    got = sorted((row.body, row.content_type, row.header_length, row.version) for row in rows)
    assert got == sorted(sent)
    for row in rows:
        assert len(row.id) == 32 and int(row.id, 16) >= 0
        assert row.model == MODEL and abs(row.time - time.time()) < 600
    assert all(path.name.endswith(f"-{path.name.split('-')[1]}") and len(path.name.split("-")[0]) == 10
               for path in capture.capture_files(gateway.capture_directory(MODEL)))


def test_at_fraction_three_tenths_about_that_share_is_captured(gateway):
    gateway.set_route(MODEL, stable=2)
    gateway.set_capture(MODEL, fraction=0.3, max_bytes=64 << 20, retention_seconds=WEEK)
    with requests.Session() as session:
        for _ in range(1000):
            assert session.post(f"{gateway.url}/v2/models/{MODEL}/infer", json=BODY, timeout=30).status_code == 200
    time.sleep(0.2)
    share = len(captured(gateway)) / 1000
    # 1000 draws at p = 0.3: one standard deviation is 1.45 points; 5 points is more than three.
    assert abs(share - 0.3) <= 0.05, share


def test_capture_stops_at_max_bytes_and_counts_what_it_skipped(gateway):
    gateway.set_route(MODEL, stable=1)
    gateway.set_capture(MODEL, fraction=1.0, max_bytes=1 << 20, retention_seconds=WEEK)
    with requests.Session() as session:
        session.post(f"{gateway.url}/v2/models/{MODEL}/infer", json=BODY, timeout=30)
        assert len(settle(gateway, 1)) == 1
        line = sum(path.stat().st_size for path in capture.capture_files(gateway.capture_directory(MODEL)))
        # Room for five lines and half of a sixth: lines differ by a byte or two (the time's digits).
        bound = 5 * line + line // 2
        gateway.set_capture(MODEL, fraction=1.0, max_bytes=bound, retention_seconds=WEEK)
        for _ in range(20):
            assert session.post(f"{gateway.url}/v2/models/{MODEL}/infer", json=BODY, timeout=30).status_code == 200
    rows = settle(gateway, 5)
    on_disk = sum(path.stat().st_size for path in capture.capture_files(gateway.capture_directory(MODEL)))
    assert on_disk <= bound and len(rows) == 5
    # The last request's log phase may run just after its answer reached the client.
    wait_for(lambda: gateway.capture()[MODEL]["skipped"] >= 16, timeout=5, what="the last skip counted", interval=0.02)
    assert gateway.capture()[MODEL]["skipped"] == 16
    # Off deletes the files, and on again starts from nothing: not full, nothing skipped.
    gateway.set_capture(MODEL, fraction=0, max_bytes=0, retention_seconds=WEEK)
    gateway.set_capture(MODEL, fraction=1.0, max_bytes=bound, retention_seconds=WEEK)
    assert (gateway.capture()[MODEL]["bytes"], gateway.capture()[MODEL]["skipped"]) == (0, 0)
    with requests.Session() as session:
        assert session.post(f"{gateway.url}/v2/models/{MODEL}/infer", json=BODY, timeout=30).status_code == 200
    assert len(settle(gateway, 1)) == 1


def test_a_body_over_the_memory_bound_is_skipped_not_captured(gateway):
    gateway.set_route(MODEL, stable=1)
    gateway.set_capture(MODEL, fraction=1.0, max_bytes=64 << 20, retention_seconds=WEEK)
    big = {**BODY, "parameters": {"padding": "x" * (2 << 20)}}
    with requests.Session() as session:
        answer = session.post(f"{gateway.url}/v2/models/{MODEL}/infer", json=big, timeout=30)
    assert answer.status_code == 200, answer.text
    # The skip is counted in the log phase, after the client has its answer.
    wait_for(lambda: gateway.capture()[MODEL]["skipped"] >= 1, timeout=5, what="the skip counted", interval=0.02)
    assert captured(gateway) == [] and gateway.capture()[MODEL]["skipped"] == 1


def test_shadow_mirror_requests_are_not_captured(gateway):
    gateway.set_route(MODEL, stable=1, shadow=2, shadow_percent=100)
    gateway.set_capture(MODEL, fraction=1.0, max_bytes=64 << 20, retention_seconds=WEEK)
    with requests.Session() as session:
        for _ in range(30):
            assert session.post(f"{gateway.url}/v2/models/{MODEL}/infer", json=BODY, timeout=30).status_code == 200
    time.sleep(0.2)
    rows = captured(gateway)
    assert len(rows) == 30 and {row.version for row in rows} == {1}
    stats = requests.get(f"http://{gateway.triton}/v2/models/{MODEL}/versions/2/stats", timeout=10).json()
    assert stats["model_stats"][0]["inference_stats"]["success"]["count"] >= 30  # the shadow did get them


def test_the_agent_deletes_expired_files_and_the_capture_of_a_model_turned_off_or_not_served(gateway):
    gateway.set_route(MODEL, stable=1)
    gateway.set_capture(MODEL, fraction=1.0, max_bytes=64 << 20, retention_seconds=3600)
    with requests.Session() as session:
        for _ in range(5):
            session.post(f"{gateway.url}/v2/models/{MODEL}/infer", json=BODY, timeout=30)
    settle(gateway, 5)
    directory = gateway.capture_directory(MODEL)
    old = directory / "2000010100-1.ndjson"
    old.write_text(json.dumps({"id": "0" * 32, "time": 946684800.0, "model": MODEL, "version": 1,
                               "content_type": None, "header_length": None, "body": ""}) + "\n")
    os.utime(old, (946684800, 946684800))
    stray = gateway.dir / "capture" / "other-model"
    stray.mkdir()
    (stray / "2026010100-1.ndjson").write_text("{}\n")

    report = capture.enforce(gateway, {MODEL})
    assert not old.exists() and not stray.exists()
    assert report[MODEL]["requests"] == 5 and report[MODEL]["bytes"] == gateway.capture()[MODEL]["bytes"] > 0
    assert report[MODEL]["oldest"] <= report[MODEL]["newest"] and report[MODEL]["fraction"] == 1.0

    # Not READY for a moment (a failed load, Triton restarting): kept; gone for the grace period: deleted.
    assert capture.enforce(gateway, set())[MODEL]["requests"] == 5
    assert capture.enforce(gateway, {MODEL})[MODEL]["requests"] == 5
    assert capture.enforce(gateway, set())[MODEL]["requests"] == 5
    later = time.time() + capture.UNSERVED_GRACE_SECONDS + 1
    assert capture.enforce(gateway, set(), now=later) == {MODEL: {
        **report[MODEL], "requests": 0, "bytes": 0, "oldest": None, "newest": None}}
    assert capture.capture_files(directory) == [] and gateway.capture()[MODEL]["bytes"] == 0

    gateway.set_capture(MODEL, fraction=0, max_bytes=0, retention_seconds=1)
    assert gateway.capture() == {} and not directory.exists()


def test_settings_survive_a_restart_and_bad_settings_are_refused(gateway):
    gateway.set_capture(MODEL, fraction=0.5, max_bytes=1000, retention_seconds=60)
    with pytest.raises(ValueError, match="from 0 to 1"):
        gateway.set_capture(MODEL, fraction=1.5, max_bytes=1000, retention_seconds=60)
    with pytest.raises(ServingRuntimeError, match="must be"):
        gateway._control("POST", {MODEL: {"fraction": 2}}, path="/capture")
    gateway.stop()
    gateway.ensure_running()
    assert gateway.capture() == {MODEL: {"fraction": 0.5, "max_bytes": 1000, "retention_seconds": 60,
                                         "bytes": 0, "skipped": 0}}


@pytest.fixture
def host(triton_server, artifacts, agent_settings):
    """A Triton host agent with its gateway, whose state directory nginx's workers may traverse."""
    from demo.iris import build_iris_archive
    from modelyard_agent.adapters.triton import TritonHostAgent, triton_gateway
    from tests.deployments.triton_host import agent_payload

    root, base_url = artifacts
    archive = build_iris_archive(root / "iris.tar.gz", name="iris")
    home = Path(tempfile.mkdtemp(prefix="modelyard-agent-"))
    home.chmod(0o711)
    agent_settings(model_repository=triton_server.model_repository, staging_dir=home / "staging",
                   triton_url=triton_server.http_url)
    url = f"http://127.0.0.1:{free_port()}"

    class Host:
        agent = TritonHostAgent()
        gateway = triton_gateway(url)

        @staticmethod
        def payload(version: int) -> dict:
            return {**agent_payload(archive, base_url, triton_server, model=MODEL, version=version),
                    "inference_url": url}

        @staticmethod
        def route(version: int, **capture) -> dict:
            return {"host": "local", "runtime": "triton", "model": MODEL, "inference_url": url, "metrics_url": "",
                    "stable": version, "canary": None, "percent": 0.0, "shadow": None, "shadow_percent": 0.0,
                    "capture": capture}

        @staticmethod
        def heartbeat() -> dict:
            return Host.agent.heartbeat({"host": "local", "inference_url": url, "metrics_url": "",
                                         "runtime": "triton"})

    Host.url = url
    yield Host
    Host.gateway.stop()
    import shutil

    shutil.rmtree(home, ignore_errors=True)


def test_the_agent_sets_capture_from_a_route_reports_it_and_keeps_it_through_a_deployment(host):
    assert host.agent.deploy(host.payload(1), report=lambda state: None)["state"] == "ready"
    week = {"fraction": 1.0, "max_bytes": 1 << 20, "retention_seconds": WEEK}
    assert host.agent.route(host.route(1, **week))["stable"] == 1
    with requests.Session() as session:
        for _ in range(3):
            assert session.post(f"{host.url}/v2/models/{MODEL}/infer", json=BODY, timeout=30).status_code == 200
    settle(host.gateway, 3)
    report = host.heartbeat()["gateway"]["capture"][MODEL]
    assert (report["requests"], report["fraction"], report["retention_seconds"]) == (3, 1.0, WEEK)

    # A new version deployed while capture is on keeps a route to the version that serves.
    assert host.agent.deploy(host.payload(2), report=lambda state: None)["state"] == "ready"
    assert host.gateway.routes()[MODEL]["stable"] == 2
    with requests.Session() as session:
        assert session.post(f"{host.url}/v2/models/{MODEL}/infer", json=BODY, timeout=30).status_code == 200
    assert sorted(row.version for row in settle(host.gateway, 4)) == [1, 1, 1, 2]

    # Off: the capture is deleted, the route that only served it goes.
    host.agent.route(host.route(2, fraction=0.0, max_bytes=1 << 20, retention_seconds=WEEK))
    assert not host.gateway.capture_directory(MODEL).exists() and MODEL not in host.gateway.routes()
    assert host.heartbeat()["gateway"]["capture"] == {}


@pytest.mark.skipif(os.geteuid() != 0, reason="nginx's workers run as the agent's own user when it is not root")
def test_a_state_directory_the_workers_cannot_reach_is_refused_with_what_to_do(tmp_path):
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    front = TritonGateway(closed / "gateway", free_port(), triton="127.0.0.1:8000")
    with pytest.raises(ServingRuntimeError, match=rf"chmod o\+x {closed}") as refused:
        front.set_capture(MODEL, fraction=0.5, max_bytes=1000, retention_seconds=60)
    assert not refused.value.retryable
    assert not (closed / "gateway" / "capture" / MODEL).exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root agent hands directories to nginx's worker user")
def test_a_symlink_where_a_capture_directory_belongs_is_refused_and_never_followed(gateway, tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    (target / "2000010100-1.ndjson").write_text("{}\n")
    root = gateway.dir / "capture"
    gateway.set_capture("other", fraction=0.5, max_bytes=1000, retention_seconds=60)
    assert root.stat().st_uid == 0 and root.stat().st_mode & 0o777 == 0o711  # the workers cannot replace entries
    assert (root / "other").stat().st_uid != 0  # each model's directory is theirs
    (root / MODEL).symlink_to(target)
    with pytest.raises(ServingRuntimeError, match="is a symlink"):
        gateway.set_capture(MODEL, fraction=1.0, max_bytes=1 << 20, retention_seconds=WEEK)
    assert target.stat().st_uid == 0 and target.stat().st_mode & 0o777 == 0o700  # not handed to nobody
    capture.enforce(gateway, {MODEL})
    assert not (root / MODEL).exists() and (target / "2000010100-1.ndjson").exists()  # the link went, not its files
