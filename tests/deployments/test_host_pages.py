"""Registering and viewing serving hosts in the browser pages."""

import pytest
from django.contrib.auth import get_user_model

from audit.models import AuditEvent
from deployments.models import ServingHost

pytestmark = pytest.mark.django_db

FORM = {
    "name": "gpu-7", "runtime": "triton", "inference_url": "http://gpu-7:8000",
    "metrics_url": "http://gpu-7:8002/metrics", "parameters": '{"EXECUTION_ENV_PATH": "/opt/envs/py311"}',
}


@pytest.fixture
def admin(db):
    return get_user_model().objects.create_user(username="ops", password="a-long-test-password", is_staff=True)


def test_an_administrator_registers_a_host_from_the_page(client, admin):
    client.force_login(admin)
    answer = client.post("/hosts/new/", FORM)
    assert answer.status_code == 302 and answer["Location"] == "/hosts/gpu-7/"
    host = ServingHost.objects.get(name="gpu-7")
    assert host.config_overrides == {"parameters": {"EXECUTION_ENV_PATH": "/opt/envs/py311"}}
    assert AuditEvent.objects.filter(action="host.registered", actor=admin).exists()
    assert b"gpu-7" in client.get("/hosts/").content


@pytest.mark.parametrize("change,message", [
    ({"name": "GPU 7"}, b"upper-case"),
    ({"inference_url": "ftp://gpu-7"}, b"http:// or https://"),
    ({"parameters": "[1]"}, b"must be a JSON object"),
    ({"parameters": "{oops"}, b"not valid JSON"),
])
def test_the_form_explains_what_is_wrong_and_registers_nothing(client, admin, change, message):
    client.force_login(admin)
    answer = client.post("/hosts/new/", {**FORM, **change})
    assert answer.status_code == 200
    assert message in answer.content
    assert not ServingHost.objects.exists()


def test_a_second_host_with_the_same_name_is_a_form_error(client, admin):
    client.force_login(admin)
    client.post("/hosts/new/", FORM)
    answer = client.post("/hosts/new/", FORM)
    assert b"already exists" in answer.content
    assert ServingHost.objects.count() == 1


def test_only_administrators_may_register_hosts(client, user):
    client.force_login(user)
    assert client.get("/hosts/new/").status_code == 403
    assert client.post("/hosts/new/", FORM).status_code == 403
    assert not ServingHost.objects.exists()


def test_an_unknown_host_page_is_a_404(client, user):
    client.force_login(user)
    assert client.get("/hosts/nowhere/").status_code == 404


def test_the_host_page_and_api_show_a_version_stuck_loading_to_its_team_only(client, api_client, user, admin):
    from datetime import timedelta

    from django.utils import timezone

    from registry.models import RegisteredModel

    RegisteredModel.objects.create(name="iris")
    since = (timezone.now() - timedelta(seconds=900)).isoformat()
    ServingHost.objects.create(
        name="gpu-7", inference_url="http://gpu-7:8000", load_deadline=600, last_heartbeat_at=timezone.now(),
        heartbeat={"runtime_live": True, "models": [
            {"name": "iris", "version": 1, "state": "READY"},
            {"name": "iris", "version": 2, "state": "LOADING", "reason": "", "since": since},
            {"name": "secret", "version": 1, "state": "LOADING", "reason": "", "since": since}]},
    )
    client.force_login(user)
    html = client.get("/hosts/gpu-7/").content.decode()
    assert "Stuck in the runtime" in html
    assert "v2 has been LOADING for 9" in html and "load deadline of 600 s" in html
    assert "secret" not in html  # another team's model, not shown to this user
    body = api_client.get("/api/v1/hosts/gpu-7/").json()
    assert [(s["name"], s["version"], s["state"], s["deadline"]) for s in body["stuck"]] == [
        ("iris", 2, "LOADING", 600)]

    answer = api_client.patch("/api/v1/hosts/gpu-7/", {"load_deadline": 0}, format="json")
    assert answer.status_code == 403  # deadlines are for administrators


def test_an_administrator_sets_a_hosts_deadlines_and_the_change_is_audited(admin):
    from rest_framework.test import APIClient

    from tests.factories import token_for

    ServingHost.objects.create(name="gpu-7", inference_url="http://gpu-7:8000")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {token_for(admin)}")
    answer = api.patch("/api/v1/hosts/gpu-7/", {"load_deadline": 120, "unload_deadline": 30}, format="json")
    assert answer.status_code == 200, answer.content
    assert (answer.json()["load_deadline"], answer.json()["unload_deadline"]) == (120, 30)
    host = ServingHost.objects.get(name="gpu-7")
    assert (host.load_deadline_seconds, host.unload_deadline_seconds) == (120.0, 30.0)
    event = AuditEvent.objects.get(action="host.updated")
    assert event.data["after"]["load_deadline"] == 120 and event.data["before"]["load_deadline"] is None
    assert api.patch("/api/v1/hosts/gpu-7/", {"load_deadline": 0}, format="json").status_code == 400
    assert api.patch("/api/v1/hosts/gpu-7/", {"load_deadline": None}, format="json").json()["load_deadline"] is None


def test_a_host_that_serves_a_model_is_not_deleted_and_its_page_says_why(client, admin):
    from tests.monitoring.synthetic import deploy_version

    host = ServingHost.objects.create(name="gpu-7", inference_url="http://gpu-7:8000")
    deploy_version("iris", 1, host)
    client.force_login(admin)
    answer = client.post("/hosts/gpu-7/delete/", follow=True)
    assert answer.redirect_chain == [("/hosts/gpu-7/", 302)]
    assert b"serves iris; unload them from it first" in answer.content
    assert ServingHost.objects.filter(name="gpu-7").exists()
    assert not AuditEvent.objects.filter(action="host.deleted").exists()


def test_only_administrators_see_and_may_use_the_delete_action(client, user):
    ServingHost.objects.create(name="gpu-7", inference_url="http://gpu-7:8000")
    client.force_login(user)
    assert b"Delete host" not in client.get("/hosts/gpu-7/").content
    assert client.get("/hosts/gpu-7/delete/").status_code == 403
    assert client.post("/hosts/gpu-7/delete/").status_code == 403
    assert ServingHost.objects.filter(name="gpu-7").exists()


@pytest.mark.parametrize("field", ["name", "inference_url"])
def test_an_over_long_field_reaches_the_form_whole_and_is_refused(client, admin, field):
    client.force_login(admin)
    assert b'maxlength' not in client.get("/hosts/new/").content  # a browser would cut the text short
    answer = client.post("/hosts/new/", {**FORM, field: FORM[field] + "x" * 300})
    assert answer.status_code == 200 and b"at most" in answer.content
    assert not ServingHost.objects.exists()


def test_the_api_refuses_a_host_name_of_124_characters_naming_the_limit(admin):
    from rest_framework.test import APIClient

    from tests.factories import token_for

    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {token_for(admin)}")
    answer = api.post("/api/v1/hosts/", {"name": "gpu-" + "a" * 120, "runtime": "triton",
                                         "inference_url": "http://gpu-7:8000"}, format="json")
    assert answer.status_code == 400
    assert "longer than 63 characters" in str(answer.json())
    assert not ServingHost.objects.exists()


def test_the_host_page_says_when_its_on_demand_budget_cannot_be_held_as_measured(client, admin):
    problem = "budget not enforceable as measured: the agent sees neither Triton's metrics nor its processes"
    ServingHost.objects.create(name="gpu-9", inference_url="http://gpu-9:8000", heartbeat={
        "models": [], "gateway": {"residency": {"models": {}, "budget": {"budget_bytes": 1 << 30,
                                                                          "resident_bytes": 0, "problem": problem}}}})
    ServingHost.objects.create(name="gpu-10", inference_url="http://gpu-10:8000", heartbeat={
        "gateway": {"residency": {"budget": {"budget_bytes": 1 << 30, "resident_bytes": 0, "problem": None}}}})
    client.force_login(admin)
    assert "On-demand memory: " + problem in client.get("/hosts/gpu-9/").content.decode().replace("&#x27;", "'")
    assert b"On-demand memory" not in client.get("/hosts/gpu-10/").content


def test_a_footprint_that_was_not_measured_says_so_and_why_never_0_bytes(client, admin):
    from tests.monitoring.synthetic import deploy_version

    host = ServingHost.objects.create(name="gpu-3", inference_url="http://gpu-3:8000",
                                      metrics_url="http://gpu-3:8002/metrics")
    deploy_version("iris", 1, host, footprint={"gpu": 1_500_000_000, "cpu": 0})
    client.force_login(admin)
    page = client.get("/hosts/gpu-3/").content.decode()
    row = page.split('<a href="/models/iris/">iris</a>', 1)[1].split("</tr>", 1)[0]
    assert "1.4\xa0GiB" in row and "0 bytes" not in row and "not measured" in row
    assert "iris v1: not measured: CPU: the server&#x27;s memory gauge did not grow while it loaded" in page


def test_a_model_registered_on_demand_is_in_its_own_section_not_unloaded_and_not_reloaded(client, admin):
    from deployments.choices import Residency, TargetState
    from deployments.models import Deployment, DeploymentTarget
    from tests.monitoring.synthetic import deploy_version

    residency = {"models": {"lazy": {"state": "cold", "pinned": False, "held": 0, "requests": 3},
                            "eager": {"state": "resident", "pinned": True, "held": 1, "requests": 9},
                            "gone": {"state": "cold", "pinned": False, "held": 0, "requests": 0}},
                 "budget": {"budget_bytes": 8 << 30, "resident_bytes": 3 << 30, "problem": None,
                            "devices": {"GPU-5c3f7a9e": 3 << 30, "GPU-b8e41d27": 1 << 30}}}
    host = ServingHost.objects.create(name="gpu-4", inference_url="http://gpu-4:8000",
                                      heartbeat={"gateway": {"residency": residency}})
    for name in ("lazy", "eager"):
        deployment = deploy_version(name, 1, host)
        Deployment.objects.filter(pk=deployment.pk).update(residency=Residency.ON_DEMAND)
        DeploymentTarget.objects.filter(deployment=deployment).update(details={"resident": False})
    # lazy's earlier deployment here was unloaded by hand: its row is older than the one registered on demand
    unloaded = deploy_version("lazy", 2, host)
    DeploymentTarget.objects.filter(deployment=unloaded).update(state=TargetState.UNLOADED)
    Deployment.objects.filter(pk=unloaded.pk).update(created_at=Deployment.objects.get(
        model__name="lazy", version__version=1).created_at.replace(year=2020))
    # gone's only target here is unloaded, but the gateway still holds it registered on demand (its last report)
    gone = deploy_version("gone", 1, host)
    DeploymentTarget.objects.filter(deployment=gone).update(state=TargetState.UNLOADED)
    client.force_login(admin)
    page = client.get("/hosts/gpu-4/").content.decode()
    assert "<h3>Unloaded</h3>" not in page and "Reload" not in page
    assert "Nothing loaded while it serves; the models on demand are below." in page
    section = page.split('class="card host-on-demand"', 1)[1]
    assert "3 registered" in section and "1 resident" in section and "3.0\xa0GiB of a budget of 8.0\xa0GiB" in section
    # The budget holds on each GPU: what each one holds is shown.
    assert "8.0\xa0GiB per device" in section
    assert '<span class="device" data-device="GPU-5c3f7a9e">GPU-5c3f7a9e 3.0\xa0GiB</span>' in section
    assert '<span class="device" data-device="GPU-b8e41d27">GPU-b8e41d27 1.0\xa0GiB</span>' in section
    lazy = section.split('data-model="lazy"', 1)[1].split("</tr>", 1)[0]
    assert 'data-state="cold"' in page and "not resident now" in lazy and "v1" in lazy and "Unload…" in lazy
    eager = section.split('data-model="eager"', 1)[1].split("</tr>", 1)[0]
    assert "resident" in eager and "pinned" in eager and '<td class="num held">1</td>' in eager
    assert "not resident now" in section.split('data-model="gone"', 1)[1].split("</tr>", 1)[0]
