"""The ``modelyard`` console script against a live server, as a CI job runs it."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from demo.iris import build_iris_model_dir
from deployments.choices import TargetState
from deployments.models import Deployment, DeploymentTarget, ServingHost
from registry.models import ModelVersion, RegisteredModel
from tests.factories import team_member, token_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
CLI = Path(sys.executable).parent / "modelyard"


@pytest.fixture
def cli(live_server, s3_endpoint):
    user = team_member(get_user_model().objects.create_user(username="ci"))
    env = {**os.environ, "MODELYARD_URL": live_server.url, "MODELYARD_TOKEN": token_for(user)}

    def run(*args: str, token: str | None = None) -> subprocess.CompletedProcess:
        run_env = dict(env) if token is None else {**env, "MODELYARD_TOKEN": token}
        return subprocess.run([str(CLI), *args], env=run_env, capture_output=True, text=True, timeout=120)

    return run


def test_it_registers_a_model_directory_with_a_progress_bar_and_sets_an_alias(cli, tmp_path):
    RegisteredModel.objects.create(name="iris")
    model_dir = build_iris_model_dir(tmp_path, name="iris")
    result = cli("register", "iris", str(model_dir), "--metadata", '{"commit": "abc123"}')
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["version"] == 1
    assert "uploading: 100%" in result.stderr
    assert ModelVersion.objects.get(model__name="iris", version=1).metadata == {"commit": "abc123"}
    alias = cli("alias", "set", "iris", "production", "1")
    assert alias.returncode == 0 and json.loads(alias.stdout)["version"] == 1
    assert json.loads(cli("alias", "get", "iris", "production").stdout)["version"] == 1


def test_it_exits_non_zero_with_the_servers_message(cli, tmp_path):
    RegisteredModel.objects.create(name="iris")
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not an archive")
    result = cli("register", "iris", str(junk), "--quiet")
    assert result.returncode == 1
    assert "HTTP 400" in result.stderr and "archive" in result.stderr
    unknown = cli("deploy", "iris", "1", "--host", "nowhere")
    assert unknown.returncode == 1 and "HTTP 404" in unknown.stderr
    assert cli("alias", "get", "iris", "production", token="wrong").returncode == 1
    assert cli("register", "iris", str(tmp_path / "missing")).returncode == 1


def _deployment(state: str) -> int:
    model = RegisteredModel.objects.get_or_create(name="iris")[0]
    version = ModelVersion.objects.create(model=model, version=model.versions.count() + 1, format="triton",
                                          artifact_key="k", artifact_sha256="0" * 64, artifact_size=1)
    host = ServingHost.objects.get_or_create(name="gpu-0", inference_url="http://gpu-0:8000")[0]
    status = {TargetState.READY: "succeeded", TargetState.FAILED: "failed"}.get(state, "running")
    deployment = Deployment.objects.create(model=model, version=version, status=status)
    DeploymentTarget.objects.create(deployment=deployment, host=host, state=state, error="Triton said no")
    return deployment.pk


def test_wait_exits_zero_when_the_rollout_succeeded_and_one_when_it_failed(cli):
    ready = cli("wait", str(_deployment(TargetState.READY)))
    assert ready.returncode == 0 and json.loads(ready.stdout)["status"] == "succeeded"
    failed = cli("wait", str(_deployment(TargetState.FAILED)))
    assert failed.returncode == 1 and "Triton said no" in failed.stderr
    stuck = cli("wait", str(_deployment(TargetState.PENDING)), "--timeout", "1")
    assert stuck.returncode == 1 and "still running" in stuck.stderr


def test_it_needs_a_token(cli):
    result = cli("alias", "get", "iris", "production", token="")
    assert result.returncode == 1 and "MODELYARD_TOKEN is not set" in result.stderr


def test_it_registers_single_model_files_with_a_signature_and_batch_size(cli, tmp_path):
    from tests.registry.format_builders import SIGNATURE, write_onnx, write_torchscript

    RegisteredModel.objects.create(name="double")
    onnx_run = cli("register", "double", str(write_onnx(tmp_path / "double.onnx")), "--max-batch-size", "8", "--quiet")
    assert onnx_run.returncode == 0, onnx_run.stderr
    assert ModelVersion.objects.get(model__name="double", version=1).signature["max_batch_size"] == 8

    torchscript = str(write_torchscript(tmp_path / "double.pt"))
    refused = cli("register", "double", torchscript, "--quiet")
    assert refused.returncode == 1 and "HTTP 400" in refused.stderr and "signature" in refused.stderr
    signature_file = tmp_path / "signature.json"
    signature_file.write_text(json.dumps(SIGNATURE))
    from_file = cli("register", "double", torchscript, "--signature", str(signature_file), "--quiet")
    assert from_file.returncode == 0, from_file.stderr
    inline = cli("register", "double", torchscript, "--signature", json.dumps(SIGNATURE), "--quiet")
    assert inline.returncode == 0, inline.stderr
    formats = ModelVersion.objects.filter(model__name="double").order_by("version").values_list("format", flat=True)
    assert list(formats) == ["onnx", "torchscript", "torchscript"]


def test_a_ci_maintainer_creates_a_model_in_its_team_but_may_not_move_production(cli):
    from accounts.models import Team

    vision = Team.objects.create(name="vision")
    maintainer = team_member(get_user_model().objects.create_user(username="ci-vision"), "maintainer", vision)
    token = token_for(maintainer, ["read", "write"], team=vision)

    created = cli("model", "create", "resnet", token=token)
    assert created.returncode == 0, created.stderr
    assert json.loads(created.stdout) == {"name": "resnet", "team": "vision"}
    model = RegisteredModel.objects.get(name="resnet")
    ModelVersion.objects.create(model=model, version=1, format="triton", artifact_key="sha256/x",
                                artifact_sha256="0" * 64, artifact_size=1)
    assert cli("alias", "set", "resnet", "staging", "1", token=token).returncode == 0
    refused = cli("alias", "set", "resnet", "production", "1", token=token)
    assert refused.returncode == 1
    assert "HTTP 403" in refused.stderr and "needs the owner role in team 'vision'" in refused.stderr
    assert not model.aliases.filter(name="production").exists()
    elsewhere = cli("model", "create", "bert", "--team", "default", token=token)
    assert elsewhere.returncode == 1 and not RegisteredModel.objects.filter(name="bert").exists()


def test_an_owner_locks_an_alias_and_then_sets_it_only_with_a_reason(cli):
    from audit.models import AuditEvent

    model = RegisteredModel.objects.create(name="iris")
    for number in (1, 2):
        ModelVersion.objects.create(model=model, version=number, format="triton", artifact_key=f"sha256/{number}",
                                    artifact_sha256=f"{number:064d}", artifact_size=1)
    assert cli("alias", "set", "iris", "production", "1").returncode == 0
    locked = cli("alias", "lock", "iris", "production", "--reason", "release freeze")
    assert locked.returncode == 0 and json.loads(locked.stdout)["protected"] is True
    refused = cli("alias", "set", "iris", "production", "2")
    assert refused.returncode == 1 and "@production is protected: moving it needs a reason" in refused.stderr
    moved = cli("alias", "set", "iris", "production", "2", "--reason", "v2 passed the canary")
    assert moved.returncode == 0 and json.loads(moved.stdout)["version"] == 2
    assert AuditEvent.objects.filter(action="alias.set", data__reason="v2 passed the canary", data__owner="ci").exists()


def test_a_canary_is_started_changed_and_promoted_from_the_cli(cli):
    from django.utils import timezone

    first = _deployment(TargetState.READY)
    ServingHost.objects.filter(name="gpu-0").update(
        heartbeat={"agent": {"protocol": 4}, "gateway": {"live": True, "routes": {}}}, last_heartbeat_at=timezone.now())
    ModelVersion.objects.create(model=RegisteredModel.objects.get(name="iris"), version=2, format="triton",
                                artifact_key="k2", artifact_sha256="2" * 64, artifact_size=1)
    started = cli("deploy", "iris", "2", "--host", "gpu-0", "--canary", "10")
    assert started.returncode == 0, started.stderr
    canary = json.loads(started.stdout)["id"]
    DeploymentTarget.objects.filter(deployment_id=canary).update(
        state=TargetState.READY, previous_version=Deployment.objects.get(pk=first).version)

    changed = cli("canary", "set", str(canary), "30")
    assert changed.returncode == 0, changed.stderr
    assert json.loads(changed.stdout)["canary"]["hosts"] == [
        {"host": "gpu-0", "state": "ready", "stable": 1, "applied_percent": None, "applied_shadow_percent": None}]
    missing = cli("canary", "set", str(canary))
    assert missing.returncode == 1 and "needs the new percent" in missing.stderr
    refused = cli("canary", "set", str(first), "5")
    assert refused.returncode == 1 and "has no active canary" in refused.stderr

    promoted = cli("canary", "promote", str(canary))
    assert promoted.returncode == 0, promoted.stderr
    [promotion] = json.loads(promoted.stdout)
    assert promotion["version"] == 2 and Deployment.objects.get(pk=canary).canary_state == "promoted"


def test_capture_is_set_shown_and_turned_off_from_the_cli(cli):
    RegisteredModel.objects.create(name="iris")
    done = cli("capture", "set", "iris", "--fraction", "0.05", "--max-bytes", "256MiB", "--retention", "7d")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["max_bytes"] == 256 * 1024**2
    model = RegisteredModel.objects.get(name="iris")
    assert (model.capture_fraction, model.capture_max_bytes, model.capture_retention_seconds) == (
        0.05, 256 * 1024**2, 7 * 86400)
    shown = json.loads(cli("capture", "show", "iris").stdout)
    assert (shown["fraction"], shown["hosts"]) == (0.05, [])
    assert cli("capture", "off", "iris").returncode == 0
    assert RegisteredModel.objects.get(name="iris").capture_fraction == 0
    bad = cli("capture", "set", "iris", "--fraction", "1.5")
    assert bad.returncode == 1 and "less than or equal to 1" in bad.stderr
    unit = cli("capture", "set", "iris", "--max-bytes", "12parsecs")
    assert unit.returncode == 1
    assert "--max-bytes '12parsecs': unknown unit 'parsecs'; the units are b, kib" in unit.stderr
    nonsense = cli("capture", "set", "iris", "--retention", "soon")
    assert nonsense.returncode == 1
    assert "--retention 'soon' must be a number with one of the units s, m" in nonsense.stderr
    ignored = cli("capture", "off", "iris", "--fraction", "0.5")
    assert ignored.returncode == 1 and "capture off takes no --fraction" in ignored.stderr
    assert RegisteredModel.objects.get(name="iris").capture_fraction == 0


def test_a_model_is_deployed_on_demand_from_the_cli(cli):
    _deployment(TargetState.READY)
    started = cli("deploy", "iris", "1", "--host", "gpu-0", "--on-demand", "--pinned", "--cold-start-timeout", "20")
    assert started.returncode == 0, started.stderr
    deployment = Deployment.objects.get(pk=json.loads(started.stdout)["id"])
    assert deployment.residency_settings() == {"residency": "on_demand", "pinned": True, "cold_start_timeout": 20.0}
    refused = cli("deploy", "iris", "1", "--host", "gpu-0", "--pinned")
    assert refused.returncode != 0 and "--pinned and --cold-start-timeout go with --on-demand" in refused.stderr
