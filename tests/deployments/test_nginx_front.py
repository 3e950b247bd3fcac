"""The BentoML host's nginx front (real nginx with its Lua module) in front of two plain HTTP servers standing
in for two versions' ``bentoml serve`` processes: with client keep-alive on, each swap reloads nginx, and
the drain before each reload keeps every kept-alive client's requests answered."""

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from modelyard_agent.runtimes.base import ServingRuntimeError
from modelyard_agent.runtimes.nginx import NginxFront
from modelyard_agent.runtimes.routes import lua_available
from tests.fixtures.services import free_port

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not lua_available(), reason="the drain needs nginx's Lua module (make install-nginx)")]

MODEL = "iris-bento"


def version_server(version: int, *, echo_headers: bool = False) -> ThreadingHTTPServer:
    """An HTTP/1.1 server with keep-alive answering ``POST /classify`` with ``{"version": version}`` (and, with
    ``echo_headers``, ``"headers"``: the lower-case names of the headers it got)."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            answer = {"version": version}
            if echo_headers:
                answer["headers"] = [name.lower() for name in self.headers]
            body = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def front(tmp_path):
    """A running front with client keep-alive on, and the two version servers."""
    servers = {version: version_server(version) for version in (1, 2)}
    nginx = NginxFront(tmp_path / "bentoml", free_port(), listen_host="127.0.0.1", client_keepalive=75)
    nginx.DRAIN_SECONDS = 0.3
    nginx.ensure_running()
    nginx.switch(MODEL, servers[1].server_address[1], 1)
    nginx.url = f"http://127.0.0.1:{nginx.listen_port}/{MODEL}/classify"
    yield nginx, servers
    nginx.stop()
    for server in servers.values():
        server.shutdown()


def test_swaps_reload_under_kept_alive_clients_and_fail_no_request(front):
    nginx, servers = front
    failures, seen, closes, stop = [], [], [], threading.Event()

    def client() -> None:
        with requests.Session() as session:
            while not stop.is_set():
                try:
                    answer = session.post(nginx.url, json={"features": [[5.1, 3.5, 1.4, 0.2]]}, timeout=10)
                    if answer.status_code != 200:
                        failures.append(f"HTTP {answer.status_code}: {answer.text[:100]}")
                        continue
                    seen.append(answer.json()["version"])
                    if answer.headers.get("Connection", "").lower() == "close":
                        closes.append(answer.headers.get("X-Modelyard-Version"))
                except requests.RequestException as exc:
                    failures.append(repr(exc))

    threads = [threading.Thread(target=client) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        for swap in range(8):
            version = 2 if swap % 2 == 0 else 1
            nginx.switch(MODEL, servers[version].server_address[1], version)
            stop.wait(0.2)
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    assert failures == [], failures[:5]
    assert {1, 2} <= set(seen) and len(closes) >= 8  # each drain told the busy clients to reconnect
    assert set(closes) <= {"1", "2"}  # and those answers still came through the model's own location
    with requests.Session() as session:  # keep-alive is back after the last reload
        answer = session.post(nginx.url, json={}, timeout=10)
        assert answer.json() == {"version": 1} and answer.headers.get("Connection", "").lower() != "close"


@pytest.mark.skipif(os.geteuid() != 0, reason="nginx's workers run as the agent's own user when it is not root")
def test_a_root_front_under_a_closed_directory_is_refused_and_spools_bodies_once_it_is_open(tmp_path):
    """A root master runs its workers as ``nobody``; a body over the in-memory buffer goes to ``tmp/``,
    which they must reach, or nginx answers 500. The front refuses to start rather than fail that way."""
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    nginx = NginxFront(closed / "bentoml", free_port(), listen_host="127.0.0.1")
    with pytest.raises(ServingRuntimeError, match=rf"chmod o\+x {closed}") as refused:
        nginx.ensure_running()
    assert not refused.value.retryable and nginx.master_pid() is None

    closed.chmod(0o711)
    server = version_server(1)
    try:
        nginx.ensure_running()
        nginx.switch(MODEL, server.server_address[1], 1)
        answer = requests.post(f"http://127.0.0.1:{nginx.listen_port}/{MODEL}/classify",
                               data=b"x" * (512 << 10), timeout=30)  # over the 16-KiB buffer, so spooled to tmp/
        assert answer.status_code == 200 and answer.json() == {"version": 1}
    finally:
        nginx.stop()
        server.shutdown()
