"""``modelyard replay start|show|list|cancel`` against a live server."""

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.utils import timezone

from deployments.choices import JobStatus
from deployments.models import Replay, ServingHost
from deployments.replays import record_replay_report
from modelyard_agent.contract import REPLAY_PROTOCOL
from registry.models import Alias, ModelVersion, RegisteredModel
from tests.factories import team_member, token_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
CLI = Path(sys.executable).parent / "modelyard"


def heartbeat(captured: int = 500) -> dict:
    return {"runtime_live": True, "agent": {"protocol": REPLAY_PROTOCOL},
            "models": [{"name": "thr", "version": 1, "state": "READY"}],
            "gateway": {"live": True, "routes": {}, "capture": {"thr": {"requests": captured, "bytes": 1000}}}}


SUMMARY = {"compared": 10, "agreed": 8, "skipped": 1, "agreement_rate": 0.8, "disagreed_outputs": {"label": 2},
           "differences": {"histogram": [{"upto": 1e-6, "count": 8}, {"upto": 1.0, "count": 2}, {"upto": None,
                                                                                               "count": 0}],
                           "nonfinite": 0, "p50": 0.0, "p90": 1.0, "p99": 1.0, "max": 1.0},
           "latency_ms": {"serving": {"count": 10, "p50": 2.0, "p95": 4.0, "mean": 2.5},
                          "candidate": {"count": 10, "p50": 2.5, "p95": 5.0, "mean": 3.0}},
           "worst": [{"id": "f" * 32, "agree": False, "max_abs_diff": 1.0, "max_rel_diff": 1.0, "output": "label",
                      "reason": "label differs", "serving": {"label": {"data": [1]}},
                      "candidate": {"label": {"data": [0]}}}]}


@pytest.fixture
def world(live_server, s3_endpoint):
    """thr v1 (@production) served with captured requests on host edge, v2 READY; ``run(*args, role=)`` runs
    the CLI with a token of an owner, a maintainer or a viewer of the model's team."""
    model = RegisteredModel.objects.create(name="thr")
    versions = [ModelVersion.objects.create(model=model, version=n, format="triton", artifact_key=f"k{n}",
                                            artifact_sha256="0" * 64, artifact_size=1,
                                            config_text='name: "thr"\nbackend: "python"\n') for n in (1, 2)]
    Alias.objects.create(model=model, name="production", version=versions[0])
    ServingHost.objects.create(name="edge", inference_url="http://edge:8080", last_heartbeat_at=timezone.now(),
                               heartbeat=heartbeat())
    tokens = {role: token_for(team_member(get_user_model().objects.create_user(username=role), role=role))
              for role in ("owner", "maintainer", "viewer")}

    def run(*args: str, role: str = "owner") -> subprocess.CompletedProcess:
        env = {**os.environ, "MODELYARD_URL": live_server.url, "MODELYARD_TOKEN": tokens[role]}
        return subprocess.run([str(CLI), "replay", *args], env=env, capture_output=True, text=True, timeout=120)

    return run


def test_a_replay_is_started_against_an_alias_with_tolerances_and_shown_with_its_findings(world):
    started = world("start", "thr", "2", "--against", "production", "--max-requests", "200", "--atol", "0.01",
                    "--argmax", "scores", "--argmax", "probabilities", "--pace", "50", role="maintainer")
    assert started.returncode == 0, started.stderr
    body = json.loads(started.stdout)
    assert body["status"] == "queued" and body["host"] == "edge" and body["against"] == 1
    replay = Replay.objects.get(pk=body["id"])
    assert replay.max_requests == 200 and replay.pace == 50.0
    assert replay.tolerances == {"atol": 0.01, "rtol": 0.001, "argmax_outputs": ["probabilities", "scores"]}

    assert record_replay_report(replay.pk, {"status": "running", "done": 10, "total": 10, "summary": SUMMARY})
    assert record_replay_report(replay.pk, {"status": "succeeded", "done": 10, "total": 10, "summary": SUMMARY})
    shown = world("show", str(replay.pk))
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    assert "status      succeeded" in text and "10/10 requests" in text
    assert "agreement   80.00 % of 10 compared (1 skipped)" in text and "label: 2" in text
    assert "p50 0.000000, p90 1.000000, p99 1.000000, max 1.000000" in text and "≤ 1: 2" in text
    assert "serving ms   p50 2.000, p95 4.000" in text and "candidate ms p50 2.500, p95 5.000" in text
    assert "regression  p95 +25.0 %" in text
    assert "f" * 32 in text and 'serving:   {"label":{"data":[1]}}' in text
    assert 'candidate: {"label":{"data":[0]}}' in text

    as_member = world("show", str(replay.pk), role="viewer")
    assert as_member.returncode == 0 and "80.00 %" in as_member.stdout
    assert "f" * 32 not in as_member.stdout and "owners of the model's team only" in as_member.stdout
    assert json.loads(world("show", str(replay.pk), "--json").stdout)["worst"][0]["id"] == "f" * 32


def test_replays_of_a_model_are_listed_newest_first_and_a_queued_one_is_cancelled(world):
    first = json.loads(world("start", "thr", "2", "--against", "1", role="maintainer").stdout)["id"]
    assert world("cancel", str(first), role="maintainer").returncode == 0
    second = json.loads(world("start", "thr", "2", "--against", "1", "--host", "edge").stdout)["id"]
    listed = world("list", "thr")
    assert listed.returncode == 0, listed.stderr
    rows = listed.stdout.splitlines()
    assert rows[0].split()[:3] == ["id", "version", "against"]
    assert [line.split()[0] for line in rows[1:]] == [str(second), str(first)]
    assert "cancelled" in rows[2] and "queued" in rows[1]
    cancelled = world("cancel", str(second))
    assert cancelled.returncode == 0 and json.loads(cancelled.stdout)["status"] == "cancelled"
    assert Replay.objects.get(pk=second).status == JobStatus.CANCELLED


def test_refusals_exit_one_with_the_servers_message_and_start_nothing(world):
    viewer = world("start", "thr", "2", "--against", "production", role="viewer")
    assert viewer.returncode == 1 and "HTTP 403" in viewer.stderr
    itself = world("start", "thr", "2", "--against", "2")
    assert itself.returncode == 1 and "HTTP 400" in itself.stderr and "itself" in itself.stderr
    bad = world("start", "thr", "2", "--against", "1", "--atol", "-1")
    assert bad.returncode == 1 and "HTTP 400" in bad.stderr and "atol" in bad.stderr
    ServingHost.objects.update(heartbeat=heartbeat(captured=0))
    nowhere = world("start", "thr", "2", "--against", "production")
    assert nowhere.returncode == 1 and "HTTP 409" in nowhere.stderr and "captured requests" in nowhere.stderr
    assert not Replay.objects.exists()
    assert world("show", "999999").returncode == 1
    missing = world("start", "thr", "2")
    assert missing.returncode == 1 and "--against" in missing.stderr
    assert world("show", "notanid").returncode == 1
    assert world("cancel", "999999").returncode == 1
    unknown = world("list", "nosuch")
    assert unknown.returncode == 1 and "HTTP 404" in unknown.stderr and "nosuch" in unknown.stderr
    assert world("list", "thr").returncode == 0  # a known model with no replays: an empty list


def test_wait_follows_the_replay_and_exits_one_when_it_failed(world):
    replay_id = {}

    def fail_it():
        try:
            report_failure()
        finally:
            connection.close()  # this thread's own connection, so the test database can be dropped

    def report_failure():
        import time

        for _ in range(200):  # bounded: the CLI's start lands within a few seconds
            row = Replay.objects.filter(status=JobStatus.QUEUED).first()
            if row is not None:
                replay_id["id"] = row.pk
                record_replay_report(row.pk, {"status": "running", "done": 0, "total": 10,
                                              "step": "loading the copy"})
                record_replay_report(row.pk, {"status": "failed", "done": 0, "total": 10,
                                              "message": "the copy did not load: out of memory"})
                return
            time.sleep(0.1)

    worker = threading.Thread(target=fail_it)
    worker.start()
    waited = world("start", "thr", "2", "--against", "production", "--wait", "--timeout", "60")
    worker.join(timeout=30)
    assert waited.returncode == 1, waited.stderr
    assert f"replay {replay_id['id']} queued on edge" in waited.stderr
    assert "status      failed — the copy did not load: out of memory" in waited.stdout
