"""A model's request capture settings: owners only, audited, bounded, sent to the Triton hosts that serve it
in their route, and sent again by the reconciler to a gateway that holds others."""

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from audit.models import AuditEvent
from deployments.capture import resend_capture
from deployments.choices import TargetState
from deployments.models import Deployment, DeploymentTarget, ServingHost
from modelyard_agent.contract import PROTOCOL_VERSION
from registry.choices import ArtifactFormat
from registry.models import ModelVersion, RegisteredModel
from tests.deployments.test_canaries import routes_sent
from tests.factories import api_client_for, team_member

pytestmark = pytest.mark.django_db

URL = "/api/v1/models/iris/capture/"


def heartbeat(protocol: int = 5, capture: dict | None = None) -> dict:
    return {"runtime_live": True, "agent": {"protocol": protocol},
            "gateway": {"live": True, "routes": {}, "capture": capture or {}}}


@pytest.fixture
def people(db):
    users = {}
    for name, role in (("owner", "owner"), ("member", "maintainer"), ("outsider", None)):
        user = get_user_model().objects.create_user(username=name, password="a-long-test-password")
        if role:
            team_member(user, role)
        users[name] = user
    return users


@pytest.fixture
def served(db):
    """iris v1 served by gpu-new (protocol 5) and gpu-old (protocol 4), both with live gateways."""
    model = RegisteredModel.objects.create(name="iris", next_version=2)
    version = ModelVersion.objects.create(
        model=model, version=1, format=ArtifactFormat.TRITON_MODEL_DIR, artifact_key="sha256/1",
        artifact_sha256="1" * 64, artifact_size=10, config_text='backend: "python"')
    deployment = Deployment.objects.create(model=model, version=version, status="succeeded")
    for name, protocol in (("gpu-new", 5), ("gpu-old", 4)):
        host = ServingHost.objects.create(name=name, inference_url=f"http://{name}:8080",
                                          heartbeat=heartbeat(protocol), last_heartbeat_at=timezone.now())
        DeploymentTarget.objects.create(deployment=deployment, host=host, state=TargetState.READY)
    return model


def test_capture_is_off_by_default(people, served):
    body = api_client_for(people["member"]).get(URL).json()
    assert (body["fraction"], body["max_bytes"], body["retention_seconds"]) == (0.0, 256 * 1024**2, 7 * 86400)
    assert [h["host"] for h in body["hosts"]] == ["gpu-new", "gpu-old"] and all(h["applied"] for h in body["hosts"])


def test_an_owner_turns_capture_on_audited_and_sent_to_each_host_that_can_capture(
        people, served, broker, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        answer = api_client_for(people["owner"]).patch(
            URL, {"fraction": 0.05, "max_bytes": 1024**2, "retention_seconds": 86400}, format="json")
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert (body["fraction"], body["max_bytes"], body["retention_seconds"]) == (0.05, 1024**2, 86400)
    assert len(body["warnings"]) == 1 and "gpu-old's agent speaks protocol 4" in body["warnings"][0]
    event = AuditEvent.objects.get(action="model.capture_settings")
    assert event.actor_label == "owner" and event.data == {
        "from": {"fraction": 0.0, "max_bytes": 256 * 1024**2, "retention_seconds": 7 * 86400},
        "to": {"fraction": 0.05, "max_bytes": 1024**2, "retention_seconds": 86400}}
    [route] = routes_sent(broker, "gpu-new")
    assert route["capture"] == {"fraction": 0.05, "max_bytes": 1024**2, "retention_seconds": 86400}
    assert (route["model"], route["stable"], route["canary"], route["protocol"]) == ("iris", 1, None, PROTOCOL_VERSION)
    assert routes_sent(broker, "gpu-old") == []
    assert api_client_for(people["owner"]).patch(URL, {"fraction": 0.05}, format="json").status_code == 200
    assert AuditEvent.objects.filter(action="model.capture_settings").count() == 1  # no change, no event


@pytest.mark.parametrize("who, status", [("member", 403), ("outsider", 404)])
def test_members_and_outsiders_may_not_change_capture(people, served, broker, who, status):
    answer = api_client_for(people[who]).patch(URL, {"fraction": 1.0}, format="json")
    assert answer.status_code == status, answer.content
    assert RegisteredModel.objects.get(name="iris").capture_fraction == 0
    assert routes_sent(broker, "gpu-new") == [] and not AuditEvent.objects.filter(action="model.capture_settings")


@pytest.mark.parametrize("body, message", [
    ({"fraction": 1.5}, "less than or equal to 1"),
    ({"fraction": True}, "not a boolean"),
    ({"max_bytes": 5 * 1024**3}, "MODELYARD_CAPTURE_MAX_BYTES_LIMIT"),
    ({"retention_seconds": 60}, "retention_seconds must be a whole number of seconds from 3600"),
    ({"retention_seconds": 31 * 86400}, "MODELYARD_CAPTURE_MAX_RETENTION_SECONDS"),
    ({}, "give fraction, max_bytes, retention_seconds"),
    ({"fraction": 0.1, "sample": 1}, "sample"),
])
def test_bad_settings_are_refused_with_a_message_and_change_nothing(people, served, body, message):
    answer = api_client_for(people["owner"]).patch(URL, body, format="json")
    assert answer.status_code == 400 and message in answer.content.decode(), answer.content
    model = RegisteredModel.objects.get(name="iris")
    assert (model.capture_fraction, model.capture_retention_seconds) == (0, 7 * 86400)


def test_the_reconciler_sends_the_settings_again_to_a_gateway_that_holds_others(people, served, broker):
    api_client_for(people["owner"]).patch(URL, {"fraction": 0.5}, format="json")
    broker.flushdb()
    assert resend_capture() == [("gpu-new", "iris")]
    assert resend_capture() == []  # not again within the backoff
    host = ServingHost.objects.get(name="gpu-new")
    host.heartbeat = heartbeat(capture={"iris": {"fraction": 0.5, "max_bytes": 256 * 1024**2,
                                                 "retention_seconds": 7 * 86400, "requests": 3, "bytes": 900,
                                                 "oldest": 1.0, "newest": 2.0, "skipped": 0}})
    host.save()
    broker.flushdb()
    assert resend_capture() == []
    body = api_client_for(people["member"]).get(URL).json()
    assert body["hosts"][0] == {"host": "gpu-new", "requests": 3, "bytes": 900, "oldest": 1.0, "newest": 2.0,
                                "skipped": 0, "applied": True, "problem": None}
    assert body["hosts"][1]["problem"].startswith("gpu-old's agent speaks protocol 4")


def test_the_model_page_shows_the_capture_panel_and_its_form_to_owners_only(people, served, client):
    from tests.factories import page_with_panels

    client.force_login(people["member"])
    page = page_with_panels(client, "/models/iris/")
    assert "Request capture" in page and "Off." in page and "captured requests hold users" in page.lower()
    assert "Save capture settings" not in page
    client.force_login(people["owner"])
    assert "Save capture settings" in page_with_panels(client, "/models/iris/")
    refused = client.post("/deployments/capture/iris/", {"fraction": "0.1", "max_mib": "64", "retention_days": "1"})
    assert refused.status_code == 302 and RegisteredModel.objects.get(name="iris").capture_fraction == 0
    client.post("/deployments/capture/iris/", {"fraction": "0.1", "max_mib": "64", "retention_days": "1",
                                              "confirm": "on"})
    model = RegisteredModel.objects.get(name="iris")
    assert (model.capture_fraction, model.capture_max_bytes, model.capture_retention_seconds) == (0.1, 64 << 20, 86400)
    client.force_login(people["member"])
    assert client.post("/deployments/capture/iris/", {"fraction": "0"}).status_code == 403


def test_turning_capture_on_for_a_model_a_bentoml_host_serves_warns_that_it_captures_nothing(
        people, served, broker):
    from deployments.choices import Runtime

    bento = ServingHost.objects.create(name="bento-0", runtime=Runtime.BENTOML, inference_url="http://bento-0:3000",
                                       heartbeat=heartbeat(), last_heartbeat_at=timezone.now())
    deployment = Deployment.objects.create(model=served, version=served.versions.get(version=1), status="succeeded")
    DeploymentTarget.objects.create(deployment=deployment, host=bento, state=TargetState.READY)
    answer = api_client_for(people["owner"]).patch(URL, {"fraction": 0.5}, format="json")
    assert answer.status_code == 200, answer.content
    assert any("bento-0 serves iris with BentoML, which captures nothing" in w for w in answer.json()["warnings"])
    assert all("bento-0" not in w for w in api_client_for(people["owner"]).patch(
        URL, {"fraction": 0}, format="json").json()["warnings"])


def test_a_bentoml_models_page_says_what_applies_instead_of_the_capture_form(people, client):
    clf = RegisteredModel.objects.create(name="clf", next_version=2)
    ModelVersion.objects.create(model=clf, version=1, format=ArtifactFormat.BENTO, artifact_key="b",
                                artifact_sha256="1" * 64, artifact_size=1)
    client.force_login(people["owner"])
    page = client.get("/models/clf/").content.decode()
    assert "Request capture and replay gates run on Triton hosts" in page
    assert 'id="model-capture"' not in page
