"""Deployment markers of the model charts: what each rollout did, and none for one that reached no host."""

import pytest

from deployments.choices import DeploymentStatus, RolloutTrigger, TargetState
from deployments.models import Deployment, DeploymentTarget, ServingHost
from monitoring import services
from registry.choices import ArtifactFormat
from registry.models import ModelVersion, RegisteredModel

pytestmark = pytest.mark.django_db


def rollout(model, number: int, status: str, states: list[str], trigger: str = RolloutTrigger.OPERATOR):
    """A deployment of version ``number`` with one target per state, on hosts h0, h1, ..."""
    version, _ = ModelVersion.objects.get_or_create(
        model=model, version=number,
        defaults={"format": ArtifactFormat.TRITON_MODEL_DIR, "artifact_key": f"k{number}", "artifact_sha256": "0" * 64,
                  "artifact_size": 1})
    deployment = Deployment.objects.create(model=model, version=version, status=status, trigger=trigger)
    for i, state in enumerate(states):
        host, _ = ServingHost.objects.get_or_create(name=f"h{i}", defaults={"inference_url": f"http://h{i}:8000"})
        DeploymentTarget.objects.create(deployment=deployment, host=host, state=state)
    return deployment


def test_markers_say_what_each_rollout_did_and_mark_one_cancelled_before_any_host_as_untouched():
    model = RegisteredModel.objects.create(name="iris")
    rollout(model, 1, DeploymentStatus.SUCCEEDED, [TargetState.READY, TargetState.READY])
    rollout(model, 2, DeploymentStatus.FAILED, [TargetState.READY, TargetState.FAILED])
    rollout(model, 3, DeploymentStatus.CANCELLED, [TargetState.CANCELLED, TargetState.CANCELLED])
    rollout(model, 4, DeploymentStatus.CANCELLED, [TargetState.READY, TargetState.CANCELLED, TargetState.CANCELLED])
    rollout(model, 5, DeploymentStatus.RUNNING, [TargetState.LOADING, TargetState.PENDING])
    rollout(model, 1, DeploymentStatus.SUCCEEDED, [TargetState.READY], trigger=RolloutTrigger.ROLLBACK)

    markers = services.deployment_markers(model, since_seconds=3600)

    assert [(m["label"], m["touched"]) for m in markers] == [
        ("v1 rolled out to 2 hosts", True),
        ("v2 failed on 1 of 2 hosts", True),
        ("v3 cancelled before any host", False),
        ("v4 cancelled after 1 of 3 hosts", True),
        ("v5 rolling out: 0 of 2 hosts", True),
        ("v1 rolled out to 1 host (rollback)", True),
    ]
    assert [(m["hosts"], m["moved"], m["failed"]) for m in markers][:2] == [(2, 2, 0), (2, 1, 1)]


def test_the_markers_cost_one_sql_query_whatever_the_number_of_rollouts(django_assert_num_queries):
    model = RegisteredModel.objects.create(name="iris")
    for number in range(1, 13):
        rollout(model, number, DeploymentStatus.SUCCEEDED, [TargetState.READY, TargetState.FAILED])
    with django_assert_num_queries(1):
        assert len(services.deployment_markers(model, since_seconds=3600)) == 12
