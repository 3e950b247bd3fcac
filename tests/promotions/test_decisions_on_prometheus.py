"""Evaluations judged on a real Prometheus fed known counters (see ``tests.promotions.support``).

The evaluation runs in the test process here; ``test_promotion_workers`` runs it on Celery.
"""

import pytest
from django.contrib.auth import get_user_model

from audit.choices import AuditAction
from audit.models import AuditEvent
from deployments.models import Deployment
from deployments.rollouts import follow_alias
from modelyard.errors import Conflict
from monitoring.prometheus import PrometheusClient
from promotions import evaluations, policies
from promotions.choices import Decision
from registry.models import Alias
from tests.fixtures.services import free_port
from tests.promotions.support import following, iris_with_aliases

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

GATES = {"window_seconds": 60, "min_requests": 600, "max_p95_ms": 20, "max_error_rate": 0.01, "max_regression": 0.1}


def evaluate(policy, client) -> object:
    evaluation = evaluations.request_evaluation(policy.pk)
    return evaluations.evaluate(evaluation.pk, client=client)


def policy_for(staging: int, **changes):
    model = iris_with_aliases(production=1, staging=staging)
    return policies.create_policy(model_name=model.name, candidate_alias="staging", target_alias="production",
                                  **{**GATES, **changes})


def production() -> int:
    return Alias.objects.get(model__name="iris", name="production").version.version


def test_a_good_candidate_is_promoted_and_the_deployments_following_the_target_roll_out(
    prometheus, django_capture_on_commit_callbacks
):
    policy = policy_for(staging=2)
    following(policy.model, "production", ["gpu-prod-1", "gpu-prod-2"])
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        evaluation = evaluate(policy, prometheus.client)
    assert evaluation.decision == Decision.PROMOTED, evaluation.reason
    assert production() == 2
    candidate = evaluation.metrics["candidate"]
    assert candidate["version"] == 2
    assert candidate["requests"] == pytest.approx(1200, rel=0.1)
    assert candidate["latency_p95_ms"] == pytest.approx(10.5)
    assert candidate["error_rate"] == 0
    assert evaluation.metrics["target"]["latency_p95_ms"] == pytest.approx(10.0)
    assert all(check["passed"] for check in evaluation.checks)
    audit = AuditEvent.objects.get(action=AuditAction.ALIAS_SET, data__alias="production")
    assert (audit.actor, audit.actor_label) == (None, f"policy:{policy.pk}")
    assert audit.data == {"policy": policy.pk, "evaluation": evaluation.pk, "alias": "production", "from": 1, "to": 2,
                          "reason": f"promotion policy {policy.pk}, evaluation {evaluation.pk}: {evaluation.reason}"}
    # On commit the worker's task (test_promotion_workers) starts the rollout of what follows production:
    assert len(callbacks) == 2  # the queued evaluation's task, then follow_alias's
    follow_alias(policy.model_id, "production")
    rollout = Deployment.objects.exclude(status="succeeded").get()
    assert (rollout.version.version, rollout.trigger, rollout.follow_alias) == (2, "alias", "production")
    assert sorted(rollout.targets.values_list("host__name", flat=True)) == ["gpu-prod-1", "gpu-prod-2"]


@pytest.mark.parametrize("staging,changes,failed_gates", [
    (3, {}, ["max_error_rate", "max_p95_ms", "max_regression_error_rate", "max_regression_p95"]),
    (4, {}, ["min_requests"]),
    (2, {"max_regression": 0.02}, ["max_regression_p95"]),  # 10.5 ms is 5 % slower than production's 10 ms
])
def test_a_candidate_that_fails_a_gate_is_held_and_nothing_moves(prometheus, staging, changes, failed_gates):
    policy = policy_for(staging=staging, **changes)
    evaluation = evaluate(policy, prometheus.client)
    assert evaluation.decision == Decision.HELD
    assert sorted(c["gate"] for c in evaluation.checks if not c["passed"]) == failed_gates
    assert evaluation.reason.startswith("held: ")
    assert production() == 1
    assert not AuditEvent.objects.filter(action=AuditAction.ALIAS_SET).exists()


def test_with_prometheus_down_nothing_is_promoted_and_the_error_is_recorded(prometheus):
    policy = policy_for(staging=2)
    down = PrometheusClient(f"http://127.0.0.1:{free_port()}", timeout=2)
    evaluation = evaluate(policy, down)
    assert evaluation.decision == Decision.ERROR
    assert "metrics unavailable" in evaluation.reason and "unreachable" in evaluation.reason
    assert production() == 1


def test_a_dry_run_records_that_it_would_promote_and_moves_nothing(prometheus):
    evaluation = evaluate(policy_for(staging=2, dry_run=True), prometheus.client)
    assert evaluation.decision == Decision.DRY_RUN_PASS
    assert "would promote v2 to @production" in evaluation.reason
    assert production() == 1


def test_a_passing_candidate_waits_for_approval_then_an_approver_promotes_it(prometheus):
    policy = policy_for(staging=2, requires_approval=True)
    evaluation = evaluate(policy, prometheus.client)
    assert evaluation.decision == Decision.AWAITING_APPROVAL
    assert production() == 1
    approver = get_user_model().objects.create_user(username="lead", is_staff=True)
    approved = evaluations.approve_evaluation(evaluation.pk, actor=approver)
    assert (approved.decision, approved.decided_by) == (Decision.APPROVED, approver)
    assert production() == 2
    audit = AuditEvent.objects.get(action=AuditAction.ALIAS_SET, data__alias="production")
    assert audit.data["approved_by"] == "lead" and audit.actor_label == f"policy:{policy.pk}"
    with pytest.raises(Conflict):
        evaluations.reject_evaluation(evaluation.pk, actor=approver)


def test_a_protected_target_waits_for_an_owners_approval_who_is_recorded_with_the_reason(prometheus):
    from accounts.choices import Role
    from modelyard.errors import Forbidden
    from tests.factories import team_member

    policy = policy_for(staging=2)
    Alias.objects.filter(name="production").update(protected=True)
    evaluation = evaluate(policy, prometheus.client)
    assert evaluation.decision == Decision.AWAITING_APPROVAL
    assert "@production is protected: promoting v2 to @production awaits an owner's approval" in evaluation.reason
    assert production() == 1

    maintainer = team_member(get_user_model().objects.create_user(username="dev"), Role.MAINTAINER)
    with pytest.raises(Forbidden, match="moving the protected alias 'production' needs the owner role"):
        evaluations.approve_evaluation(evaluation.pk, actor=maintainer)
    assert production() == 1
    owner = team_member(get_user_model().objects.create_user(username="lead"), Role.OWNER)
    evaluations.approve_evaluation(evaluation.pk, actor=owner)
    assert production() == 2
    audit = AuditEvent.objects.get(action=AuditAction.ALIAS_SET, data__alias="production")
    assert (audit.data["protected"], audit.data["owner"], audit.data["approved_by"]) == (True, "lead", "lead")
    assert audit.data["reason"].startswith(f"promotion policy {policy.pk}, evaluation {evaluation.pk}: ")
    assert "approved by lead" in audit.data["reason"]


def test_approval_is_refused_once_the_target_moved_since_the_evaluation(prometheus):
    policy = policy_for(staging=2, requires_approval=True)
    evaluation = evaluate(policy, prometheus.client)
    Alias.objects.filter(name="production").update(version=policy.model.versions.get(version=3))
    approver = get_user_model().objects.create_user(username="lead", is_staff=True)
    with pytest.raises(Conflict, match="moved since"):
        evaluations.approve_evaluation(evaluation.pk, actor=approver)
    assert production() == 3


def test_a_promotion_does_not_overwrite_an_alias_moved_after_the_evaluation_last_looked(prometheus, monkeypatch):
    policy = policy_for(staging=2)
    judge = evaluations.gates.judge

    def judge_while_a_person_moves_it(*args, **kwargs):  # after the "moved while read" check, before the move
        Alias.objects.filter(name="production").update(version=policy.model.versions.get(version=3))
        return judge(*args, **kwargs)

    monkeypatch.setattr(evaluations.gates, "judge", judge_while_a_person_moves_it)
    evaluation = evaluate(policy, prometheus.client)
    assert evaluation.decision == Decision.ERROR, evaluation.reason
    assert "@production names v3 now, not v1 as when this evaluation judged it" in evaluation.reason
    assert production() == 3
    assert not AuditEvent.objects.filter(action=AuditAction.ALIAS_SET, data__alias="production").exists()


def test_a_candidate_the_target_already_names_is_skipped(prometheus):
    policy = policy_for(staging=1)
    assert evaluate(policy, prometheus.client).decision == Decision.SKIPPED


def _card(version_number: int, host: str, throughput: float, *, slo: float | None = 5.0):
    """A finished performance card of iris ``version_number`` on ``host``: one config at concurrency 4."""
    from django.utils import timezone

    from deployments.models import Profile, ServingHost
    from registry.models import ModelVersion

    row = {"config": {"key": "i2-nobatch", "label": "2 instances, no dynamic batching", "instance_count": 2},
           "concurrency": 4, "throughput": throughput, "p50_ms": 1.0, "p99_ms": 3.0}
    return Profile.objects.create(
        version=ModelVersion.objects.get(model__name="iris", version=version_number),
        host=ServingHost.objects.get_or_create(name=host, defaults={"inference_url": f"http://{host}:8000"})[0],
        sweep={"configs": [], "concurrency": [4]}, rows=[row], slo_p99_ms=slo, status="succeeded",
        finished_at=timezone.now())


@pytest.mark.parametrize("candidate_throughput,decision", [(9_500, Decision.PROMOTED), (8_000, Decision.HELD)])
def test_the_profile_gate_compares_throughput_on_the_target_cards_host_and_config(
    prometheus, candidate_throughput, decision
):
    policy = policy_for(staging=2, max_profile_regression=0.1)
    _card(1, "staging-a", 10_000)
    _card(2, "staging-b", 20_000)  # another host: not comparable
    _card(2, "staging-a", candidate_throughput)
    evaluation = evaluate(policy, prometheus.client)
    assert evaluation.decision == decision, evaluation.reason
    check = next(c for c in evaluation.checks if c["gate"] == "max_profile_regression")
    assert check["value"] == pytest.approx(candidate_throughput / 10_000 - 1)
    assert "on staging-a" in check["message"] and "concurrency 4" in check["message"]
    assert evaluation.metrics["profiles"]["candidate_throughput"] == candidate_throughput


def test_the_profile_gate_holds_a_candidate_without_a_comparable_card(prometheus):
    policy = policy_for(staging=2, max_profile_regression=0.1)
    _card(1, "staging-a", 10_000)
    _card(2, "staging-b", 12_000)
    evaluation = evaluate(policy, prometheus.client)
    assert evaluation.decision == Decision.HELD
    assert "v2 has no performance card on staging-a" in evaluation.reason
    assert production() == 1
