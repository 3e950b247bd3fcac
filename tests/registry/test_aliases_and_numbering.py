"""Aliases (set, move, resolve, delete, audit) and version numbers under concurrency."""

import pytest
from django.db import connection

from audit.models import AuditEvent
from registry.choices import ArtifactFormat
from registry.models import ModelVersion, RegisteredModel
from registry.versions import register_version
from tests.fixtures.concurrency import at_once


def _versions(model: RegisteredModel, count: int) -> None:
    for number in range(1, count + 1):
        ModelVersion.objects.create(
            model=model, version=number, format=ArtifactFormat.TRITON_MODEL_DIR, artifact_key=f"k{number}",
            artifact_sha256=f"{number:064d}", artifact_size=1,
        )
    model.next_version = count + 1
    model.save()


@pytest.fixture
def iris(db) -> RegisteredModel:
    model = RegisteredModel.objects.create(name="iris")
    _versions(model, 3)
    return model


@pytest.mark.django_db
def test_an_alias_is_set_moved_resolved_and_each_move_is_audited(api_client, iris, user):
    assert api_client.put("/api/v1/models/iris/aliases/production/", {"version": 1}, format="json").status_code == 200
    moved = api_client.put("/api/v1/models/iris/aliases/production/", {"version": 2}, format="json")
    assert moved.json()["version"] == 2 and moved.json()["updated_by"] == "engineer"
    assert api_client.get("/api/v1/models/iris/aliases/production/").json()["version"] == 2
    events = list(AuditEvent.objects.filter(action="alias.set").order_by("id").values_list("data", flat=True))
    assert events == [{"alias": "production", "from": None, "to": 1}, {"alias": "production", "from": 1, "to": 2}]
    assert AuditEvent.objects.filter(action="alias.set").first().actor == user


@pytest.mark.django_db
def test_setting_an_alias_to_the_version_it_names_changes_nothing(api_client, iris):
    api_client.put("/api/v1/models/iris/aliases/staging/", {"version": 3}, format="json")
    api_client.put("/api/v1/models/iris/aliases/staging/", {"version": 3}, format="json")
    assert AuditEvent.objects.filter(action="alias.set").count() == 1


@pytest.mark.django_db
def test_latest_is_computed_and_reserved(api_client, iris):
    assert api_client.get("/api/v1/models/iris/aliases/latest/").json()["version"] == 3
    refused = api_client.put("/api/v1/models/iris/aliases/latest/", {"version": 1}, format="json")
    assert refused.status_code == 400 and "reserved" in refused.json()["detail"]


@pytest.mark.django_db
@pytest.mark.parametrize("alias", ["Production", "1", "prod/x", "-x", "x-", "a" * 64, "pr od"])
def test_it_refuses_an_alias_outside_the_grammar(api_client, iris, alias):
    answer = api_client.put(f"/api/v1/models/iris/aliases/{alias}/", {"version": 1}, format="json")
    assert answer.status_code in (400, 404)
    assert not iris.aliases.exists()


@pytest.mark.django_db
def test_an_alias_of_308_characters_is_refused_naming_its_length_not_cut_short(api_client, iris):
    answer = api_client.put(f"/api/v1/models/iris/aliases/{'p' * 308}/", {"version": 1}, format="json")
    assert answer.status_code == 400
    assert "is 308 characters long; the limit is 63" in answer.json()["detail"]
    assert not iris.aliases.exists()


@pytest.mark.django_db
def test_an_alias_cannot_point_at_a_missing_version_and_deletion_is_audited(api_client, iris):
    assert api_client.put("/api/v1/models/iris/aliases/production/", {"version": 9}, format="json").status_code == 404
    api_client.put("/api/v1/models/iris/aliases/production/", {"version": 1}, format="json")
    assert [a["alias"] for a in api_client.get("/api/v1/models/iris/aliases/").json()] == ["production"]
    assert api_client.delete("/api/v1/models/iris/aliases/production/").status_code == 204
    assert api_client.get("/api/v1/models/iris/aliases/production/").status_code == 404
    assert api_client.delete("/api/v1/models/iris/aliases/production/").status_code == 404
    deleted = AuditEvent.objects.get(action="alias.deleted")
    assert deleted.data == {"alias": "production", "from": 1, "to": None}


@pytest.mark.django_db(transaction=True)
def test_twenty_parallel_registrations_get_twenty_distinct_consecutive_numbers(s3_endpoint, iris_archive):
    if connection.vendor != "postgresql":
        pytest.skip("row locks are only exercised on PostgreSQL")
    model = RegisteredModel.objects.create(name="iris")
    numbers, errors = at_once(lambda: register_version(model=model, artifact_path=iris_archive).version, 20)
    assert errors == []
    assert sorted(numbers) == list(range(1, 21))
    model.refresh_from_db()
    assert model.next_version == 21


@pytest.mark.django_db
def test_an_alias_is_set_from_the_model_page_and_deleted_after_confirmation(client, user, iris):
    client.force_login(user)
    answer = client.post("/models/iris/aliases/", {"alias": "production", "version": 2}, follow=True)
    assert "@production now points at v2" in answer.content.decode()
    assert iris.aliases.get(name="production").version.version == 2
    confirm = client.get("/models/iris/aliases/production/delete/")
    assert confirm.status_code == 200 and "Delete @production of iris?" in confirm.content.decode()
    assert iris.aliases.filter(name="production").exists()  # nothing happens before the POST
    client.post("/models/iris/aliases/production/delete/")
    assert not iris.aliases.exists()
    assert AuditEvent.objects.filter(action="alias.deleted", actor=user).exists()


@pytest.mark.django_db
def test_the_model_page_explains_a_refused_alias(client, user, iris):
    client.force_login(user)
    answer = client.post("/models/iris/aliases/", {"alias": "latest", "version": 1}, follow=True)
    assert "reserved" in answer.content.decode()
    answer = client.post("/models/iris/aliases/", {"alias": "prod", "version": 9}, follow=True)
    assert "version" in answer.content.decode() and not iris.aliases.exists()
    assert client.get("/models/iris/aliases/nope/delete/").status_code == 404


def test_version_objects_carry_the_aliases_that_name_them(api_client, s3_endpoint, iris_archive):
    from tests.registry.format_builders import upload

    assert api_client.post("/api/v1/models/", {"name": "iris"}, format="json").status_code == 201
    for _ in range(2):
        assert upload(api_client, "iris", iris_archive).status_code == 201
    for alias, version in (("production", 1), ("staging", 1), ("canary", 2)):
        assert api_client.put(f"/api/v1/models/iris/aliases/{alias}/", {"version": version},
                              format="json").status_code == 200
    listed = api_client.get("/api/v1/models/iris/versions/").json()["results"]
    assert {v["version"]: sorted(v["aliases"]) for v in listed} == {2: ["canary"], 1: ["production", "staging"]}
    assert api_client.get("/api/v1/models/iris/versions/2/").json()["aliases"] == ["canary"]
