"""API tokens: stored as digests, shown once, scoped, team-limited, expiring, revocable, last use recorded."""

import hashlib
import os
import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient, APIRequestFactory
from rest_framework.views import APIView

from accounts.choices import Role
from accounts.models import ApiToken, Team
from accounts.services import set_membership
from accounts.tokens import TokenRejected, authenticate_token, issue_token
from audit.models import AuditEvent
from tests.factories import token_for

pytestmark = pytest.mark.django_db
TOKENS = "/api/v1/tokens/"
PASSWORD = "a-long-test-password"


def bearer(plaintext: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    return client


@pytest.fixture
def member(db):
    return get_user_model().objects.create_user(username="member", password=PASSWORD)


@pytest.fixture
def outsider(db):
    return get_user_model().objects.create_user(username="outsider", password=PASSWORD)


@pytest.fixture
def admin(db):
    return get_user_model().objects.create_user(username="admin", password=PASSWORD, is_staff=True)


@pytest.fixture
def teams(member):
    """Teams ``vision`` and ``speech`` with ``member`` a maintainer of both, and ``other`` without them."""
    vision, speech, other = (Team.objects.create(name=n) for n in ("vision", "speech", "other"))
    set_membership(team=vision, user=member, role=Role.MAINTAINER)
    set_membership(team=speech, user=member, role=Role.MAINTAINER)
    return vision, speech, other


def test_the_database_holds_only_a_digest_and_the_secret_is_answered_once(member):
    client = bearer(token_for(member))
    created = client.post(TOKENS, {"name": "ci", "scopes": ["read", "write"]}, format="json")
    assert created.status_code == 201, created.json()
    assert created["Cache-Control"] == "no-store"
    body = created.json()
    plaintext, secret = body["token"], body["token"].split("_", 2)[2]
    assert plaintext.startswith(f"my_{body['prefix']}_") and len(secret) >= 43

    row = ApiToken.objects.filter(pk=body["id"]).values().get()
    assert row["digest"] == hashlib.sha256(plaintext.encode()).hexdigest()
    assert not any(secret in str(value) for value in row.values())
    assert not any(secret in str(event) for event in AuditEvent.objects.values())
    with connection.cursor() as cursor:  # nowhere in the table, in any column
        cursor.execute("SELECT count(*) FROM accounts_apitoken WHERE CAST(accounts_apitoken.* AS text) LIKE %s",
                       [f"%{secret}%"])
        assert cursor.fetchone()[0] == 0

    listed = client.get(TOKENS).json()["results"]
    assert {t["name"] for t in listed} == {"ci", "test"}
    retrieved = client.get(f"{TOKENS}{body['id']}/")
    assert all("token" not in t for t in client.get(TOKENS).json()["results"]) and "token" not in retrieved.json()
    assert secret not in client.get(TOKENS).content.decode() and secret not in retrieved.content.decode()
    assert retrieved.json()["scopes"] == ["read", "write"] and retrieved.json()["state"] == "active"
    assert bearer(plaintext).get("/api/v1/models/").status_code == 200


def test_expired_revoked_and_unknown_tokens_are_refused_with_401_and_a_message(member):
    expired = token_for(member, expires_at=timezone.now() + timedelta(days=1), name="old")
    ApiToken.objects.filter(name="old").update(expires_at=timezone.now() - timedelta(seconds=1))
    answer = bearer(expired).get("/api/v1/models/")
    assert answer.status_code == 401 and "expired at" in answer.json()["detail"]
    assert answer["WWW-Authenticate"].startswith("Bearer")

    revoked = token_for(member, name="leaked")
    assert bearer(revoked).delete(f"{TOKENS}{ApiToken.objects.get(name='leaked').pk}/").status_code == 204
    answer = bearer(revoked).get("/api/v1/models/")
    assert answer.status_code == 401 and "revoked at" in answer.json()["detail"]
    assert ApiToken.objects.get(name="leaked").revoked_at is not None  # the row stays

    forged = revoked[:-4] + "AAAA"  # right prefix, wrong secret: told nothing about the row
    assert bearer(forged).get("/api/v1/models/").json()["detail"] == "unknown API token"
    assert "my_<prefix>_<secret>" in bearer("0" * 40).get("/api/v1/models/").json()["detail"]



def test_an_inactive_users_token_is_refused(member):
    plaintext = token_for(member)
    member.is_active = False
    member.save()
    answer = bearer(plaintext).get("/api/v1/models/")
    assert answer.status_code == 401 and "inactive" in answer.json()["detail"]


def test_last_used_is_set_on_use_and_not_rewritten_within_a_minute(member):
    plaintext = token_for(member)
    token = ApiToken.objects.get(user=member)
    assert token.last_used_at is None
    client = bearer(plaintext)
    assert client.get(TOKENS).status_code == 200
    first = ApiToken.objects.get(pk=token.pk).last_used_at
    assert first is not None

    with CaptureQueriesContext(connection) as queries:
        assert client.get(TOKENS).status_code == 200
    assert not [q for q in queries if q["sql"].startswith("UPDATE")], "last_used_at rewritten within 60 s"
    assert ApiToken.objects.get(pk=token.pk).last_used_at == first

    ApiToken.objects.filter(pk=token.pk).update(last_used_at=first - timedelta(seconds=61))
    assert client.get(TOKENS).status_code == 200
    assert ApiToken.objects.get(pk=token.pk).last_used_at > first - timedelta(seconds=61)


def test_the_token_list_takes_the_same_number_of_queries_for_one_token_or_twenty(member, teams):
    client = bearer(token_for(member))
    client.get(TOKENS)  # last_used_at written once

    def count() -> int:
        with CaptureQueriesContext(connection) as queries:
            assert client.get(TOKENS).status_code == 200
        return len(queries)

    few = count()
    for i in range(20):
        token_for(member, ["read"], team=teams[i % 2], name=f"t{i}")
    assert count() == few


def test_a_read_only_token_reads_but_gets_403_on_a_write(member):
    client = bearer(token_for(member, ["read"]))
    assert client.get("/api/v1/models/").status_code == 200
    answer = client.post("/api/v1/models/", {"name": "iris"}, format="json")
    assert answer.status_code == 403 and "lacks the 'write' scope" in answer.json()["detail"]
    assert client.post(TOKENS, {"name": "more", "scopes": ["read"]}, format="json").status_code == 403


class DeployView(APIView):
    """Stands for a view the access layer gives scopes to: POST needs deploy, PUT admin; the default
    permission classes (IsAuthenticated, TokenScopePermission) apply."""

    required_scope = {"POST": "deploy", "PUT": "admin"}

    def get(self, request):
        from rest_framework.response import Response

        return Response({})

    post = put = get


@pytest.mark.parametrize("scopes, method, allowed", [
    (["read"], "get", True), (["write"], "post", False), (["deploy"], "post", True),
    (["read", "write", "deploy"], "put", False), (["admin"], "put", True),
])
def test_a_views_required_scope_bounds_what_a_token_may_do(admin, scopes, method, allowed):
    plaintext = token_for(admin, scopes)
    request = getattr(APIRequestFactory(), method)("/x/", HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    answer = DeployView.as_view()(request)
    assert (answer.status_code == 200) is allowed, answer.data


def test_a_team_limited_token_cannot_make_a_token_for_another_team_or_for_every_team(member, teams):
    vision, speech, _other = teams
    client = bearer(token_for(member, ["read", "write"], team=vision))
    for team in ("speech", None):
        answer = client.post(TOKENS, {"name": "wider", "scopes": ["read"], "team": team}, format="json")
        assert answer.status_code == 403 and "limited to team 'vision'" in answer.json()["detail"]
    narrower = client.post(TOKENS, {"name": "same", "scopes": ["read"], "team": "vision"}, format="json")
    assert narrower.status_code == 201 and narrower.json()["team"] == "vision"
    assert set(ApiToken.objects.values_list("name", flat=True)) == {"test", "same"}


def test_a_token_cannot_make_a_token_with_more_scopes_or_a_longer_life(member):
    limit = timezone.now() + timedelta(days=7)
    client = bearer(token_for(member, ["read", "write"], expires_at=limit))
    answer = client.post(TOKENS, {"name": "x", "scopes": ["read", "deploy"]}, format="json")
    assert answer.status_code == 403 and "lacks the 'deploy' scope" in answer.json()["detail"]
    later = (limit + timedelta(days=1)).isoformat()
    answer = client.post(TOKENS, {"name": "x", "scopes": ["read"], "expires_at": later}, format="json")
    assert answer.status_code == 403 and "cannot outlive it" in answer.json()["detail"]
    inherits = client.post(TOKENS, {"name": "x", "scopes": ["read"]}, format="json")
    assert inherits.status_code == 201
    assert ApiToken.objects.get(pk=inherits.json()["id"]).expires_at == ApiToken.objects.get(name="test").expires_at


def test_what_a_token_may_carry_is_checked_for_every_way_of_making_one(member, admin, outsider, teams):
    vision, _speech, other = teams
    client = APIClient()
    client.force_login(member)  # a browser session: no token narrows it
    for body, status, message in [
        ({"name": "x", "scopes": ["admin"]}, 403, "only administrators"),
        ({"name": "x", "scopes": ["read"], "team": "other"}, 403, "not a member of team 'other'"),
        ({"name": "x", "scopes": ["read"], "team": "nosuch"}, 403, "not a member of team 'nosuch'"),
        ({"name": "x", "scopes": ["read"], "expires_at": "2001-01-01T00:00:00Z"}, 400, "in the future"),
        ({"name": "  ", "scopes": ["read"]}, 400, None),
        ({"name": "x", "scopes": []}, 400, None),
        ({"name": "x", "scopes": ["root"]}, 400, None),
    ]:
        answer = client.post(TOKENS, body, format="json")
        assert answer.status_code == status, (body, answer.json())
        assert message is None or message in answer.json()["detail"]
    assert not ApiToken.objects.exists() and not AuditEvent.objects.filter(object_type="token").exists()
    assert issue_token(user=admin, name="ops", scopes=["admin", "read"], team=other)[0].scopes == ["read", "admin"]


def test_others_tokens_are_not_found_and_only_administrators_list_them(member, outsider, admin):
    mine = token_for(member)
    theirs = ApiToken.objects.get(user=member)
    outsider_client = bearer(token_for(outsider))
    assert outsider_client.get(f"{TOKENS}{theirs.pk}/").status_code == 404
    assert outsider_client.post(f"{TOKENS}{theirs.pk}/revoke/").status_code == 404
    assert outsider_client.delete(f"{TOKENS}{theirs.pk}/").status_code == 404
    answer = outsider_client.get(TOKENS, {"user": "member"})
    assert answer.status_code == 403 and "only administrators" in answer.json()["detail"]
    assert bearer(mine).get("/api/v1/models/").status_code == 200

    admin_client = bearer(token_for(admin))
    assert [t["user"] for t in admin_client.get(TOKENS, {"user": "member"}).json()["results"]] == ["member"]
    assert admin_client.get(TOKENS, {"user": "nobody"}).status_code == 404
    reader = bearer(token_for(admin, ["read"], name="reader"))  # an administrator's token without admin scope
    assert reader.get(TOKENS, {"user": "member"}).status_code == 403
    revoked = admin_client.post(f"{TOKENS}{theirs.pk}/revoke/")
    assert revoked.status_code == 200 and revoked.json()["state"] == "revoked"
    assert bearer(mine).get("/api/v1/models/").status_code == 401


def test_revoking_is_idempotent_and_audited_once(member):
    client = bearer(token_for(member, name="keeper"))
    token_for(member, name="doomed")
    doomed = ApiToken.objects.get(name="doomed")
    first = client.post(f"{TOKENS}{doomed.pk}/revoke/").json()
    again = client.post(f"{TOKENS}{doomed.pk}/revoke/").json()
    assert first["revoked_at"] == again["revoked_at"] is not None
    assert client.delete(f"{TOKENS}{doomed.pk}/").status_code == 204
    events = AuditEvent.objects.filter(object_type="token", object_id=str(doomed.pk)).order_by("id")
    assert [e.action for e in events] == ["token.created", "token.revoked"]
    assert events[1].actor == member and events[1].data["prefix"] == doomed.prefix


# ---------------------------------------------------------------- pages


def test_the_page_shows_a_new_tokens_secret_once_and_lists_it_without(member, teams):
    browser = Client()
    browser.force_login(member)
    form = browser.get("/account/tokens/new/")
    assert form.status_code == 200 and "vision" in form.content.decode() and "other" not in form.content.decode()
    assert 'value="admin"' not in form.content.decode()  # not offered to a non-administrator
    sent = {"name": "laptop", "scopes": ["read", "deploy"], "team": teams[0].pk, "expires_in_days": "30",
            "form_id": "a1b2c3"}
    made = browser.post("/account/tokens/new/", sent)
    assert made.status_code == 200 and "no-store" in made["Cache-Control"]
    token = ApiToken.objects.get(name="laptop")
    page = made.content.decode()
    start = page.index("my_" + token.prefix)
    plaintext = page[start:page.index("<", start)]
    assert "shown only this once" in page and hashlib.sha256(plaintext.encode()).hexdigest() == token.digest
    assert token.scopes == ["read", "deploy"] and token.team == teams[0]
    assert timedelta(days=29) < token.expires_at - timezone.now() <= timedelta(days=30)

    listing = browser.get("/account/tokens/").content.decode()
    assert "laptop" in listing and f"my_{token.prefix}…" in listing and plaintext not in listing
    assert browser.get("/account/tokens/").status_code == 200
    again = browser.post("/account/tokens/new/", sent, follow=True)  # the secret's page reloaded
    assert "sent already" in again.content.decode() and ApiToken.objects.filter(name="laptop").count() == 1
    refused = browser.post("/account/tokens/new/", {"name": "root", "scopes": ["admin"], "expires_in_days": "30",
                                                    "form_id": "d4e5f6"})
    assert refused.status_code == 200 and "admin is not one of the available choices" in refused.content.decode()


def test_a_token_is_revoked_from_the_page_after_a_confirmation_and_a_csrf_checked_post(member, outsider):
    token, _plaintext = issue_token(user=member, name="ci", scopes=["read"])
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(member)
    confirm = browser.get(f"/account/tokens/{token.pk}/revoke/")
    assert confirm.status_code == 200 and "Revoke token ci?" in confirm.content.decode()
    assert not re.search(r"<script(?![^>]*\bsrc=)", confirm.content.decode())  # no inline script
    assert browser.post(f"/account/tokens/{token.pk}/revoke/").status_code == 403  # no CSRF token
    token.refresh_from_db()
    assert token.revoked_at is None
    csrf = confirm.cookies["csrftoken"].value
    done = browser.post(f"/account/tokens/{token.pk}/revoke/", {"csrfmiddlewaretoken": csrf})
    assert done.status_code == 302 and done["Location"] == "/account/tokens/"
    token.refresh_from_db()
    assert token.revoked_at is not None
    assert "revoked" in browser.get("/account/tokens/").content.decode()

    stranger = Client()
    stranger.force_login(outsider)
    assert stranger.get(f"/account/tokens/{token.pk}/revoke/").status_code == 404
    assert Client().get("/account/tokens/").status_code == 302  # to the login page


# ---------------------------------------------------------------- commands


def test_create_api_token_takes_scopes_a_team_and_an_expiry(member, admin, teams, capsys):
    call_command("create_api_token", "member", "--name", "ci", "--scope", "read", "--scope", "write",
                 "--team", "vision", "--expires-in-days", "7")
    plaintext = capsys.readouterr().out.strip()
    token = authenticate_token(plaintext)
    assert (token.name, token.scopes, token.team.name) == ("ci", ["read", "write"], "vision")
    assert timedelta(days=6) < token.expires_at - timezone.now() <= timedelta(days=7)
    call_command("create_api_token", "admin")
    default = authenticate_token(capsys.readouterr().out.strip())
    assert default.scopes == ["read", "write", "deploy", "admin"]
    assert timedelta(days=89, hours=23) < default.expires_at - timezone.now() <= timedelta(days=90)
    call_command("create_api_token", "admin", "--no-expiry")
    assert authenticate_token(capsys.readouterr().out.strip()).expires_at is None
    for args, message in [(["member", "--scope", "admin"], "only administrators"),
                          (["member", "--team", "nosuch"], "does not exist"),
                          (["member", "--team", "other"], "not a member"),
                          (["member", "--expires-in-days", "0"], "at least 1")]:
        with pytest.raises(CommandError, match=message):
            call_command("create_api_token", *args)


def test_bootstrap_local_keeps_a_working_token_file_and_replaces_a_lost_or_revoked_one(tmp_path):
    token_file, password_file = tmp_path / "admin.token", tmp_path / "login.txt"

    def bootstrap() -> str:
        call_command("bootstrap_local", "--password-file", str(password_file), "--token-file", str(token_file),
                     "--skip-bucket")
        assert token_file.stat().st_mode & 0o777 == 0o600
        return token_file.read_text().strip()

    first = bootstrap()
    assert bootstrap() == first and authenticate_token(first).allows("admin")
    assert ApiToken.objects.count() == 1
    ApiToken.objects.update(revoked_at=timezone.now())
    second = bootstrap()
    assert second != first and authenticate_token(second).user.username == "admin"
    token_file.unlink()
    third = bootstrap()
    assert third != second
    with pytest.raises(TokenRejected, match="revoked"):  # its file was lost, so was its secret
        authenticate_token(second)
    assert ApiToken.objects.usable().count() == 1


# ---------------------------------------------------------------- CLI


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_the_cli_with_a_revoked_token_exits_non_zero_with_the_servers_message(live_server, member):
    token, plaintext = issue_token(user=member, name="ci", scopes=["read"])
    cli = Path(sys.executable).parent / "modelyard"
    env = {**os.environ, "MODELYARD_URL": live_server.url, "MODELYARD_TOKEN": plaintext}

    def run() -> subprocess.CompletedProcess:
        return subprocess.run([str(cli), "alias", "get", "iris", "production"], env=env, capture_output=True,
                              text=True, timeout=60)

    assert "HTTP 404" in run().stderr  # the token works; the model does not exist
    token.revoked_at = timezone.now()
    token.save()
    result = run()
    assert result.returncode == 1
    assert "HTTP 401" in result.stderr and "was revoked at" in result.stderr and plaintext not in result.stderr


def test_a_token_made_through_the_api_without_an_expiry_expires_in_90_days_and_null_means_never(member):
    client = bearer(token_for(member))
    default = client.post(TOKENS, {"name": "ci", "scopes": ["read"]}, format="json")
    assert default.status_code == 201
    left = ApiToken.objects.get(pk=default.json()["id"]).expires_at - timezone.now()
    assert timedelta(days=89, hours=23) < left <= timedelta(days=90)
    forever = client.post(TOKENS, {"name": "forever", "scopes": ["read"], "expires_at": None}, format="json")
    assert forever.status_code == 201 and ApiToken.objects.get(pk=forever.json()["id"]).expires_at is None


def test_the_token_form_offers_90_days_and_the_token_list_is_paged(member):
    browser = Client()
    browser.force_login(member)
    assert 'name="expires_in_days" value="90"' in browser.get("/account/tokens/new/").content.decode()
    for i in range(30):
        issue_token(user=member, name=f"ci-{i:02d}", scopes=["read"])
    first = browser.get("/account/tokens/").content.decode()
    second = browser.get("/account/tokens/?page=2").content.decode()
    assert first.count("<tr><td>") == 25 and "ci-29" in first and "ci-04" not in first
    assert second.count("<tr><td>") == 5 and "ci-04" in second and "ci-05" not in second
    assert "page 1 of 2 · 30 tokens" in first and 'href="?page=2"' in first


def test_the_token_list_costs_the_same_queries_for_one_page_of_tokens_or_two(member):
    browser = Client()
    browser.force_login(member)
    issue_token(user=member, name="first", scopes=["read"])

    def count() -> int:
        with CaptureQueriesContext(connection) as queries:
            assert browser.get("/account/tokens/").status_code == 200
        return len(queries)

    few = count()
    for i in range(60):
        issue_token(user=member, name=f"ci-{i}", scopes=["read"], team=None)
    assert count() == few


def model_state(instance) -> dict:
    """Every concrete field of ``instance`` as loaded (attribute name -> value)."""
    return {field.attname: getattr(instance, field.attname) for field in type(instance)._meta.concrete_fields}


@pytest.mark.parametrize("with_team", [False, True])
def test_the_token_lookup_loads_what_the_orm_loads_in_one_query(with_team):
    user = get_user_model().objects.create_user(username="lookup", first_name="Ada", is_staff=False)
    team = Team.objects.create(name="lookup-team") if with_team else None
    if team:
        set_membership(team=team, user=user, role=Role.MAINTAINER, actor=None)
    token, plaintext = issue_token(user=user, name="ci", scopes=["read", "write"], team=team,
                                   expires_at=timezone.now() + timedelta(days=3))
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=timezone.now() - timedelta(hours=1))
    expected = ApiToken.objects.select_related("user", "team").get(pk=token.pk)

    with CaptureQueriesContext(connection) as queries:
        found = authenticate_token(plaintext)
        user_state, team = model_state(found.user), found.team  # loaded with it: no query
    assert len(queries) == 1, [q["sql"] for q in queries]
    assert model_state(found) == model_state(expected)
    assert found.scopes == ["read", "write"] and found.expires_at == expected.expires_at
    assert user_state == model_state(expected.user)
    assert (model_state(team) if team else None) == (model_state(expected.team) if with_team else None)
    assert found._state.db == expected._state.db and not found._state.adding
