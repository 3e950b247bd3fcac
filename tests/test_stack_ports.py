"""scripts/stack.sh: `make status` and `make stop` from another shell reach the stack `make run` started, with the
settings it was started with (var/stack.ports), its database included."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_status_from_another_shell_names_the_database_the_stack_was_started_with(tmp_path):
    # A copy of the script in an empty checkout: nothing of it runs, and its var/ is this test's own.
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts/stack.sh", tmp_path / "scripts/stack.sh")
    (tmp_path / "var").mkdir()
    env = {key: value for key, value in os.environ.items() if key != "DATABASE_URL"}
    # What `start` writes for a stack started with DATABASE_URL set (write_stack_env).
    script = (f"source <(sed -n '/^write_stack_env()/,/^}}/p' {tmp_path}/scripts/stack.sh); "
              "PORTS_FILE=var/stack.ports; VAR_DIR=var; WEB_PORT=1; S3_PORT=1; GATEWAY_PORT=1; GATEWAY_GRPC_PORT=1; "
              "TRITON_HTTP_PORT=1; TRITON_GRPC_PORT=1; TRITON_METRICS_PORT=1; PROMETHEUS_PORT=1; BENTO_PORT=1; "
              "CELERY_BROKER_URL=redis://127.0.0.1:1/0; STACK_ENV_FILE=var/stack.env; TOKEN_FILE=var/admin.token; "
              "MODELYARD_S3_ENDPOINT_URL=; MODELYARD_PROMETHEUS_URL=; write_stack_env")
    subprocess.run(["bash", "-c", script], cwd=tmp_path, check=True, timeout=60,
                   env={**env, "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/elsewhere?sslmode=disable"})
    assert "DATABASE_URL=postgres://postgres@127.0.0.1:5432/elsewhere?sslmode=disable" in (
        tmp_path / "var/stack.ports").read_text()
    status = subprocess.run(["bash", "scripts/stack.sh", "status"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=120, env=env)
    database = next(line for line in status.stdout.splitlines() if line.split()[:1] == ["database"])
    assert "DATABASE_URL" in database and "SQLite" not in database, status.stdout


def _copy_of_the_script(tmp_path: Path) -> Path:
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts/stack.sh", tmp_path / "scripts/stack.sh")
    (tmp_path / "var").mkdir()
    return tmp_path


def test_a_stack_started_with_replicas_is_stopped_and_reported_replica_by_replica_from_another_shell(tmp_path):
    checkout = _copy_of_the_script(tmp_path)
    (checkout / "var/stack.ports").write_text("MODELYARD_WEB_PORT=1\nMODELYARD_WEB_REPLICAS=3\nMODELYARD_WORKERS=2\n")
    env = {key: value for key, value in os.environ.items() if not key.startswith("MODELYARD_")}
    status = subprocess.run(["bash", "scripts/stack.sh", "status"], cwd=checkout, capture_output=True, text=True,
                            timeout=120, env=env)
    lines = {line.split()[0]: line for line in status.stdout.splitlines() if line.strip()}
    assert "http://127.0.0.1:2/" in lines["web-2"] and "http://127.0.0.1:3/" in lines["web-3"], status.stdout
    assert "orchestrator-2" in lines and "orchestrator-3" not in lines and "web-4" not in lines, status.stdout


@pytest.mark.parametrize(("settings", "message"), [
    ({"MODELYARD_WORKERS": "2"}, "need PostgreSQL"),
    ({"MODELYARD_WEB_REPLICAS": "2", "DATABASE_URL": "sqlite:///x.db"}, "need PostgreSQL"),
    ({"MODELYARD_WORKERS": "two"}, "MODELYARD_WORKERS must be a number from 1 to 8"),
    ({"MODELYARD_WEB_REPLICAS": "9"}, "MODELYARD_WEB_REPLICAS must be a number from 1 to 8"),
])
def test_replicas_on_sqlite_or_a_count_out_of_range_are_refused_before_anything_starts(tmp_path, settings, message):
    checkout = _copy_of_the_script(tmp_path)
    env = {key: value for key, value in os.environ.items()
           if key != "DATABASE_URL" and not key.startswith("MODELYARD_")}
    started = subprocess.run(["bash", "scripts/stack.sh", "start"], cwd=checkout, capture_output=True, text=True,
                             timeout=120, env={**env, **settings})
    assert started.returncode != 0 and message in started.stderr, started.stderr
    assert not (checkout / "var/run").exists() or not any((checkout / "var/run").glob("*.pid"))
