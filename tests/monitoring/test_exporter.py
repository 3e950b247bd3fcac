"""The app's own /metrics: values computed per scrape from the database and the Celery broker."""

import uuid
from collections import Counter

import pytest
import redis
from django.db import connection
from django.test.utils import CaptureQueriesContext
from prometheus_client.parser import text_string_to_metric_families

from deployments.choices import DeploymentStatus, TargetState
from deployments.models import Deployment, DeploymentTarget, ServingHost
from monitoring.exporter import PRIORITY_SEPARATOR, STEP_BUCKETS_SECONDS
from registry.choices import VersionStatus
from registry.models import ModelVersion, RegisteredModel
from tests.fixtures.services import TEST_BROKER_URL, free_port

pytestmark = pytest.mark.django_db

MAX_QUERIES_PER_SCRAPE = 6


@pytest.fixture(autouse=True)
def test_broker(settings):
    """Every scrape in these tests reads the test broker database, never a developer's queues."""
    settings.CELERY_BROKER_URL = TEST_BROKER_URL
    settings.METRICS_TOKEN = ""
    return redis.Redis.from_url(TEST_BROKER_URL)


def make_model(name: str, versions: int = 1, deleted: int = 0) -> RegisteredModel:
    model = RegisteredModel.objects.create(name=name, next_version=versions + deleted + 1)
    for number in range(1, versions + deleted + 1):
        ModelVersion.objects.create(
            model=model, version=number, format="triton",
            status=VersionStatus.DELETED if number > versions else VersionStatus.READY,
            artifact_key=f"sha256/00/{number:064d}", artifact_sha256=f"{number:064d}", artifact_size=1024,
        )
    return model


def make_host(name: str) -> ServingHost:
    return ServingHost.objects.create(
        name=name, inference_url=f"http://{name}:8000", metrics_url=f"http://{name}:8002/metrics"
    )


def make_deployment(model: RegisteredModel, targets: list[tuple[ServingHost, str, dict]],
                    status: str = DeploymentStatus.RUNNING) -> Deployment:
    deployment = Deployment.objects.create(model=model, version=model.versions.order_by("version").first(),
                                           status=status)
    for host, state, details in targets:
        DeploymentTarget.objects.create(deployment=deployment, host=host, state=state, details=details)
    return deployment


def scrape(client, **headers) -> dict[tuple[str, frozenset], float]:
    """GET /metrics, parse the exposition, return {(sample name, labels): value}."""
    answer = client.get("/metrics", **headers)
    assert answer.status_code == 200, answer.content
    assert answer["Content-Type"].startswith("text/plain; version=0.0.4")
    samples = {}
    for family in text_string_to_metric_families(answer.content.decode()):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: dict, name: str, **labels) -> float:
    return samples[(name, frozenset(labels.items()))]


def test_it_reports_models_versions_deployments_and_targets_as_the_database_holds_them(client):
    iris, digits, _wine = make_model("iris", versions=3, deleted=1), make_model("digits", 1), make_model("wine", 1)
    a, b = make_host("gpu-a"), make_host("gpu-b")
    ready, failed, pending, loading = TargetState.READY, TargetState.FAILED, TargetState.PENDING, TargetState.LOADING
    make_deployment(iris, [(a, ready, {}), (b, ready, {})], DeploymentStatus.SUCCEEDED)
    make_deployment(iris, [(a, ready, {}), (b, failed, {})], DeploymentStatus.FAILED)
    make_deployment(digits, [(a, pending, {}), (b, ready, {})])
    make_deployment(digits, [])
    make_deployment(iris, [(a, loading, {}), (b, failed, {})], DeploymentStatus.PAUSED)
    make_deployment(digits, [(b, ready, {})], DeploymentStatus.ROLLED_BACK)

    samples = scrape(client)

    assert value(samples, "modelyard_registered_models") == 3
    assert value(samples, "modelyard_model_versions", status="ready") == 5
    assert value(samples, "modelyard_model_versions", status="deleted") == 1
    expected = Counter(Deployment.objects.values_list("status", flat=True))
    assert expected == {DeploymentStatus.SUCCEEDED: 1, DeploymentStatus.FAILED: 1, DeploymentStatus.RUNNING: 2,
                        DeploymentStatus.PAUSED: 1, DeploymentStatus.ROLLED_BACK: 1}
    for status in DeploymentStatus.values:
        assert value(samples, "modelyard_deployments_total", status=status) == expected[status], status
    assert value(samples, "modelyard_deployment_targets", state="ready") == 5
    assert value(samples, "modelyard_deployment_targets", state="failed") == 2
    assert value(samples, "modelyard_deployment_targets", state="pending") == 1
    assert value(samples, "modelyard_deployment_targets", state="loading") == 1
    assert value(samples, "modelyard_deployment_targets", state="staging") == 0


def test_an_empty_registry_reports_zeros_for_every_status(client):
    samples = scrape(client)
    assert value(samples, "modelyard_registered_models") == 0
    for status in DeploymentStatus.values:
        assert value(samples, "modelyard_deployments_total", status=status) == 0
    for state in TargetState.values:
        assert value(samples, "modelyard_deployment_targets", state=state) == 0
    for step in ("stage", "load", "cutover"):
        assert value(samples, "modelyard_target_step_duration_seconds_count", step=step) == 0
        assert value(samples, "modelyard_target_step_duration_seconds_sum", step=step) == 0


def test_step_durations_form_a_cumulative_histogram_over_finished_targets(client):
    model = make_model("iris")
    hosts = [make_host(f"gpu-{i}") for i in range(5)]
    make_deployment(model, [
        (hosts[0], TargetState.READY, {"stage_seconds": 0.05, "load_seconds": 1.5, "cutover_seconds": 0.3}),
        (hosts[1], TargetState.READY, {"stage_seconds": 4, "load_seconds": 45.0, "cutover_seconds": 700}),
        # A failed load reports no load or cutover time; a malformed value is skipped.
        (hosts[2], TargetState.FAILED, {"stage_seconds": 0.2, "load_seconds": "n/a"}),
        # Targets still under way are not counted yet.
        (hosts[3], TargetState.LOADING, {"stage_seconds": 1.0}),
        (hosts[4], TargetState.PENDING, {}),
    ])

    samples = scrape(client)

    def buckets(step: str) -> list[float]:
        bounds = [f"{float(b)}" for b in STEP_BUCKETS_SECONDS] + ["+Inf"]
        return [value(samples, "modelyard_target_step_duration_seconds_bucket", step=step, le=le) for le in bounds]

    #                       0.1 0.5 1  2  5  10 30 60 120 300 600 +Inf
    assert buckets("stage") == [1, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3]
    assert buckets("load") == [0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 2]
    assert buckets("cutover") == [0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2]
    for step, count, total in (("stage", 3, 4.25), ("load", 2, 46.5), ("cutover", 2, 700.3)):
        series = buckets(step)
        assert series == sorted(series), f"{step} buckets are not cumulative"
        assert value(samples, "modelyard_target_step_duration_seconds_count", step=step) == count == series[-1]
        assert value(samples, "modelyard_target_step_duration_seconds_sum", step=step) == pytest.approx(total)


def test_queue_lengths_are_read_from_the_broker_for_default_and_every_host_queue(client, test_broker):
    suffix = uuid.uuid4().hex[:8]
    busy, idle = make_host(f"busy-{suffix}"), make_host(f"idle-{suffix}")
    keys = [busy.queue, f"{busy.queue}{PRIORITY_SEPARATOR}3", idle.queue, f"host.unregistered-{suffix}"]
    test_broker.delete(*keys)
    try:
        test_broker.rpush(busy.queue, "m1", "m2", "m3")
        test_broker.rpush(f"{busy.queue}{PRIORITY_SEPARATOR}3", "m4")  # sent with a priority
        test_broker.rpush(f"host.unregistered-{suffix}", "m5")
        default_length = test_broker.llen("default")

        samples = scrape(client)
    finally:
        test_broker.delete(*keys)

    assert value(samples, "modelyard_celery_broker_up") == 1
    assert value(samples, "modelyard_celery_queue_length", queue=busy.queue) == 4
    assert value(samples, "modelyard_celery_queue_length", queue=idle.queue) == 0
    assert value(samples, "modelyard_celery_queue_length", queue="default") >= default_length
    queues = {dict(labels)["queue"] for name, labels in samples if name == "modelyard_celery_queue_length"}
    assert queues == {"default", busy.queue, idle.queue}


def test_a_broker_that_does_not_answer_gives_broker_up_0_and_the_scrape_still_succeeds(client, settings):
    make_host("gpu-a")
    settings.CELERY_BROKER_URL = f"redis://127.0.0.1:{free_port()}/0"

    samples = scrape(client)

    assert value(samples, "modelyard_celery_broker_up") == 0
    assert not [key for key in samples if key[0] == "modelyard_celery_queue_length"]
    assert value(samples, "modelyard_registered_models") == 0


def test_metrics_are_open_without_a_configured_token(client):
    assert client.get("/metrics").status_code == 200


def test_a_configured_metrics_token_is_required_as_a_bearer_token(client, settings):
    settings.METRICS_TOKEN = "a-long-metrics-token"

    missing = client.get("/metrics")
    assert missing.status_code == 401
    assert missing["WWW-Authenticate"].startswith("Bearer")
    assert missing.json() == {"detail": "a bearer token is required", "code": "not_authenticated"}
    for header in ("Bearer wrong", "Token a-long-metrics-token"):
        wrong = client.get("/metrics", HTTP_AUTHORIZATION=header)
        assert wrong.status_code == 401 and wrong["WWW-Authenticate"].startswith("Bearer")
        assert wrong.json()["code"] == "authentication_failed" and "a-long" not in wrong.json()["detail"]

    samples = scrape(client, HTTP_AUTHORIZATION="Bearer a-long-metrics-token")
    assert value(samples, "modelyard_registered_models") == 0


def test_a_method_other_than_get_is_refused_in_the_error_envelope(client):
    refused = client.post("/metrics")
    assert refused.status_code == 405 and refused["Allow"] == "GET, HEAD"
    assert refused.json() == {"detail": "/metrics takes GET and HEAD, not POST", "code": "method_not_allowed"}
    assert client.head("/metrics").status_code == 200


def test_a_failing_scrape_answers_a_server_error_in_the_envelope(monkeypatch):
    from django.test import Client

    from monitoring import exporter

    def crash(*args, **kwargs):
        raise RuntimeError("the database went away")

    monkeypatch.setattr(exporter, "deployment_status_counts", crash)  # a fault no real scrape provokes on demand
    answer = Client(raise_request_exception=False).get("/metrics")
    assert answer.status_code == 500
    assert answer.json() == {"detail": "the server failed to answer this request; the failure is logged",
                             "code": "server_error"}


def test_the_number_of_queries_per_scrape_does_not_grow_with_the_number_of_rows(client):
    model = make_model("iris", versions=2)
    hosts = [make_host(f"gpu-{i}") for i in range(3)]

    def add_deployments(count: int) -> None:
        for i in range(count):
            state = (TargetState.READY, TargetState.FAILED, TargetState.LOADING)[i % 3]
            make_deployment(model, [(host, state, {"stage_seconds": i, "load_seconds": i / 10}) for host in hosts])

    add_deployments(2)
    with CaptureQueriesContext(connection) as few:
        scrape(client)
    add_deployments(18)
    with CaptureQueriesContext(connection) as many:
        samples = scrape(client)

    assert Deployment.objects.count() == 20
    assert sum(value(samples, "modelyard_deployments_total", status=s) for s in DeploymentStatus.values) == 20
    assert len(many) == len(few) <= MAX_QUERIES_PER_SCRAPE, [q["sql"] for q in many.captured_queries]
