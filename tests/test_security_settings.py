"""Production settings: Django's deployment checklist and the response headers."""

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_manage_py_check_deploy_is_clean_with_production_settings():
    env = {**os.environ, "MODELYARD_DEBUG": "false", "MODELYARD_SECRET_KEY": secrets.token_urlsafe(50),
           "MODELYARD_ALLOWED_HOSTS": "modelyard.example.com"}
    result = subprocess.run([sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_production_settings_refuse_to_start_without_a_secret_key():
    env = {**os.environ, "MODELYARD_DEBUG": "false", "MODELYARD_SECRET_KEY": ""}
    result = subprocess.run([sys.executable, "manage.py", "check"], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode != 0
    assert "MODELYARD_SECRET_KEY must be set" in result.stderr


def test_pages_carry_a_content_security_policy_without_inline_scripts(client, user):
    client.force_login(user)
    answer = client.get("/models/")
    policy = answer["Content-Security-Policy"]
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy
    assert "frame-ancestors 'none'" in policy
    assert answer["X-Content-Type-Options"] == "nosniff"
    assert "<script>" not in answer.content.decode()
    assert "wasm-unsafe-eval" not in policy


@pytest.mark.django_db
def test_only_the_upload_page_may_compile_webassembly_and_never_eval(client, user):
    from registry.models import RegisteredModel
    from tests.factories import team_member

    RegisteredModel.objects.create(name="iris")
    client.force_login(team_member(user, "maintainer"))
    policy = client.get("/models/iris/upload/")["Content-Security-Policy"]
    script_src = next(d for d in policy.split(";") if d.strip().startswith("script-src")).split()
    assert script_src == ["script-src", "'self'", "'wasm-unsafe-eval'"]
    assert "'unsafe-eval'" not in policy


@pytest.mark.django_db
@pytest.mark.parametrize("url", ["/models/", "/monitoring/", "/hosts/", "/audit/", "/api/v1/models/",
                                 "/api/v1/hosts/", "/api/v1/deployments/", "/api/v1/audit/",
                                 "/api/v1/prometheus/targets/"])
def test_every_page_and_endpoint_but_the_documented_ones_needs_a_login(client, url):
    answer = client.get(url)
    assert answer.status_code in (302, 401), url
    if answer.status_code == 302:
        assert "/login/" in answer["Location"]


@pytest.mark.django_db
@pytest.mark.parametrize("url", ["/healthz", "/login/", "/api/schema/", "/api/docs/", "/api/docs/?script="])
def test_the_documented_open_urls_answer_without_a_login(client, url):
    assert client.get(url).status_code == 200


def test_passwords_are_kept_with_the_shipped_hasher_and_a_user_logs_in_with_one(client, db, settings,
                                                                                 shipped_password_hashers):
    # The suite hashes with MD5 for speed (tests/conftest.py); this test puts back what the project ships.
    from django.contrib.auth import get_user_model

    settings.PASSWORD_HASHERS = shipped_password_hashers
    assert "MD5" not in shipped_password_hashers[0]
    user = get_user_model().objects.create_user(username="shipped", password="a-long-test-password")
    assert user.password.startswith("pbkdf2_sha256$"), user.password.split("$")[0]
    answer = client.post("/login/", {"username": "shipped", "password": "a-long-test-password"})
    assert answer.status_code == 302, answer.content[:300]
    assert client.get("/models/").status_code == 200
