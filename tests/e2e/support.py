"""Helpers shared by the end-to-end tests: API calls that wait, a client that keeps sending requests, and a
Triton host behind its agent's gateway."""

import contextlib
import shutil
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import requests
from rest_framework.test import APIClient

from demo.iris import SAMPLE_INPUT


def wait_deployment(client: APIClient, deployment_id: int, timeout: float = 240) -> dict:
    deadline = time.monotonic() + timeout
    body = {}
    while time.monotonic() < deadline:
        body = client.get(f"/api/v1/deployments/{deployment_id}/").json()
        if body["status"] not in ("running",):
            return body
        time.sleep(0.5)
    pytest.fail(f"deployment {deployment_id} still in progress after {timeout} s: {body}")


def deploy_iris(client: APIClient, host: str, version: int, **fields) -> dict:
    """Deploy iris ``version`` to ``host`` through the API and wait: the rollout, which must succeed."""
    answer = client.post("/api/v1/deployments/", {"model": "iris", "version": version, "hosts": [host], **fields},
                         format="json")
    assert answer.status_code == 201, answer.content
    done = wait_deployment(client, answer.json()["id"])
    assert done["status"] == "succeeded", done
    return done


def upload(client: APIClient, archive) -> int:
    with open(archive, "rb") as fh:
        answer = client.post("/api/v1/models/iris/versions/", {"artifact": fh}, format="multipart")
    assert answer.status_code == 201, answer.content
    return answer.json()["version"]


class Traffic:
    """A client thread sending inference requests that name no version to one Triton host.

    Speaks Triton's HTTP/REST protocol (KServe v2) with plain requests so that each answer's
    ``model_version`` is seen: ``versions`` is the version of every successful answer, in order,
    ``failures`` the text of every failed request (each one a dropped request).
    """

    def __init__(self, base_url: str, model: str = "iris"):
        self.url = f"{base_url}/v2/models/{model}/infer"
        self.stop = threading.Event()
        self.versions: list[str] = []
        self.failures: list[str] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        batch = np.asarray(SAMPLE_INPUT, dtype=np.float32)
        self.body = {"inputs": [{"name": "input", "shape": list(batch.shape), "datatype": "FP32",
                                 "data": batch.reshape(-1).tolist()}], "outputs": [{"name": "label"}]}

    @property
    def ok(self) -> int:
        return len(self.versions)

    def _run(self):
        with requests.Session() as session:
            while not self.stop.is_set():
                try:
                    answer = session.post(self.url, json=self.body, timeout=10)
                    if answer.status_code == 200:
                        self.versions.append(answer.json()["model_version"])
                    else:
                        self.failures.append(f"HTTP {answer.status_code}: {answer.text[:200]}")
                except requests.RequestException as exc:
                    self.failures.append(f"{time.monotonic() - self.started:.1f} s in: {exc}")
                time.sleep(0.01)

    def __enter__(self):
        self.started = time.monotonic()
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(timeout=10)


def build_slow_iris_archive(out_path, *, name: str = "iris", seconds: float) -> Path:
    """The real iris model whose ``initialize`` takes ``seconds`` longer: a load that outlasts a
    host's deadline, the way a model that downloads weights or compiles kernels does (and, with a
    large ``seconds``, like a load that never ends)."""
    from demo.iris import build_iris_model_dir

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_iris_model_dir(Path(tmp), name=name)
        source = model_dir / "1" / "model.py"
        text = source.read_text()
        marker = "    def initialize(self, args):\n"
        assert marker in text
        source.write_text(text.replace(marker, f"{marker}        import time\n        time.sleep({seconds!r})\n", 1))
        out_path = Path(out_path)
        with tarfile.open(out_path, "w:gz") as archive:
            archive.add(model_dir, arcname=name)
    return out_path


class Heartbeats:
    """Ask every host to report in every ``interval`` seconds from a thread, as beat does in production
    (``deployments.request_heartbeats``); the reports are what mark hosts online and what makes the
    orchestrator send again the work a restarted agent dropped. Set ``settings.HEARTBEAT_INTERVAL``
    to the same interval (the requests expire after it)."""

    def __init__(self, interval: float = 1.0):
        self.interval = interval

    def __enter__(self):
        from deployments.tasks import request_heartbeats

        self._stop = threading.Event()

        def run():
            try:
                while not self._stop.wait(self.interval):
                    request_heartbeats()
            finally:
                from django.db import connections

                connections.close_all()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=30)


@dataclass
class GatewayStack:
    """A Triton host registered through the API, whose agent (a Celery worker on the host's queue) runs its
    gateway in front of a real Triton: ``client`` (an admin's API client), ``triton``, ``gateway_url``
    (the host's ``inference_url``) and the agent's ``staging`` directory."""

    client: APIClient
    triton: object
    gateway_url: str
    staging: Path


@contextlib.contextmanager
def gateway_stack(host: str, *, versions: int, s3_endpoint: str, start_triton: Callable,
                  start_celery_worker: Callable, tmp_path: Path,
                  agent_env: dict | None = None) -> Iterator[GatewayStack]:
    """Start the workers, register iris versions 1..``versions`` and the host ``host``; stop the gateway after
    (nginx runs as a daemon of its own). The agent's files live in a directory nginx's workers may traverse
    (they run as nobody under a root agent). ``agent_env`` adds to the agent's environment."""
    from django.contrib.auth import get_user_model

    from demo.iris import build_iris_archive
    from modelyard_agent.runtimes.gateway import TritonGateway
    from tests.factories import token_for
    from tests.fixtures.services import free_port

    triton = start_triton()
    port = free_port()
    home = Path(tempfile.mkdtemp(prefix="modelyard-e2e-gateway-"))
    home.chmod(0o711)
    start_celery_worker("default", env={"MODELYARD_S3_ENDPOINT_URL": s3_endpoint})
    start_celery_worker(f"host.{host}", concurrency=2, env={
        "MODELYARD_AGENT_MODEL_REPOSITORY": str(triton.model_repository),
        "MODELYARD_AGENT_STAGING_DIR": str(home / "staging"),
        "MODELYARD_AGENT_TRITON_GRPC_URL": triton.grpc_url, "MODELYARD_AGENT_TRITON_URL": triton.http_url,
        **(agent_env or {}),
    })
    user = get_user_model().objects.create_user(username="ci", password="a-long-test-password", is_staff=True)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token_for(user)}")
    assert client.post("/api/v1/models/", {"name": "iris"}, format="json").status_code == 201
    for version in range(1, versions + 1):
        assert upload(client, build_iris_archive(tmp_path / f"iris-{version}.tar.gz", name="iris")) == version
    gateway_url = f"http://127.0.0.1:{port}"
    assert client.post("/api/v1/hosts/", {
        "name": host, "inference_url": gateway_url,
        "config_overrides": {"parameters": {"EXECUTION_ENV_PATH": str(triton.execution_env)}},
    }, format="json").status_code == 201
    try:
        yield GatewayStack(client, triton, gateway_url, home / "staging")
    finally:
        TritonGateway(home / "staging" / "gateway", port, triton="").stop()
        shutil.rmtree(home, ignore_errors=True)
