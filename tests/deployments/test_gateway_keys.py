"""Inference keys at a Triton host's gateway: real nginx (Lua, limit_req) in front of a real tritonserver."""

import hashlib
import re
import time

import pytest
import requests

from modelyard_agent.runtimes.base import ServingRuntimeError
from modelyard_agent.runtimes.triton import TritonRuntime
from tests.deployments.test_gateway import BODY, grpc_gateway
from tests.deployments.test_gateway_capture import WEEK, captured, host, settle
from tests.deployments.test_triton_runtime import MODEL, load_config, put_iris
from tests.deployments.triton_host import artifacts, gateway_in_front

pytestmark = pytest.mark.integration
__all__ = ["artifacts", "grpc_gateway", "host"]  # fixtures

KEY = "myk_abcdefgh_" + "s3cret-" * 5
OTHER = "myk_zyxwvuts_" + "0ther-" * 5


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@pytest.fixture
def gateway(triton_server, tmp_path):
    """iris versions 1 and 2 on a real Triton behind a running gateway; iris requires KEY."""
    put_iris(triton_server.model_repository, tmp_path, versions=[1, 2])
    TritonRuntime(triton_server.http_url, load_timeout=120).load(MODEL, load_config(triton_server, [1, 2]))
    with gateway_in_front(triton_server) as front:
        front.set_inference_keys({MODEL: [digest(KEY)]})
        yield front


def infer(gateway, key: str | None = None, path: str = f"/v2/models/{MODEL}/infer") -> requests.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return requests.post(f"{gateway.url}{path}", json=BODY, headers=headers, timeout=30)


def test_a_keyed_model_answers_401_without_a_key_403_with_a_wrong_one_and_serves_with_its_key(gateway):
    missing = infer(gateway)
    assert missing.status_code == 401 and missing.json()["code"] == "inference_key_missing"
    assert missing.headers["WWW-Authenticate"].startswith("Bearer")
    wrong = infer(gateway, OTHER)
    assert wrong.status_code == 403 and wrong.json()["code"] == "inference_key_refused"
    assert OTHER not in wrong.text
    assert infer(gateway, KEY).status_code == 200
    assert infer(gateway, KEY, f"/v2/models/{MODEL}/versions/2/infer").status_code == 200
    assert infer(gateway, path=f"/v2/models/{MODEL}/versions/2/infer").status_code == 401
    assert requests.get(f"{gateway.url}/v2/models/{MODEL}", timeout=10).status_code == 401
    assert requests.get(f"{gateway.url}/v2/models/{MODEL}", headers={"Authorization": f"Bearer {KEY}"},
                        timeout=10).status_code == 200
    assert gateway.key_refusals() == {"missing": 3, "wrong": 1}
    exposed = requests.get(f"{gateway.url}/metrics", timeout=10).text
    assert 'modelyard_gateway_inference_key_refusals_total{reason="missing"} 3' in exposed
    assert 'modelyard_gateway_inference_key_refusals_total{reason="wrong"} 1' in exposed
    assert KEY not in exposed and OTHER not in exposed


def test_a_model_without_a_key_requirement_is_served_as_before(gateway):
    gateway.set_inference_keys({MODEL: None})
    assert infer(gateway).status_code == 200
    assert gateway.inference_keys() == {}


def test_a_revoked_key_is_refused_from_the_next_push_without_a_reload(gateway):
    gateway.set_inference_keys({MODEL: [digest(KEY), digest(OTHER)]})
    assert infer(gateway, OTHER).status_code == 200
    pid = gateway.master_pid()
    started = time.monotonic()
    assert gateway.set_inference_keys({MODEL: [digest(KEY)]}) == {MODEL: [digest(KEY)]}
    assert infer(gateway, OTHER).status_code == 403
    assert time.monotonic() - started < 1
    assert infer(gateway, KEY).status_code == 200 and gateway.master_pid() == pid
    gateway.set_inference_keys({MODEL: []})  # the model's last key revoked: nothing opens it
    assert infer(gateway, KEY).status_code == 403


def test_the_keys_survive_a_restart_and_malformed_ones_are_refused(gateway):
    gateway.stop()
    gateway.ensure_running()
    assert gateway.inference_keys() == {MODEL: [digest(KEY)]}
    assert infer(gateway).status_code == 401
    with pytest.raises(ValueError):
        gateway.set_inference_keys({MODEL: ["not-a-digest"]})
    # The gateway refuses them itself, as it refuses malformed routes and limits (one check for all three).
    for path, body, message in (("/keys", {MODEL: ["ab"]}, "the keys of iris must be a list of hex SHA-256"),
                                ("/routes", {MODEL: {"stable": 0}}, "route of iris must be {stable"),
                                ("/limits", {MODEL: 0.5}, "the limit of iris must be a whole number of bytes"),
                                ("/keys", "x", "keys must be a JSON object of model names")):
        with pytest.raises(ServingRuntimeError, match=re.escape(message)):
            gateway._control("PATCH", body, path=path)
    assert gateway.inference_keys() == {MODEL: [digest(KEY)]}
    assert (gateway.keys_file.stat().st_mode & 0o777) == 0o600


def test_capture_and_shadow_copies_of_a_keyed_model_never_hold_the_key(gateway):
    gateway.set_route(MODEL, stable=1, shadow=2, shadow_percent=100)
    gateway.set_capture(MODEL, fraction=1.0, max_bytes=1 << 20, retention_seconds=WEEK)
    for _ in range(5):
        assert infer(gateway, KEY).status_code == 200
    rows = settle(gateway, 5)
    assert len(rows) == 5
    on_disk = b"".join(path.read_bytes() for path in gateway.capture_directory(MODEL).iterdir())
    assert KEY.encode() not in on_disk and b"Bearer" not in on_disk
    stats = requests.get(f"http://{gateway.triton}/v2/models/{MODEL}/versions/2/stats", timeout=10).json()
    assert stats["model_stats"][0]["inference_stats"]["success"]["count"] >= 5  # the shadow got its copies
    assert len(captured(gateway)) == 5  # refused requests are not captured
    infer(gateway)
    time.sleep(0.1)
    assert len(captured(gateway)) == 5


def test_a_client_that_keeps_sending_wrong_keys_is_answered_429_with_retry_after(gateway):
    codes = []
    with requests.Session() as session:
        for n in range(40):
            answer = session.post(f"{gateway.url}/v2/models/{MODEL}/infer", json=BODY, timeout=30,
                                  headers={"Authorization": f"Bearer myk_guess_{n:030d}"})
            codes.append(answer.status_code)
            if answer.status_code == 429:
                assert answer.headers["Retry-After"] == "1"
                assert answer.json()["code"] == "inference_key_guessing"
        assert set(codes) == {403, 429} and codes.count(403) <= 12
        # The client with the right key is still served.
        assert session.post(f"{gateway.url}/v2/models/{MODEL}/infer", json=BODY, timeout=30,
                            headers={"Authorization": f"Bearer {KEY}"}).status_code == 200


def test_a_deployment_of_a_keyed_model_sets_its_keys_before_the_version_serves(host):
    payload = {**host.payload(1), "inference_keys": [digest(KEY)]}
    assert host.agent.deploy(payload, report=lambda state: None)["state"] == "ready"
    assert host.gateway.inference_keys() == {MODEL: [digest(KEY)]}
    url = f"{host.url}/v2/models/{MODEL}/infer"
    assert requests.post(url, json=BODY, timeout=30).status_code == 401
    assert requests.post(url, json=BODY, timeout=30, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200


def test_grpc_calls_to_a_keyed_model_need_its_key_in_the_metadata(grpc_gateway):
    import numpy as np
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    from demo.iris import sample_input

    grpc_gateway.set_inference_keys({MODEL: [digest(KEY)]})
    client = grpcclient.InferenceServerClient(grpc_gateway.grpc_listen)
    tensor = grpcclient.InferInput("input", [len(sample_input()), 4], "FP32")
    tensor.set_data_from_numpy(np.asarray(sample_input(), dtype=np.float32))
    try:
        assert client.is_server_live()  # server-level calls name no model
        with pytest.raises(InferenceServerException, match="requires an inference key") as missing:
            client.infer(MODEL, [tensor], model_version="1")
        assert "UNAUTHENTICATED" in str(missing.value.status())
        with pytest.raises(InferenceServerException, match="does not open this model") as wrong:
            client.infer(MODEL, [tensor], headers={"authorization": f"Bearer {OTHER}"})
        assert "PERMISSION_DENIED" in str(wrong.value.status())
        with pytest.raises(InferenceServerException, match="requires an inference key"):
            client.get_model_metadata(MODEL)
        with pytest.raises(InferenceServerException, match="name one model"):
            client.get_inference_statistics("")
        authorized = {"authorization": f"Bearer {KEY}"}
        answer = client.infer(MODEL, [tensor], model_version="1", headers=authorized)
        assert answer.as_numpy("label").shape[0] == len(sample_input())
        assert client.get_model_metadata(MODEL, headers=authorized).name == MODEL
    finally:
        client.close()
    assert grpc_gateway.key_refusals() == {"missing": 2, "wrong": 1}
