"""Protected aliases through the API and the pages: an owner locks an alias; moving it then needs an
owner and a reason, both in the audit log; it is not deleted, nor is the version it names, until an
owner unlocks it. Owner, maintainer and outsider each."""

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from accounts.choices import Role
from audit.models import AuditEvent
from registry.models import Alias, ModelVersion, RegisteredModel
from tests.factories import api_client_for, team_member

pytestmark = pytest.mark.django_db
STAGING = "/api/v1/models/iris/aliases/staging/"


@pytest.fixture
def iris(db):
    model = RegisteredModel.objects.create(name="iris", next_version=3)
    for number in (1, 2):
        ModelVersion.objects.create(model=model, version=number, format="triton", artifact_key=f"k{number}",
                                    artifact_sha256=f"{number:064d}", artifact_size=1)
    Alias.objects.create(model=model, name="staging", version=model.versions.get(version=1))
    return model


@pytest.fixture
def owner(db):
    return team_member(get_user_model().objects.create_user(username="lead"), Role.OWNER)


@pytest.fixture
def maintainer(db):
    return team_member(get_user_model().objects.create_user(username="dev"), Role.MAINTAINER)


@pytest.fixture
def outsider(db):
    return get_user_model().objects.create_user(username="stranger")


def staging() -> Alias:
    return Alias.objects.get(model__name="iris", name="staging")


def test_an_owner_locks_an_alias_and_only_an_owner_moves_it_then_with_a_reason(iris, owner, maintainer):
    assert api_client_for(maintainer).patch(STAGING, {"protected": True}, format="json").status_code == 403
    locked = api_client_for(owner).patch(STAGING, {"protected": True, "reason": "release freeze"}, format="json")
    assert locked.status_code == 200 and locked.json()["protected"] is True
    event = AuditEvent.objects.get(action="alias.protected")
    assert (event.actor, event.data) == (owner, {"alias": "staging", "protected": True, "version": 1,
                                                 "reason": "release freeze"})

    refused = api_client_for(maintainer).put(STAGING, {"version": 2, "reason": "urgent"}, format="json")
    assert refused.status_code == 403
    assert "moving the protected alias 'staging' needs the owner role in team 'default'" in refused.json()["detail"]
    no_reason = api_client_for(owner).put(STAGING, {"version": 2}, format="json")
    assert no_reason.status_code == 400 and "@staging is protected: moving it needs a reason" in no_reason.json()[
        "detail"]
    assert staging().version.version == 1 and not AuditEvent.objects.filter(action="alias.set").exists()

    moved = api_client_for(owner).put(STAGING, {"version": 2, "reason": "v2 passed the load test"}, format="json")
    assert moved.status_code == 200 and moved.json()["version"] == 2 and moved.json()["protected"] is True
    event = AuditEvent.objects.get(action="alias.set")
    assert event.actor == owner
    assert event.data == {"alias": "staging", "from": 1, "to": 2, "protected": True, "owner": "lead",
                          "reason": "v2 passed the load test"}


def test_a_protected_alias_and_the_version_it_names_are_not_deleted_until_it_is_unlocked(iris, owner, maintainer):
    owner_api = api_client_for(owner)
    owner_api.patch(STAGING, {"protected": True}, format="json")
    deleting = owner_api.delete(STAGING)
    assert deleting.status_code == 409 and "unlocks it before it can be deleted" in deleting.json()["detail"]
    version = owner_api.delete("/api/v1/models/iris/versions/1/")
    assert version.status_code == 409 and "the protected alias @staging names it" in version.json()["detail"]
    assert staging().version.version == 1

    assert owner_api.patch(STAGING, {"protected": False}, format="json").json()["protected"] is False
    assert api_client_for(maintainer).put(STAGING, {"version": 2}, format="json").status_code == 200  # no reason needed
    assert owner_api.delete(STAGING).status_code == 204
    assert [e.data["protected"] for e in AuditEvent.objects.filter(action="alias.protected").order_by("id")] == [
        True, False]


def test_outsiders_see_no_alias_to_lock(iris, outsider):
    assert api_client_for(outsider).patch(STAGING, {"protected": True}, format="json").status_code == 404
    assert staging().protected is False


def test_locking_twice_records_one_event_and_bad_input_is_a_400(iris, owner):
    owner_api = api_client_for(owner)
    owner_api.patch(STAGING, {"protected": True}, format="json")
    owner_api.patch(STAGING, {"protected": True}, format="json")
    assert AuditEvent.objects.filter(action="alias.protected").count() == 1
    assert owner_api.patch(STAGING, {"protected": "maybe"}, format="json").status_code == 400
    assert owner_api.patch(STAGING, {"protected": True, "colour": "red"}, format="json").status_code == 400
    assert owner_api.put(STAGING, {"version": 2, "reason": "x" * 1001}, format="json").status_code == 400
    assert staging().version.version == 1


def test_the_model_page_locks_and_moves_a_protected_alias_with_a_reason(iris, owner, maintainer):
    page = Client()
    page.force_login(maintainer)
    assert "Lock</button>" not in page.get("/models/iris/").content.decode()
    assert page.post("/models/iris/aliases/staging/protect/", {"protected": "1"}).status_code == 403

    page.force_login(owner)
    html = page.post("/models/iris/aliases/staging/protect/", {"protected": "1"}, follow=True).content.decode()
    assert "@staging locked" in html and 'class="tag protected"' in html and "Unlock</button>" in html
    refused = page.post("/models/iris/aliases/", {"alias": "staging", "version": "2"}, follow=True).content.decode()
    assert "moving it needs a reason" in refused and staging().version.version == 1
    page.post("/models/iris/aliases/", {"alias": "staging", "version": "2", "reason": "hotfix"})
    assert staging().version.version == 2
    assert AuditEvent.objects.get(action="alias.set").data["reason"] == "hotfix"

    page.force_login(maintainer)
    html = page.post("/models/iris/aliases/", {"alias": "staging", "version": "1", "reason": "mine"},
                     follow=True).content.decode()
    assert "needs the owner role" in html and staging().version.version == 2
    assert "Delete…" not in html.split('data-alias="staging"')[1].split("</tr>")[0]


def test_an_automated_actor_cannot_move_a_protected_alias(iris):
    from modelyard.errors import Forbidden
    from promotions.evaluations import PolicyActor
    from registry.aliases import set_alias

    Alias.objects.filter(name="staging").update(protected=True)
    with pytest.raises(Forbidden, match="only an owner of team 'default' moves it"):
        set_alias(model_name="iris", alias="staging", version=2, actor=PolicyActor("policy:1"), reason="gates passed")
    assert staging().version.version == 1



def test_deleting_an_alias_is_a_destructive_action_behind_a_confirmation(iris, owner, client):
    client.force_login(owner)
    row = client.get("/models/iris/").content.decode().split('data-alias="staging"')[1].split("</tr>")[0]
    assert '<a class="button danger" href="/models/iris/aliases/staging/delete/">Delete…</a>' in row
    confirm = client.get("/models/iris/aliases/staging/delete/")
    assert confirm.status_code == 200 and staging().version.version == 1  # the link only asks
