"""Fixtures for fault tests: real services that a test can stop and start again on the same port."""

import os
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from demo.iris import build_iris_archive
from modelyard_agent.runtimes.triton import TritonRuntime
from tests.e2e.support import upload, wait_deployment
from tests.factories import token_for
from tests.fixtures.services import (
    BIN,
    TEST_BROKER_URL,
    Service,
    _http_ok,
    _spawn,
    free_port,
    point_celery_at,
    wait_for,
)
from tests.fixtures.triton import TritonServer


@dataclass
class RestartableS3:
    """The S3 stand-in (moto's server) on a fixed port, stoppable and startable again.

    Moto keeps objects in memory, so a restart loses them, the bucket included; ``start`` creates the
    bucket again (a real S3 coming back keeps both).
    """

    port: int
    log_dir: Path
    service: Service | None = None
    url: str = field(init=False)

    def __post_init__(self):
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        from registry.storage import ArtifactStore

        self.service = _spawn("s3", [str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(self.port)],
                              self.log_dir, env={"MOTO_DISABLE_GLOBAL_CORS": "true"})
        wait_for(lambda: _http_ok(self.url), timeout=30, what="the S3 stand-in")
        ArtifactStore(endpoint_url=self.url).ensure_bucket()

    def stop(self) -> None:
        if self.service is not None:
            self.service.stop()


@pytest.fixture
def restartable_s3(tmp_path, settings) -> Iterator[RestartableS3]:
    """A running S3 stand-in of this test's own (the session's one stays up); settings point at it."""
    s3 = RestartableS3(port=free_port(), log_dir=tmp_path / "s3-logs")
    s3.start()
    settings.S3_ENDPOINT_URL = s3.url
    yield s3
    s3.stop()


def restart_triton(server: TritonServer) -> None:
    """Start a stopped or killed ``server`` again with the same command: same ports, same model
    repository, in explicit mode (so it comes back serving nothing). Waits until it is live."""
    with open(server.log_path, "ab") as log:
        server.process = subprocess.Popen(
            server.process.args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")})
    wait_for(lambda: TritonRuntime(server.http_url).is_live(), timeout=60, what="Triton to come back")


def kill_triton(server: TritonServer) -> None:
    """SIGKILL the server and its python-backend stubs (one process group), as a crash would."""
    os.killpg(server.process.pid, signal.SIGKILL)
    server.process.wait(timeout=30)


@pytest.fixture
def fleet_broker() -> str:
    """The broker the fleet's workers and this process use; a test module may start its own."""
    return TEST_BROKER_URL


@dataclass
class OneHostFleet:
    """One real Triton host ``gpu-1`` with its agent, an orchestrator worker, and model iris with
    versions 1 and 2 registered (v1 deployed and serving)."""

    client: APIClient
    triton: TritonServer
    workers: list

    def deploy(self, version: int, **options) -> int:
        answer = self.client.post("/api/v1/deployments/", {"model": "iris", "version": version, "hosts": ["gpu-1"],
                                                           **options}, format="json")
        assert answer.status_code == 201, answer.content
        return answer.json()["id"]

    def ready_versions(self) -> list[int]:
        return TritonRuntime(self.triton.http_url).ready_versions("iris")

    def worker_logs(self) -> str:
        return "\n".join(f"--- {w.name}\n{w.log_text()[-3000:]}" for w in self.workers)


@pytest.fixture
def fleet_orchestrators() -> int:
    """How many orchestrator workers ``one_host_fleet`` starts; a module overrides it for more."""
    return 1


@pytest.fixture
def one_host_fleet(fleet_broker, fleet_orchestrators, s3_endpoint, start_triton, start_celery_worker, tmp_path,
                   settings) -> Iterator[OneHostFleet]:
    settings.CELERY_BROKER_URL = fleet_broker
    point_celery_at(fleet_broker)
    triton = start_triton()
    env = {"MODELYARD_S3_ENDPOINT_URL": s3_endpoint, "CELERY_BROKER_URL": fleet_broker,
           "MODELYARD_BROKER_VISIBILITY_TIMEOUT": "20"}
    workers = [*(start_celery_worker("default", env=env) for _ in range(fleet_orchestrators)),
               start_celery_worker("host.gpu-1", env={
                   **env, "MODELYARD_AGENT_MODEL_REPOSITORY": str(triton.model_repository)})]
    staff = get_user_model().objects.create_user(username="ci", is_staff=True)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token_for(staff)}")
    assert client.post("/api/v1/models/", {"name": "iris"}, format="json").status_code == 201
    answer = client.post("/api/v1/hosts/", {
        "name": "gpu-1", "runtime": "triton", "inference_url": triton.http_url, "metrics_url": triton.metrics_url,
        "config_overrides": {"parameters": {"EXECUTION_ENV_PATH": str(triton.execution_env)}},
    }, format="json")
    assert answer.status_code == 201, answer.content
    for number in (1, 2):
        assert upload(client, build_iris_archive(tmp_path / f"v{number}.tar.gz")) == number
    fleet = OneHostFleet(client, triton, workers)
    first = wait_deployment(client, fleet.deploy(1))
    assert first["status"] == "succeeded", (first, fleet.worker_logs())
    yield fleet
    point_celery_at(TEST_BROKER_URL)
