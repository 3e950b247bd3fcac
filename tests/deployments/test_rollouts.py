"""Rollouts in batches: dispatch order, failure policies, pause/resume/cancel/rollback, alias following; an
on-demand version's known footprint in its payload, and its refusal where a host's budget is smaller."""

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from audit.choices import AuditAction
from audit.models import AuditEvent
from deployments import rollouts
from deployments.choices import DeploymentStatus, TargetState
from deployments.footprints import deploy_payload, reported_footprint
from deployments.models import Deployment, DeploymentTarget, RolloutEvent, ServingHost
from deployments.services import start_deployment
from deployments.targets import build_agent_payload, record_target_progress
from modelyard.errors import Conflict, InvalidInput
from registry.aliases import set_alias
from registry.choices import ArtifactFormat
from registry.models import ModelVersion, RegisteredModel
from tests.factories import team_member
from tests.registry.test_upload_digests import queued

pytestmark = pytest.mark.django_db

MB = 1 << 20


@pytest.fixture
def model() -> RegisteredModel:
    model = RegisteredModel.objects.create(name="iris", next_version=4)
    for number in (1, 2, 3):
        ModelVersion.objects.create(
            model=model, version=number, format=ArtifactFormat.TRITON_MODEL_DIR, artifact_key=f"sha256/0{number}/x",
            artifact_sha256=f"{number}" * 64, artifact_size=10, config_text='backend: "python"',
        )
    return model


@pytest.fixture
def hosts() -> list[ServingHost]:
    return [ServingHost.objects.create(name=f"gpu-{i}", inference_url=f"http://gpu-{i}:8000") for i in range(3)]


def finish(deployment: Deployment, host: str, state: str = TargetState.READY, message: str = "") -> str:
    """What the agent's report does: record the host's result, then advance the rollout."""
    target = deployment.targets.get(host__name=host)
    record_target_progress(target.pk, state, message=message)
    return rollouts.advance_rollout(deployment.pk)


def dispatched(deployment: Deployment) -> set[str]:
    return set(deployment.targets.filter(dispatched_at__isnull=False).values_list("host__name", flat=True))


def start(django_capture_on_commit_callbacks, **kwargs) -> Deployment:
    """Start a deployment and take its first step, as the on-commit task would."""
    with django_capture_on_commit_callbacks(execute=False):
        deployment = start_deployment(model_name="iris", **kwargs)
        rollouts.advance_rollout(deployment.pk)
    return deployment


def test_it_moves_hosts_in_batches_of_the_given_size(model, hosts, django_capture_on_commit_callbacks):
    deployment = start(django_capture_on_commit_callbacks, version=2,
                       host_names=["gpu-0", "gpu-1", "gpu-2"], batch_size=2)
    assert list(deployment.targets.order_by("host__name").values_list("batch", flat=True)) == [0, 0, 1]
    assert dispatched(deployment) == {"gpu-0", "gpu-1"}
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        assert finish(deployment, "gpu-0") == DeploymentStatus.RUNNING
    assert dispatched(deployment) == {"gpu-0", "gpu-1"} and not callbacks  # batch 0 is still in flight
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        finish(deployment, "gpu-1")
    assert dispatched(deployment) == {"gpu-0", "gpu-1", "gpu-2"} and len(callbacks) == 1
    assert finish(deployment, "gpu-2") == DeploymentStatus.SUCCEEDED
    deployment.refresh_from_db()
    assert deployment.finished_at is not None
    assert list(deployment.events.values_list("to_status", flat=True)) == ["succeeded"]


def test_advancing_twice_dispatches_a_batch_once(model, hosts, django_capture_on_commit_callbacks):
    deployment = start(django_capture_on_commit_callbacks, version=2, host_names=["gpu-0", "gpu-1"])
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        rollouts.advance_rollout(deployment.pk)
        rollouts.advance_rollout(deployment.pk)
    assert dispatched(deployment) == {"gpu-0"} and not callbacks


def test_a_failed_host_pauses_the_rollout_and_resume_goes_on_with_the_next_batch(
    model, hosts, django_capture_on_commit_callbacks
):
    deployment = start(django_capture_on_commit_callbacks, version=2, host_names=["gpu-0", "gpu-1"])
    assert finish(deployment, "gpu-0", TargetState.FAILED, "Triton said no") == DeploymentStatus.PAUSED
    assert dispatched(deployment) == {"gpu-0"}
    assert "gpu-0 failed" in deployment.events.get(to_status="paused").message
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        rollouts.resume_rollout(deployment.pk)
    assert len(callbacks) == 1  # the advance task, on commit
    rollouts.advance_rollout(deployment.pk)
    assert dispatched(deployment) == {"gpu-0", "gpu-1"}
    assert finish(deployment, "gpu-1") == DeploymentStatus.FAILED  # finished, one host did not take it


def test_the_rollback_policy_sends_moved_hosts_back_to_what_they_served(
    model, hosts, django_capture_on_commit_callbacks
):
    first = start(django_capture_on_commit_callbacks, version=1, host_names=["gpu-0", "gpu-1"], batch_size=2)
    finish(first, "gpu-0")
    assert finish(first, "gpu-1") == DeploymentStatus.SUCCEEDED
    second = start(django_capture_on_commit_callbacks, version=2, host_names=["gpu-0", "gpu-1"],
                   failure_policy="rollback")
    assert set(second.targets.values_list("previous_version__version", flat=True)) == {1}
    finish(second, "gpu-0")
    with django_capture_on_commit_callbacks(execute=False):
        assert finish(second, "gpu-1", TargetState.FAILED, "load failed") == DeploymentStatus.ROLLED_BACK
    (rollback,) = Deployment.objects.filter(rollback_of=second)
    assert rollback.version.version == 1
    assert list(rollback.targets.values_list("host__name", flat=True)) == ["gpu-0"]  # gpu-1 never moved


def test_an_operator_can_pause_cancel_and_not_resume_a_cancelled_rollout(
    model, hosts, django_capture_on_commit_callbacks
):
    deployment = start(django_capture_on_commit_callbacks, version=2, host_names=["gpu-0", "gpu-1", "gpu-2"])
    rollouts.pause_rollout(deployment.pk)
    finish(deployment, "gpu-0")
    assert dispatched(deployment) == {"gpu-0"}  # paused: no further batch
    rollouts.cancel_rollout(deployment.pk)
    states = dict(deployment.targets.values_list("host__name", "state"))
    assert states == {"gpu-0": "ready", "gpu-1": "cancelled", "gpu-2": "cancelled"}
    with pytest.raises(Conflict, match="not paused"):
        rollouts.resume_rollout(deployment.pk)
    assert list(RolloutEvent.objects.filter(deployment=deployment).values_list("to_status", flat=True)) == [
        "paused", "cancelled"]
    assert AuditEvent.objects.filter(action=AuditAction.DEPLOYMENT_CHANGED).count() == 2


def test_a_finished_rollout_is_not_rolled_back_once_a_later_one_moved_its_hosts(
    model, hosts, django_capture_on_commit_callbacks
):
    first = start(django_capture_on_commit_callbacks, version=1, host_names=["gpu-0"])
    finish(first, "gpu-0")
    second = start(django_capture_on_commit_callbacks, version=2, host_names=["gpu-0"])
    finish(second, "gpu-0")
    start(django_capture_on_commit_callbacks, version=3, host_names=["gpu-0"])
    with pytest.raises(Conflict, match="later deployment"):
        rollouts.rollback_rollout(second.pk)


def test_moving_a_followed_alias_starts_a_rollout_to_the_same_hosts(model, hosts, django_capture_on_commit_callbacks):
    set_alias(model_name="iris", alias="production", version=1)
    first = start(django_capture_on_commit_callbacks, alias="production", host_names=["gpu-2", "gpu-0"],
                  batch_size=2)
    assert (first.version.version, first.follow_alias) == (1, "production")
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        set_alias(model_name="iris", alias="production", version=2)
    assert len(callbacks) == 1  # the follow task, enqueued once the move commits
    with django_capture_on_commit_callbacks(execute=False):
        follow = rollouts.follow_alias(model.pk, "production")
    assert follow.version.version == 2 and follow.batch_size == 2 and follow.follow_alias == "production"
    assert sorted(follow.targets.values_list("host__name", flat=True)) == ["gpu-0", "gpu-2"]
    first.refresh_from_db()
    assert first.status == DeploymentStatus.CANCELLED  # superseded before it finished
    assert rollouts.follow_alias(model.pk, "production") is None  # a repeat does nothing


def test_an_alias_nobody_follows_starts_nothing(model, hosts, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        set_alias(model_name="iris", alias="staging", version=1)
    assert not callbacks


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"version": 2, "alias": "production"}, "not both"),
        ({}, "a version to pin or an alias to follow"),
        ({"version": 2, "host_names": ["gpu-0"], "batch_size": 0}, "batch_size"),
        ({"version": 2, "host_names": ["gpu-0"], "failure_policy": "pray"}, "failure_policy"),
        ({"version": 2, "host_names": ["gpu-0"], "selector": {"zone": "a"}}, "not both"),
        ({"version": 2, "selector": {"zone": "mars"}}, "no serving host carries"),
        ({"version": 2, "host_names": ["gpu-0"], "config_overrides": {"input": []}}, "may set only"),
        ({"version": 2, "host_names": ["gpu-0"], "config_overrides": {"instance_group": [{"kind": "KIND_TPU"}]}},
         "do not fit"),
        ({"version": 2, "host_names": ["gpu-0"], "config_overrides": {"instance_group": [{"count": 500}]}},
         "count must be"),
    ],
)
def test_it_refuses_a_bad_deployment_and_writes_nothing(model, hosts, kwargs, message):
    with pytest.raises(InvalidInput, match=message):
        start_deployment(model_name="iris", **kwargs)
    assert not Deployment.objects.exists() and not DeploymentTarget.objects.exists()


def test_a_triton_host_refuses_a_bentoml_artifact(model, hosts):
    ModelVersion.objects.create(model=model, version=4, format=ArtifactFormat.BENTOML_MODEL,
                                artifact_key="sha256/04/x", artifact_sha256="4" * 64, artifact_size=10)
    with pytest.raises(Conflict, match="cannot serve"):
        start_deployment(model_name="iris", version=4, host_names=["gpu-0"])
    assert not Deployment.objects.exists()


def test_a_bentoml_host_refuses_a_triton_model_and_takes_a_bento_with_its_runtime_in_the_payload(model):
    host = ServingHost.objects.create(name="bento-0", runtime="bentoml", inference_url="http://bento-0:3000")
    with pytest.raises(Conflict, match="cannot serve"):
        start_deployment(model_name="iris", version=1, host_names=["bento-0"])
    ModelVersion.objects.create(model=model, version=4, format=ArtifactFormat.BENTO, artifact_key="sha256/04/x",
                                artifact_sha256="4" * 64, artifact_size=10, signature={"bentoml": {"tag": "iris:v4"}})
    deployment = start_deployment(model_name="iris", version=4, host_names=["bento-0"])
    payload = build_agent_payload(deployment.targets.get(host=host), download_url="http://s3/x")
    assert (payload["runtime"], payload["format"]) == ("bentoml", "bento")
    assert payload["signature"]["bentoml"]["tag"] == "iris:v4"


def test_rollout_controls_through_the_api(api_client, model, hosts, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False):
        created = api_client.post("/api/v1/deployments/", {
            "model": "iris", "version": 2, "hosts": ["gpu-0", "gpu-1"], "batch_size": 1,
            "config_overrides": {"instance_group": [{"count": 2, "kind": "KIND_CPU"}]},
        }, format="json")
    assert created.status_code == 201, created.content
    body = created.json()
    assert body["config_overrides"] == {"instance_group": [{"count": 2, "kind": "KIND_CPU"}]}
    url = f"/api/v1/deployments/{body['id']}/"
    assert api_client.post(url + "pause/").json()["status"] == "paused"
    assert api_client.post(url + "pause/").status_code == 409
    with django_capture_on_commit_callbacks(execute=False):
        assert api_client.post(url + "resume/").json()["status"] == "running"
    cancelled = api_client.post(url + "cancel/").json()
    assert cancelled["status"] == "cancelled"
    assert [e["to_status"] for e in cancelled["events"]] == ["paused", "running", "cancelled"]
    assert api_client.post(url + "rollback/").json() == []  # no host had moved
    assert api_client.post(url + "rollback/").status_code == 409


def test_a_deployment_by_selector_takes_every_matching_host(model, hosts, django_capture_on_commit_callbacks):
    ServingHost.objects.filter(name__in=["gpu-0", "gpu-2"]).update(labels={"zone": "a"})
    deployment = start(django_capture_on_commit_callbacks, version=2, selector={"zone": "a"})
    assert sorted(deployment.targets.values_list("host__name", flat=True)) == ["gpu-0", "gpu-2"]
    assert deployment.selector == {"zone": "a"}


@pytest.fixture
def ensemble(model) -> ModelVersion:
    """iris-ens v1: an ensemble composing iris v2."""
    from registry.models import EnsembleMember

    ens = RegisteredModel.objects.create(name="iris-ens", next_version=2)
    version = ModelVersion.objects.create(model=ens, version=1, format=ArtifactFormat.TRITON_ENSEMBLE,
                                          artifact_key="sha256/ee/x", artifact_sha256="e" * 64, artifact_size=10)
    EnsembleMember.objects.create(ensemble=version, member=model.versions.get(version=2), requested_version=2)
    return version


def test_an_ensemble_rollout_deploys_its_composing_model_first(model, hosts, ensemble,
                                                                django_capture_on_commit_callbacks):
    first = start(django_capture_on_commit_callbacks, version=2, host_names=["gpu-0"])
    finish(first, "gpu-0")  # gpu-0 serves iris v2 already; gpu-1 does not
    with django_capture_on_commit_callbacks(execute=False):
        parent = start_deployment(model_name="iris-ens", version=1, host_names=["gpu-0", "gpu-1"], batch_size=2)
    (child,) = parent.prerequisites.all()
    assert (child.model.name, child.version.version) == ("iris", 2)
    assert list(child.targets.values_list("host__name", flat=True)) == ["gpu-1"]
    assert rollouts.advance_rollout(parent.pk) == DeploymentStatus.RUNNING
    assert dispatched(parent) == set()  # waits for iris
    rollouts.advance_rollout(child.pk)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        assert finish(child, "gpu-1") == DeploymentStatus.SUCCEEDED
    assert len(callbacks) >= 1  # the ensemble's rollout is advanced once iris is in place
    rollouts.advance_rollout(parent.pk)
    assert dispatched(parent) == {"gpu-0", "gpu-1"}


def test_an_ensemble_rollout_fails_without_moving_a_host_when_a_composing_model_fails(
    model, hosts, ensemble, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=False):
        parent = start_deployment(model_name="iris-ens", version=1, host_names=["gpu-0"])
    (child,) = parent.prerequisites.all()
    rollouts.advance_rollout(child.pk)
    with django_capture_on_commit_callbacks(execute=False):
        finish(child, "gpu-0", TargetState.FAILED, "load failed")
    assert rollouts.advance_rollout(parent.pk) == DeploymentStatus.FAILED
    parent.refresh_from_db()
    assert "composing model(s) could not be deployed: iris" in parent.events.last().message
    assert list(parent.targets.values_list("state", flat=True)) == ["cancelled"]


def test_a_host_that_finishes_loading_after_its_rollout_was_rolled_back_is_rolled_back_too(
    model, hosts, django_capture_on_commit_callbacks
):
    first = start(django_capture_on_commit_callbacks, version=1, host_names=["gpu-0", "gpu-1"], batch_size=2)
    with django_capture_on_commit_callbacks(execute=False):
        finish(first, "gpu-0")
        finish(first, "gpu-1")
    second = start(django_capture_on_commit_callbacks, version=2, host_names=["gpu-0", "gpu-1"], batch_size=2)
    with django_capture_on_commit_callbacks(execute=False):
        finish(second, "gpu-0")
        record_target_progress(second.targets.get(host__name="gpu-1").pk, TargetState.LOADING)
        (early,) = rollouts.rollback_rollout(second.pk)  # gpu-1 is still loading v2: a load cannot be stopped
    assert list(early.targets.values_list("host__name", flat=True)) == ["gpu-0"]
    with django_capture_on_commit_callbacks(execute=False):
        assert finish(second, "gpu-1") == DeploymentStatus.ROLLED_BACK
        rollouts.advance_rollout(second.pk)  # a second report of the same end sends nothing more
    late = Deployment.objects.filter(rollback_of=second).exclude(pk=early.pk)
    assert [(d.version.version, list(d.targets.values_list("host__name", flat=True))) for d in late] == [
        (1, ["gpu-1"])]


def test_an_on_demand_payload_carries_the_versions_measured_footprint(model, hosts):
    earlier = start_deployment(model_name="iris", version=2, host_names=["gpu-0"])
    DeploymentTarget.objects.filter(deployment=earlier).update(
        state=TargetState.READY, details={"footprint_bytes": {"gpu": 3 << 30, "cpu": None}})
    on_demand = start_deployment(model_name="iris", version=2, host_names=["gpu-1"], residency="on_demand")
    assert deploy_payload(on_demand.targets.get(), download_url="http://s3/x")["footprint_bytes"] == 3 << 30
    # Not measured anywhere yet: None, and the host's loader measures it at its first load.
    unmeasured = start_deployment(model_name="iris", version=1, host_names=["gpu-1"], residency="on_demand")
    assert deploy_payload(unmeasured.targets.get(), download_url="http://s3/x")["footprint_bytes"] is None
    # Always resident: the payload says nothing of it (the agent measures the load itself).
    assert "footprint_bytes" not in deploy_payload(earlier.targets.get(), download_url="http://s3/x")



def gateway_block(*, footprints=None, budget=None) -> dict:
    """A Triton host's heartbeat whose gateway reports ``footprints`` (``{"<model>/<versions>": {device: bytes}}``)
    and an on-demand budget of ``budget`` bytes per device."""
    residency = {"models": {}, **({"budget": {"budget_bytes": budget, "resident_bytes": 0, "devices": {},
                                               "problem": None}} if budget is not None else {})}
    return {"runtime_live": True, "gateway": {"live": True, "routes": {}, "residency": residency,
                                              "footprints": footprints or {}}}


def test_the_footprint_a_host_measured_for_a_version_travels_with_its_next_on_demand_deployment(model, hosts):
    start_deployment(model_name="iris", version=2, host_names=["gpu-0"], residency="on_demand")
    # gpu-0's loader loaded version 2 alone (700 MiB), and version 1 beside it as a canary (900 MiB for both).
    ServingHost.objects.filter(name="gpu-0").update(heartbeat=gateway_block(footprints={
        "iris/2": {"cpu": 700 * MB}, "iris/1+2": {"cpu": 900 * MB}, "other/2": {"cpu": 5000 * MB}}))
    assert reported_footprint(model.versions.get(version=2)) == 700 * MB
    on_demand = start_deployment(model_name="iris", version=2, host_names=["gpu-1"], residency="on_demand")
    assert deploy_payload(on_demand.targets.get(), download_url="http://s3/x")["footprint_bytes"] == 700 * MB
    # Version 1 was measured only beside version 2: nothing known of it alone, so its loader measures it.
    first = start_deployment(model_name="iris", version=1, host_names=["gpu-1"], residency="on_demand")
    assert deploy_payload(first.targets.get(), download_url="http://s3/x")["footprint_bytes"] is None
    # A deployment's own load measured more GPU memory than the loader saw: the larger figure counts.
    DeploymentTarget.objects.filter(deployment__version__version=2, host__name="gpu-0").update(
        state="ready", details={"footprint_bytes": {"gpu": 800 * MB, "cpu": None}})
    assert deploy_payload(on_demand.targets.get(), download_url="http://s3/x")["footprint_bytes"] == 800 * MB


def budgets_and_measured(hosts) -> None:
    """gpu-0 measured iris v2 at 700 MiB; gpu-1's on-demand budget is 512 MiB per device."""
    start_deployment(model_name="iris", version=2, host_names=["gpu-0"], residency="on_demand")
    ServingHost.objects.filter(name="gpu-0").update(heartbeat=gateway_block(footprints={"iris/2": {"cpu": 700 * MB}},
                                                                          budget=2048 * MB),
                                                    last_heartbeat_at=timezone.now())
    ServingHost.objects.filter(name="gpu-1").update(heartbeat=gateway_block(budget=512 * MB),
                                                    last_heartbeat_at=timezone.now())


def test_the_api_refuses_an_on_demand_version_larger_than_a_hosts_budget_and_writes_nothing(api_client, model,
                                                                                           hosts):
    budgets_and_measured(hosts)
    before = Deployment.objects.count()
    answer = api_client.post("/api/v1/deployments/", {"model": "iris", "version": 2, "hosts": ["gpu-0", "gpu-1"],
                                                      "residency": "on_demand"}, format="json")
    assert answer.status_code == 409, answer.content
    assert answer.json()["code"] == "conflict" and answer.json()["detail"] == (
        f"iris v2 needs {700 * MB} bytes of memory on one device, more than the on-demand memory budget of "
        f"'gpu-1' ({512 * MB} bytes per device): its loader could never load it. Raise the host's "
        "--memory-budget-bytes, or deploy it there with residency always")
    assert Deployment.objects.count() == before and not DeploymentTarget.objects.filter(host__name="gpu-1").exists()
    # Where it fits, or kept resident (the budget holds on-demand models only), it deploys.
    for body in ({"hosts": ["gpu-0"], "residency": "on_demand"}, {"hosts": ["gpu-1"]}):
        answer = api_client.post("/api/v1/deployments/", {"model": "iris", "version": 2, **body}, format="json")
        assert answer.status_code == 201, answer.content


def test_the_rollout_form_says_an_on_demand_version_is_larger_than_a_hosts_budget(client, model, hosts):
    budgets_and_measured(hosts)
    client.force_login(team_member(get_user_model().objects.create_user(username="ml-engineer"), "maintainer"))
    before = Deployment.objects.count()
    refused = client.post("/deployments/new/iris/", {"version": "2", "hosts": ["gpu-1"], "batch_size": "1",
                                                     "failure_policy": "pause", "residency": "on_demand"})
    assert refused.status_code == 200
    assert "more than the on-demand memory budget of &#x27;gpu-1&#x27;" in refused.content.decode()
    assert Deployment.objects.count() == before


def queued_dispatches(broker) -> list[int]:
    """The target ids of the ``dispatch_target`` tasks waiting on the real broker's ``default`` queue."""
    return sorted(args[0] for name, args in queued(broker) if name == "deployments.dispatch_target")


@pytest.mark.django_db(transaction=True)
def test_two_workers_advancing_a_six_host_rollout_at_every_step_dispatch_each_target_once(model, broker):
    # Two orchestrator workers at each step (the report of the batch's last host, and a reconciler pass): the
    # deployment's row lock lets one of them dispatch the next batch, and the other finds it in flight.
    from tests.fixtures.concurrency import at_once

    names = [f"six-{i}" for i in range(6)]
    for name in names:
        ServingHost.objects.create(name=name, inference_url=f"http://{name}:8000")
    deployment = start_deployment(model_name="iris", version=2, host_names=names, batch_size=2)
    for batch in range(3):
        _, errors = at_once(lambda: rollouts.advance_rollout(deployment.pk), 2, timeout=30)
        assert errors == []
        in_batch = sorted(deployment.targets.filter(batch=batch).values_list("pk", flat=True))
        assert queued_dispatches(broker) == sorted(deployment.targets.filter(batch__lte=batch).values_list(
            "pk", flat=True)), f"batch {batch}"
        for target in in_batch:
            record_target_progress(target, TargetState.READY)
    _, errors = at_once(lambda: rollouts.advance_rollout(deployment.pk), 2, timeout=30)
    deployment.refresh_from_db()
    assert errors == [] and deployment.status == DeploymentStatus.SUCCEEDED
    assert queued_dispatches(broker) == sorted(deployment.targets.values_list("pk", flat=True))  # each once
    assert deployment.events.filter(to_status=DeploymentStatus.SUCCEEDED).count() == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("act", "then"), [
    (rollouts.pause_rollout, DeploymentStatus.PAUSED), (rollouts.cancel_rollout, DeploymentStatus.CANCELLED)])
def test_a_pause_or_cancel_sent_twice_at_the_same_moment_acts_once(model, hosts, broker, act, then):
    from tests.fixtures.concurrency import at_once

    deployment = start_deployment(model_name="iris", version=2, host_names=["gpu-0", "gpu-1"], batch_size=1)
    rollouts.advance_rollout(deployment.pk)
    done, errors = at_once(lambda: act(deployment.pk), 2, timeout=30)
    deployment.refresh_from_db()
    assert len(done) == 1 and len(errors) == 1 and "Conflict" in errors[0], errors
    assert deployment.status == then and deployment.events.filter(to_status=then).count() == 1
    if then == DeploymentStatus.PAUSED:
        resumed, errors = at_once(lambda: rollouts.resume_rollout(deployment.pk), 2, timeout=30)
        assert len(resumed) == 1 and len(errors) == 1 and "Conflict" in errors[0], errors
        assert deployment.events.filter(to_status=DeploymentStatus.RUNNING).count() == 1
