"""Registry events for pipelines, on real processes: a Celery worker signs and delivers
``version.registered``, ``alias.moved``, ``model.tags_changed`` and ``version.deleted`` to a receiver on
127.0.0.1 that checks every signature; a webhook scoped to a team hears only that team's models and is
managed by that team's owners (owner, maintainer, outsider, administrator each); the address rules
stay as they were.

Loopback webhooks are allowed here only through ``MODELYARD_WEBHOOK_ALLOW_PRIVATE`` (the test setting).
"""

import pytest
from django.contrib.auth import get_user_model
from django.test import override_settings

from accounts.choices import Role
from accounts.models import Team
from accounts.services import set_membership
from audit.models import AuditEvent
from demo.iris import build_iris_archive
from promotions.choices import DeliveryStatus
from promotions.models import Webhook, WebhookDelivery
from registry.models import RegisteredModel
from tests.factories import api_client_for
from tests.fixtures.services import wait_for
from tests.promotions.support import WebhookReceiver

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
SECRET = "a-webhook-secret-of-some-length"
REGISTRY_EVENTS = ["alias.moved", "model.tags_changed", "version.deleted", "version.registered"]


@pytest.fixture(scope="module")
def iris_archive(tmp_path_factory):
    return build_iris_archive(tmp_path_factory.mktemp("iris") / "iris.tar.gz", name="iris")


@pytest.fixture
def teams(db):
    """Team vision (model iris) with an owner and a maintainer; team nlp (model bert) with its owner."""
    users = get_user_model().objects
    vision, nlp = Team.objects.create(name="vision"), Team.objects.create(name="nlp")
    people = {"admin": users.create_user(username="admin", is_staff=True)}
    for name, team, role in (("owner", vision, Role.OWNER), ("maintainer", vision, Role.MAINTAINER),
                             ("nlp-owner", nlp, Role.OWNER)):
        people[name] = users.create_user(username=name)
        set_membership(team=team, user=people[name], role=role)
    RegisteredModel.objects.create(name="iris", team=vision)
    RegisteredModel.objects.create(name="bert", team=nlp)
    return {"vision": vision, "nlp": nlp, **{name: api_client_for(user) for name, user in people.items()}}


@pytest.fixture
def receiver():
    hook = WebhookReceiver(SECRET)
    yield hook
    hook.stop()


def bodies(receiver, event: str) -> list[dict]:
    """The data of each delivered ``event`` (a retried delivery counted once)."""
    seen = {}
    for r in receiver.received:
        if r["event"] == event:
            seen[r["body"]["delivery"]] = r["body"]["data"]
    return list(seen.values())


def test_a_teams_owner_hears_its_models_registry_events_signed_and_nothing_of_other_teams(
    teams, receiver, s3_endpoint, start_celery_worker, iris_archive
):
    with override_settings(WEBHOOK_ALLOW_PRIVATE=True):
        made = teams["owner"].post("/api/v1/webhooks/", {"url": receiver.url, "secret": SECRET, "team": "vision",
                                                         "events": REGISTRY_EVENTS}, format="json")
    assert made.status_code == 201, made.content
    assert made.json()["team"] == "vision" and made.json()["secret"] == SECRET
    start_celery_worker("default", env={"MODELYARD_S3_ENDPOINT_URL": s3_endpoint,
                                        "MODELYARD_WEBHOOK_ALLOW_PRIVATE": "true"})
    owner = teams["owner"]

    with open(iris_archive, "rb") as artifact:
        registered = owner.post("/api/v1/models/iris/versions/", {"artifact": artifact, "source_commit": "abc123"},
                                format="multipart")
    assert registered.status_code == 201, registered.content
    assert owner.put("/api/v1/models/iris/aliases/staging/", {"version": 1, "reason": "first cut"},
                     format="json").status_code == 200
    assert owner.patch("/api/v1/models/iris/", {"tags": {"task": "classification"}}, format="json").status_code == 200
    assert owner.delete("/api/v1/models/iris/versions/1/").status_code == 204
    nlp = teams["nlp-owner"]
    assert nlp.patch("/api/v1/models/bert/", {"tags": {"task": "nlp"}}, format="json").status_code == 200

    wait_for(lambda: WebhookDelivery.objects.filter(status=DeliveryStatus.DELIVERED).count() == 4
             and not WebhookDelivery.objects.filter(status=DeliveryStatus.PENDING).exists(),
             timeout=90, what="four delivered webhook deliveries")
    assert all(r["signature_ok"] for r in receiver.received)
    assert bodies(receiver, "version.registered") == [{
        "model": "iris", "version": 1, "format": "triton", "sha256": registered.json()["artifact_sha256"],
        "size": registered.json()["artifact_size"], "source_commit": "abc123", "actor": "owner"}]
    assert bodies(receiver, "alias.moved") == [{"model": "iris", "alias": "staging", "from_version": None,
                                                "to_version": 1, "reason": "first cut", "actor": "owner"}]
    assert bodies(receiver, "model.tags_changed") == [{"model": "iris", "from": {},
                                                       "to": {"task": "classification"}, "actor": "owner"}]
    assert bodies(receiver, "version.deleted") == [{"model": "iris", "version": 1,
                                                    "sha256": registered.json()["artifact_sha256"], "actor": "owner"}]
    assert not WebhookDelivery.objects.filter(payload__model="bert").exists()  # team nlp's model


def test_team_webhooks_are_managed_by_that_teams_owners_and_global_ones_by_administrators(teams):
    with override_settings(WEBHOOK_ALLOW_PRIVATE=True):
        body = {"url": "http://127.0.0.1:9/hook", "team": "vision"}
        assert teams["maintainer"].post("/api/v1/webhooks/", body, format="json").status_code == 403
        assert teams["nlp-owner"].post("/api/v1/webhooks/", body, format="json").status_code == 403
        unknown = teams["nlp-owner"].post("/api/v1/webhooks/", {**body, "team": "no-such-team"}, format="json")
        assert unknown.status_code == 403 and "not a member" in unknown.json()["detail"]  # as for vision
        everyone = teams["owner"].post("/api/v1/webhooks/", {"url": "http://127.0.0.1:9/hook"}, format="json")
        assert everyone.status_code == 403 and "administrators only" in everyone.json()["detail"]
        other_team = teams["owner"].post("/api/v1/webhooks/", {**body, "model": "bert"}, format="json")
        assert other_team.status_code == 400 and "no model named 'bert'" in other_team.json()["detail"]
        hook = teams["owner"].post("/api/v1/webhooks/", body, format="json").json()["id"]
        global_hook = teams["admin"].post("/api/v1/webhooks/", {"url": "http://127.0.0.1:9/all"},
                                          format="json").json()["id"]

    assert [h["id"] for h in teams["owner"].get("/api/v1/webhooks/").json()["results"]] == [hook]
    assert teams["maintainer"].get("/api/v1/webhooks/").json()["results"] == []
    assert [h["id"] for h in teams["admin"].get("/api/v1/webhooks/").json()["results"]] == [hook, global_hook]
    refused = teams["maintainer"].patch(f"/api/v1/webhooks/{hook}/", {"enabled": False}, format="json")
    assert refused.status_code == 403 and "needs the owner role in team 'vision'" in refused.json()["detail"]
    assert teams["nlp-owner"].get(f"/api/v1/webhooks/{hook}/").status_code == 404  # another team's: unseen
    assert teams["owner"].get(f"/api/v1/webhooks/{global_hook}/").status_code == 404
    moving = teams["owner"].patch(f"/api/v1/webhooks/{hook}/", {"team": None}, format="json")
    assert moving.status_code == 403 and Webhook.objects.get(pk=hook).team.name == "vision"
    assert teams["owner"].patch(f"/api/v1/webhooks/{hook}/", {"enabled": False},
                                format="json").json()["enabled"] is False
    assert teams["owner"].get(f"/api/v1/webhooks/{hook}/deliveries/").status_code == 200
    assert teams["owner"].delete(f"/api/v1/webhooks/{hook}/").status_code == 204
    assert list(Webhook.objects.values_list("pk", flat=True)) == [global_hook]
    events = AuditEvent.objects.filter(object_type="webhook", object_id=str(hook)).order_by("id")
    assert [(e.action, e.actor_label) for e in events] == [
        ("webhook.created", "owner"), ("webhook.changed", "owner"), ("webhook.deleted", "owner")]
    assert events[1].data["before"]["enabled"] is True and events[1].data["after"]["enabled"] is False
    assert events[0].object_label == "webhook http://127.0.0.1:9/hook"
    assert not any("secret" in str(e.data).lower() for e in events)


def test_a_team_owner_cannot_point_a_webhook_at_an_internal_address(teams):
    for url in ("http://127.0.0.1:8080/hook", "http://10.0.0.5/hook", "http://169.254.169.254/latest/"):
        answer = teams["owner"].post("/api/v1/webhooks/", {"url": url, "team": "vision"}, format="json")
        assert answer.status_code == 400 and "webhooks may only call public addresses" in answer.json()["detail"]
    assert not Webhook.objects.exists()
