"""Hosts and deployments through the API, and the target state machine."""

import pytest
from django.contrib.auth import get_user_model

from deployments.choices import TargetState
from deployments.models import Deployment, DeploymentTarget, ServingHost, TargetEvent
from deployments.rollouts import advance_rollout
from deployments.targets import record_target_progress, transition
from modelyard.states import IllegalTransition
from registry.choices import ArtifactFormat
from registry.models import ModelVersion, RegisteredModel

pytestmark = pytest.mark.django_db

HOST = {
    "name": "gpu-0",
    "runtime": "triton",
    "inference_url": "http://gpu-0.internal:8000",
    "metrics_url": "http://gpu-0.internal:8002/metrics",
    "config_overrides": {"parameters": {"EXECUTION_ENV_PATH": "/opt/envs/py311"}},
}


@pytest.fixture
def user(db):
    """Hosts are registered by administrators: the API client here is one."""
    return get_user_model().objects.create_user(username="ops", password="a-long-test-password", is_staff=True)


def test_only_administrators_register_or_delete_hosts(db):
    from rest_framework.test import APIClient

    from tests.factories import token_for

    member = get_user_model().objects.create_user(username="member")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token_for(member)}")
    answer = client.post("/api/v1/hosts/", HOST, format="json")
    assert answer.status_code == 403 and "administrators" in answer.json()["detail"]
    assert client.get("/api/v1/hosts/").status_code == 200
    ServingHost.objects.create(name="gpu-0", inference_url="http://gpu-0:8000")
    assert client.delete("/api/v1/hosts/gpu-0/").status_code == 403
    assert ServingHost.objects.filter(name="gpu-0").exists()


@pytest.fixture
def version(db) -> ModelVersion:
    model = RegisteredModel.objects.create(name="iris", next_version=2)
    return ModelVersion.objects.create(
        model=model, version=1, format=ArtifactFormat.TRITON_MODEL_DIR, artifact_key="sha256/ab/ab",
        artifact_sha256="ab" * 32, artifact_size=10, config_text='backend: "python"',
    )


def test_it_registers_and_lists_a_serving_host(api_client):
    answer = api_client.post("/api/v1/hosts/", HOST, format="json")
    assert answer.status_code == 201, answer.content
    assert answer.json()["inference_url"] == "http://gpu-0.internal:8000"
    listing = api_client.get("/api/v1/hosts/").json()
    assert [h["name"] for h in listing["results"]] == ["gpu-0"]
    assert ServingHost.objects.get(name="gpu-0").queue == "host.gpu-0"


def test_it_refuses_a_second_host_with_the_same_name(api_client):
    api_client.post("/api/v1/hosts/", HOST, format="json")
    assert api_client.post("/api/v1/hosts/", HOST, format="json").status_code == 409


@pytest.mark.parametrize(
    "change",
    [
        {"name": "GPU 0"},
        {"inference_url": "ftp://gpu-0:8000"},
        {"inference_url": "http://user:pw@gpu-0:8000"},
        {"runtime": "tensorflow-serving"},
        {"config_overrides": {"files": {"1/model.py": "x"}}},
        {"config_overrides": {"parameters": {"EXECUTION_ENV_PATH": 3}}},
    ],
)
def test_it_refuses_a_host_with_invalid_fields(api_client, change):
    answer = api_client.post("/api/v1/hosts/", {**HOST, **change}, format="json")
    assert answer.status_code == 400, answer.content
    assert not ServingHost.objects.exists()


def test_it_starts_a_deployment_with_one_pending_target_per_host_and_enqueues_on_commit(
    api_client, version, django_capture_on_commit_callbacks
):
    api_client.post("/api/v1/hosts/", HOST, format="json")
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        answer = api_client.post("/api/v1/deployments/", {"model": "iris", "version": 1, "hosts": ["gpu-0"]},
                                 format="json")
    assert answer.status_code == 201, answer.content
    body = answer.json()
    assert body["status"] == "running"
    assert [(t["host"], t["state"]) for t in body["targets"]] == [("gpu-0", "pending")]
    assert len(callbacks) == 1
    assert api_client.get(f"/api/v1/deployments/{body['id']}/").json()["targets"][0]["state"] == "pending"


def test_it_refuses_a_deployment_to_an_unknown_host_and_writes_nothing(api_client, version):
    answer = api_client.post("/api/v1/deployments/", {"model": "iris", "version": 1, "hosts": ["nowhere"]},
                             format="json")
    assert answer.status_code == 400
    assert "nowhere" in answer.json()["detail"]
    assert not Deployment.objects.exists()


def test_it_answers_404_for_a_deployment_of_an_unknown_version(api_client, version):
    api_client.post("/api/v1/hosts/", HOST, format="json")
    answer = api_client.post("/api/v1/deployments/", {"model": "iris", "version": 9, "hosts": ["gpu-0"]},
                             format="json")
    assert answer.status_code == 404
    assert not Deployment.objects.exists()


@pytest.fixture
def target(version) -> DeploymentTarget:
    host = ServingHost.objects.create(name="gpu-0", inference_url="http://gpu-0:8000")
    deployment = Deployment.objects.create(model=version.model, version=version)
    return DeploymentTarget.objects.create(deployment=deployment, host=host)


def test_a_target_moves_forward_and_records_each_change(target):
    assert transition(target.pk, TargetState.STAGING)
    assert transition(target.pk, TargetState.LOADING)
    assert transition(target.pk, TargetState.READY, details={"load_seconds": 1.5})
    target.refresh_from_db()
    assert target.state == TargetState.READY and target.details == {"load_seconds": 1.5}
    assert list(TargetEvent.objects.values_list("to_state", flat=True)) == ["staging", "loading", "ready"]
    assert advance_rollout(target.deployment_id) == "succeeded"


def test_a_repeated_report_is_a_no_op(target):
    transition(target.pk, TargetState.STAGING)
    assert transition(target.pk, TargetState.STAGING) is False
    assert TargetEvent.objects.count() == 1


def test_a_finished_target_refuses_to_move_back(target):
    transition(target.pk, TargetState.FAILED, message="Triton said no")
    with pytest.raises(IllegalTransition):
        transition(target.pk, TargetState.LOADING)
    record_target_progress(target.pk, TargetState.LOADING)  # a late report is ignored
    target.refresh_from_db()
    assert (target.state, target.error) == (TargetState.FAILED, "Triton said no")
    assert advance_rollout(target.deployment_id) == "failed"


@pytest.mark.parametrize("field", ["inference_url", "metrics_url"])
def test_it_refuses_a_second_host_on_the_same_endpoint(api_client, field):
    api_client.post("/api/v1/hosts/", HOST, format="json")
    twin = {**HOST, "name": "gpu-9", "inference_url": "http://gpu-9:8000", "metrics_url": "http://gpu-9:8002/metrics",
            field: HOST[field]}
    answer = api_client.post("/api/v1/hosts/", twin, format="json")
    assert answer.status_code == 409 and "already uses" in answer.json()["detail"]


def test_a_host_is_deleted_unless_a_deployment_runs_there(api_client, version):
    api_client.post("/api/v1/hosts/", HOST, format="json")
    created = api_client.post("/api/v1/deployments/", {"model": "iris", "version": 1, "hosts": ["gpu-0"]},
                              format="json").json()
    refused = api_client.delete("/api/v1/hosts/gpu-0/")
    assert refused.status_code == 409 and "in progress" in refused.json()["detail"]
    transition(DeploymentTarget.objects.get(deployment_id=created["id"]).pk, TargetState.FAILED, message="x")
    assert api_client.delete("/api/v1/hosts/gpu-0/").status_code == 204
    assert not ServingHost.objects.exists()
    assert Deployment.objects.filter(pk=created["id"]).exists()
    assert api_client.delete("/api/v1/hosts/gpu-0/").status_code == 404


def test_a_host_that_serves_a_model_is_not_deleted(api_client, version):
    api_client.post("/api/v1/hosts/", HOST, format="json")
    created = api_client.post("/api/v1/deployments/", {"model": "iris", "version": 1, "hosts": ["gpu-0"]},
                              format="json").json()
    transition(DeploymentTarget.objects.get(deployment_id=created["id"]).pk, TargetState.READY)
    refused = api_client.delete("/api/v1/hosts/gpu-0/")
    assert refused.status_code == 409 and "serves iris" in refused.json()["detail"]
    assert ServingHost.objects.filter(name="gpu-0").exists()


def test_an_administrator_marks_a_host_production_and_the_change_is_audited(api_client):
    from audit.models import AuditEvent

    assert api_client.post("/api/v1/hosts/", HOST, format="json").json()["production"] is False
    answer = api_client.patch("/api/v1/hosts/gpu-0/", {"production": True, "labels": {"pool": "a100"}}, format="json")
    assert answer.status_code == 200 and answer.json()["production"] is True
    host = ServingHost.objects.get(name="gpu-0")
    assert host.production and host.labels == {"pool": "a100"}
    event = AuditEvent.objects.get(action="host.updated")
    assert event.data["before"] == {"production": False, "labels": {}, "load_deadline": None, "unload_deadline": None}
    assert event.data["after"]["production"] is True
    bad = api_client.patch("/api/v1/hosts/gpu-0/", {"labels": {"pool": ["a", "b"]}}, format="json")
    assert bad.status_code == 400 and ServingHost.objects.get(name="gpu-0").labels == {"pool": "a100"}
    assert api_client.patch("/api/v1/hosts/nowhere/", {"production": True}, format="json").status_code == 404


@pytest.mark.parametrize("taken,spelling", [
    ("http://127.0.0.1:8000", "http://127.1:8000"),
    ("http://127.0.0.1:8000", "http://127.000.000.001:8000/"),
    ("http://127.0.0.1:8000", "HTTP://LOCALHOST:8000"),
    ("http://127.0.0.1:8000", "http://[::ffff:127.0.0.1]:8000"),
    ("http://127.0.0.1:8000", "http://2130706433:8000"),
    ("http://gpu-0:80", "http://GPU-0"),
    ("https://gpu-0", "https://gpu-0:443/"),
])
def test_two_hosts_on_one_endpoint_conflict_however_it_is_spelt(api_client, taken, spelling):
    first = api_client.post("/api/v1/hosts/", {"name": "first", "inference_url": taken}, format="json")
    assert first.status_code == 201, first.content
    answer = api_client.post("/api/v1/hosts/", {"name": "second", "inference_url": spelling}, format="json")
    assert answer.status_code == 409, answer.content
    assert "first" in answer.json()["detail"]


@pytest.mark.parametrize("url,says", [
    ("http://gpu-0:8000/v2", "no path"),
    ("http://gpu-0:8000?x=1", "query or a fragment"),
    ("http://gpu-0:8000#top", "query or a fragment"),
    ("http://user:pw@gpu-0:8000", "credentials"),
    ("http://gpu-0:99999", "invalid port"),
    ("ftp://gpu-0", "http:// or https://"),
])
def test_a_host_url_with_more_than_scheme_host_and_port_is_refused(api_client, url, says):
    answer = api_client.post("/api/v1/hosts/", {"name": "gpu-0", "inference_url": url}, format="json")
    assert answer.status_code == 400 and says in str(answer.json())


def test_host_urls_are_stored_normalised(api_client):
    answer = api_client.post("/api/v1/hosts/", {"name": "gpu-0", "inference_url": "HTTP://GPU-0.Example:80/",
                                                  "metrics_url": "http://0x7f.1:8002/metrics/"}, format="json")
    assert answer.status_code == 201, answer.content
    assert answer.json()["inference_url"] == "http://gpu-0.example"
    assert answer.json()["metrics_url"] == "http://127.0.0.1:8002/metrics"


def test_with_the_task_queue_down_a_deployment_is_a_503_that_writes_nothing(api_client, version, queue_down):
    from audit.models import AuditEvent

    ServingHost.objects.create(name="gpu-0", inference_url="http://gpu-0:8000")
    answer = api_client.post("/api/v1/deployments/", {"model": "iris", "version": 1, "hosts": ["gpu-0"]},
                             format="json")
    assert answer.status_code == 503, answer.content
    assert "task queue (Redis) does not answer" in answer.json()["detail"]
    assert "nothing was recorded" in answer.json()["detail"]
    assert not Deployment.objects.exists() and not AuditEvent.objects.filter(action="deployment.created").exists()


def test_a_queue_that_stops_after_the_check_leaves_a_running_deployment_for_the_reconciler(
        api_client, version, monkeypatch, django_capture_on_commit_callbacks, caplog):
    """The check passed, then the publish on commit failed: the answer is still the 201 of what was recorded,
    and the reconciler's pass over running rollouts is what takes its first step."""
    from kombu.exceptions import OperationalError

    from deployments.rollouts import advance_running_rollouts
    from modelyard.celery import app

    def queue_gone(*args, **kwargs):  # the queue stopped between the check and the publish: no way to time it
        raise OperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    monkeypatch.setattr(app, "send_task", queue_gone)  # deployments.enqueue publishes through it
    ServingHost.objects.create(name="gpu-0", inference_url="http://gpu-0:8000")
    with django_capture_on_commit_callbacks(execute=True):
        answer = api_client.post("/api/v1/deployments/", {"model": "iris", "version": 1, "hosts": ["gpu-0"]},
                                 format="json")
    assert answer.status_code == 201, answer.content
    assert any(record.exc_info for record in caplog.records)  # Django logged the failed publish
    deployment = Deployment.objects.get()
    assert deployment.status == "running" and deployment.targets.get().dispatched_at is None
    assert advance_running_rollouts() == 1
    assert deployment.targets.get().dispatched_at is not None  # its first batch went out


def test_with_the_task_queue_down_an_unload_is_a_503_that_changes_nothing(api_client, version, queue_down):
    from audit.models import AuditEvent

    host = ServingHost.objects.create(name="gpu-0", inference_url="http://gpu-0:8000")
    deployment = Deployment.objects.create(model=version.model, version=version, status="succeeded")
    target = DeploymentTarget.objects.create(deployment=deployment, host=host, state=TargetState.READY)
    answer = api_client.post("/api/v1/hosts/gpu-0/models/iris/unload/")
    assert answer.status_code == 503 and "the unload was not started" in answer.json()["detail"]
    target.refresh_from_db()
    assert target.state == TargetState.READY and not AuditEvent.objects.filter(action="host_model.unloaded").exists()


def test_deleting_a_host_removes_its_broker_keys_and_keeps_the_other_hosts(api_client, broker,
                                                                           django_capture_on_commit_callbacks):
    """Each key is written by the code that writes it in production: the heartbeat request (the queue and
    its binding), the agent's lock, work record and start time, its profile and replay locks, and the
    reconciler's back-off."""
    from deployments.reconcile import _first_repair_in_backoff
    from deployments.tasks import request_heartbeats
    from modelyard_agent import coordination

    for name, url in (("gpu-0", "http://gpu-0:8000"), ("gpu-1", "http://gpu-1:8000")):
        ServingHost.objects.create(name=name, inference_url=url)
    assert request_heartbeats() == 2
    for name in ("gpu-0", "gpu-1"):
        assert coordination.host_model_lock(name, "iris").acquire(blocking=False)
        assert coordination.host_job_lock("profile", name, 60).acquire(blocking=False)
        assert coordination.host_job_lock("replay", name, 60).acquire(blocking=False)
        assert _first_repair_in_backoff(name, "iris")
        broker.hset(coordination.working_key(name), "task-1", "{}")
        broker.set(coordination.started_key(name), "1")
    before = {key.decode() for key in broker.keys("*")}
    assert {"host.gpu-0", "_kombu.binding.host.gpu-0", "modelyard:lock:gpu-0:iris"} <= before

    with django_capture_on_commit_callbacks(execute=True):
        assert api_client.delete("/api/v1/hosts/gpu-0/").status_code == 204
    after = {key.decode() for key in broker.keys("*")}
    assert [key for key in after if "gpu-0" in key] == []
    assert {key for key in before if "gpu-1" in key} <= after
