"""What users install is what works: the agent's wheel on a serving host, and the web application
as its image installs it, each in a virtualenv of its own, importing nothing from the checkout."""

import json
import os
import subprocess

import pytest

from tests.fixtures.wheels import REPO

pytestmark = pytest.mark.integration

# Runs in the installed virtualenv, outside the checkout: every module of the agent that the wheel holds is
# imported with Django, boto3 and the database drivers blocked, and where each came from is printed.
_IMPORT_INSTALLED = """
import importlib, json, pkgutil, sys
for name in ("django", "rest_framework", "boto3", "botocore", "psycopg", "psycopg2"):
    sys.modules[name] = None
import modelyard_agent
names = sorted(m.name for m in pkgutil.walk_packages(modelyard_agent.__path__, "modelyard_agent."))
files = {name: importlib.import_module(name).__file__ for name in names}
print(json.dumps({"package": modelyard_agent.__file__, "modules": files}))
"""


def _source_modules() -> set[str]:
    """The agent's modules as the checkout holds them: every .py file under modelyard_agent/."""
    root = REPO / "modelyard_agent"
    names = set()
    for path in root.rglob("*.py"):
        parts = ("modelyard_agent", *path.relative_to(root).with_suffix("").parts)
        if "__pycache__" in parts:
            continue
        names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names - {"modelyard_agent"}


def test_the_agents_wheel_installs_and_imports_every_module_of_the_checkout(installed_agent, tmp_path):
    done = installed_agent.run("-c", _IMPORT_INSTALLED, cwd=tmp_path, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout)
    assert found["package"].startswith(str(installed_agent.root)), found["package"]
    assert set(found["modules"]) == _source_modules()
    assert "modelyard_agent.replay.compare" in found["modules"]
    assert all(path.startswith(str(installed_agent.root)) for path in found["modules"].values())
    runtimes = installed_agent.root.glob("lib/python*/site-packages/modelyard_agent/runtimes")
    lua = {path.name for path in next(runtimes).glob("*.lua")}
    assert lua == {path.name for path in (REPO / "modelyard_agent" / "runtimes").glob("*.lua")} and lua


def test_the_installed_agent_command_starts_and_checks_its_settings(installed_agent, tmp_path):
    agent = str(installed_agent.bin / "modelyard-agent")
    bad = installed_agent.run("-c", "import sys; from modelyard_agent.cli import main; sys.exit(main())",
                              cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "MODELYARD_AGENT_HOST": "GPU/0"})
    assert bad.returncode == 2 and "must be a registry name" in bad.stderr, bad.stderr
    shown = subprocess.run([agent, "--host", "gpu-0", "--print-config"], cwd=tmp_path, capture_output=True, text=True,
                           timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert shown.returncode == 0 and "MODELYARD_AGENT_HOST=gpu-0\n" in shown.stdout, shown.stderr


def test_the_web_application_as_its_image_installs_it_passes_the_system_checks(installed_web):
    venv, app = installed_web
    assert not (app / "modelyard_agent").exists()
    env = {"PATH": f"{venv.bin}:/usr/bin:/bin", "MODELYARD_SECRET_KEY": "install-check", "MODELYARD_DEBUG": "false",
           "MODELYARD_VAR_DIR": str(app / "var"), "HOME": str(app)}
    if "DATABASE_URL" in os.environ:
        env["DATABASE_URL"] = os.environ["DATABASE_URL"]
    check = venv.run("manage.py", "check", "--deploy", "--fail-level", "ERROR", cwd=app, env=env)
    assert check.returncode == 0, check.stdout[-2000:] + check.stderr[-3000:]
    where = venv.run("-c", "import modelyard_agent.replay.compare as m, modelyard_cli; print(m.__file__);"
                     "print(modelyard_cli.__file__)", cwd=app, env=env)
    assert where.returncode == 0, where.stderr
    assert all(line.startswith(str(venv.root)) for line in where.stdout.split()), where.stdout
    static = venv.run("manage.py", "collectstatic", "--noinput", "-v", "0", cwd=app, env=env)
    assert static.returncode == 0, static.stderr[-3000:]
