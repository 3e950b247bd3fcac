"""scripts/stack.sh: `make status` and `make stop` from another shell reach the stack `make run` started, with the
settings it was started with (var/stack.ports), its database included."""

import os
import shutil
import subprocess
from pathlib import Path

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
