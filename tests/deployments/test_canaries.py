"""Canary deployments through the API: refused where a host cannot split traffic, percent changes sent to
each host's agent and audited, promotion and rollback as plain rollouts."""

import base64
import json

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from audit.models import AuditEvent
from deployments.choices import CanaryState, TargetState
from deployments.models import Deployment, DeploymentTarget, ServingHost
from deployments.targets import build_agent_payload
from modelyard_agent.contract import AgentTask, host_queue
from registry.choices import ArtifactFormat
from registry.models import ModelVersion, RegisteredModel

pytestmark = pytest.mark.django_db

GATEWAY = {"runtime_live": True, "agent": {"protocol": 4}, "gateway": {"live": True, "routes": {}}}


@pytest.fixture
def user(db):
    return get_user_model().objects.create_user(username="ops", password="a-long-test-password", is_staff=True)


@pytest.fixture
def fleet(db):
    """Model iris with versions 1 and 2; gpu-0 and gpu-1 serve version 1, their agents run gateways."""
    model = RegisteredModel.objects.create(name="iris", next_version=3)
    versions = [ModelVersion.objects.create(
        model=model, version=n, format=ArtifactFormat.TRITON_MODEL_DIR, artifact_key=f"sha256/{n}",
        artifact_sha256=f"{n}" * 64, artifact_size=10, config_text='backend: "python"') for n in (1, 2)]
    served = Deployment.objects.create(model=model, version=versions[0], status="succeeded")
    hosts = []
    for name in ("gpu-0", "gpu-1"):
        host = ServingHost.objects.create(name=name, inference_url=f"http://{name}:8080", heartbeat=GATEWAY,
                                          last_heartbeat_at=timezone.now())
        DeploymentTarget.objects.create(deployment=served, host=host, state=TargetState.READY)
        hosts.append(host)
    return versions, hosts


def start(api_client, percent=10, hosts=("gpu-0", "gpu-1")):
    return api_client.post("/api/v1/deployments/", {"model": "iris", "version": 2, "hosts": list(hosts),
                                                    "canary_percent": percent}, format="json")


def routes_sent(client, host: str) -> list[dict]:
    """The ROUTE payloads queued for ``host``'s agent (kombu keeps each message as JSON in the queue's list)."""
    found = []
    for raw in client.lrange(host_queue(host), 0, -1):
        message = json.loads(raw)
        if message["headers"]["task"] == AgentTask.ROUTE.value:
            found.append(json.loads(base64.b64decode(message["body"]))[0][0])
    return found


def test_a_canary_deployment_keeps_the_stable_version_in_each_payload(api_client, fleet):
    answer = start(api_client, percent=10)
    assert answer.status_code == 201, answer.content
    body = answer.json()
    assert (body["canary_percent"], body["canary_state"]) == (10.0, "active")
    assert [(h["host"], h["stable"]) for h in body["canary"]["hosts"]] == [("gpu-0", 1), ("gpu-1", 1)]
    target = DeploymentTarget.objects.get(deployment_id=body["id"], host__name="gpu-0")
    assert build_agent_payload(target, download_url="http://s3/x")["canary_percent"] == 10.0


@pytest.mark.parametrize("change,says", [
    (lambda hosts: hosts[1].__setattr__("heartbeat", {"agent": {"protocol": 4}, "gateway": None}),
     "gpu-1 reports no live gateway (run its agent with --triton-url"),
    (lambda hosts: hosts[1].__setattr__("heartbeat", {"agent": {"protocol": 3}, "gateway": {"live": True}}),
     "gpu-1's agent speaks protocol 3, canaries need 4"),
])
def test_a_canary_is_refused_on_a_host_that_cannot_split_and_nothing_is_written(api_client, fleet, change, says):
    versions, hosts = fleet
    change(hosts)
    hosts[1].save()
    before = Deployment.objects.count()
    answer = start(api_client)
    assert answer.status_code == 409 and says in answer.json()["detail"], answer.content
    assert Deployment.objects.count() == before


@pytest.fixture
def bento_fleet(db):
    """Model clf with Bento versions 1 and 2; bento-0 serves version 1, bento-1 too but its agent reports no
    gateway (an agent from before BentoML canaries, or an nginx without the Lua module)."""
    model = RegisteredModel.objects.create(name="clf", next_version=3)
    versions = [ModelVersion.objects.create(
        model=model, version=n, format=ArtifactFormat.BENTO, artifact_key=f"sha256/{n}", artifact_sha256=f"{n}" * 64,
        artifact_size=10, signature={"bentoml": {"tag": f"clf:v{n}"}}) for n in (1, 2)]
    served = Deployment.objects.create(model=model, version=versions[0], status="succeeded")
    hosts = []
    for name, heartbeat in (("bento-0", GATEWAY), ("bento-1", {"runtime_live": True, "agent": {"protocol": 4}})):
        host = ServingHost.objects.create(name=name, runtime="bentoml", inference_url=f"http://{name}:3000",
                                          heartbeat=heartbeat, last_heartbeat_at=timezone.now())
        DeploymentTarget.objects.create(deployment=served, host=host, state=TargetState.READY)
        hosts.append(host)
    return versions, hosts


def test_a_bentoml_host_whose_agent_reports_a_gateway_takes_a_canary_and_its_percent_changes(
        api_client, bento_fleet, broker, django_capture_on_commit_callbacks):
    versions, _ = bento_fleet
    answer = api_client.post("/api/v1/deployments/", {"model": "clf", "version": 2, "hosts": ["bento-0"],
                                                      "canary_percent": 10}, format="json")
    assert answer.status_code == 201, answer.content
    deployment = answer.json()["id"]
    DeploymentTarget.objects.filter(deployment_id=deployment).update(state=TargetState.READY,
                                                                     previous_version=versions[0])
    with django_capture_on_commit_callbacks(execute=True):
        changed = api_client.patch(f"/api/v1/deployments/{deployment}/", {"canary_percent": 50}, format="json")
    assert changed.status_code == 200
    [route] = routes_sent(broker, "bento-0")
    assert (route["runtime"], route["model"], route["stable"], route["canary"], route["percent"]) == (
        "bentoml", "clf", 1, 2, 50.0)


def test_a_bentoml_host_whose_agent_reports_no_gateway_is_refused_with_what_to_install(api_client, bento_fleet):
    answer = api_client.post("/api/v1/deployments/", {"model": "clf", "version": 2, "hosts": ["bento-0", "bento-1"],
                                                      "canary_percent": 10}, format="json")
    assert answer.status_code == 409
    detail = answer.json()["detail"]
    assert "bento-1 reports no live gateway (its agent's nginx needs Debian's libnginx-mod-http-lua" in detail
    assert "bento-0" not in detail


def test_a_canary_on_a_host_that_serves_nothing_yet_is_refused(api_client, fleet):
    ServingHost.objects.create(name="gpu-2", inference_url="http://gpu-2:8080", heartbeat=GATEWAY,
                               last_heartbeat_at=timezone.now())
    answer = start(api_client, hosts=["gpu-2"])
    assert answer.status_code == 409 and "gpu-2 serves no version of iris yet" in answer.json()["detail"]


@pytest.mark.parametrize("percent", [-1, 100.5, "ten"])
def test_a_percent_outside_0_to_100_is_a_400(api_client, fleet, percent):
    answer = start(api_client, percent=percent)
    assert answer.status_code == 400 and "canary_percent" in answer.json()["fields"]


def _reach(deployment_id: int, versions) -> None:
    """Mark the canary READY on both hosts, each with version 1 as its stable version."""
    DeploymentTarget.objects.filter(deployment_id=deployment_id).update(state=TargetState.READY,
                                                                        previous_version=versions[0])


def test_changing_the_percent_sends_each_reached_host_its_route_and_is_audited(api_client, fleet, broker,
                                                                                 django_capture_on_commit_callbacks):
    versions, _ = fleet
    deployment = start(api_client).json()["id"]
    _reach(deployment, versions)
    with django_capture_on_commit_callbacks(execute=True):
        answer = api_client.patch(f"/api/v1/deployments/{deployment}/", {"canary_percent": 40}, format="json")
    assert answer.status_code == 200 and answer.json()["canary_percent"] == 40.0
    for host in ("gpu-0", "gpu-1"):
        [route] = routes_sent(broker, host)
        assert (route["model"], route["stable"], route["canary"], route["percent"]) == ("iris", 1, 2, 40.0)
    event = AuditEvent.objects.filter(object_type="deployment", object_id=str(deployment)).latest("id")
    assert event.data["change"] == "canary_traffic"
    assert (event.data["from"]["canary_percent"], event.data["to"]["canary_percent"]) == (10.0, 40.0)


def test_a_shadow_deployment_mirrors_its_share_and_serves_no_client(api_client, fleet, broker,
                                                                    django_capture_on_commit_callbacks):
    versions, _ = fleet
    answer = api_client.post("/api/v1/deployments/", {"model": "iris", "version": 2, "hosts": ["gpu-0"],
                                                      "shadow_percent": 20}, format="json")
    assert answer.status_code == 201, answer.content
    body = answer.json()
    assert (body["canary_percent"], body["shadow_percent"], body["canary_state"]) == (0.0, 20.0, "active")
    target = DeploymentTarget.objects.get(deployment_id=body["id"])
    payload = build_agent_payload(target, download_url="http://s3/x")
    assert (payload["canary_percent"], payload["shadow_percent"]) == (0.0, 20.0)
    _reach(body["id"], versions)
    with django_capture_on_commit_callbacks(execute=True):
        changed = api_client.patch(f"/api/v1/deployments/{body['id']}/", {"shadow_percent": 50}, format="json")
    assert changed.status_code == 200 and changed.json()["shadow_percent"] == 50.0
    [route] = routes_sent(broker, "gpu-0")
    assert (route["stable"], route["canary"], route["percent"], route["shadow"], route["shadow_percent"]) == (
        1, 2, 0.0, 2, 50.0)
    assert api_client.patch(f"/api/v1/deployments/{body['id']}/", {}, format="json").status_code == 400


def test_patch_refuses_other_fields_a_bad_percent_and_a_deployment_without_a_canary(api_client, fleet):
    versions, _ = fleet
    deployment = start(api_client).json()["id"]
    assert api_client.patch(f"/api/v1/deployments/{deployment}/", {"batch_size": 3}, format="json").status_code == 400
    assert api_client.patch(f"/api/v1/deployments/{deployment}/", {"canary_percent": 101},
                            format="json").status_code == 400
    plain = Deployment.objects.exclude(pk=deployment).get()
    answer = api_client.patch(f"/api/v1/deployments/{plain.pk}/", {"canary_percent": 5}, format="json")
    assert answer.status_code == 409 and "has no active canary (not a canary)" in answer.json()["detail"]
    assert Deployment.objects.get(pk=deployment).canary_percent == 10.0


def test_promote_rolls_the_canary_version_out_plainly_and_only_once(api_client, fleet):
    versions, _ = fleet
    deployment = start(api_client).json()["id"]
    _reach(deployment, versions)
    answer = api_client.post(f"/api/v1/deployments/{deployment}/promote/")
    assert answer.status_code == 201, answer.content
    promotion = answer.json()
    assert (promotion["version"], promotion["canary_state"], promotion["canary"]) == (2, "", None)
    assert sorted(t["host"] for t in promotion["targets"]) == ["gpu-0", "gpu-1"]
    assert Deployment.objects.get(pk=deployment).canary_state == CanaryState.PROMOTED
    again = api_client.post(f"/api/v1/deployments/{deployment}/promote/")
    assert again.status_code == 409 and "(promoted)" in again.json()["detail"]


def test_rollback_of_a_canary_rolls_each_host_back_to_its_stable_version(api_client, fleet):
    versions, _ = fleet
    deployment = start(api_client).json()["id"]
    _reach(deployment, versions)
    Deployment.objects.filter(pk=deployment).update(status="succeeded")
    answer = api_client.post(f"/api/v1/deployments/{deployment}/rollback/")
    assert answer.status_code == 200, answer.content
    [rollback] = answer.json()
    assert rollback["version"] == 1 and rollback["canary_percent"] is None
    assert Deployment.objects.get(pk=deployment).canary_state == CanaryState.ROLLED_BACK
    assert api_client.post(f"/api/v1/deployments/{deployment}/promote/").status_code == 409


def test_the_canary_block_shows_the_percent_each_host_s_gateway_reports(api_client, fleet):
    versions, hosts = fleet
    deployment = start(api_client, percent=25).json()["id"]
    hosts[0].heartbeat = {**GATEWAY, "gateway": {"live": True, "routes": {
        "iris": {"stable": 1, "canary": 2, "percent": 25.0}}}}
    hosts[0].save()
    canary = api_client.get(f"/api/v1/deployments/{deployment}/").json()["canary"]
    assert [(h["host"], h["applied_percent"], h["applied_shadow_percent"]) for h in canary["hosts"]] == [
        ("gpu-0", 25.0, None), ("gpu-1", None, None)]


def test_the_rollout_page_shows_the_canary_and_changes_its_percent(client, user, fleet, broker,
                                                                   django_capture_on_commit_callbacks):
    from tests.factories import team_member

    versions, _ = fleet
    team_member(user)
    client.force_login(user)
    deployment = Deployment.objects.create(model=versions[1].model, version=versions[1], status="succeeded",
                                           canary_percent=10, canary_state=CanaryState.ACTIVE)
    for host in ServingHost.objects.all():
        DeploymentTarget.objects.create(deployment=deployment, host=host, state=TargetState.READY,
                                        previous_version=versions[0])
    page = client.get(f"/deployments/{deployment.pk}/").content.decode()
    assert "<strong>10 %</strong> of the requests that name no version go to v2" in page
    assert page.count("no route yet") == 2 and "Promote…" in page
    with django_capture_on_commit_callbacks(execute=True):
        answer = client.post(f"/deployments/{deployment.pk}/canary/", {"percent": "35"}, follow=True)
    assert "The canary now takes 35 % of the requests" in answer.content.decode()
    assert Deployment.objects.get(pk=deployment.pk).canary_percent == 35.0
    assert [r["percent"] for r in routes_sent(broker, "gpu-0")] == [35.0]
    refused = client.post(f"/deployments/{deployment.pk}/canary/", {"percent": "lots"}, follow=True)
    assert "must be a number from 0 to 100" in refused.content.decode()
    confirm = client.get(f"/deployments/{deployment.pk}/promote/").content.decode()
    assert "Promote the canary of rollout" in confirm


def test_the_model_page_s_serving_panel_shows_each_host_s_canary_at_pinned_queries(client, user, fleet):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from tests.factories import team_member
    from tests.registry.test_serving_at_a_glance import SERVING_PANEL_QUERIES

    versions, hosts = fleet
    team_member(user)
    client.force_login(user)
    client.get("/models/iris/")
    deployment = Deployment.objects.create(model=versions[1].model, version=versions[1], status="succeeded",
                                           canary_percent=20, shadow_percent=5, canary_state=CanaryState.ACTIVE)
    for host in hosts:
        DeploymentTarget.objects.create(deployment=deployment, host=host, state=TargetState.READY,
                                        previous_version=versions[0])
    hosts[0].heartbeat = {**GATEWAY, "gateway": {"live": True, "routes": {
        "iris": {"stable": 1, "canary": 2, "percent": 20.0, "shadow": 2, "shadow_percent": 5.0}}}}
    hosts[0].save()
    with CaptureQueriesContext(connection) as two_hosts:
        panel = client.get("/deployments/serving/iris/").content.decode()
    assert panel.count("v2 takes 20 %, shadow 5 % beside v1") == 2
    assert "gateway reports 20 %" in panel and "gateway has no route yet" in panel
    assert f"Canary v2 (<a href=\"/deployments/{deployment.pk}/\">rollout {deployment.pk}</a>): 20 %" in panel
    served = Deployment.objects.get(version=versions[0])
    for name in ("gpu-7", "gpu-8", "gpu-9"):
        host = ServingHost.objects.create(name=name, inference_url=f"http://{name}:8080", heartbeat=GATEWAY,
                                          last_heartbeat_at=timezone.now())
        DeploymentTarget.objects.create(deployment=served, host=host, state=TargetState.READY)
        DeploymentTarget.objects.create(deployment=deployment, host=host, state=TargetState.READY,
                                        previous_version=versions[0])
    with CaptureQueriesContext(connection) as five_hosts:
        panel = client.get("/deployments/serving/iris/").content.decode()
    assert panel.count("v2 takes 20 %, shadow 5 % beside v1") == 5
    # No active rollout here (its query returns nothing and prefetches none: one query where SERVING_PANEL_QUERIES
    # counts three), and the canary's query with its targets, hosts and stable versions (four where it counts one).
    assert len(two_hosts) == len(five_hosts) == SERVING_PANEL_QUERIES + 1, "\n".join(q["sql"][:110] for q in five_hosts)


def test_a_second_canary_a_canary_of_the_served_version_and_a_boolean_percent_are_refused(api_client, fleet):
    versions, _ = fleet
    served = api_client.post("/api/v1/deployments/", {"model": "iris", "version": 1, "hosts": ["gpu-0"],
                                                      "canary_percent": 5}, format="json")
    assert served.status_code == 409 and "gpu-0 serves v1 already" in served.json()["detail"]
    first = start(api_client, percent=10).json()["id"]
    _reach(first, versions)
    again = start(api_client, percent=20)
    assert again.status_code == 409 and f"runs the canary of rollout {first}" in again.json()["detail"]
    boolean = api_client.patch(f"/api/v1/deployments/{first}/", {"canary_percent": True}, format="json")
    assert boolean.status_code == 400 and "canary_percent" in boolean.json()["fields"]


def test_a_host_whose_agent_never_reported_is_named_as_such(api_client, fleet):
    ServingHost.objects.filter(name="gpu-1").update(heartbeat={})
    answer = start(api_client)
    assert answer.status_code == 409 and "gpu-1's agent has never reported" in answer.json()["detail"]


def test_a_promotion_can_be_rolled_back_to_the_version_that_was_stable(api_client, fleet):
    versions, _ = fleet
    canary = start(api_client).json()["id"]
    _reach(canary, versions)
    promotion = api_client.post(f"/api/v1/deployments/{canary}/promote/").json()
    assert {t["previous_version"] for t in promotion["targets"]} == {1}
    DeploymentTarget.objects.filter(deployment_id=promotion["id"]).update(state=TargetState.READY)
    Deployment.objects.filter(pk=promotion["id"]).update(status="succeeded")
    [rollback] = api_client.post(f"/api/v1/deployments/{promotion['id']}/rollback/").json()
    assert rollback["version"] == 1


def test_a_plain_rollout_over_every_host_of_a_canary_ends_it(api_client, fleet):
    versions, _ = fleet
    canary = start(api_client).json()["id"]
    _reach(canary, versions)
    plain = api_client.post("/api/v1/deployments/", {"model": "iris", "version": 1, "hosts": ["gpu-0", "gpu-1"]},
                            format="json")
    assert plain.status_code == 201
    assert Deployment.objects.get(pk=canary).canary_state == CanaryState.ROLLED_BACK


def test_the_reconciler_sends_again_a_route_a_gateway_does_not_hold(api_client, fleet, broker):
    from deployments.canaries import resend_routes

    versions, hosts = fleet
    canary = start(api_client, percent=10).json()["id"]
    _reach(canary, versions)
    Deployment.objects.filter(pk=canary).update(canary_percent=100)  # a PATCH the hosts never applied
    hosts[0].heartbeat = {**GATEWAY, "gateway": {"live": True, "routes": {
        "iris": {"stable": 1, "canary": 2, "percent": 100.0, "shadow": None, "shadow_percent": 0.0}}}}
    hosts[0].save()
    assert resend_routes() == [("gpu-1", "iris")]
    assert [r["percent"] for r in routes_sent(broker, "gpu-1")] == [100.0] and routes_sent(broker, "gpu-0") == []
    assert resend_routes() == []  # not again within the backoff
