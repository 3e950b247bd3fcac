"""The audit log through the API and the page."""

import pytest
from django.contrib.auth import get_user_model

from registry.models import ModelVersion, RegisteredModel

pytestmark = pytest.mark.django_db


@pytest.fixture
def history(api_client):
    api_client.post("/api/v1/models/", {"name": "iris"}, format="json")
    api_client.post("/api/v1/models/", {"name": "resnet"}, format="json")
    model = RegisteredModel.objects.get(name="iris")
    ModelVersion.objects.create(model=model, version=1, format="triton", artifact_key="k", artifact_sha256="0" * 64,
                                artifact_size=1)
    api_client.put("/api/v1/models/iris/aliases/production/", {"version": 1}, format="json")
    return api_client


def test_the_api_lists_every_change_newest_first_with_actor_and_details(history):
    events = history.get("/api/v1/audit/").json()["results"]
    # api_client's own token.created is an event of no model: only administrators see those
    assert [e["action"] for e in events] == ["alias.set", "model.created", "model.created"]
    assert events[0]["actor"] == "engineer" and events[0]["model"] == "iris"
    assert events[0]["data"] == {"alias": "production", "from": None, "to": 1}


def test_the_api_filters_by_action_model_and_time(history):
    assert [e["action"] for e in history.get("/api/v1/audit/?model=resnet").json()["results"]] == ["model.created"]
    assert len(history.get("/api/v1/audit/?action=alias.set").json()["results"]) == 1
    assert history.get("/api/v1/audit/?since=2999-01-01T00:00:00Z").json()["results"] == []
    assert history.get("/api/v1/audit/?since=yesterday").status_code == 400


def test_the_page_shows_and_filters_the_log(history, client, user):
    client.force_login(user)
    page = client.get("/audit/").content.decode()
    assert page.count('class="audit-row"') == 3
    filtered = client.get("/audit/?model=iris&action=alias.set").content.decode()
    assert filtered.count('class="audit-row"') == 1 and "<dt>change</dt><dd>— → 1</dd>" in filtered


def test_the_audit_log_requires_authentication(client):
    assert client.get("/api/v1/audit/").status_code == 401
    assert client.get("/audit/").status_code == 302


def test_events_of_no_model_are_shown_to_administrators_only(history, client, user):
    from django.contrib.auth import get_user_model

    client.force_login(get_user_model().objects.create_user(username="root", is_staff=True, is_superuser=True))
    from audit.models import AuditEvent

    page = client.get("/audit/").content.decode()  # the model events, token.created and membership.set
    assert page.count('class="audit-row"') == AuditEvent.objects.count() == 5
    assert "version v1" not in page and "alias production" in page
    client.force_login(user)
    assert client.get("/audit/").content.decode().count('class="audit-row"') == 3


def test_details_read_as_labelled_values_and_objects_by_their_names(history, client, user):
    from deployments.hosts import update_host
    from deployments.models import ServingHost
    from registry.registered_models import update_model

    update_model(name="iris", description="iris species", tags={"team": "vision"}, actor=user)
    ServingHost.objects.create(name="gpu-7", inference_url="http://gpu-7:8000")
    update_host(name="gpu-7", production=True, actor=user)
    client.force_login(get_user_model().objects.create_user(username="root", is_staff=True))
    page = client.get("/audit/").content.decode()

    assert "<td>model iris</td>" in page and "model #" not in page
    assert "<td>host gpu-7</td>" in page and "host #" not in page
    assert "<dt>description</dt><dd>— → iris species</dd>" in page
    assert '<dt>tags</dt><dd>{} → {&quot;team&quot;: &quot;vision&quot;}</dd>' in page
    assert "<dt>production</dt><dd>no → yes</dd>" in page
    assert "{&#x27;" not in page and "&#x27;from&#x27;" not in page  # no Python reprs
    events = history.get("/api/v1/audit/?action=model.updated").json()["results"]
    assert [e["object"] for e in events] == ["model iris"]
