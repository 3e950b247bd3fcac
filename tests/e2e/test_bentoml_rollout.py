"""A BentoML host through the same API, rollouts and workers as Triton hosts: Bentos built by BentoML
are uploaded, rolled out by a real orchestrator worker to a real host agent, which serves them with
``bentoml serve`` behind its nginx; v1 to v2 under continuous requests fails none, a Bento whose
service cannot start fails its rollout with v2 still serving, the heartbeat reports what serves, and
an agent SIGKILLed mid-swap leaves one version serving and the rollout finishes once an agent is back."""

import signal
import threading

import pytest
import requests
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from deployments.models import DeploymentTarget, ServingHost
from modelyard_agent.worker import report_heartbeat
from tests.deployments.bentoml_host import MODEL, SAMPLE, agent_root, serving_homes
from tests.e2e.support import Heartbeats, wait_deployment
from tests.factories import token_for
from tests.fixtures.services import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
__all__ = ["agent_root"]  # fixtures


HOST = "bento-1"
VISIBILITY_TIMEOUT_S = 20  # a redelivered deployment comes back soon, never while its first delivery runs


class Traffic:
    """A client thread posting the sample input to the model through the host's nginx, with keep-alive:
    ``versions`` holds the version that answered each successful request, ``failures`` the others."""

    def __init__(self, url: str):
        self.url, self.versions, self.failures = url, [], []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        session = requests.Session()
        while not self._stop.is_set():
            try:
                answer = session.post(f"{self.url}/{MODEL}/classify", json=SAMPLE, timeout=30)
                if answer.status_code == 200:
                    self.versions.append(answer.headers.get("X-Modelyard-Version"))
                else:
                    self.failures.append(f"{answer.status_code}: {answer.text[:200]}")
            except requests.RequestException as exc:
                self.failures.append(repr(exc))

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


@pytest.fixture
def bento_host(s3_endpoint, start_celery_worker, bentos, agent_root):
    """An API client, a BentoML host with a real agent, versions 1, 2 and 3 (cannot start) uploaded
    and v1 rolled out. Returns ``(client, deploy(version) -> started deployment, start_agent, agents)``."""
    root, url = agent_root
    env = {"MODELYARD_S3_ENDPOINT_URL": s3_endpoint, "MODELYARD_BROKER_VISIBILITY_TIMEOUT": str(VISIBILITY_TIMEOUT_S)}
    start_celery_worker("default", env=env)
    agents = []

    def start_agent():
        agents.append(start_celery_worker(f"host.{HOST}", runtime="bentoml",
                                          env={**env, "MODELYARD_AGENT_BENTOML_ROOT": str(root)}))

    start_agent()
    user = get_user_model().objects.create_user(username="ci", is_staff=True)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token_for(user)}")
    assert client.post("/api/v1/models/", {"name": MODEL}, format="json").status_code == 201
    answer = client.post("/api/v1/hosts/", {"name": HOST, "runtime": "bentoml", "inference_url": url}, format="json")
    assert answer.status_code == 201, answer.content
    for number, name in ((1, "v1"), (2, "v2"), (3, "refuses")):
        with bentos[name].open("rb") as handle:
            answer = client.post(f"/api/v1/models/{MODEL}/versions/", {
                "artifact": handle, "metadata": '{"sample_input": {"features": [[0.0, 1.0]]}}'}, format="multipart")
        assert answer.status_code == 201, answer.content
        assert answer.json()["version"] == number

    def deploy(version: int) -> int:
        started = client.post("/api/v1/deployments/", {"model": MODEL, "version": version, "hosts": [HOST]},
                              format="json")
        assert started.status_code == 201, started.content
        return started.json()["id"]

    assert wait_deployment(client, deploy(1))["status"] == "succeeded"
    return client, deploy, start_agent, agents


def test_a_bentoml_host_takes_rollouts_through_the_api_without_failing_a_request(bento_host, agent_root):
    client, deploy, _, _ = bento_host
    root, url = agent_root
    with Traffic(url) as traffic:
        second = wait_deployment(client, deploy(2))
        # nginx's reload lets old and new workers both accept for ~100 ms, so answers from v1 and v2
        # may interleave until the swap ends; once it has, only v2 answers.
        after_swap = len(traffic.versions)
        wait_for(lambda: len(traffic.versions) > after_swap + 20, timeout=10, what="answers after the swap")
        third = wait_deployment(client, deploy(3))
    assert second["status"] == "succeeded", second
    assert third["status"] in ("paused", "failed"), third
    assert "this service refuses to start" in third["targets"][0]["error"]
    assert traffic.failures == []
    assert set(traffic.versions[after_swap:]) == {"2"}

    host = ServingHost.objects.get(name=HOST)
    report_heartbeat.apply_async(args=[{"host": host.name, "inference_url": url, "runtime": "bentoml"}],
                                 queue=host.queue)

    def reported() -> bool:
        host.refresh_from_db()
        return bool(host.heartbeat.get("models"))

    wait_for(reported, timeout=30, what="the BentoML agent's heartbeat")
    assert host.heartbeat["runtime_live"] is True
    assert host.heartbeat["models"] == [{"name": MODEL, "version": 2, "state": "READY"}]


def test_a_rollout_survives_a_bentoml_agent_killed_mid_swap(bento_host, agent_root, settings):
    client, deploy, start_agent, agents = bento_host
    root, url = agent_root
    settings.HEARTBEAT_INTERVAL = 1
    with Heartbeats(1), Traffic(url) as traffic:
        started = deploy(2)
        target = DeploymentTarget.objects.get(deployment_id=started)

        def in_flight() -> bool:
            target.refresh_from_db()
            return target.state in ("loading", "verifying")

        wait_for(in_flight, timeout=60, what="the agent to start v2", interval=0.05)
        agents[0].stop(sig=signal.SIGKILL)  # the whole worker, as a crashed machine would
        wait_for(lambda: len(traffic.versions) > 10, timeout=30, what="answers while no agent runs")
        start_agent()  # its heartbeat tidies the half-done swap, and the orchestrator sends the target again
        rollout = wait_deployment(client, started, timeout=240)
        wait_for(lambda: traffic.versions[-1:] == ["2"], timeout=10, what="answers from v2")
    assert rollout["status"] == "succeeded", rollout
    assert traffic.failures == []
    assert len(serving_homes(root)) == 1
