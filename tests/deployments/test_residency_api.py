"""Residency through the API, the rollout form's service and the agent payload: "on_demand" with pinned and a
cold-start timeout is kept on the deployment, sent to the agent and carried by the rollouts that repeat it;
bad settings are refused with nothing written, and BentoML hosts refuse on demand."""

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone
from rest_framework.test import APIClient

from accounts.models import Team
from deployments.choices import Residency, TargetState
from deployments.lifecycle import reload_model
from deployments.models import Deployment, DeploymentTarget, ServingHost
from deployments.targets import build_agent_payload, transition
from registry.choices import ArtifactFormat
from registry.models import ModelVersion, RegisteredModel
from tests.factories import team_member, token_for

pytestmark = pytest.mark.django_db


@pytest.fixture
def version(db) -> ModelVersion:
    model = RegisteredModel.objects.create(name="iris", next_version=2)
    ServingHost.objects.create(name="gpu-0", inference_url="http://gpu-0:8000")
    return ModelVersion.objects.create(
        model=model, version=1, format=ArtifactFormat.TRITON_MODEL_DIR, artifact_key="sha256/ab/ab",
        artifact_sha256="ab" * 32, artifact_size=10, config_text='backend: "python"')


def deploy(api_client, **fields):
    return api_client.post("/api/v1/deployments/", {"model": "iris", "version": 1, "hosts": ["gpu-0"], **fields},
                           format="json")


def test_an_on_demand_deployment_keeps_its_settings_and_sends_them_to_the_agent(api_client, version):
    answer = deploy(api_client, residency="on_demand", pinned=True, cold_start_timeout=12.5)
    assert answer.status_code == 201, answer.content
    body = api_client.get(f"/api/v1/deployments/{answer.json()['id']}/").json()
    assert (body["residency"], body["pinned"], body["cold_start_timeout"]) == ("on_demand", True, 12.5)
    target = DeploymentTarget.objects.get(deployment_id=body["id"])
    payload = build_agent_payload(target, download_url="http://s3/x")
    assert (payload["residency"], payload["pinned"], payload["cold_start_timeout"]) == ("on_demand", True, 12.5)
    # The default stays "always", as before.
    plain = api_client.get(f"/api/v1/deployments/{deploy(api_client).json()['id']}/").json()
    assert (plain["residency"], plain["pinned"], plain["cold_start_timeout"]) == ("always", False, None)


def test_a_reload_repeats_the_residency_of_the_deployment_it_repeats(api_client, version):
    created = deploy(api_client, residency="on_demand", cold_start_timeout=5).json()
    transition(DeploymentTarget.objects.get(deployment_id=created["id"]).pk, TargetState.READY)
    DeploymentTarget.objects.filter(deployment_id=created["id"]).update(state=TargetState.UNLOADED)
    again = reload_model(host_name="gpu-0", model_name="iris")
    assert again.residency_settings() == {"residency": Residency.ON_DEMAND, "pinned": False,
                                          "cold_start_timeout": 5.0}


@pytest.mark.parametrize(("fields", "status", "says"), [
    ({"residency": "sometimes"}, 400, "residency"),
    ({"pinned": True}, 400, "on_demand"),
    ({"cold_start_timeout": 10}, 400, "on_demand"),
    ({"residency": "on_demand", "cold_start_timeout": 0}, 400, "cold_start_timeout"),
    ({"residency": "on_demand", "cold_start_timeout": 601}, 400, "cold_start_timeout"),
    ({"residency": "on_demand", "pinned": "yes please"}, 400, "pinned"),
])
def test_bad_residency_settings_are_refused_and_nothing_is_written(api_client, version, fields, status, says):
    answer = deploy(api_client, **fields)
    assert answer.status_code == status, answer.content
    assert says in answer.content.decode()
    assert not Deployment.objects.exists()


def test_bentoml_hosts_refuse_on_demand_with_a_reason(api_client, db):
    model = RegisteredModel.objects.create(name="iris", next_version=2)
    ModelVersion.objects.create(model=model, version=1, format=ArtifactFormat.BENTO, artifact_key="k",
                                artifact_sha256="cd" * 32, artifact_size=10, config_text="service: svc:Svc")
    ServingHost.objects.create(name="bento-0", runtime="bentoml", inference_url="http://bento-0:3000")
    answer = api_client.post("/api/v1/deployments/", {"model": "iris", "version": 1, "hosts": ["bento-0"],
                                                      "residency": "on_demand"}, format="json")
    assert answer.status_code == 409, answer.content
    assert "bento-0 run BentoML" in answer.json()["detail"]
    assert not Deployment.objects.exists()


GB = 1 << 30
REPORTED = {"gateway": {"live": True, "residency": {
    "models": {
        "iris": {"state": "resident", "pinned": False, "held": 0, "requests": 40, "last_used": 1_733_500_000.5,
                 "wanted": False, "failure": None, "cold_start_timeout": 30, "max_held": 256},
        "secret": {"state": "cold", "pinned": True, "held": 2, "requests": 3, "last_used": None, "wanted": True,
                   "failure": {"message": "out of memory", "retry_after": 4}, "cold_start_timeout": 10, "max_held": 8},
    },
    "budget": {"budget_bytes": 8 * GB, "resident_bytes": 3 * GB,
               "devices": {"GPU-b8e41d27-6f3a-4e95-a0c2-7d19e5b3f604": 1 * GB,
                           "GPU-5c3f7a9e-1d2b-4c8e-9f60-3a7b2e4d1c85": 3 * GB, "cpu": 0},
               "problem": "the memory of loaded models cannot be measured: no metrics URL"},
}}}


def test_a_hosts_residency_shows_each_model_on_demand_the_caller_may_read_and_the_budget(version):
    RegisteredModel.objects.create(name="secret", team=Team.objects.create(name="vision"))
    ServingHost.objects.filter(name="gpu-0").update(heartbeat=REPORTED, last_heartbeat_at=timezone.now())
    member = APIClient()
    member.credentials(HTTP_AUTHORIZATION="Bearer " + token_for(
        team_member(get_user_model().objects.create_user(username="reader"), "viewer")))

    answer = member.get("/api/v1/hosts/gpu-0/residency/")
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["host"] == "gpu-0" and body["reported_at"]
    # The budget holds on each device: the bytes held on each GPU (by its uuid) and in CPU memory.
    assert body["budget"] == {"budget_bytes": 8 * GB, "resident_bytes": 3 * GB,
                              "devices": {"GPU-5c3f7a9e-1d2b-4c8e-9f60-3a7b2e4d1c85": 3 * GB,
                                          "GPU-b8e41d27-6f3a-4e95-a0c2-7d19e5b3f604": 1 * GB, "cpu": 0},
                              "problem": "the memory of loaded models cannot be measured: no metrics URL"}
    # "secret" belongs to a team the reader is not in: left out, as if absent.
    assert body["models"] == [{"model": "iris", **REPORTED["gateway"]["residency"]["models"]["iris"]}]

    staff = APIClient()
    staff.credentials(HTTP_AUTHORIZATION="Bearer " + token_for(
        get_user_model().objects.create_user(username="admin", is_staff=True)))
    both = staff.get("/api/v1/hosts/gpu-0/residency/").json()["models"]
    assert [m["model"] for m in both] == ["iris", "secret"] and both[1]["failure"]["message"] == "out of memory"

    ServingHost.objects.create(name="cpu-1", inference_url="http://cpu-1:8000")  # never reported
    assert staff.get("/api/v1/hosts/cpu-1/residency/").json() == {
        "host": "cpu-1", "reported_at": None, "models": [],
        "budget": {"budget_bytes": None, "resident_bytes": None, "devices": {}, "problem": ""}}
    missing = staff.get("/api/v1/hosts/nowhere/residency/")
    assert missing.status_code == 404 and missing.json()["code"]
