"""The reference topology: two serving hosts, each in a network namespace of its own.

Each namespace (``tests.fixtures.netns``) holds a real Triton and a host agent started with
``modelyard-agent`` as a serving host installs it (the built wheel in a virtualenv of its own,
``tests.fixtures.wheels.installed_agent``), with an environment that holds no database or S3
settings. From inside a namespace only the broker and the S3 endpoint are reachable (both listen on the bridge's address
in this namespace); PostgreSQL is not. The control plane reaches S3 at a loopback address, which hosts cannot, so
artifact URLs must name the hosts' endpoint (``MODELYARD_S3_HOST_ENDPOINT_URL``). The orchestrator worker, the
API and the clients stay in this namespace, as the control plane and the users would.
Under steady client load from outside:

- a rolling update across both hosts fails no request;
- an agent killed with SIGKILL in the middle of a load, then started again, finishes the rollout
  within 60 s of being back: its heartbeat names its start and its work, and the orchestrator
  sends again what it dropped (``deployments.reconcile.dropped_targets``), well before the
  broker's visibility timeout would hand the old message out;
- a host whose link is down for 30 s is shown offline, then online again, still serving, with
  nothing lost and the other host serving throughout.
"""

import logging
import os
import signal
import subprocess
import sys
import time

import pytest
import redis
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from demo.iris import build_iris_archive
from deployments.models import DeploymentTarget
from modelyard_agent.runtimes.triton import TritonRuntime
from tests.e2e.support import Heartbeats, Traffic, upload, wait_deployment
from tests.factories import token_for
from tests.fixtures.services import (
    BIN,
    TEST_BROKER_URL,
    _spawn,
    _without_service_credentials,
    free_port,
    point_celery_at,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
logger = logging.getLogger(__name__)

HOSTS = ("ns-a", "ns-b")
HEARTBEAT_S = 1.0  # how often heartbeats are asked for (Heartbeats), and sent during long work
OFFLINE_AFTER_S = 6.0
LINK_DOWN_S = 30
BACK_WITHIN_S = 60

# Run inside a namespace: connect to each address and print what happened, one line each.
_REACH = """
import socket, sys
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
        print(target, "open")
    except OSError as exc:
        print(target, "closed", type(exc).__name__)
"""


@pytest.fixture
def fleet(request, network_namespaces, start_triton, start_celery_worker, installed_agent, tmp_path, settings):
    subnet = network_namespaces(len(HOSTS))
    gateway = subnet.gateway
    services = []

    broker_port, s3_port = free_port(), free_port()
    redis_log = tmp_path / "redis.log"
    services.append(subprocess.Popen(
        ["redis-server", "--port", str(broker_port), "--bind", "127.0.0.1", gateway, "--save", "",
         "--appendonly", "no", "--protected-mode", "no", "--logfile", str(redis_log)], start_new_session=True))
    broker = f"redis://{gateway}:{broker_port}/0"
    wait_for(lambda: _pings(broker), timeout=30, what="the fleet's broker")
    # One S3, at two addresses: the control plane's (loopback, as on `make run`) and the one hosts reach.
    s3 = _spawn("s3", [str(BIN / "moto_server"), "-H", "0.0.0.0", "-p", str(s3_port)], tmp_path,
                env={"MOTO_DISABLE_GLOBAL_CORS": "true"})
    services.append(s3.process)
    s3_url, s3_host_url = f"http://127.0.0.1:{s3_port}", f"http://{gateway}:{s3_port}"
    wait_for(lambda: _http_answers(s3_url), timeout=30, what="the fleet's S3 endpoint")

    from registry.storage import ArtifactStore

    settings.S3_ENDPOINT_URL = s3_url
    settings.S3_HOST_ENDPOINT_URL = s3_host_url
    settings.CELERY_BROKER_URL = broker
    settings.HEARTBEAT_INTERVAL = HEARTBEAT_S
    settings.HOST_OFFLINE_AFTER = OFFLINE_AFTER_S
    ArtifactStore().ensure_bucket()
    start_celery_worker("default", env={"CELERY_BROKER_URL": broker, "MODELYARD_S3_ENDPOINT_URL": s3_url,
                                        "MODELYARD_S3_HOST_ENDPOINT_URL": s3_host_url}, concurrency=2)
    point_celery_at(broker)
    request.addfinalizer(lambda: point_celery_at(TEST_BROKER_URL))  # the shared test broker again, after

    namespaces = dict(zip(HOSTS, subnet.namespaces, strict=True))
    tritons = {name: start_triton(netns=namespaces[name]) for name in HOSTS}
    agents = {}
    # Started outside the checkout, with nothing pointing back at its sources: the agent runs the wheel's code.
    agent_env = {k: v for k, v in _without_service_credentials(os.environ).items() if k != "PYTHONPATH"}
    where = subprocess.run([str(installed_agent.python), "-c", "import modelyard_agent as a; print(a.__file__)"],
                           cwd=tmp_path, env=agent_env, capture_output=True, text=True, timeout=60)
    assert where.stdout.startswith(str(installed_agent.root)), where.stdout + where.stderr

    def start_agent(name: str):
        ns = namespaces[name]
        command = ns.command([str(installed_agent.bin / "modelyard-agent"), "--host", name, "--runtime", "triton",
                              "--broker-url", broker, "--model-repository", str(tritons[name].model_repository),
                              "--triton-grpc-url", tritons[name].grpc_url, "--concurrency", "2",
                              "--heartbeat-interval", str(HEARTBEAT_S)])
        agent = _spawn(f"agent-{name}", command, tmp_path, env=agent_env, inherit=False, cwd=tmp_path)
        services.append(agent.process)
        wait_for(lambda: " ready." in agent.log_text() or agent.process.poll() is not None, timeout=60,
                 what=f"the agent of {name}")
        assert agent.process.poll() is None, agent.log_text()[-3000:]
        agents[name] = agent
        return agent

    for name in HOSTS:
        start_agent(name)
    staff = get_user_model().objects.create_user(username="ci", is_staff=True)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token_for(staff)}")
    assert client.post("/api/v1/models/", {"name": "iris"}, format="json").status_code == 201
    for name, triton in tritons.items():
        answer = client.post("/api/v1/hosts/", {
            "name": name, "runtime": "triton", "inference_url": triton.http_url, "metrics_url": triton.metrics_url,
            "config_overrides": {"parameters": {"EXECUTION_ENV_PATH": str(triton.execution_env)}},
        }, format="json")
        assert answer.status_code == 201, answer.content
    for number in (1, 2, 3):
        assert upload(client, build_iris_archive(tmp_path / f"v{number}.tar.gz")) == number
    yield {"client": client, "namespaces": namespaces, "tritons": tritons, "agents": agents,
           "start_agent": start_agent, "gateway": gateway, "broker_port": broker_port, "s3_port": s3_port}
    for process in services:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)


def _pings(url: str) -> bool:
    try:
        return redis.Redis.from_url(url, socket_timeout=1).ping()
    except redis.exceptions.RedisError:
        return False


def _http_answers(url: str) -> bool:
    import requests

    try:
        requests.get(url, timeout=1)
        return True
    except requests.RequestException:
        return False


def _deploy(client: APIClient, version: int, batch_size: int) -> int:
    answer = client.post("/api/v1/deployments/", {"model": "iris", "version": version, "hosts": list(HOSTS),
                                                  "batch_size": batch_size}, format="json")
    assert answer.status_code == 201, answer.content
    return answer.json()["id"]


def _online(client: APIClient, name: str) -> bool:
    return client.get(f"/api/v1/hosts/{name}/").json()["online"]


def test_two_namespaced_hosts_roll_out_recover_a_killed_agent_and_ride_out_a_lost_link(fleet):
    client, tritons, namespaces = fleet["client"], fleet["tritons"], fleet["namespaces"]
    gateway = fleet["gateway"]

    # The boundary: from inside a host only the broker and S3 answer; PostgreSQL does not.
    reach = subprocess.run(namespaces["ns-a"].command([
        sys.executable, "-c", _REACH, f"{gateway}:{fleet['broker_port']}", f"{gateway}:{fleet['s3_port']}",
        f"{gateway}:5432", "127.0.0.1:5432", f"127.0.0.1:{fleet['s3_port']}"]),
        capture_output=True, text=True, timeout=60)
    lines = dict(line.split(" ", 1) for line in reach.stdout.splitlines())
    assert lines[f"{gateway}:{fleet['broker_port']}"] == "open" and lines[f"{gateway}:{fleet['s3_port']}"] == "open"
    assert lines[f"{gateway}:5432"].startswith("closed") and lines["127.0.0.1:5432"].startswith("closed"), lines
    # The control plane's own S3 address (loopback) means nothing there: deployments work only because
    # their download URLs name MODELYARD_S3_HOST_ENDPOINT_URL.
    assert lines[f"127.0.0.1:{fleet['s3_port']}"].startswith("closed"), lines
    agent_env = open(f"/proc/{fleet['agents']['ns-a'].process.pid}/environ", "rb").read().split(b"\0")
    assert not [v for v in agent_env if v.startswith((b"DATABASE_URL=", b"MODELYARD_S3_", b"AWS_"))]

    with Heartbeats(HEARTBEAT_S):
        assert wait_deployment(client, _deploy(client, 1, batch_size=2))["status"] == "succeeded"

        # A rolling update across both hosts under load fails no request.
        with Traffic(tritons["ns-a"].http_url) as a, Traffic(tritons["ns-b"].http_url) as b:
            rollout = wait_deployment(client, _deploy(client, 2, batch_size=1))
            wait_for(lambda: a.versions[-1:] == ["2"] and b.versions[-1:] == ["2"], timeout=10, what="v2 answers")
        assert rollout["status"] == "succeeded", rollout
        assert a.failures == [] and b.failures == [] and a.ok > 20 and b.ok > 20

        # An agent SIGKILLed mid-load, started again, finishes the rollout within 60 s of being back.
        with Traffic(tritons["ns-a"].http_url) as a, Traffic(tritons["ns-b"].http_url) as b:
            started = _deploy(client, 3, batch_size=1)
            target = DeploymentTarget.objects.get(deployment_id=started, host__name="ns-a")

            def in_flight() -> bool:
                target.refresh_from_db()
                return target.state in ("staging", "loading", "verifying")

            wait_for(in_flight, timeout=60, what="the agent of ns-a to start v3", interval=0.05)
            fleet["agents"]["ns-a"].stop(sig=signal.SIGKILL)  # parent and children, as a crashed machine would
            time.sleep(3)
            fleet["start_agent"]("ns-a")
            back = time.monotonic()
            rollout = wait_deployment(client, started, timeout=BACK_WITHIN_S + 30)
            finished_after = time.monotonic() - back
        assert rollout["status"] == "succeeded", rollout
        logger.info("rollout done %.1f s after the killed agent was back", finished_after)
        assert finished_after < BACK_WITHIN_S, f"the rollout ended {finished_after:.0f} s after the agent was back"
        assert a.failures == [] and b.failures == []
        assert {n: TritonRuntime(t.http_url).ready_versions("iris") for n, t in tritons.items()} == \
            {"ns-a": [3], "ns-b": [3]}

        # ns-b's link down for 30 s: shown offline, then online again, still serving v3; ns-a serves throughout.
        assert _online(client, "ns-b")
        with Traffic(tritons["ns-a"].http_url) as a:
            namespaces["ns-b"].link(up=False)
            try:
                cut = time.monotonic()
                wait_for(lambda: not _online(client, "ns-b"), timeout=LINK_DOWN_S, what="ns-b shown offline")
                logger.info("ns-b shown offline %.1f s after its link went down", time.monotonic() - cut)
                time.sleep(max(0.0, LINK_DOWN_S - (time.monotonic() - cut)))
            finally:
                namespaces["ns-b"].link(up=True)
            restored = time.monotonic()
            wait_for(lambda: _online(client, "ns-b"), timeout=BACK_WITHIN_S, what="ns-b online again")
            logger.info("ns-b online again %.1f s after its link came back", time.monotonic() - restored)
        assert a.failures == [] and a.ok > 20
        with Traffic(tritons["ns-b"].http_url) as b:
            wait_for(lambda: b.ok > 20, timeout=30, what="answers from ns-b after its link came back")
        assert b.failures == [] and set(b.versions) == {"3"}
        assert {n: TritonRuntime(t.http_url).ready_versions("iris") for n, t in tritons.items()} == \
            {"ns-a": [3], "ns-b": [3]}
        assert client.get(f"/api/v1/deployments/{started}/").json()["status"] == "succeeded"
        assert not DeploymentTarget.objects.filter(state__in=["failed", "pending"]).exists()
