"""Residency through the API, the rollout form's service and the agent payload: "on_demand" with pinned and a
cold-start timeout is kept on the deployment, sent to the agent and carried by the rollouts that repeat it;
bad settings are refused with nothing written, and BentoML hosts refuse on demand."""

import pytest

from deployments.choices import Residency, TargetState
from deployments.lifecycle import reload_model
from deployments.models import Deployment, DeploymentTarget, ServingHost
from deployments.targets import build_agent_payload, transition
from registry.choices import ArtifactFormat
from registry.models import ModelVersion, RegisteredModel

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
