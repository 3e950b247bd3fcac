"""The admin site holds models and hosts to the same rules as the API: one grammar, one URL check."""

import pytest
from django.contrib.auth import get_user_model

from deployments.models import ServingHost
from registry.models import RegisteredModel

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(client):
    admin = get_user_model().objects.create_user(username="root", password="a-long-test-password", is_staff=True,
                                                 is_superuser=True)
    client.force_login(admin)
    return client


def team_id():
    from accounts.services import default_team

    return default_team().pk


@pytest.mark.parametrize("name", ["../x", "a/b", "Iris", "іris", "x" * 64, ""])  # the fourth starts with a Cyrillic і
def test_the_admin_refuses_a_model_name_the_api_refuses(admin_client, name):
    answer = admin_client.post("/admin/registry/registeredmodel/add/",
                               {"name": name, "team": team_id(), "description": "", "tags": "{}"})
    assert answer.status_code == 200  # the form again, with its error
    assert b"errorlist" in answer.content
    assert not RegisteredModel.objects.exists()


def test_the_admin_renames_a_model_only_within_the_grammar(admin_client):
    model = RegisteredModel.objects.create(name="iris")
    answer = admin_client.post(f"/admin/registry/registeredmodel/{model.pk}/change/",
                               {"name": "../iris", "team": team_id(), "description": "", "tags": "{}"})
    assert b"errorlist" in answer.content
    model.refresh_from_db()
    assert model.name == "iris"
    answer = admin_client.post(f"/admin/registry/registeredmodel/{model.pk}/change/",
                               {"name": "iris-v2", "team": team_id(), "description": "", "tags": "{}",
                                "next_version": "1"})
    assert answer.status_code == 302
    model.refresh_from_db()
    assert model.name == "iris-v2"


HOST = {"name": "gpu-0", "runtime": "triton", "inference_url": "http://gpu-0:8000", "metrics_url": "",
        "config_overrides": "{}", "labels": "{}", "load_deadline": "", "unload_deadline": ""}


@pytest.mark.parametrize("change,says", [
    ({"name": "GPU-0"}, b"upper-case"),
    ({"name": "../gpu"}, b"not valid"),
    ({"inference_url": "http://user:secret@gpu-0:8000"}, b"credentials"),
    ({"inference_url": "http://gpu-0:8000/v2?x=1"}, b"query"),
    ({"config_overrides": '{"instance_group": []}'}, b"supports only"),
    ({"load_deadline": "0"}, b"greater than or equal to 1"),
])
def test_the_admin_refuses_a_host_the_api_refuses(admin_client, change, says):
    answer = admin_client.post("/admin/deployments/servinghost/add/", {**HOST, **change})
    assert answer.status_code == 200 and says in answer.content, answer.content[:2000]
    assert not ServingHost.objects.exists()


def test_the_admin_stores_a_host_url_normalised(admin_client):
    answer = admin_client.post("/admin/deployments/servinghost/add/", {**HOST, "inference_url": "HTTP://GPU-0:8000/"})
    assert answer.status_code == 302
    assert ServingHost.objects.get().inference_url == "http://gpu-0:8000"


def test_the_admin_forms_carry_no_maxlength_and_refuse_a_124_character_host_name(admin_client):
    for page in ("/admin/deployments/servinghost/add/", "/admin/registry/registeredmodel/add/",
                 "/admin/accounts/team/add/", "/admin/promotions/webhook/add/",
                 "/admin/promotions/promotionpolicy/add/"):
        assert b"maxlength" not in admin_client.get(page).content, page  # a browser would cut the text short
    answer = admin_client.post("/admin/deployments/servinghost/add/", {**HOST, "name": "gpu-" + "a" * 120})
    assert answer.status_code == 200 and b"at most 63 characters (it has 124)" in answer.content
    assert not ServingHost.objects.exists()


def test_the_admin_refuses_a_webhook_of_one_team_limited_to_another_teams_model(admin_client, settings):
    from accounts.models import Team
    from promotions.models import Webhook

    settings.WEBHOOK_ALLOW_PRIVATE = True
    vision = Team.objects.create(name="vision")
    model = RegisteredModel.objects.create(name="iris")  # of the default team
    answer = admin_client.post("/admin/promotions/webhook/add/", {
        "url": "http://127.0.0.1:9/hook", "secret": "s" * 32, "events": '["alias.moved"]', "model": model.pk,
        "team": vision.pk, "enabled": "on"})
    assert answer.status_code == 200 and b"is not a model of team" in answer.content
    assert not Webhook.objects.exists()


@pytest.mark.parametrize("tags", ['{"n": 1}', '{"b": true}', '{"=x": "y"}', '["a"]'])
def test_the_admin_refuses_tags_the_api_refuses(admin_client, tags):
    answer = admin_client.post("/admin/registry/registeredmodel/add/",
                               {"name": "iris", "team": team_id(), "description": "", "tags": tags})
    assert answer.status_code == 200 and b"errorlist" in answer.content
    assert not RegisteredModel.objects.exists()
    answer = admin_client.post("/admin/registry/registeredmodel/add/",
                               {"name": "iris", "team": team_id(), "description": "", "tags": '{"n": "1"}'})
    assert answer.status_code == 302 and RegisteredModel.objects.get().tags == {"n": "1"}


def test_a_versions_admin_form_refuses_tags_the_api_refuses():
    from registry.admin import ModelVersionAdminForm

    form = ModelVersionAdminForm(data={"tags": '{"n": 1}'})
    form.is_valid()
    assert "tags" in form.errors and "string value" in str(form.errors["tags"])
    form = ModelVersionAdminForm(data={"tags": '{"n": "1"}'})
    form.is_valid()
    assert "tags" not in form.errors


def test_the_admin_registers_no_version_without_its_artifact(admin_client):
    assert admin_client.get("/admin/registry/modelversion/add/").status_code == 403
