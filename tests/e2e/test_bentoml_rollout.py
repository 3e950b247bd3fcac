"""A BentoML host through the same API, rollouts and workers as Triton hosts: Bentos built by BentoML
are uploaded, rolled out by a real orchestrator worker to a real host agent, which serves them with
``bentoml serve`` behind its nginx; v1 to v2 under continuous requests fails none, a Bento whose
service cannot start fails its rollout with v2 still serving, and the heartbeat reports what serves."""

import threading

import pytest
import requests
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from deployments.models import ServingHost
from deployments.tasks import report_heartbeat
from tests.deployments.bentoml_host import MODEL, SAMPLE, agent_root, bentos
from tests.e2e.support import wait_deployment
from tests.fixtures.services import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
__all__ = ["agent_root", "bentos"]  # fixtures


def test_a_bentoml_host_takes_rollouts_through_the_api_without_failing_a_request(
    s3_endpoint, start_celery_worker, bentos, agent_root
):
    root, url = agent_root
    env = {"MODELYARD_S3_ENDPOINT_URL": s3_endpoint}
    start_celery_worker("default", env=env)
    start_celery_worker("host.bento-1", with_database=False, env={**env, "MODELYARD_AGENT_BENTOML_ROOT": str(root)})
    user = get_user_model().objects.create_user(username="ci", is_staff=True)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    assert client.post("/api/v1/models/", {"name": MODEL}, format="json").status_code == 201
    answer = client.post("/api/v1/hosts/", {"name": "bento-1", "runtime": "bentoml", "inference_url": url},
                         format="json")
    assert answer.status_code == 201, answer.content
    for number, name in ((1, "v1"), (2, "v2"), (3, "refuses")):
        with bentos[name].open("rb") as handle:
            answer = client.post(f"/api/v1/models/{MODEL}/versions/", {
                "artifact": handle, "metadata": '{"sample_input": {"features": [[0.0, 1.0]]}}'}, format="multipart")
        assert answer.status_code == 201, answer.content
        assert answer.json()["version"] == number

    def deploy(version: int) -> dict:
        started = client.post("/api/v1/deployments/", {"model": MODEL, "version": version, "hosts": ["bento-1"]},
                              format="json")
        assert started.status_code == 201, started.content
        return wait_deployment(client, started.json()["id"])

    assert deploy(1)["status"] == "succeeded"
    stop, failures, versions = threading.Event(), [], []

    def traffic() -> None:
        session = requests.Session()
        while not stop.is_set():
            try:
                answer = session.post(f"{url}/{MODEL}/classify", json=SAMPLE, timeout=30)
                (versions if answer.status_code == 200 else failures).append(
                    answer.headers.get("X-Modelyard-Version") if answer.status_code == 200 else answer.text[:200])
            except requests.RequestException as exc:
                failures.append(repr(exc))

    client_thread = threading.Thread(target=traffic)
    client_thread.start()
    try:
        second = deploy(2)
        wait_for(lambda: versions[-1:] == ["2"], timeout=10, what="answers from v2")
        third = deploy(3)
    finally:
        stop.set()
        client_thread.join()
    assert second["status"] == "succeeded", second
    assert third["status"] in ("paused", "failed"), third
    assert "this service refuses to start" in third["targets"][0]["error"]
    assert failures == []
    assert set(versions[versions.index("2"):]) == {"2"}

    host = ServingHost.objects.get(name="bento-1")
    report_heartbeat.apply_async(args=[{"host": host.name, "inference_url": url, "runtime": "bentoml"}],
                                 queue=host.queue)

    def reported() -> bool:
        host.refresh_from_db()
        return bool(host.heartbeat.get("models"))

    wait_for(reported, timeout=30, what="the BentoML agent's heartbeat")
    assert host.heartbeat["runtime_live"] is True
    assert host.heartbeat["models"] == [{"name": MODEL, "version": 2, "state": "READY"}]
