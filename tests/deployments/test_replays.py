"""Replays in the orchestrator: starting one (and the refusals), the agent's reports, who sees what."""

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from accounts.services import create_team
from deployments.choices import JobStatus
from deployments.models import Replay, ServingHost
from deployments.replays import build_replay_payload, fail_stalled_replays, record_replay_report
from modelyard_agent.contract import REPLAY_PROTOCOL
from registry.models import Alias, ModelVersion, RegisteredModel
from tests.factories import api_client_for, team_member

CONFIG = 'name: "thr"\nbackend: "python"\nmax_batch_size: 8\n'
URL = "/api/v1/models/thr/versions/2/replays/"


def heartbeat(*, protocol=REPLAY_PROTOCOL, serves=1, captured=500, live=True) -> dict:
    return {"runtime_live": True, "agent": {"protocol": protocol},
            "models": [{"name": "thr", "version": serves, "state": "READY"}],
            "gateway": {"live": live, "routes": {}, "capture": {"thr": {"requests": captured, "bytes": 1000}}}}


@pytest.fixture
def world(db):
    """thr v1 (@production) and v2 (READY) in the default team; a host serving v1 through a gateway that
    captured requests; API clients of an owner, a maintainer, a viewer and an outsider."""
    model = RegisteredModel.objects.create(name="thr")
    versions = [ModelVersion.objects.create(model=model, version=n, format="triton", artifact_key=f"k{n}",
                                            artifact_sha256="0" * 64, artifact_size=1, config_text=CONFIG)
                for n in (1, 2)]
    Alias.objects.create(model=model, name="production", version=versions[0])
    host = ServingHost.objects.create(name="edge", inference_url="http://edge:8080",
                                      last_heartbeat_at=timezone.now(), heartbeat=heartbeat())
    users = {}
    for role in ("owner", "maintainer", "viewer"):
        users[role] = api_client_for(team_member(get_user_model().objects.create_user(username=role), role=role))
    outsider = team_member(get_user_model().objects.create_user(username="outsider"), team=create_team(name="other"))
    users["outsider"] = api_client_for(outsider)
    return users, versions, host


def finished_summary() -> dict:
    return {"compared": 10, "agreed": 8, "skipped": 0, "agreement_rate": 0.8, "disagreed_outputs": {"label": 2},
            "differences": {"histogram": [], "nonfinite": 0, "p50": 0.0, "p90": 1.0, "p99": 1.0, "max": 1.0},
            "latency_ms": {"serving": {"count": 10, "p50": 2.0, "p95": 4.0, "mean": 2.5},
                           "candidate": {"count": 10, "p50": 2.5, "p95": 5.0, "mean": 3.0}},
            "worst": [{"id": "a" * 32, "agree": False, "max_abs_diff": 1.0, "max_rel_diff": 1.0, "output": "label",
                       "reason": "differs", "serving": {"label": {"data": [1]}},
                       "candidate": {"label": {"data": [0]}}}]}


def test_a_replay_against_an_alias_is_queued_on_the_host_that_captured_and_audited(
        world, django_capture_on_commit_callbacks):
    users, versions, host = world
    with django_capture_on_commit_callbacks() as sent:
        answer = users["maintainer"].post(URL, {"against": "production", "max_requests": 200,
                                                "tolerances": {"atol": 0.001, "argmax_outputs": ["scores"]}},
                                          format="json")
    assert answer.status_code == 202, answer.content
    body = answer.json()
    assert body["status"] == "queued" and body["against"] == 1 and body["host"] == "edge"
    assert body["tolerances"] == {"atol": 0.001, "rtol": 0.001, "argmax_outputs": ["scores"]}
    assert body["progress"] == {"done": 0, "total": 0, "step": ""} and body["agreement_rate"] is None
    assert len(sent) == 1
    from audit.models import AuditEvent

    assert AuditEvent.objects.get(action="replay.started").data["against"] == 1
    replay = Replay.objects.get()
    payload = build_replay_payload(replay, download_url="http://s3/x")
    assert payload["serving"] == 1 and payload["version"] == 2 and payload["model"] == "thr"
    assert payload["pace"] == 20.0 and payload["max_requests"] == 200 and payload["time_budget_s"] > 20
    assert users["maintainer"].get(URL).json()["results"][0]["id"] == body["id"]


@pytest.mark.parametrize(("change", "message"), [
    ({"heartbeat": heartbeat(protocol=4)}, "speaks protocol 4; replays need 5"),
    ({"heartbeat": heartbeat(captured=0)}, "holds no captured requests of thr"),
    ({"heartbeat": heartbeat(live=False)}, "holds no captured requests of thr"),
    ({"heartbeat": heartbeat(serves=3)}, "does not serve thr v1"),
    ({"runtime": "bentoml"}, "replays run on Triton hosts"),
])
def test_a_named_host_that_cannot_replay_is_a_409_naming_why(world, change, message):
    users, _, host = world
    ServingHost.objects.filter(pk=host.pk).update(**change)
    answer = users["maintainer"].post(URL, {"against": "1", "host": "edge"}, format="json")
    assert answer.status_code == 409 and message in answer.json()["detail"], answer.content
    assert not Replay.objects.exists()


def test_without_a_host_that_captured_the_served_version_the_replay_is_a_409(world):
    users, _, host = world
    ServingHost.objects.filter(pk=host.pk).update(heartbeat=heartbeat(captured=0))
    answer = users["maintainer"].post(URL, {"against": "production"}, format="json")
    assert answer.status_code == 409
    assert "edge serves it but holds no captured requests of thr" in answer.json()["detail"]
    ServingHost.objects.filter(pk=host.pk).update(heartbeat=heartbeat(serves=2))
    unserved = users["maintainer"].post(URL, {"against": "1"}, format="json")
    assert unserved.status_code == 409 and "no Triton host serves it now" in unserved.json()["detail"]


def test_argmax_outputs_the_candidate_does_not_have_are_a_400(world):
    users, versions, _ = world
    ModelVersion.objects.filter(pk=versions[1].pk).update(config_text=(
        'name: "thr"\nbackend: "python"\nmax_batch_size: 8\n'
        'input [{ name: "x" data_type: TYPE_FP32 dims: [4] }]\n'
        'output [{ name: "label" data_type: TYPE_INT64 dims: [1] }, '
        '{ name: "scores" data_type: TYPE_FP32 dims: [3] }]\n'))
    typo = users["maintainer"].post(URL, {"against": "production", "tolerances": {"argmax_outputs": ["score"]}},
                                    format="json")
    assert typo.status_code == 400, typo.content
    assert "output(s) score that" in typo.json()["detail"] and "its outputs: label, scores" in typo.json()["detail"]
    assert not Replay.objects.exists()
    fine = users["maintainer"].post(URL, {"against": "production", "tolerances": {"argmax_outputs": ["scores"]}},
                                    format="json")
    assert fine.status_code == 202, fine.content


def test_bad_input_is_a_4xx_that_writes_nothing(world):
    users, _, _ = world
    client = users["maintainer"]
    assert client.post(URL, {"against": "2"}, format="json").status_code == 400  # itself
    assert client.post(URL, {"against": "1", "max_requests": 0}, format="json").status_code == 400
    assert client.post(URL, {"against": "1", "tolerances": {"atol": -1}}, format="json").status_code == 400
    assert client.post(URL, {"against": "1", "tolerances": {"btol": 1}}, format="json").status_code == 400
    assert client.post(URL, {"against": "1", "warmup": 1}, format="json").status_code == 400
    assert client.post(URL, {"against": "nowhere"}, format="json").status_code == 404
    assert client.post(URL, {"against": "1", "host": "nowhere"}, format="json").status_code == 404
    assert client.post("/api/v1/models/thr/versions/9/replays/", {"against": "1"}, format="json").status_code == 404
    assert not Replay.objects.exists()


def test_with_the_task_queue_down_a_replay_is_a_503_that_writes_nothing(world, queue_down):
    from audit.models import AuditEvent

    users, _, _ = world
    answer = users["maintainer"].post(URL, {"against": "production"}, format="json")
    assert answer.status_code == 503 and "the replay was not started" in answer.json()["detail"]
    assert not Replay.objects.exists() and not AuditEvent.objects.filter(action="replay.started").exists()


def test_one_replay_at_a_time_runs_on_a_host(world):
    users, _, _ = world
    first = users["maintainer"].post(URL, {"against": "1"}, format="json")
    second = users["maintainer"].post(URL, {"against": "1"}, format="json")
    assert first.status_code == 202 and second.status_code == 409
    assert f"replay {first.json()['id']}" in second.json()["detail"]


def test_only_owners_see_the_worst_disagreements_members_the_aggregate_and_outsiders_nothing(world):
    users, versions, host = world
    replay = Replay.objects.create(version=versions[1], against=versions[0], host=host, tolerances={},
                                   max_requests=10, pace=20, time_budget_s=600)
    assert record_replay_report(replay.pk, {"status": "succeeded", "done": 10, "total": 10,
                                            "summary": finished_summary(), "details": {"seconds": 3}})
    owner = users["owner"].get(f"/api/v1/replays/{replay.pk}/").json()
    assert owner["worst"][0]["serving"] == {"label": {"data": [1]}} and owner["agreement_rate"] == 0.8
    assert owner["latency_regression"] == pytest.approx(0.25) and owner["latency_ms"]["candidate"]["p50"] == 2.5
    for role in ("maintainer", "viewer"):
        seen = users[role].get(f"/api/v1/replays/{replay.pk}/").json()
        assert seen["worst"] is None and seen["agreement_rate"] == 0.8 and seen["disagreed_outputs"] == {"label": 2}
        assert users[role].get(URL).json()["results"][0]["worst"] is None
    assert users["owner"].get(URL).json()["results"][0]["worst"]
    assert users["outsider"].get(f"/api/v1/replays/{replay.pk}/").status_code == 404
    assert users["outsider"].get("/api/v1/replays/").json()["results"] == []
    assert users["outsider"].get(URL).status_code == 404
    assert users["viewer"].post(URL, {"against": "1"}, format="json").status_code == 403


def test_a_queued_replay_is_cancelled_at_once_and_a_late_report_does_not_revive_it(world):
    users, _, _ = world
    replay_id = users["maintainer"].post(URL, {"against": "1"}, format="json").json()["id"]
    cancelled = users["maintainer"].post(f"/api/v1/replays/{replay_id}/cancel/")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert not record_replay_report(replay_id, {"status": "running", "done": 1, "total": 9, "summary": {}})
    assert Replay.objects.get(pk=replay_id).status == JobStatus.CANCELLED
    assert users["maintainer"].post(f"/api/v1/replays/{replay_id}/cancel/").status_code == 409


def test_reports_fill_progress_and_a_replay_whose_agent_went_silent_is_failed_after_its_budget(world):
    users, versions, host = world
    replay = Replay.objects.create(version=versions[1], against=versions[0], host=host, tolerances={},
                                   max_requests=10, pace=20, time_budget_s=60)
    assert record_replay_report(replay.pk, {"status": "running", "done": 3, "total": 10, "summary": {},
                                            "step": "request 3 of 10"})
    body = users["viewer"].get(f"/api/v1/replays/{replay.pk}/").json()
    assert body["status"] == "running" and body["progress"] == {"done": 3, "total": 10, "step": "request 3 of 10"}
    assert not record_replay_report(replay.pk, {"status": "queued"})
    assert fail_stalled_replays() == []
    assert fail_stalled_replays(now=timezone.now() + timedelta(hours=2)) == [replay.pk]
    replay.refresh_from_db()
    assert replay.status == JobStatus.FAILED and "sent no report" in replay.message


def test_no_model_may_take_the_name_a_replay_copy_is_loaded_under(world):
    answer = world[0]["owner"].post("/api/v1/models/", {"name": "thr--replay-3"}, format="json")
    assert answer.status_code == 400 and "--replay-" in str(answer.json())
