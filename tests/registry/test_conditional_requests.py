"""Conditional requests with real HTTP clients (``requests`` and the ``modelyard`` console script) against a
live server: ETags, 304 for an unchanged object, and ``If-Match`` that makes moving an alias or deleting a
version a compare-and-set (412 when stale, nothing changed)."""

import json
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from django.contrib.auth import get_user_model

from audit.models import AuditEvent
from registry.models import Alias, ModelVersion, RegisteredModel
from tests.factories import team_member, token_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

CLI = Path(sys.executable).parent / "modelyard"


@pytest.fixture
def api(live_server):
    """``(base URL of the API, a requests.Session with an owner's token)``, model ``iris`` v1-v3, @production→v1."""
    user = team_member(get_user_model().objects.create_user(username="owner"))
    model = RegisteredModel.objects.create(name="iris", next_version=4)
    for n in (1, 2, 3):
        ModelVersion.objects.create(model=model, version=n, format="onnx", artifact_key=f"k{n}",
                                    artifact_sha256=f"{n}" * 64, artifact_size=1, created_by=user)
    Alias.objects.create(model=model, name="production", version=model.versions.get(version=1))
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {token_for(user)}"
    yield f"{live_server.url}/api/v1", session
    session.close()


def test_an_unchanged_version_is_a_304_with_no_body_and_a_changed_one_a_200_with_a_new_etag(api):
    url, session = api
    first = session.get(f"{url}/models/iris/versions/1/", timeout=10)
    assert first.status_code == 200 and first.headers["ETag"].startswith('"')
    again = session.get(f"{url}/models/iris/versions/1/", headers={"If-None-Match": first.headers["ETag"]},
                        timeout=10)
    assert (again.status_code, again.content, again.headers["ETag"]) == (304, b"", first.headers["ETag"])
    session.put(f"{url}/models/iris/aliases/staging/", json={"version": 1}, timeout=10).raise_for_status()
    changed = session.get(f"{url}/models/iris/versions/1/", headers={"If-None-Match": first.headers["ETag"]},
                          timeout=10)
    assert changed.status_code == 200 and changed.json()["aliases"] == ["production", "staging"]
    assert changed.headers["ETag"] != first.headers["ETag"]


def test_a_list_answers_304_while_its_page_is_unchanged(api):
    url, session = api
    first = session.get(f"{url}/models/iris/versions/", timeout=10)
    assert first.status_code == 200 and "ETag" in first.headers
    tag = first.headers["ETag"]
    assert session.get(f"{url}/models/iris/versions/", headers={"If-None-Match": tag}, timeout=10).status_code == 304
    ModelVersion.objects.filter(model__name="iris", version=3).update(tags={"team": "vision"})
    assert session.get(f"{url}/models/iris/versions/", headers={"If-None-Match": tag}, timeout=10).status_code == 200


def test_moving_an_alias_with_a_stale_if_match_is_a_412_and_changes_nothing(api):
    url, session = api
    seen = session.get(f"{url}/models/iris/aliases/production/", timeout=10)
    assert seen.json()["version"] == 1
    moved = session.put(f"{url}/models/iris/aliases/production/", json={"version": 2},
                        headers={"If-Match": seen.headers["ETag"]}, timeout=10)
    assert moved.status_code == 200 and moved.json()["version"] == 2 and moved.headers["ETag"] != seen.headers["ETag"]
    events = AuditEvent.objects.count()
    weak = session.put(f"{url}/models/iris/aliases/production/", json={"version": 3},
                       headers={"If-Match": "W/" + moved.headers["ETag"]}, timeout=10)
    assert weak.status_code == 412  # If-Match compares strongly: a weak tag matches nothing
    stale = session.put(f"{url}/models/iris/aliases/production/", json={"version": 3},
                        headers={"If-Match": seen.headers["ETag"]}, timeout=10)
    assert stale.status_code == 412
    assert stale.json()["code"] == "precondition_failed" and "changed since you read it" in stale.json()["detail"]
    assert Alias.objects.get(name="production").version.version == 2 and AuditEvent.objects.count() == events
    # The ETag a PUT answers with is the one a GET gives, so a client chains moves without reading again.
    assert session.get(f"{url}/models/iris/aliases/production/", timeout=10).headers["ETag"] == moved.headers["ETag"]
    chained = session.put(f"{url}/models/iris/aliases/production/", json={"version": 3},
                          headers={"If-Match": moved.headers["ETag"]}, timeout=10)
    assert chained.status_code == 200 and chained.json()["version"] == 3


def test_if_match_star_moves_only_an_alias_that_exists_and_delete_honours_if_match(api):
    url, session = api
    absent = session.put(f"{url}/models/iris/aliases/canary/", json={"version": 2}, headers={"If-Match": "*"},
                         timeout=10)
    assert absent.status_code == 412 and not Alias.objects.filter(name="canary").exists()
    tag = session.get(f"{url}/models/iris/aliases/production/", timeout=10).headers["ETag"]
    session.put(f"{url}/models/iris/aliases/production/", json={"version": 2}, timeout=10).raise_for_status()
    assert session.delete(f"{url}/models/iris/aliases/production/", headers={"If-Match": tag},
                          timeout=10).status_code == 412
    assert Alias.objects.filter(name="production").exists()
    version = session.get(f"{url}/models/iris/versions/3/", timeout=10).headers["ETag"]
    session.put(f"{url}/models/iris/aliases/staging/", json={"version": 3}, timeout=10).raise_for_status()
    assert session.delete(f"{url}/models/iris/versions/3/", headers={"If-Match": version},
                          timeout=10).status_code == 412
    assert ModelVersion.objects.get(model__name="iris", version=3).status != "deleted"
    current = session.get(f"{url}/models/iris/versions/3/", timeout=10).headers["ETag"]
    assert session.delete(f"{url}/models/iris/versions/3/", headers={"If-Match": current},
                          timeout=10).status_code == 204


@pytest.mark.skipif(not os.environ.get("DATABASE_URL", "").startswith("postgres"),
                    reason="twenty concurrent writers need PostgreSQL's row locks (SQLite locks the whole table)")
def test_twenty_concurrent_promotions_of_one_alias_each_win_or_get_412_and_the_audit_log_shows_the_winners(api):
    url, session = api
    seen = session.get(f"{url}/models/iris/aliases/production/", timeout=10).headers["ETag"]
    start = threading.Barrier(20)

    def promote(n: int) -> int:
        with requests.Session() as own:
            own.headers.update(session.headers)
            start.wait(timeout=30)
            return own.put(f"{url}/models/iris/aliases/production/", json={"version": 2 + n % 2},
                           headers={"If-Match": seen}, timeout=60).status_code

    with ThreadPoolExecutor(20) as pool:
        statuses = list(pool.map(promote, range(20)))
    assert set(statuses) <= {200, 412}, statuses
    winners = statuses.count(200)
    assert winners == 1, statuses  # each read the same state: exactly one move can have been from it
    moves = AuditEvent.objects.filter(action="alias.set", data__alias="production")
    assert moves.count() == winners and moves.get().data["from"] == 1
    assert moves.get().data["to"] == Alias.objects.get(name="production").version.version


def test_the_cli_moves_an_alias_only_from_the_version_it_expects_and_polls_with_if_none_match(api, live_server):
    _, session = api
    env = {**os.environ, "MODELYARD_URL": live_server.url,
           "MODELYARD_TOKEN": session.headers["Authorization"].removeprefix("Bearer ")}

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(CLI), *args], env=env, capture_output=True, text=True, timeout=120)

    moved = cli("alias", "set", "iris", "production", "2", "--expect-version", "1")
    assert moved.returncode == 0, moved.stderr
    assert json.loads(moved.stdout)["version"] == 2
    refused = cli("alias", "set", "iris", "production", "3", "--expect-version", "1")
    assert refused.returncode == 1 and "names v2, not v1" in refused.stderr
    assert Alias.objects.get(name="production").version.version == 2

    from modelyard_cli.client import Client

    client = Client(live_server.url, env["MODELYARD_TOKEN"])
    statuses = []
    client.session.hooks["response"].append(lambda answer, *args, **kwargs: statuses.append(answer.status_code))
    first = client.request("GET", "models/iris/versions/2/")
    assert client.request("GET", "models/iris/versions/2/") == first  # the cached body, on a 304
    assert statuses == [200, 304]


def test_an_alias_read_while_it_moves_answers_the_version_its_etag_names(api, monkeypatch):
    # A writer moves @production to v3 right before the read of the alias: the answer and its ETag come from
    # one read, so they name the same state (read apart, the body said v1 with v3's ETag, and a move "away from
    # v1" with that ETag to v3 was a silent no-op).
    from registry import aliases
    from registry.api import views

    url, session = api
    real = views.current_alias

    def moved_first(model, name):
        aliases.set_alias(model_name="iris", alias="production", version=3)
        return real(model, name)

    monkeypatch.setattr(views, "current_alias", moved_first)
    torn = session.get(f"{url}/models/iris/aliases/production/", timeout=10)
    monkeypatch.setattr(views, "current_alias", real)
    settled = session.get(f"{url}/models/iris/aliases/production/", timeout=10)
    assert torn.status_code == settled.status_code == 200
    assert torn.headers["ETag"] == settled.headers["ETag"]
    assert torn.json()["version"] == settled.json()["version"] == 3
