"""Try it: an inference request to a deployed version on a real Triton, from the API and the page.

Every test runs on both routes (``deployments.inference``): through the host's real agent over the
broker, as in the production topology (docker-compose), and straight to the host's inference URL.
"""

import json
import re
import shutil

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from demo.iris import SAMPLE_INPUT, build_iris_model_dir, expected_labels
from deployments.models import Deployment, DeploymentTarget, ServingHost
from modelyard_agent.formats.triton_config import describe_signature, parse_model_config, render_load_config
from modelyard_agent.runtimes.triton import TritonRuntime
from registry.choices import ArtifactFormat
from registry.models import ModelVersion, RegisteredModel
from tests.factories import team_member

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


@pytest.fixture(params=["agent", "direct"])
def served(request, module_triton, tmp_path, settings) -> ServingHost:
    """iris v1 loaded on a real Triton (by the module's first test; the others find it loaded), and the
    registry rows that say it is deployed there; Try it goes through the host's agent (one is started) or
    straight to Triton."""
    settings.TRY_IT_ROUTE = request.param
    if request.param == "agent":
        request.getfixturevalue("start_celery_worker")("host.cpu-0")
    source = build_iris_model_dir(tmp_path / "iris", name="iris")
    config_text = (source / "config.pbtxt").read_text()
    runtime = TritonRuntime(module_triton.http_url, load_timeout=120)
    if runtime.ready_versions("iris") != [1]:
        target_dir = module_triton.model_repository / "iris"
        shutil.rmtree(target_dir, ignore_errors=True)
        target_dir.mkdir()
        shutil.copytree(source / "1", target_dir / "1")
        runtime.load("iris", render_load_config(config_text, model_name="iris", versions=[1],
                                                parameters={"EXECUTION_ENV_PATH": str(module_triton.execution_env)}))
    model = RegisteredModel.objects.create(name="iris", next_version=2)
    version = ModelVersion.objects.create(
        model=model, version=1, format=ArtifactFormat.TRITON_MODEL_DIR, artifact_key="k", artifact_sha256="0" * 64,
        artifact_size=1, config_text=config_text, signature=describe_signature(parse_model_config(config_text)),
        metadata={"sample_input": {"input": SAMPLE_INPUT}},
    )
    host = ServingHost.objects.create(name="cpu-0", inference_url=module_triton.http_url,
                                      last_heartbeat_at=timezone.now())  # its agent reports in
    deployment = Deployment.objects.create(model=model, version=version, status="succeeded")
    DeploymentTarget.objects.create(deployment=deployment, host=host, state="ready")
    return host


def test_the_api_returns_the_models_own_predictions_and_the_latency(api_client, served):
    answer = api_client.post("/api/v1/models/iris/infer/", {"host": "cpu-0", "inputs": {"input": SAMPLE_INPUT}},
                             format="json")
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert [row[0] for row in body["outputs"]["label"]] == expected_labels()
    assert body["version"] == 1 and body["shapes"]["label"] == [len(SAMPLE_INPUT), 1] and body["latency_ms"] > 0
    assert body["route"] == served_route(served) and body["route_ms"] >= body["latency_ms"]


def served_route(host: ServingHost) -> str:
    from django.conf import settings

    return settings.TRY_IT_ROUTE


def test_a_host_whose_agent_does_not_answer_is_a_503_naming_it(api_client, transactional_db, settings, monkeypatch):
    from deployments import inference

    settings.TRY_IT_ROUTE = "agent"
    monkeypatch.setattr(inference, "TRY_TIMEOUT_S", 0.5)  # no agent consumes host.silent's queue
    monkeypatch.setattr(inference, "BROKER_MARGIN_S", 0.5)
    model = RegisteredModel.objects.create(name="iris", next_version=2)
    version = ModelVersion.objects.create(model=model, version=1, format=ArtifactFormat.TRITON_MODEL_DIR,
                                          artifact_key="k", artifact_sha256="0" * 64, artifact_size=1)
    host = ServingHost.objects.create(name="silent", inference_url="http://127.0.0.1:1",
                                      last_heartbeat_at=timezone.now())  # reported, then went quiet
    DeploymentTarget.objects.create(deployment=Deployment.objects.create(model=model, version=version), host=host,
                                    state="ready")
    answer = api_client.post("/api/v1/models/iris/infer/", {"host": "silent", "inputs": {"input": SAMPLE_INPUT}},
                             format="json")
    assert answer.status_code == 503, answer.content
    assert "silent: its agent did not answer within 1 s" in answer.json()["detail"]


@pytest.mark.parametrize(("reported_s_ago", "message"), [
    (None, r"gone: its agent has never reported \(is it running\?\)"),
    # the age is read when the request comes, a second or more after the host was made on a busy machine
    (600, r"gone: its agent last reported 60\d s ago, more than 90 s \(is it running\?\)"),
])
def test_a_host_whose_agent_stopped_reporting_is_a_503_at_once_without_sending_it_a_task(
        api_client, db, settings, reported_s_ago, message):
    from deployments.enqueue import host_queue
    from modelyard.celery import broker

    settings.TRY_IT_ROUTE, settings.HOST_OFFLINE_AFTER = "agent", 90.0
    model = RegisteredModel.objects.create(name="iris", next_version=2)
    version = ModelVersion.objects.create(model=model, version=1, format=ArtifactFormat.TRITON_MODEL_DIR,
                                          artifact_key="k", artifact_sha256="0" * 64, artifact_size=1)
    last = None if reported_s_ago is None else timezone.now() - timezone.timedelta(seconds=reported_s_ago)
    host = ServingHost.objects.create(name="gone", inference_url="http://127.0.0.1:1", last_heartbeat_at=last)
    DeploymentTarget.objects.create(deployment=Deployment.objects.create(model=model, version=version), host=host,
                                    state="ready")
    queued = broker().llen(host_queue("gone"))
    answer = api_client.post("/api/v1/models/iris/infer/", {"host": "gone", "inputs": {"input": SAMPLE_INPUT}},
                             format="json")
    assert answer.status_code == 503, answer.content
    assert re.search(message, answer.json()["detail"]), answer.json()  # refused, not timed out after 15 s
    assert broker().llen(host_queue("gone")) == queued  # no task left for an agent that is not there


@pytest.mark.parametrize(
    ("request_body", "status", "message"),
    [
        ({"host": "cpu-0", "inputs": {"input": [[1.0, 2.0]]}}, 400, "cpu-0"),
        ({"host": "cpu-0", "inputs": {"pixels": [[1.0]]}}, 400, "exactly the model's inputs"),
        ({"host": "cpu-0", "inputs": {"input": [["a", "b", "c", "d"]]}}, 400, "FP32 numbers"),
        ({"host": "nowhere", "inputs": {"input": SAMPLE_INPUT}}, 404, "nowhere"),
        ({"host": "cpu-0", "version": 7, "inputs": {"input": SAMPLE_INPUT}}, 404, "no version 7"),
    ],
)
def test_bad_inputs_get_a_clear_error(api_client, served, request_body, status, message):
    answer = api_client.post("/api/v1/models/iris/infer/", request_body, format="json")
    assert answer.status_code == status, answer.content
    assert message in answer.json()["detail"]


def test_the_page_prefills_the_sample_and_shows_the_outputs(client, served):
    client.force_login(team_member(get_user_model().objects.create_user(username="ml-engineer"), "maintainer"))
    page = client.get("/deployments/try/iris/").content.decode()
    assert "5.1" in page and "cpu-0" in page  # the version's sample input, the host that serves it
    inputs = json.dumps({"input": SAMPLE_INPUT})
    answer = client.post("/deployments/try/iris/", {"host": "cpu-0", "version": "", "inputs": inputs})
    html = answer.content.decode()
    assert "v1 on cpu-0 answered in" in html
    assert str([[label] for label in expected_labels()]) in html


def test_an_input_that_overflows_to_infinity_is_refused_not_a_500(api_client, served):
    body = '{"host": "cpu-0", "inputs": {"input": [[1e400, 3.5, 1.4, 0.2]]}}'  # JSON parses 1e400 as infinity
    answer = api_client.post("/api/v1/models/iris/infer/", body, content_type="application/json")
    assert answer.status_code == 400, answer.content
    assert "not a finite number" in answer.json()["detail"]
