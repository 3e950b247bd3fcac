"""Progressive rollouts: a policy with ramp steps moves a canary step by step on the canary's own metrics, read
from a real Prometheus fed known counters (``tests.promotions.support``), and holds or rolls it back."""

import pytest
from django.contrib.auth import get_user_model

from deployments.choices import CanaryState, DeploymentStatus, TargetState
from deployments.models import Deployment, DeploymentTarget
from modelyard.errors import InvalidInput
from promotions import evaluations, policies
from promotions.choices import Decision
from registry.choices import ArtifactFormat
from registry.models import Alias
from tests.promotions.support import following, iris_with_aliases

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

GATES = {"window_seconds": 60, "min_requests": 600, "max_p95_ms": 20, "max_error_rate": 0.01, "max_regression": 0.1}
HOSTS = ["gpu-prod-1", "gpu-prod-2"]


def ramp_policy(candidate: int, percent: float = 5, artifact_format: str = ArtifactFormat.TRITON_MODEL_DIR,
                **changes):
    """iris (versions in ``artifact_format``) with production=1 serving on two hosts, ``candidate`` as staging
    running as a canary at ``percent`` beside it, and a ramping policy from staging to production."""
    model = iris_with_aliases(artifact_format, production=1, staging=candidate)
    served = following(model, "production", HOSTS)
    canary = Deployment.objects.create(model=model, version=model.versions.get(version=candidate),
                                       status=DeploymentStatus.SUCCEEDED, canary_percent=percent,
                                       canary_state=CanaryState.ACTIVE)
    for target in served.targets.select_related("host"):
        DeploymentTarget.objects.create(deployment=canary, host=target.host, state=TargetState.READY,
                                        previous_version=served.version)
    policy = policies.create_policy(model_name="iris", candidate_alias="staging", target_alias="production",
                                    **{**GATES, "ramp_steps": [5, 25, 50, 100], **changes})
    return policy, canary


def run(policy, prometheus):
    return evaluations.evaluate(evaluations.request_evaluation(policy.pk).pk, client=prometheus.client)


def test_a_passing_canary_climbs_each_step_and_the_last_one_promotes_it(prometheus):
    policy, canary = ramp_policy(candidate=2)
    seen = []
    for _ in range(3):
        evaluation = run(policy, prometheus)
        canary.refresh_from_db()
        seen.append((evaluation.decision, canary.canary_percent))
    assert seen == [(Decision.ADVANCED, 25.0), (Decision.ADVANCED, 50.0), (Decision.PROMOTED, 50.0)], seen
    assert "promote the canary of v2" in evaluation.reason
    assert canary.canary_state == CanaryState.PROMOTED
    assert Alias.objects.get(model__name="iris", name="production").version.version == 2
    promotion = Deployment.objects.get(pk=evaluation.metrics["ramp"]["promotion"])
    assert (promotion.version.version, promotion.canary_state) == (2, "")
    assert sorted(promotion.targets.values_list("host__name", flat=True)) == HOSTS
    # The canary was judged on its own version's series, the stable one's as the baseline.
    assert (evaluation.metrics["candidate"]["version"], evaluation.metrics["target"]["version"]) == (2, 1)


def test_a_failing_canary_is_held_at_its_step(prometheus):
    policy, canary = ramp_policy(candidate=3, percent=25)
    evaluation = run(policy, prometheus)
    canary.refresh_from_db()
    assert evaluation.decision == Decision.HELD and "the canary stays at 25 %" in evaluation.reason
    assert (canary.canary_percent, canary.canary_state) == (25.0, CanaryState.ACTIVE)


def test_a_failing_canary_is_rolled_back_when_the_policy_says_so(prometheus):
    policy, canary = ramp_policy(candidate=3, ramp_on_failure="rollback")
    evaluation = run(policy, prometheus)
    canary.refresh_from_db()
    assert evaluation.decision == Decision.ROLLED_BACK, evaluation.reason
    assert canary.canary_state == CanaryState.ROLLED_BACK
    [rollback] = evaluation.metrics["ramp"]["rollbacks"]
    assert Deployment.objects.get(pk=rollback).version.version == 1
    assert Alias.objects.get(model__name="iris", name="production").version.version == 1


def test_a_dry_run_says_what_it_would_do_and_does_nothing(prometheus):
    policy, canary = ramp_policy(candidate=2, dry_run=True)
    evaluation = run(policy, prometheus)
    canary.refresh_from_db()
    assert evaluation.decision == Decision.DRY_RUN_PASS
    assert "would move the canary of v2" in evaluation.reason and "from 5 % to 25 %" in evaluation.reason
    assert canary.canary_percent == 5.0


def test_an_approved_step_is_taken_by_the_approver(prometheus):
    policy, canary = ramp_policy(candidate=2, requires_approval=True)
    evaluation = run(policy, prometheus)
    assert evaluation.decision == Decision.AWAITING_APPROVAL and "to move the canary" in evaluation.reason
    owner = get_user_model().objects.create_user(username="owner", is_staff=True)
    approved = evaluations.approve_evaluation(evaluation.pk, actor=owner)
    canary.refresh_from_db()
    assert approved.decision == Decision.ADVANCED and canary.canary_percent == 25.0
    assert approved.decided_by == owner


def test_a_ramp_without_an_active_canary_is_an_error_saying_how_to_start_one(prometheus):
    policy, canary = ramp_policy(candidate=2)
    Deployment.objects.filter(pk=canary.pk).update(canary_state=CanaryState.PROMOTED)
    evaluation = run(policy, prometheus)
    assert evaluation.decision == Decision.ERROR and "has no active canary to ramp" in evaluation.reason


@pytest.mark.parametrize("steps,says", [
    ([25, 5, 100], "must increase"), ([5, 50], "must end at 100"), ([0, 100], "above 0"),
    ([5, 101], "at most 100"), ("5,100", "must be a list"),
])
def test_ramp_steps_are_checked(db, steps, says):
    iris_with_aliases(production=1, staging=2)
    with pytest.raises(InvalidInput, match=says):
        policies.create_policy(model_name="iris", candidate_alias="staging", target_alias="production",
                               ramp_steps=steps)


def test_the_api_takes_a_ramp_and_refuses_a_bad_one(admin_api, db):
    iris_with_aliases(production=1, staging=2)
    body = {"model": "iris", "candidate_alias": "staging", "target_alias": "production"}
    bad = admin_api.post("/api/v1/promotion-policies/", {**body, "ramp_steps": [50, 25, 100]}, format="json")
    assert bad.status_code == 400 and "must increase" in bad.content.decode()
    good = admin_api.post("/api/v1/promotion-policies/", {**body, "ramp_steps": [5, 25, 100],
                                                          "ramp_on_failure": "rollback"}, format="json")
    assert good.status_code == 201, good.content
    assert (good.json()["ramp_steps"], good.json()["ramp_on_failure"]) == ([5.0, 25.0, 100.0], "rollback")
