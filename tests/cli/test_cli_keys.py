"""``modelyard key create|list|revoke`` against a live server."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from audit.models import AuditEvent
from registry.models import InferenceKey, RegisteredModel
from tests.factories import team_member, token_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
CLI = Path(sys.executable).parent / "modelyard"


@pytest.fixture
def cli(live_server):
    user = team_member(get_user_model().objects.create_user(username="ci"))
    env = {**os.environ, "MODELYARD_URL": live_server.url, "MODELYARD_TOKEN": token_for(user)}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(CLI), *args], env=env, capture_output=True, text=True, timeout=120)

    return run


def test_a_key_is_made_listed_and_revoked_from_the_cli_and_its_secret_is_printed_once(cli):
    RegisteredModel.objects.create(name="iris")
    RegisteredModel.objects.create(name="wine")
    made = cli("key", "create", "shop", "--model", "iris", "--model", "wine", "--expires-in", "30d")
    assert made.returncode == 0, made.stderr
    body = json.loads(made.stdout)
    assert body["key"].startswith("myk_") and body["models"] == ["iris", "wine"] and body["expires_at"]
    assert "shown only this once" in made.stderr
    key = InferenceKey.objects.get()
    assert key.expires_at is not None
    cli("key", "create", "other", "--model", "wine")
    listed = cli("key", "list", "--model", "iris")
    assert listed.returncode == 0, listed.stderr
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    assert [row["name"] for row in rows] == ["shop"] and "key" not in rows[0]
    assert body["key"] not in listed.stdout
    assert len(cli("key", "list").stdout.splitlines()) == 2
    revoked = cli("key", "revoke", str(key.pk))
    assert revoked.returncode == 0 and json.loads(revoked.stdout)["state"] == "revoked"
    assert AuditEvent.objects.filter(action="inference_key.revoked").count() == 1


def test_the_cli_says_the_servers_refusal_and_its_own_usage_errors(cli):
    refused = cli("key", "create", "shop", "--model", "nope")
    assert refused.returncode == 1 and "HTTP 404" in refused.stderr and "no model named 'nope'" in refused.stderr
    assert cli("key", "create", "shop").returncode == 1
    assert "needs the key's id" in cli("key", "revoke", "shop").stderr
    assert not InferenceKey.objects.exists()
