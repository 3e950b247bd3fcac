"""An nginx worker of a host's gateway killed while it holds requests or has them in flight, on a real Triton
behind a real gateway: the worker nginx's master starts in its place gives back the dead one's counts, so a
model's queue of held requests takes clients again, and no counter of the dead worker's stays behind."""

import json
import socket
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest
import requests

from tests.deployments.test_gateway import BODY
from tests.fixtures.on_demand import polling_without_loading, put_model
from tests.fixtures.services import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def host(make_host, triton_server):
    """A gateway in front of the session's shared Triton."""
    return make_host(triton_server)


def send_and_leave_open(gateway, model: str) -> socket.socket:
    """A client that sends one inference request for ``model`` and keeps its connection open."""
    body = json.dumps(BODY).encode()
    client = socket.create_connection(("127.0.0.1", gateway.listen_port))
    client.sendall(f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
                   f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    return client


def kill_workers(gateway) -> None:
    """SIGKILL every worker of the gateway's nginx and wait until its master has started new ones."""
    master = psutil.Process(int((gateway.dir / "nginx.pid").read_text()))
    old = master.children()
    assert old, "the gateway's nginx has no workers"
    for worker in old:
        worker.kill()
    psutil.wait_procs(old, timeout=10)
    dead = {worker.pid for worker in old}
    wait_for(lambda: len({w.pid for w in master.children()} - dead) == len(old), timeout=10,
             what="nginx's master to start new workers")


def test_held_requests_of_a_killed_worker_give_their_places_back(host):
    put_model(host.server, "held_by_dead")
    host.register_on_demand("held_by_dead", cold_start_timeout=60, max_held=2)
    clients = []
    with polling_without_loading(host) as stop_polling:
        try:
            clients = [send_and_leave_open(host, "held_by_dead") for _ in range(2)]
            wait_for(lambda: host.residency()["models"]["held_by_dead"]["held"] == 2, timeout=10, what="two held")
            kill_workers(host)
            wait_for(lambda: host.residency()["models"]["held_by_dead"]["held"] == 0, timeout=10,
                     what="the dead worker's held requests given back")
            # The queue (two places) takes the next client: it waits, rather than being refused queue_full.
            with ThreadPoolExecutor(1) as pool:
                waiting = pool.submit(requests.post, f"{host.url}/v2/models/held_by_dead/infer", json=BODY,
                                      timeout=60)
                wait_for(lambda: host.residency()["models"]["held_by_dead"]["held"] == 1, timeout=10,
                         what="the next client held")
                stop_polling.set()  # the loader dies: the held request is answered no_loader within seconds
                assert waiting.result().json()["reason"] == "no_loader"
        finally:
            for client in clients:
                client.close()


def test_requests_in_flight_on_a_killed_worker_are_no_longer_counted(host):
    put_model(host.server, "inflight_on_dead", infer_seconds=8)
    host.set_route("inflight_on_dead", stable=1)
    requests.post(f"{host.server.http_url}/v2/repository/models/inflight_on_dead/load", timeout=120).raise_for_status()
    client = send_and_leave_open(host, "inflight_on_dead")
    try:
        wait_for(lambda: host.inflight().get("inflight_on_dead/1", 0) == 1, timeout=30, what="one request in flight")
        counted = [key for key, count in host._control("GET", path="/inflight").items()
                   if key.startswith("inflight_on_dead/1/") and count]
        kill_workers(host)
        # The agent's sum already leaves out what dead workers counted (RoutesControl.inflight); the counters
        # themselves go too, so the dict does not fill with one counter per dead worker.
        wait_for(lambda: not set(counted) & set(host._control("GET", path="/inflight")), timeout=10,
                 what="the dead worker's counter gone")
        assert host.inflight().get("inflight_on_dead/1", 0) == 0
    finally:
        client.close()
        requests.post(f"{host.server.http_url}/v2/repository/models/inflight_on_dead/unload", timeout=60)
