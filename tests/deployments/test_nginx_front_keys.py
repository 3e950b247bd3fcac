"""Inference keys at the BentoML host's nginx front (real nginx with its Lua module), in front of two plain HTTP
servers standing in for two versions' ``bentoml serve`` processes (``test_nginx_front.version_server``), which
answer with the headers they got."""

import hashlib

import pytest
import requests

from modelyard_agent.runtimes.nginx import NginxFront
from modelyard_agent.runtimes.routes import lua_available
from tests.deployments.test_nginx_front import version_server
from tests.fixtures.services import free_port

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not lua_available(), reason="the key check needs nginx's Lua module")]

MODEL = "iris-bento"
KEY = "myk_abcdefgh_" + "s3cret-" * 5


@pytest.fixture
def front(tmp_path):
    """A running front serving MODEL v1 from a plain location; MODEL requires KEY."""
    servers = {version: version_server(version, echo_headers=True) for version in (1, 2)}
    nginx = NginxFront(tmp_path / "bentoml", free_port(), listen_host="127.0.0.1")
    nginx.ensure_running()
    nginx.switch(MODEL, servers[1].server_address[1], 1)
    nginx.set_inference_keys({MODEL: [hashlib.sha256(KEY.encode()).hexdigest()]})
    nginx.url = f"http://127.0.0.1:{nginx.listen_port}/{MODEL}/classify"
    nginx.servers = servers
    yield nginx
    nginx.stop()
    for server in servers.values():
        server.shutdown()


def post(front, key: str | None = None) -> requests.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return requests.post(front.url, json={"x": 1}, headers=headers, timeout=10)


def test_a_keyed_bento_model_answers_401_and_403_and_its_process_never_sees_the_key(front):
    missing = post(front)
    assert missing.status_code == 401 and missing.json()["code"] == "inference_key_missing"
    wrong = post(front, "myk_zyxwvuts_" + "0ther-" * 5)
    assert wrong.status_code == 403 and wrong.json()["code"] == "inference_key_refused"
    served = post(front, KEY)
    assert served.status_code == 200 and "authorization" not in served.json()["headers"]
    assert front.key_refusals() == {"missing": 1, "wrong": 1}


def test_a_split_bento_model_checks_the_key_and_a_revoke_takes_effect_at_the_next_push(front):
    ports = {version: server.server_address[1] for version, server in front.servers.items()}
    front.set_route(MODEL, stable=1, canary=2, percent=50, ports=ports)
    front.split(MODEL)
    assert post(front).status_code == 401
    assert {post(front, KEY).json()["version"] for _ in range(40)} == {1, 2}
    front.set_inference_keys({MODEL: []})
    assert post(front, KEY).status_code == 403
    front.set_inference_keys({MODEL: None})
    assert post(front).status_code == 200
