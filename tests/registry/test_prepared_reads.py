"""Server-side prepared statements (``MODELYARD_DB_PREPARE_THRESHOLD``): PostgreSQL parses and plans a read the
web process repeats once per connection, the answers stay what they were, and the setting turns them off."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

from registry.models import RegisteredModel
from tests.factories import team_member

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.django_db


def prepared_statements() -> list[str]:
    """The text of every statement prepared on this test's database connection."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall()]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="prepared statements are PostgreSQL's")
def test_a_page_of_models_asked_for_again_and_again_is_answered_from_a_prepared_statement(api_client, user):
    team_member(user, "viewer")
    RegisteredModel.objects.bulk_create(RegisteredModel(name=f"m{n:02d}") for n in range(3))  # the default team
    first = api_client.get("/api/v1/models/")
    assert first.status_code == 200, first.content
    for _ in range(6):  # past the threshold (5 runs on one connection)
        again = api_client.get("/api/v1/models/")
        assert again.content == first.content
    pages = [text for text in prepared_statements() if "json_build_object" in text and "registry_registeredmodel"
             in text]
    assert pages, prepared_statements()
    assert [row["name"] for row in first.json()["results"]] == ["m00", "m01", "m02"]


def database_options(threshold: str) -> subprocess.CompletedProcess:
    code = ("import django; django.setup(); from django.conf import settings; "
            "print(settings.DATABASES['default'].get('OPTIONS', {}))")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "modelyard.settings", "MODELYARD_DB_PREPARE_THRESHOLD": threshold,
           "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/unused"}
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=60)


def test_the_threshold_defaults_to_five_runs_and_zero_turns_prepared_statements_off():
    default = database_options("")
    assert default.returncode == 0, default.stderr
    assert "'server_side_binding': True" in default.stdout and "'prepare_threshold': 5" in default.stdout
    off = database_options("0")
    assert off.returncode == 0, off.stderr
    assert "server_side_binding" not in off.stdout and "prepare_threshold" not in off.stdout


def test_a_negative_threshold_is_refused_with_the_settings_name():
    refused = database_options("-1")
    assert refused.returncode != 0
    assert "MODELYARD_DB_PREPARE_THRESHOLD must be 0 (off) or a positive number of runs" in refused.stderr


@pytest.mark.skipif(connection.vendor != "postgresql", reason="prepared statements are PostgreSQL's")
@pytest.mark.django_db(transaction=True)
def test_a_prepared_read_outlives_a_column_type_change_made_by_another_process(api_client, user):
    import psycopg

    team_member(user, "viewer")
    RegisteredModel.objects.create(name="iris")
    for _ in range(7):  # prepared by now, the model's lookup with the caller's role among them
        assert api_client.get("/api/v1/models/iris/").status_code == 200
    settings = connection.settings_dict
    column = RegisteredModel._meta.get_field("description")
    table = RegisteredModel._meta.db_table
    other = psycopg.connect(dbname=settings["NAME"], user=settings["USER"], host=settings["HOST"],
                            port=settings["PORT"] or 5432, autocommit=True)  # a migration, as another process runs it
    try:
        other.execute(f'ALTER TABLE "{table}" ALTER COLUMN "{column.column}" TYPE varchar(4000)')
        answers = [api_client.get("/api/v1/models/iris/") for _ in range(3)]
        assert [a.status_code for a in answers] == [200, 200, 200], answers[0].content[:500]
        assert answers[0].json()["name"] == "iris"
    finally:
        other.execute(f'ALTER TABLE "{table}" ALTER COLUMN "{column.column}" TYPE text')
        other.close()
