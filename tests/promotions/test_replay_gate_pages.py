"""The replay gate on the policy page, a failed replay's message in the next evaluation, and the policy's pace."""

import html

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from accounts.services import create_team
from deployments.choices import JobStatus
from deployments.models import Replay, ServingHost
from deployments.replays import record_replay_report
from modelyard.errors import InvalidInput
from promotions import evaluations, policies
from promotions.choices import Decision
from promotions.models import PromotionEvaluation
from registry.models import Alias, ModelVersion, RegisteredModel
from tests.deployments.test_replays import finished_summary, heartbeat
from tests.factories import team_member

pytestmark = pytest.mark.django_db
WORST_ID = "a" * 32


@pytest.fixture
def policy(db):
    """thr v1 @production served on edge with captured requests, v2 @staging, and a policy gating on a replay
    at 50 requests per second."""
    model = RegisteredModel.objects.create(name="thr", next_version=3)
    for number, alias in ((1, "production"), (2, "staging")):
        version = ModelVersion.objects.create(model=model, version=number, format="triton", artifact_key=f"k{number}",
                                              artifact_sha256="0" * 64, artifact_size=1)
        Alias.objects.create(model=model, name=alias, version=version)
    ServingHost.objects.create(name="edge", inference_url="http://edge:8080", last_heartbeat_at=timezone.now(),
                               heartbeat=heartbeat())
    return policies.create_policy(model_name="thr", candidate_alias="staging", target_alias="production",
                                  min_requests=None, min_agreement=0.95, max_latency_regression=1.0,
                                  replay_pace=50)


def evaluate(policy, prometheus) -> PromotionEvaluation:
    evaluation = PromotionEvaluation.objects.create(policy=policy)
    return evaluations.evaluate(evaluation.pk, client=prometheus.client)


def test_the_next_evaluation_after_a_failed_replay_says_why_and_starts_another_at_the_policys_pace(
        policy, prometheus):
    first = evaluate(policy, prometheus)
    replay = Replay.objects.get()
    assert first.decision == Decision.HELD and replay.pace == 50.0
    assert record_replay_report(replay.pk, {"status": "running", "done": 0, "total": 1000, "step": "loading"})
    assert record_replay_report(replay.pk, {"status": "failed", "done": 0, "total": 1000,
                                            "message": "the copy did not load: out of memory"})

    second = evaluate(policy, prometheus)
    retry = Replay.objects.exclude(pk=replay.pk).get()
    assert second.decision == Decision.HELD
    assert f"replay {replay.pk} failed: the copy did not load: out of memory" in second.reason
    assert f"replay {retry.pk} running, the next evaluation judges it" in second.reason
    assert second.metrics["replay"]["failed_replay"] == {"id": replay.pk,
                                                         "message": "the copy did not load: out of memory"}
    assert retry.pace == 50.0 and retry.status == JobStatus.QUEUED

    third = evaluate(policy, prometheus)  # the retry still runs: no word of the old failure, no third replay
    assert "failed" not in third.reason and Replay.objects.count() == 2


def test_a_failure_that_also_keeps_a_new_replay_from_starting_is_named_with_both_reasons(policy, prometheus):
    evaluate(policy, prometheus)
    replay = Replay.objects.get()
    assert record_replay_report(replay.pk, {"status": "failed", "message": "the agent was restarted"})
    ServingHost.objects.update(heartbeat=heartbeat(captured=0))
    held = evaluate(policy, prometheus)
    assert held.decision == Decision.HELD and Replay.objects.count() == 1
    assert f"replay {replay.pk} failed: the agent was restarted; no replay of v2 against v1 could start" in held.reason


def login(client, role: str | None):
    user = get_user_model().objects.create_user(username=role or "outsider")
    if role:
        team_member(user, role=role)
    else:
        team_member(user, team=create_team(name="other"))
    client.force_login(user)


def test_the_policy_page_shows_the_replay_an_evaluation_judged_and_only_owners_its_worst_disagreements(
        policy, prometheus, client):
    evaluate(policy, prometheus)
    replay = Replay.objects.get()
    assert record_replay_report(replay.pk, {"status": "running", "done": 5, "total": 10})
    assert record_replay_report(replay.pk, {"status": "succeeded", "done": 10, "total": 10,
                                            "summary": finished_summary()})
    judged = evaluate(policy, prometheus)
    assert judged.decision == Decision.HELD and "agreement with the target version 80.00 %" in judged.reason
    url = f"/promotions/policies/{policy.pk}/"

    login(client, "owner")
    page = html.unescape(client.get(url).content.decode())
    assert f'href="/replays/{replay.pk}/">Replay {replay.pk}</a> on edge: done, 10 of 10 requests' in page
    assert "80.00% of 10 compared" in page and "p50 0 · p90 1 · p99 1 · max 1" in page
    assert "<th>Serving v1</th><td>2.000</td><td>4.000</td>" in page and "+25.0 %" in page
    assert WORST_ID in page and '{"label":{"data":[1]}}' in page
    assert "1000 captured requests at 50/s" in page

    login(client, "viewer")
    member_page = client.get(url).content.decode()
    assert "80.00% of 10 compared" in member_page and WORST_ID not in member_page
    login(client, None)
    assert client.get(url).status_code == 404


def test_the_replay_pace_is_bounded_and_named_when_out_of_bounds(policy, admin_api):
    for pace in (0.5, 1001, "fast", True):
        with pytest.raises(InvalidInput, match="replay_pace must be a number of requests per second from 1 to 1000"):
            policies.update_policy(policy.pk, replay_pace=pace)
    assert policies.update_policy(policy.pk, replay_pace=1000).replay_pace == 1000.0
    answer = admin_api.patch(f"/api/v1/promotion-policies/{policy.pk}/", {"replay_pace": 2000}, format="json")
    assert answer.status_code == 400 and "replay_pace" in answer.content.decode()
    assert admin_api.get(f"/api/v1/promotion-policies/{policy.pk}/").json()["replay_pace"] == 1000.0
    created = policies.create_policy(model_name="thr", candidate_alias="staging", target_alias="canary")
    assert created.replay_pace == 20.0
