"""Registering and viewing serving hosts in the browser pages."""

import pytest
from django.contrib.auth import get_user_model

from deployments.models import ServingHost
from registry.models import AuditEvent

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
