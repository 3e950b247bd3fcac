"""Twenty writers at once on one model, through a live server with real HTTP clients: each registers a version
(the real upload path, S3 included), moves the model's alias to it without ``If-Match`` and sets the model's
tags. No write may be lost: every success is in the database and in the audit log, in one order."""

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from django.contrib.auth import get_user_model

from audit.choices import AuditAction
from audit.models import AuditEvent
from registry.models import Alias, ModelVersion, RegisteredModel
from tests.factories import team_member, token_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not os.environ.get("DATABASE_URL", "").startswith("postgres"),
                       reason="twenty concurrent writers need PostgreSQL's row locks (SQLite locks the whole table)"),
]

WRITERS = 20


def _chain(action: str, model: RegisteredModel, field: str = "") -> list[tuple]:
    """``(from, to)`` of the model's audit events of ``action`` in the order they were written; with ``field``
    ("tags", "description") only the events that changed it, the pair read from ``data[field]``."""
    events = AuditEvent.objects.filter(action=action, model=model).order_by("id")
    if field:
        events = events.filter(data__has_key=field)
    return [(data[field]["from"], data[field]["to"]) if field else (data["from"], data["to"])
            for data in events.values_list("data", flat=True)]


def test_twenty_writers_registering_moving_the_alias_and_tagging_at_once_lose_no_write(
        live_server, s3_endpoint, iris_archive):
    user = team_member(get_user_model().objects.create_user(username="owner"))
    model = RegisteredModel.objects.create(name="iris", tags={"writer": "none"})
    url = f"{live_server.url}/api/v1/models/iris"
    headers = {"Authorization": f"Bearer {token_for(user)}"}
    start = threading.Barrier(WRITERS)

    def write(n: int) -> dict:
        """Register, move @production to what it registered, tag; odd writers tag first, so all three
        kinds of write are in flight together from the start."""
        answers: dict = {}
        with requests.Session() as session:
            session.headers.update(headers)
            start.wait(timeout=60)
            if n % 2:
                answers["tag"] = session.patch(f"{url}/", json={"tags": {"writer": str(n)}}, timeout=120)
            with iris_archive.open("rb") as artifact:
                answers["register"] = session.post(f"{url}/versions/", files={"artifact": ("iris.tar.gz", artifact)},
                                                   timeout=120)
            if answers["register"].status_code == 201:
                answers["move"] = session.put(f"{url}/aliases/production/",
                                              json={"version": answers["register"].json()["version"]}, timeout=120)
            if not n % 2:
                answers["tag"] = session.patch(f"{url}/", json={"tags": {"writer": str(n)}}, timeout=120)
        return {kind: (answer.status_code, answer.json()) for kind, answer in answers.items()}

    with ThreadPoolExecutor(WRITERS) as pool:
        results = list(pool.map(write, range(WRITERS)))

    statuses = [{kind: status for kind, (status, _) in result.items()} for result in results]
    assert statuses == [{"register": 201, "move": 200, "tag": 200}] * WRITERS, statuses
    registered = sorted(result["register"][1]["version"] for result in results)
    assert registered == list(range(1, WRITERS + 1))  # distinct and contiguous
    model.refresh_from_db()
    assert model.next_version == WRITERS + 1
    assert sorted(ModelVersion.objects.filter(model=model).values_list("version", flat=True)) == registered

    events = AuditEvent.objects.filter(model=model, action=AuditAction.VERSION_REGISTERED)
    assert sorted(events.values_list("data__version", flat=True)) == registered

    # Each move is audited once, each from the version the one before it left the alias at: the moves were
    # serialised, and the alias names the version of the last one.
    moves = _chain(AuditAction.ALIAS_SET, model)
    assert sorted(to for _, to in moves) == registered
    assert [before for before, _ in moves] == [None] + [to for _, to in moves[:-1]]
    assert Alias.objects.get(model=model, name="production").version.version == moves[-1][1]

    # The same for the tags: every change audited once, from what the one before it set; the model keeps the last.
    changes = _chain(AuditAction.MODEL_UPDATED, model, "tags")
    assert sorted(int(to["writer"]) for _, to in changes) == list(range(WRITERS))
    assert [before for before, _ in changes] == [{"writer": "none"}] + [to for _, to in changes[:-1]]
    assert model.tags == changes[-1][1]

    # What readers are shown agrees.
    summary = requests.get(f"{url}/", headers=headers, timeout=30).json()
    assert (summary["latest_version"], summary["tags"]) == (WRITERS, model.tags)
    alias = requests.get(f"{url}/aliases/production/", headers=headers, timeout=30).json()
    assert alias["version"] == moves[-1][1]


def test_twenty_writers_changing_a_models_description_or_its_tags_at_once_keep_each_others_change(live_server):
    user = team_member(get_user_model().objects.create_user(username="owner"))
    model = RegisteredModel.objects.create(name="iris", description="d-none", tags={"writer": "none"})
    url = f"{live_server.url}/api/v1/models/iris/"
    headers = {"Authorization": f"Bearer {token_for(user)}"}
    start = threading.Barrier(WRITERS)

    def write(n: int) -> int:
        """Even writers set the description, odd ones the tags: each PATCH names one field only."""
        body = {"description": f"d-{n}"} if n % 2 == 0 else {"tags": {"writer": str(n)}}
        with requests.Session() as session:
            session.headers.update(headers)
            start.wait(timeout=60)
            return session.patch(url, json=body, timeout=120).status_code

    with ThreadPoolExecutor(WRITERS) as pool:
        assert list(pool.map(write, range(WRITERS))) == [200] * WRITERS

    model.refresh_from_db()
    for field, first, kept in (("description", "d-none", model.description), ("tags", {"writer": "none"}, model.tags)):
        changes = _chain(AuditAction.MODEL_UPDATED, model, field)
        assert len(changes) == WRITERS // 2, field
        assert [before for before, _ in changes] == [first] + [to for _, to in changes[:-1]], field
        assert kept == changes[-1][1], field
