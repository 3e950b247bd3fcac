"""The idle-unload and autoscale policies, judged on a real Prometheus.

A Triton exposition serves three models with known counters: ``busy`` answers 50 requests/s that
each wait 40 ms in the queue, ``calm`` answers 50 requests/s with 0.5 ms of queueing, and ``idle``
answered requests long ago and none since. Prometheus holds two minutes of that history (written
with promtool) and keeps scraping it.
"""

import time

import pytest
from django.test import override_settings
from django.utils import timezone

from deployments.autoscale import autoscale_fleet, decide
from deployments.choices import RolloutTrigger, TargetState
from deployments.lifecycle import unload_idle_models
from deployments.models import Deployment, DeploymentTarget, ServingHost
from monitoring.prometheus import PrometheusClient
from registry.choices import ArtifactFormat
from registry.models import ModelVersion, RegisteredModel
from tests.fixtures.expositions import ServedExposition
from tests.fixtures.services import launch_prometheus, wait_for
from tests.monitoring.synthetic import write_history

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

HOST = "gpu-a"
# model: (requests per second, queue µs per request)
RATES = {"busy": (50, 40_000), "calm": (50, 500), "idle": (0, 0)}
BOUNDS = {"min_instances": 1, "max_instances": 3, "queue_ms_high": 20, "queue_ms_low": 2}


def exposition(started: float, at: float | None = None) -> str:
    t = (time.time() if at is None else at) - started
    lines = []
    for name in ("request_success", "request_failure", "queue_duration_us", "count"):
        lines.append(f"# TYPE nv_inference_{name} counter")
        for model, (rps, queue_us) in RATES.items():
            done = 1000 if model == "idle" else rps * t  # idle: 1000 requests before, none since
            value = {"request_success": done, "request_failure": 0, "count": done,
                     "queue_duration_us": done * queue_us}[name]
            lines.append(f'nv_inference_{name}{{model="{model}",version="1"}} {value:.3f}')
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("policies")
    started = time.time() - 600
    served = ServedExposition(lambda: exposition(started))
    tsdb = workdir / "tsdb"
    tsdb.mkdir()
    write_history(tsdb, [(lambda t: exposition(started, t), {"job": "serving", "instance": served.target,
                                                            "host": HOST})],
                  seconds=180, end=time.time(), step=1)
    config = {"global": {"scrape_interval": "1s"}, "scrape_configs": [{"job_name": "serving", "static_configs": [
        {"targets": [served.target], "labels": {"host": HOST}}]}]}
    service = launch_prometheus(config, workdir, tsdb)
    client = PrometheusClient(service.url)
    wait_for(lambda: len(client.instant('count by (model)(nv_inference_request_success{host="gpu-a"})')) == 3,
             timeout=40, what="Prometheus to hold the models' series")
    yield client
    service.stop()
    served.stop()


def serve(model: str, *, instances: int | None = None, autoscale=None, minutes_ago: float = 10) -> DeploymentTarget:
    host, _ = ServingHost.objects.get_or_create(name=HOST, defaults={"inference_url": "http://gpu-a:8000"})
    registered = RegisteredModel.objects.create(name=model, next_version=2)
    config = 'backend: "python"\ninput [{ name: "x", data_type: TYPE_FP32, dims: [1] }]\n' \
             'output [{ name: "y", data_type: TYPE_FP32, dims: [1] }]\n'
    version = ModelVersion.objects.create(model=registered, version=1, format=ArtifactFormat.TRITON_MODEL_DIR,
                                          artifact_key=f"k-{model}", artifact_sha256="0" * 64, artifact_size=1,
                                          config_text=config)
    overrides = {"instance_group": [{"count": instances, "kind": "KIND_CPU"}]} if instances else {}
    deployment = Deployment.objects.create(model=registered, version=version, status="succeeded",
                                           config_overrides=overrides, autoscale=autoscale or {})
    target = DeploymentTarget.objects.create(deployment=deployment, host=host, state=TargetState.READY)
    DeploymentTarget.objects.filter(pk=target.pk).update(updated_at=timezone.now() - timezone.timedelta(
        minutes=minutes_ago))
    target.refresh_from_db()
    return target


@override_settings(IDLE_UNLOAD_AFTER=60)
def test_a_model_that_served_nothing_for_the_window_is_unloaded_and_busy_ones_stay(prometheus,
                                                                                    django_capture_on_commit_callbacks):
    for model in ("busy", "idle"):
        serve(model)
    serve("never-scraped")  # no series at all: unknown, not idle
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        assert unload_idle_models(client=prometheus) == [(HOST, "idle")]
    assert len(callbacks) == 1  # the agent's unload, once committed
    states = dict(DeploymentTarget.objects.values_list("deployment__model__name", "state"))
    assert states == {"busy": "ready", "idle": "unloaded", "never-scraped": "ready"}


@override_settings(AUTOSCALE_WINDOW=60)
def test_the_autoscaler_adds_an_instance_while_requests_queue_and_removes_one_when_they_do_not(
    prometheus, django_capture_on_commit_callbacks
):
    serve("busy", instances=1, autoscale=BOUNDS)
    serve("calm", instances=3, autoscale=BOUNDS)
    serve("idle", instances=2)  # no bounds: never touched
    with django_capture_on_commit_callbacks(execute=False):
        decisions = {d.model: d for d in autoscale_fleet(client=prometheus)}
    assert set(decisions) == {"busy", "calm"}
    assert (decisions["busy"].instances_before, decisions["busy"].instances_after) == (1, 2)
    assert decisions["busy"].queue_ms == pytest.approx(40, rel=0.05)
    assert (decisions["calm"].instances_before, decisions["calm"].instances_after) == (3, 2)
    scale_up = Deployment.objects.get(pk=decisions["busy"].deployment_id)
    assert scale_up.trigger == RolloutTrigger.AUTOSCALE
    assert scale_up.config_overrides["instance_group"] == [{"count": 2, "kind": "KIND_CPU"}]
    with django_capture_on_commit_callbacks(execute=False):
        assert autoscale_fleet(client=prometheus) == []  # rollouts in flight: no second change


def test_decisions_stay_within_the_bounds():
    assert decide(3, 500, BOUNDS) == 3  # at max_instances already
    assert decide(1, 0, BOUNDS) == 1  # at min_instances already
    assert decide(2, 10, BOUNDS) == 2  # between the marks
