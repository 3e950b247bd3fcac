"""Inference keys: a model's requirement, a team's keys (made, listed, read, revoked) through the API and the
pages, audited, never stored nor shown after creation; and the digests a host's route push will carry."""

import hashlib
import logging
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from accounts.models import Team
from audit.models import AuditEvent
from deployments.models import ServingHost
from deployments.routes import wanted_inference_keys
from deployments.services import start_deployment
from modelyard.errors import Conflict
from registry.choices import ArtifactFormat
from registry.inference_keys import create_inference_key, revoke_inference_key
from registry.models import InferenceKey, ModelVersion, RegisteredModel
from tests.factories import api_client_for, team_member

pytestmark = pytest.mark.django_db


def model_named(name: str, team=None) -> RegisteredModel:
    from accounts.services import default_team

    return RegisteredModel.objects.create(name=name, team=team or default_team())


def everything_stored() -> str:
    """Every audit row, key row and log line that could hold a key, as one text to search."""
    rows = list(AuditEvent.objects.values()) + list(InferenceKey.objects.values())
    return repr(rows)


def test_a_model_needs_no_key_until_its_owner_requires_one_and_the_change_is_audited(api_client, user):
    model_named("iris")
    assert api_client.get("/api/v1/models/iris/").json()["inference_key_required"] is False
    assert api_client.get("/api/v1/models/").json()["results"][0]["inference_key_required"] is False
    answer = api_client.patch("/api/v1/models/iris/", {"inference_key_required": True}, format="json")
    assert answer.status_code == 200, answer.content
    assert answer.json()["inference_key_required"] is True
    assert RegisteredModel.objects.get(name="iris").inference_key_required is True
    assert api_client.get("/api/v1/models/").json()["results"][0]["inference_key_required"] is True
    event = AuditEvent.objects.get(action="model.updated")
    assert event.data == {"inference_key_required": {"from": False, "to": True}}
    assert event.actor == user
    # Setting what it holds changes nothing and writes no event.
    api_client.patch("/api/v1/models/iris/", {"inference_key_required": True}, format="json")
    assert AuditEvent.objects.filter(action="model.updated").count() == 1


def test_a_maintainer_may_edit_the_description_but_not_the_key_requirement(db):
    maintainer = team_member(get_user_model().objects.create_user(username="m"), role="maintainer")
    model_named("iris")
    client = api_client_for(maintainer)
    assert client.patch("/api/v1/models/iris/", {"description": "x"}, format="json").status_code == 200
    answer = client.patch("/api/v1/models/iris/", {"inference_key_required": True, "description": "y"},
                          format="json")
    assert answer.status_code == 403
    assert "managing inference keys needs the owner role" in answer.json()["detail"]
    model = RegisteredModel.objects.get(name="iris")
    assert model.inference_key_required is False and model.description == "x"


def test_the_api_makes_a_key_shows_it_once_and_stores_only_its_digest(api_client, user):
    model_named("iris")
    model_named("wine")
    answer = api_client.post("/api/v1/inference-keys/", {"name": "shop", "models": ["iris", "wine"]}, format="json")
    assert answer.status_code == 201, answer.content
    body = answer.json()
    plaintext = body["key"]
    assert plaintext.startswith(f"myk_{body['prefix']}_") and len(plaintext) > 50
    assert answer["Cache-Control"] == "no-store"
    assert body["models"] == ["iris", "wine"] and body["team"] == "default" and body["state"] == "active"
    assert body["created_by"] == user.username and body["expires_at"] is None and body["last_used_at"] is None
    key = InferenceKey.objects.get()
    assert key.digest == hashlib.sha256(plaintext.encode()).hexdigest()
    assert plaintext not in everything_stored()
    # Read back, it never carries the key nor its digest.
    again = api_client.get(f"/api/v1/inference-keys/{key.pk}/")
    assert again.status_code == 200 and "key" not in again.json() and key.digest not in again.content.decode()
    listed = api_client.get("/api/v1/inference-keys/").content.decode()
    assert plaintext not in listed and key.digest not in listed
    event = AuditEvent.objects.get(action="inference_key.created")
    assert event.data["models"] == ["iris", "wine"] and event.data["prefix"] == key.prefix
    assert plaintext not in repr(event.data) and key.digest not in repr(event.data)


def test_the_list_is_paginated_filtered_and_shows_only_the_callers_teams(api_client, user):
    iris, wine = model_named("iris"), model_named("wine")
    other = model_named("bert", Team.objects.create(name="nlp"))
    for n in range(3):
        create_inference_key(name=f"k{n}", models=[iris])
    create_inference_key(name="w", models=[wine])
    create_inference_key(name="theirs", models=[other])
    first = api_client.get("/api/v1/inference-keys/?page_size=2").json()
    assert [k["name"] for k in first["results"]] == ["w", "k2"] and first["next"]
    second = api_client.get(first["next"]).json()
    assert [k["name"] for k in second["results"]] == ["k1", "k0"]
    assert [k["name"] for k in api_client.get("/api/v1/inference-keys/?model=wine").json()["results"]] == ["w"]
    theirs = InferenceKey.objects.get(name="theirs")
    answer = api_client.get(f"/api/v1/inference-keys/{theirs.pk}/")
    assert answer.status_code == 404 and answer.json()["detail"] == f"no inference key {theirs.pk}"


def test_a_key_is_refused_for_models_of_two_teams_or_a_past_expiry_with_the_error_envelope(api_client, user):
    model_named("iris")
    nlp = Team.objects.create(name="nlp")
    team_member(user, role="owner", team=nlp)
    model_named("bert", nlp)
    answer = api_client.post("/api/v1/inference-keys/", {"name": "x", "models": ["iris", "bert"]}, format="json")
    assert answer.status_code == 400 and "one team" in answer.json()["detail"]
    past = (timezone.now() - timedelta(days=1)).isoformat()
    answer = api_client.post("/api/v1/inference-keys/", {"name": "x", "models": ["iris"], "expires_at": past},
                             format="json")
    assert answer.status_code == 400 and "future" in answer.json()["detail"]
    answer = api_client.post("/api/v1/inference-keys/", {"name": "x", "models": ["nope"]}, format="json")
    assert answer.status_code == 404 and answer.json()["detail"] == "no model named 'nope'"
    assert not InferenceKey.objects.exists()


def test_revoking_a_key_is_audited_once_and_keeps_the_row(api_client, user):
    key, _plaintext = create_inference_key(name="shop", models=[model_named("iris")])
    answer = api_client.post(f"/api/v1/inference-keys/{key.pk}/revoke/")
    assert answer.status_code == 200 and answer.json()["state"] == "revoked"
    assert api_client.post(f"/api/v1/inference-keys/{key.pk}/revoke/").status_code == 200  # a repeat: a no-op
    key.refresh_from_db()
    assert key.revoked_at is not None
    events = AuditEvent.objects.filter(action="inference_key.revoked")
    assert events.count() == 1 and events.get().actor == user


def test_no_key_reaches_the_logs(api_client, user, caplog):
    model_named("iris")
    with caplog.at_level(logging.DEBUG):
        answer = api_client.post("/api/v1/inference-keys/", {"name": "shop", "models": ["iris"]}, format="json")
        api_client.post(f"/api/v1/inference-keys/{answer.json()['id']}/revoke/")
    plaintext = answer.json()["key"]
    assert plaintext not in caplog.text
    assert InferenceKey.objects.get().digest not in caplog.text


def test_the_admin_shows_neither_the_key_nor_its_digest(client, db):
    admin = get_user_model().objects.create_superuser(username="root", password=None)
    key, plaintext = create_inference_key(name="shop", models=[model_named("iris")])
    client.force_login(admin)
    for url in ("/admin/registry/inferencekey/", f"/admin/registry/inferencekey/{key.pk}/change/"):
        page = client.get(url)
        assert page.status_code == 200
        assert key.prefix in page.content.decode()
        assert plaintext not in page.content.decode() and key.digest not in page.content.decode()


def test_the_keys_page_makes_shows_once_and_revokes_a_key_after_confirmation(client, user):
    model_named("iris")
    model_named("wine")
    client.force_login(user)
    page = client.get("/models/iris/inference-keys/")
    assert page.status_code == 200 and "No inference key opens iris yet" in page.content.decode()
    made = client.post("/models/iris/inference-keys/", {"name": "shop", "models": ["iris", "wine"],
                                                        "expires_in_days": "30"})
    key = InferenceKey.objects.get()
    plaintext = made.context["plaintext"]
    assert made.status_code == 200 and plaintext in made.content.decode()
    assert sorted(m.name for m in key.scoped_models.all()) == ["iris", "wine"]
    assert key.expires_at > timezone.now() + timedelta(days=29)
    listing = client.get("/models/wine/inference-keys/").content.decode()
    assert f"myk_{key.prefix}" in listing and plaintext not in listing and key.digest not in listing
    confirm = client.get(f"/models/iris/inference-keys/{key.pk}/revoke/")
    assert confirm.status_code == 200 and "Revoke inference key shop?" in confirm.content.decode()
    key.refresh_from_db()
    assert key.revoked_at is None  # asking is not revoking
    client.post(f"/models/iris/inference-keys/{key.pk}/revoke/")
    key.refresh_from_db()
    assert key.revoked_at is not None
    assert AuditEvent.objects.filter(action__startswith="inference_key.").count() == 2
    assert plaintext not in everything_stored()


def test_the_keys_page_switches_the_requirement_for_an_owner(client, user):
    model_named("iris")
    client.force_login(user)
    client.post("/models/iris/edit/", {"inference_key_required": "1"})
    assert RegisteredModel.objects.get(name="iris").inference_key_required is True
    assert "Calls to iris need one of these keys" in client.get("/models/iris/inference-keys/").content.decode()
    client.post("/models/iris/edit/", {"inference_key_required": "0"})
    assert RegisteredModel.objects.get(name="iris").inference_key_required is False
    assert AuditEvent.objects.filter(action="model.updated").count() == 2


def test_a_viewer_sees_the_keys_page_without_the_form_and_cannot_post_it(client, db):
    viewer = team_member(get_user_model().objects.create_user(username="v"), role="viewer")
    create_inference_key(name="shop", models=[model_named("iris")])
    client.force_login(viewer)
    page = client.get("/models/iris/inference-keys/").content.decode()
    assert "shop" in page and "New inference key" not in page and "Revoke" not in page
    assert client.post("/models/iris/inference-keys/", {"name": "x", "models": ["iris"]}).status_code == 403
    assert InferenceKey.objects.count() == 1


def test_a_hosts_route_push_carries_the_digests_of_usable_keys_of_models_that_require_one(db):
    owner = get_user_model().objects.create_user(username="o")
    host = ServingHost.objects.create(name="gpu-0", inference_url="http://127.0.0.1:1")
    models = {}
    for name in ("iris", "wine", "open"):
        models[name] = model_named(name)
        ModelVersion.objects.create(model=models[name], version=1, format=ArtifactFormat.ONNX, artifact_key=f"k/{name}",
                                    artifact_sha256="0" * 64, artifact_size=1)
        start_deployment(model_name=name, version=1, host_names=["gpu-0"], actor=owner)
    model_named("elsewhere")  # requires a key, but is not deployed on the host
    RegisteredModel.objects.filter(name__in=["iris", "wine", "elsewhere"]).update(inference_key_required=True)
    both, _ = create_inference_key(name="both", models=[models["iris"], models["wine"]])
    iris_only, _ = create_inference_key(name="iris", models=[models["iris"]])
    revoked, _ = create_inference_key(name="revoked", models=[models["iris"]])
    revoke_inference_key(revoked)
    expiring, _ = create_inference_key(name="expired", models=[models["wine"]],
                                       expires_at=timezone.now() + timedelta(days=1))
    InferenceKey.objects.filter(pk=expiring.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    create_inference_key(name="open", models=[models["open"]])
    assert wanted_inference_keys(host) == {
        "iris": sorted([both.digest, iris_only.digest]),
        "wine": [both.digest],
    }
    # A model that requires a key and has none usable is closed to all: an empty list, not absent.
    revoke_inference_key(both)
    assert wanted_inference_keys(host) == {"iris": [iris_only.digest], "wine": []}


def test_an_error_answer_never_echoes_a_key_sent_to_it(api_client, user, caplog):
    iris = model_named("iris")
    _key, plaintext = create_inference_key(name="shop", models=[iris])
    with caplog.at_level(logging.DEBUG):
        answers = [
            api_client.post("/api/v1/inference-keys/", {"name": "x", "models": ["iris"], "key": plaintext},
                            format="json"),
            api_client.post("/api/v1/inference-keys/", {"name": plaintext * 3, "models": ["iris"]}, format="json"),
            api_client.post("/api/v1/inference-keys/", {"name": plaintext, "models": ["iris"]}, format="json"),
            api_client.post("/api/v1/inference-keys/", {"name": f"for {plaintext}", "models": ["iris"]}, format="json"),
            api_client.post("/api/v1/inference-keys/", {"name": "x", "models": [plaintext]}, format="json"),
        ]
    for answer in answers:
        assert answer.status_code == 400, answer.content
        assert answer.json()["code"]  # the error envelope
        assert plaintext not in answer.content.decode()
    assert plaintext not in caplog.text
    assert InferenceKey.objects.count() == 1


def test_the_key_list_costs_the_same_queries_for_one_key_or_many(api_client, user):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    iris, wine = model_named("iris"), model_named("wine")
    create_inference_key(name="first", models=[iris])
    api_client.get("/api/v1/inference-keys/")  # the token's last use written once
    with CaptureQueriesContext(connection) as one:
        assert len(api_client.get("/api/v1/inference-keys/").json()["results"]) == 1
    for n in range(5):
        create_inference_key(name=f"k{n}", models=[iris, wine])
    with CaptureQueriesContext(connection) as many:
        assert len(api_client.get("/api/v1/inference-keys/").json()["results"]) == 6
    assert len(many) == len(one) == 3  # the token, the page of keys with their team and creator, their models


def test_a_model_that_requires_a_key_is_not_deployed_to_an_agent_that_cannot_check_it(db):
    owner = get_user_model().objects.create_user(username="o")
    iris = model_named("iris")
    ModelVersion.objects.create(model=iris, version=1, format=ArtifactFormat.ONNX, artifact_key="k/iris",
                                artifact_sha256="0" * 64, artifact_size=1)
    RegisteredModel.objects.filter(pk=iris.pk).update(inference_key_required=True)
    ServingHost.objects.create(name="old", inference_url="http://127.0.0.1:1", heartbeat={"agent": {"protocol": 5}})
    ServingHost.objects.create(name="new", inference_url="http://127.0.0.1:2", heartbeat={"agent": {"protocol": 6}})
    with pytest.raises(Conflict, match=r"old \(protocol 5\) would serve it to any client"):
        start_deployment(model_name="iris", version=1, host_names=["old", "new"], actor=owner)
    assert start_deployment(model_name="iris", version=1, host_names=["new"], actor=owner).targets.count() == 1
