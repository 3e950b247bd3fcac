"""Project wiring: the OpenAPI schema, the health probe, the token command."""

import hashlib

import pytest
from django.core.management import call_command

from accounts.models import ApiToken

pytestmark = pytest.mark.django_db

CONTRACT_PATHS = [
    "/api/v1/models/",
    "/api/v1/models/{name}/",
    "/api/v1/models/{model_name}/versions/",
    "/api/v1/models/{model_name}/versions/{version}/",
    "/api/v1/models/{model_name}/metrics/",
    "/api/v1/hosts/",
    "/api/v1/deployments/",
    "/api/v1/deployments/{id}/",
]


def test_the_openapi_schema_lists_every_contract_path(api_client):
    answer = api_client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert answer.status_code == 200
    paths = answer.json()["paths"]
    for path in CONTRACT_PATHS:
        assert path in paths, path
    assert "multipart/form-data" in paths["/api/v1/models/{model_name}/versions/"]["post"]["requestBody"]["content"]


def test_the_health_probe_answers_without_login(client):
    answer = client.get("/healthz")
    assert answer.status_code == 200 and answer.content == b"ok"


def test_create_api_token_prints_a_working_token_and_stores_only_its_digest(user, client, capsys):
    call_command("create_api_token", user.username)
    key = capsys.readouterr().out.strip()
    token = ApiToken.objects.get(user=user)
    assert token.digest == hashlib.sha256(key.encode()).hexdigest() and key.startswith(f"my_{token.prefix}_")
    assert token.scopes == ["read", "write", "deploy"] and token.expires_at is not None and token.team is None
    for scheme in ("Bearer", "Token"):
        answer = client.get("/api/v1/models/", HTTP_AUTHORIZATION=f"{scheme} {key}")
        assert answer.status_code == 200


def test_create_api_token_fails_clearly_for_an_unknown_user():
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="no user named"):
        call_command("create_api_token", "nobody")


def test_an_api_path_that_names_no_endpoint_is_a_json_404(api_client):
    for path in ("/api/v1/nonexistent/", "/api/v1/teams/default/members/", "/api/v1/models/iris/nothing/"):
        answer = api_client.get(path)
        assert answer.status_code == 404 and answer["Content-Type"] == "application/json", path
        assert answer.json()["detail"].startswith("no API endpoint at /api/v1/")
    assert api_client.post("/api/v1/deployments/x5/pause/").status_code == 404
