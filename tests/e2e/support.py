"""Helpers shared by the end-to-end tests: API calls that wait, and a client that keeps sending requests."""

import tarfile
import tempfile
import threading
import time
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
