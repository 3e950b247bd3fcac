"""A model renamed (in the admin) keeps its copies on hosts to itself, under the name the runtime knows.

Another team that creates a model with the old name does not see those copies on host pages or in
the API, cannot deploy over them, and the renamed model unloads them under its new name.
"""

import base64
import json

import pytest
import redis
from django.contrib.auth import get_user_model
from django.utils import timezone

from accounts.models import Team
from deployments.choices import TargetState
from deployments.models import Deployment, DeploymentTarget, ServingHost
from deployments.reconcile import reconcile_host
from registry.choices import ArtifactFormat
from registry.models import ModelVersion, RegisteredModel
from tests.factories import api_client_for, team_member
from tests.fixtures.services import TEST_BROKER_URL

pytestmark = pytest.mark.django_db


@pytest.fixture
def renamed(db):
    """Team vision's model served on gpu-0 as ``iris``, then renamed ``iris-legacy``; team nlp makes ``iris``."""
    vision, nlp = Team.objects.create(name="vision"), Team.objects.create(name="nlp")
    model = RegisteredModel.objects.create(name="iris", team=vision, next_version=2)
    version = ModelVersion.objects.create(model=model, version=1, format=ArtifactFormat.TRITON_MODEL_DIR,
                                          artifact_key="k", artifact_sha256="0" * 64, artifact_size=1)
    host = ServingHost.objects.create(
        name="gpu-0", inference_url="http://gpu-0:8000", last_heartbeat_at=timezone.now(),
        heartbeat={"runtime_live": True, "models": [{"name": "iris", "version": 1, "state": "READY"}]})
    deployment = Deployment.objects.create(model=model, version=version)
    DeploymentTarget.objects.create(deployment=deployment, host=host, state=TargetState.READY, served_name="iris")
    model.name = "iris-legacy"  # what the admin's change form does
    model.save()
    RegisteredModel.objects.create(name="iris", team=nlp)
    users = get_user_model().objects
    return {
        "vision": team_member(users.create_user(username="v"), "owner", team=vision),
        "nlp": team_member(users.create_user(username="n"), "owner", team=nlp),
        "host": host, "model": model,
    }


def test_the_new_iris_team_does_not_see_the_renamed_models_copies(renamed, client):
    body = api_client_for(renamed["nlp"]).get("/api/v1/hosts/gpu-0/").json()
    assert body["heartbeat"]["models"] == []
    client.force_login(renamed["nlp"])
    assert "In Triton" not in client.get("/hosts/gpu-0/").content.decode()
    owner_view = api_client_for(renamed["vision"]).get("/api/v1/hosts/gpu-0/").json()
    assert owner_view["heartbeat"]["models"] == [{"name": "iris", "version": 1, "state": "READY"}]


def test_the_new_iris_cannot_be_deployed_over_them(renamed, s3_endpoint):
    from deployments.served import host_served_name
    from modelyard.errors import Conflict

    with pytest.raises(Conflict, match="serves model 'iris-legacy' under the name 'iris'"):
        host_served_name(renamed["host"], RegisteredModel.objects.get(name="iris"))


def test_the_renamed_model_keeps_its_runtime_name_and_unloads_under_its_new_name(
    renamed, django_capture_on_commit_callbacks
):
    from deployments.lifecycle import unload_model
    from deployments.served import host_served_name

    assert host_served_name(renamed["host"], renamed["model"]) == "iris"
    assert reconcile_host(renamed["host"]) == []  # served as "iris": nothing to redeploy
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        assert unload_model(host_name="gpu-0", model_name="iris-legacy") == 1
    assert len(callbacks) == 1
    broker = redis.Redis.from_url(TEST_BROKER_URL)
    broker.delete("host.gpu-0")
    callbacks[0]()  # publishes the agent's task to the (test) broker
    message = json.loads(broker.lpop("host.gpu-0"))
    (payload,), _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
    assert payload["model"] == "iris" and payload["host"] == "gpu-0"


@pytest.mark.integration
def test_the_new_iris_pages_and_gates_leave_out_the_renamed_models_series(
        renamed, serve_exposition, start_prometheus):
    """gpu-0 still labels the renamed model's series ``model="iris"``; the new iris reads only gpu-1's."""
    import itertools
    import time

    from monitoring.prometheus import PrometheusClient
    from monitoring.services import model_metrics, version_gate_metrics

    def counting(version: int):
        ticks = itertools.count(1)
        def exposition() -> str:
            count = next(ticks) * 10
            return "".join(f'{name}{{model="iris",version="{version}"}} {count}\n'
                           for name in ("nv_inference_count", "nv_inference_request_success"))

        return exposition

    prometheus = start_prometheus([
        {"target": serve_exposition(counting(1)).target, "labels": {"host": "gpu-0"}},
        {"target": serve_exposition(counting(7)).target, "labels": {"host": "gpu-1"}},
    ])
    client = PrometheusClient(prometheus.url)
    both = 'count(nv_inference_count{model="iris"}) >= 2 and count(count_over_time(nv_inference_count[1m]) > 2) > 1'
    deadline = time.monotonic() + 30
    while not client.instant(both) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert client.instant(both), "Prometheus never scraped both hosts three times"

    shown = model_metrics("iris", "15m", client=client)["versions"]
    assert [row["version"] for row in shown] == [7] and shown[0]["throughput"] > 0
    assert set(version_gate_metrics("iris", window_seconds=60, client=client)) == {"7"}
