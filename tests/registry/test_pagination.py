"""Cursor pagination: no row skipped or repeated while rows are inserted, a documented maximum page
size, and list endpoints whose SQL query count does not grow with the page size."""

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from accounts.models import Team
from audit.models import AuditEvent
from registry.choices import ArtifactFormat
from registry.models import Alias, ModelVersion, RegisteredModel
from tests.factories import team_member, token_for

pytestmark = pytest.mark.django_db


def add_versions(model: RegisteredModel, numbers) -> None:
    ModelVersion.objects.bulk_create(
        ModelVersion(model=model, version=n, format=ArtifactFormat.TRITON_MODEL_DIR, artifact_key=f"k{n}",
                     artifact_sha256=f"{n:064d}", artifact_size=1, tags={"team": "ml"}) for n in numbers
    )


def page_through(api_client, url: str, key: str, between_pages) -> list:
    """Every row's ``key`` in page order, calling ``between_pages(page_number)`` after each page."""
    seen, page_number = [], 0
    while url:
        answer = api_client.get(url)
        assert answer.status_code == 200, answer.content
        seen += [row[key] for row in answer.json()["results"]]
        page_number += 1
        between_pages(page_number)
        url = answer.json()["next"]
    return seen


def test_paging_through_models_while_models_are_registered_skips_and_repeats_nothing(api_client):
    original = [f"m{n:02d}" for n in range(0, 40, 2)]
    RegisteredModel.objects.bulk_create(RegisteredModel(name=name) for name in original)

    def register_around_the_cursor(page_number: int) -> None:
        # one name sorting before the rows already seen, one among those still to come
        RegisteredModel.objects.create(name=f"a{page_number:02d}")
        RegisteredModel.objects.create(name=f"m{page_number * 6 + 1:02d}")

    seen = page_through(api_client, "/api/v1/models/?page_size=3", "name", register_around_the_cursor)
    assert len(seen) == len(set(seen))
    assert set(original) <= set(seen)
    assert seen == sorted(seen)


def test_paging_through_versions_and_the_audit_log_while_rows_are_added_skips_and_repeats_nothing(api_client):
    model = RegisteredModel.objects.create(name="iris", next_version=21)
    add_versions(model, range(1, 21))
    AuditEvent.objects.bulk_create(AuditEvent(action="model.updated", object_type="model", object_id=str(n),
                                              model=model) for n in range(20))
    # events of a model (the token and membership events of api_client's user are for administrators)
    original_events = set(AuditEvent.objects.filter(model=model).values_list("id", flat=True))

    def register_a_version(page_number: int) -> None:
        add_versions(model, [100 + page_number])

    versions = page_through(api_client, "/api/v1/models/iris/versions/?page_size=3", "version", register_a_version)
    assert len(versions) == len(set(versions)) and set(range(1, 21)) <= set(versions)

    def record_an_event(page_number: int) -> None:
        AuditEvent.objects.create(action="model.updated", object_type="model", object_id=f"new{page_number}",
                                  model=model)

    events = page_through(api_client, "/api/v1/audit/?page_size=3", "id", record_an_event)
    assert len(events) == len(set(events)) and original_events <= set(events)


@pytest.mark.parametrize("page_size", ["0", "201", "-1", "many"])
def test_a_page_size_outside_one_to_two_hundred_is_refused_not_cut(api_client, page_size):
    answer = api_client.get(f"/api/v1/models/?page_size={page_size}")
    assert answer.status_code == 400 and "from 1 to 200" in answer.json()["fields"]["page_size"][0]


def test_the_maximum_page_size_is_served_and_documented_in_the_schema(api_client):
    RegisteredModel.objects.bulk_create(RegisteredModel(name=f"m{n:03d}") for n in range(201))
    assert len(api_client.get("/api/v1/models/?page_size=200").json()["results"]) == 200
    schema = api_client.get("/api/schema/?format=json").json()
    parameters = schema["paths"]["/api/v1/models/"]["get"]["parameters"]
    assert "1 to 200" in next(p for p in parameters if p["name"] == "page_size")["description"]
    assert "at most 200" in schema["info"]["description"]


def queries_for(api_client, url: str) -> int:
    with CaptureQueriesContext(connection) as captured:
        assert api_client.get(url).status_code == 200
    return len(captured)


@pytest.mark.parametrize(("url", "most"), [
    ("/api/v1/models/?page_size={n}", 3),
    ("/api/v1/models/?page_size={n}&tag=team%3Dml&alias=production", 3),
    # the model, the user's role in its team, the page, and a fixed number of prefetches (ensemble members
    # and their versions, aliases)
    ("/api/v1/models/iris/versions/?page_size={n}", 6),
    ("/api/v1/audit/?page_size={n}", 3),
])
def test_a_list_page_costs_the_same_sql_queries_for_five_rows_as_for_fifty(api_client, url, most):
    models = RegisteredModel.objects.bulk_create(
        RegisteredModel(name="iris" if n == 0 else f"m{n:02d}", tags={"team": "ml"}) for n in range(60)
    )
    for model in models:
        add_versions(model, [1, 2])
        Alias.objects.create(model=model, name="production", version=model.versions.get(version=2))
    add_versions(models[0], range(3, 61))
    AuditEvent.objects.bulk_create(
        AuditEvent(action="model.created", model=m, object_type="model", object_id=str(m.pk)) for m in models
    )
    api_client.get(url.format(n=5))  # the token's first use writes its last_used_at (once a minute), not counted
    small, large = queries_for(api_client, url.format(n=5)), queries_for(api_client, url.format(n=50))
    assert small == large, f"{small} queries for 5 rows, {large} for 50"
    assert large <= most


@pytest.mark.parametrize("role", ["viewer", "maintainer"])
def test_a_team_members_page_of_versions_reads_the_model_and_the_members_teams_in_the_pages_query(role):
    model = RegisteredModel.objects.create(name="iris")
    add_versions(model, range(1, 8))
    member = team_member(get_user_model().objects.create_user(username=f"member-{role}"), role)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token_for(member)}")
    client.get("/api/v1/models/iris/versions/")  # the token's first use writes its last_used_at, not counted
    with CaptureQueriesContext(connection) as captured:
        answer = client.get("/api/v1/models/iris/versions/?page_size=5")
    assert answer.status_code == 200 and [v["version"] for v in answer.json()["results"]] == [7, 6, 5, 4, 3]
    # The token; the page with each version's JSON, of the model by name in the member's teams (PostgreSQL;
    # SQLite serializes them with prefetches).
    if connection.vendor == "postgresql":
        assert len(captured) == 2, [q["sql"][:120] for q in captured]
    assert not any("accounts_membership" in q["sql"] and "registry_registeredmodel" not in q["sql"]
                   for q in captured), "the role was read in a query of its own"
    # and the member's teams still decide: another team's member sees no such model.
    outsider = get_user_model().objects.create_user(username=f"outsider-{role}")
    team_member(outsider, role, team=Team.objects.create(name=f"other-{role}"))
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Bearer {token_for(outsider)}")
    assert other.get("/api/v1/models/iris/versions/").status_code == 404


@pytest.mark.parametrize("position", ["abc", "1\u00b2", "99999999999999999999"])
def test_a_cursor_whose_position_the_ordering_column_cannot_hold_is_the_404_of_an_invalid_cursor(api_client,
                                                                                                position):
    # A crafted cursor (base64 of "p=<position>") on lists ordered by a number: versions by number, the audit
    # log by id. It was a server error (int("abc"); a number past the column's range).
    import base64
    from urllib.parse import quote

    add_versions(RegisteredModel.objects.create(name="iris"), [1, 2])
    cursor = quote(base64.b64encode(f"p={position}".encode()).decode())
    for url in ("/api/v1/models/iris/versions/", "/api/v1/audit/"):
        answer = api_client.get(f"{url}?cursor={cursor}")
        assert answer.status_code in (200, 404), (url, answer.status_code, answer.content[:200])
        if answer.status_code == 404:
            assert answer.json()["detail"] == "Invalid cursor", answer.content
    assert api_client.get("/api/v1/models/iris/versions/?cursor=" + quote(base64.b64encode(b"p=abc").decode())
                          ).status_code == 404
