"""The control plane scaled out, on real components: two web processes (gunicorn, as docker-compose runs it) and
two orchestrator workers, each a process of its own, six Triton hosts with their agents, PostgreSQL, Redis and
S3. A rolling update over the six in batches of two is started through one web process, paused through the
other while its first batch loads, resumed through the first, and one orchestrator worker is SIGKILLed while
the next batch loads. The other finishes the rollout, and each host's agent received its target exactly once,
counted in the agents' own logs.
"""

import re
import signal
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from demo.iris import build_iris_archive
from deployments.models import DeploymentTarget
from modelyard_agent.contract import AgentTask
from modelyard_agent.runtimes.triton import TritonRuntime
from tests.e2e.support import Heartbeats, upload
from tests.factories import token_for
from tests.fixtures.services import TEST_BROKER_URL, _spawn, _test_database_url, free_port, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

HOSTS = tuple(f"scale-{i}" for i in range(6))


def start_web(tmp_path: Path, s3_endpoint: str):
    """One gunicorn web process on the test database, broker and S3; its service and base URL."""
    port = free_port()
    gunicorn = str(Path(sys.executable).parent / "gunicorn")
    service = _spawn(f"web-{port}", [gunicorn, "-c", "python:modelyard.gunicorn_config", "modelyard.wsgi",
                                     "--bind", f"127.0.0.1:{port}", "--workers", "1", "--timeout", "120"],
                     tmp_path, env={"DATABASE_URL": _test_database_url(), "CELERY_BROKER_URL": TEST_BROKER_URL,
                                    "MODELYARD_S3_ENDPOINT_URL": s3_endpoint})
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        try:
            return requests.get(f"{url}/healthz", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    wait_for(healthy, timeout=90, what=f"gunicorn on {port}", describe=service.log_text)
    return service, url


def received(log_text: str) -> int:
    """How many deploy tasks a Celery agent's log says it received."""
    return len(re.findall(rf"Task {re.escape(AgentTask.DEPLOY.value)}\[[^\]]+\] received", log_text))


def test_six_hosts_in_batches_of_two_through_two_web_processes_and_two_workers_one_killed_get_one_dispatch_each(
        s3_endpoint, start_triton, start_celery_worker, tmp_path, settings):
    settings.HEARTBEAT_INTERVAL = 1
    with ThreadPoolExecutor(len(HOSTS)) as pool:
        tritons = dict(zip(HOSTS, pool.map(lambda _: start_triton(), HOSTS), strict=True))
    env = {"MODELYARD_S3_ENDPOINT_URL": s3_endpoint}
    workers = [start_celery_worker("default", env=env, name=f"orchestrator-{i}") for i in (1, 2)]
    agents = {name: start_celery_worker(f"host.{name}", env={
        **env, "MODELYARD_AGENT_MODEL_REPOSITORY": str(tritons[name].model_repository)}) for name in HOSTS}
    webs = [start_web(tmp_path, s3_endpoint) for _ in range(2)]
    try:
        user = get_user_model().objects.create_user(username="ci", is_staff=True)
        token = token_for(user)
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
        assert client.post("/api/v1/models/", {"name": "iris"}, format="json").status_code == 201
        for name, triton in tritons.items():
            assert client.post("/api/v1/hosts/", {
                "name": name, "runtime": "triton", "inference_url": triton.http_url,
                "config_overrides": {"parameters": {"EXECUTION_ENV_PATH": str(triton.execution_env)}},
            }, format="json").status_code == 201
        assert upload(client, build_iris_archive(tmp_path / "v1.tar.gz")) == 1
        (_, web_a), (_, web_b) = webs
        auth = {"Authorization": f"Bearer {token}"}

        def call(url: str, method: str, path: str, **body) -> dict:
            answer = requests.request(method, f"{url}/api/v1/{path}", json=body or None, headers=auth, timeout=30)
            assert answer.status_code < 300, (url, path, answer.status_code, answer.text)
            return answer.json()

        with Heartbeats(1):
            rollout = call(web_a, "POST", "deployments/", model="iris", version=1, hosts=list(HOSTS), batch_size=2)
            targets = DeploymentTarget.objects.filter(deployment_id=rollout["id"])
            wait_for(lambda: targets.filter(dispatched_at__isnull=False).count() == 2, timeout=60,
                     what="the first batch dispatched", interval=0.05)
            call(web_b, "POST", f"deployments/{rollout['id']}/pause/")
            wait_for(lambda: targets.filter(state="ready").count() == 2, timeout=120, what="the first batch ready")
            assert targets.filter(dispatched_at__isnull=False).count() == 2  # paused: no second batch
            call(web_a, "POST", f"deployments/{rollout['id']}/resume/")
            wait_for(lambda: targets.filter(state__in=["staging", "loading", "verifying"]).exists(), timeout=60,
                     what="the second batch under way", interval=0.05)
            workers[0].stop(sig=signal.SIGKILL)
            wait_for(lambda: call(web_b, "GET", f"deployments/{rollout['id']}/")["status"] != "running",
                     timeout=240, what="the rollout to end", interval=0.5)
        done = call(web_b, "GET", f"deployments/{rollout['id']}/")
        assert done["status"] == "succeeded", done
        assert sorted(t["batch"] for t in done["targets"]) == [0, 0, 1, 1, 2, 2]
        assert {name: TritonRuntime(t.http_url).ready_versions("iris") for name, t in tritons.items()} == {
            name: [1] for name in HOSTS}
        assert {name: received(agent.log_text()) for name, agent in agents.items()} == {name: 1 for name in HOSTS}
    finally:
        for service, _ in webs:
            service.stop()
