"""Comparing two versions: each signature change judged for the clients of the older version, the
serving config, files, lineage and offline metrics, through the API and the page; a rollout that would
break the clients of the version it replaces needs an explicit confirmation."""

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from accounts.choices import Role
from deployments.choices import TargetState
from deployments.models import Deployment, DeploymentTarget, ServingHost
from registry.compare import BREAKING, COMPATIBLE, SAME, compare_signatures
from registry.models import ModelVersion, RegisteredModel
from tests.factories import api_client_for, team_member
from tests.fixtures.services import free_port

pytestmark = pytest.mark.django_db


def tensor(name: str, data_type: str = "TYPE_FP32", dims=(-1, 4), **extra) -> dict:
    return {"name": name, "data_type": data_type, "dims": list(dims), **extra}


BASE = {"inputs": [tensor("input")], "outputs": [tensor("label", "TYPE_INT64", (-1, 1))], "max_batch_size": 8}
CONFIG = '''name: "iris"
backend: "python"
max_batch_size: 8
input [ { name: "input" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]
output [ { name: "label" data_type: TYPE_INT64 dims: [ -1, 1 ] } ]
'''


def changed(**parts) -> dict:
    return {**BASE, **parts}


@pytest.mark.parametrize("new,name,verdict", [
    (BASE, "input", SAME),
    (changed(inputs=[tensor("input", dims=(-1, -1))]), "input", COMPATIBLE),  # accepts more shapes
    (changed(inputs=[tensor("input", dims=(4, 4))]), "input", BREAKING),  # accepts fewer
    (changed(inputs=[tensor("input", dims=(-1, 4, 1))]), "input", BREAKING),  # another rank
    (changed(inputs=[tensor("input", "TYPE_FP16")]), "input", BREAKING),
    (changed(inputs=[tensor("features")]), "input", BREAKING),  # removed: requests that send it are refused
    (changed(inputs=[tensor("input"), tensor("mask")]), "mask", BREAKING),  # new required input
    (changed(inputs=[tensor("input"), tensor("mask", optional=True)]), "mask", COMPATIBLE),
    (changed(outputs=[tensor("label", "TYPE_INT64", (-1, 1)), tensor("score")]), "score", COMPATIBLE),
    (changed(outputs=[tensor("score")]), "label", BREAKING),  # clients read it
    (changed(outputs=[tensor("label", "TYPE_INT64", (4, 1))]), "label", COMPATIBLE),  # produces fewer shapes
    (changed(outputs=[tensor("label", "TYPE_INT64", (-1, -1))]), "label", BREAKING),
])
def test_each_tensor_change_is_judged_for_the_clients_of_the_older_version(new, name, verdict):
    found = compare_signatures(BASE, new)
    assert {t["name"]: t["verdict"] for t in found["tensors"]}[name] == verdict
    assert found["verdict"] == max((t["verdict"] for t in found["tensors"]),
                                   key=[SAME, COMPATIBLE, BREAKING].index)


@pytest.mark.parametrize("old,new,verdict", [(8, 8, SAME), (8, 16, COMPATIBLE), (8, 4, BREAKING),
                                             (8, 0, BREAKING), (0, 8, BREAKING)])
def test_batching_changes_are_judged_too(old, new, verdict):
    found = compare_signatures(changed(max_batch_size=old), changed(max_batch_size=new))
    assert (found["max_batch_size"]["verdict"], found["verdict"]) == (verdict, verdict)


@pytest.fixture
def iris(db):
    model = RegisteredModel.objects.create(name="iris", next_version=3)
    owner = get_user_model().objects.create_user(username="lead")
    versions = {}
    for number, signature, config, files, metrics in (
        (1, BASE, CONFIG, ["model.py", "model.onnx"], {"accuracy": 0.95}),
        (2, changed(inputs=[tensor("input", dims=(-1, 5))], max_batch_size=16),
         CONFIG.replace("max_batch_size: 8", "max_batch_size: 16\ninstance_group [ { count: 2 kind: KIND_CPU } ]\n"
                        "dynamic_batching { max_queue_delay_microseconds: 100 }"),
         ["model.py", "model.onnx", "labels.txt"], {"accuracy": 0.97, "f1": 0.9}),
    ):
        versions[number] = ModelVersion.objects.create(
            model=model, version=number, format="triton", artifact_key=f"k{number}",
            artifact_sha256=f"{number}" * 64, artifact_size=1000 * number, signature=signature, config_text=config,
            artifact_files=files, metrics=metrics, source_commit=f"{number}abc", created_by=owner)
    return versions


def test_the_api_compares_signature_config_files_lineage_and_metrics(iris, settings):
    settings.PROMETHEUS_URL = f"http://127.0.0.1:{free_port()}"  # nothing listens: the serving part says so
    viewer = api_client_for(team_member(get_user_model().objects.create_user(username="v"), Role.VIEWER))
    answer = viewer.get("/api/v1/models/iris/compare/?a=1&b=2")
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert (body["a"], body["b"], body["signature"]["verdict"]) == (1, 2, BREAKING)
    assert {t["name"]: t["why"] for t in body["signature"]["tensors"]}["input"] == (
        "dims [-1, 4] → [-1, 5]: not every input of a fits b")
    assert body["signature"]["max_batch_size"] == {"a": 8, "b": 16, "verdict": COMPATIBLE,
                                                   "why": "larger batches allowed"}
    config = {row["field"]: row for row in body["config"]}
    assert config["instance_group"]["a"] == "— (Triton's default)" and config["instance_group"]["b"] == "2 × KIND_CPU"
    assert config["dynamic_batching"]["b"] == "max_queue_delay_microseconds=100"
    assert config["backend"]["changed"] is False
    assert body["files"] == {"a_size": 1000, "b_size": 2000, "a_sha256": "1" * 64, "b_sha256": "2" * 64,
                             "same_artifact": False, "added": ["labels.txt"], "removed": [], "common": 2}
    assert {row["field"]: (row["a"], row["b"]) for row in body["lineage"]}["source_commit"] == ("1abc", "2abc")
    assert body["metrics"] == [{"name": "accuracy", "a": 0.95, "b": 0.97, "delta": pytest.approx(0.02)},
                               {"name": "f1", "a": None, "b": 0.9, "delta": None}]
    assert body["serving"] is None and "unreachable" in body["serving_error"]


@pytest.mark.parametrize("query,status,message", [
    ("a=1", 400, "b must be a version number"), ("a=1&b=x", 400, "b must be a version number"),
    ("a=1&b=9", 404, "has no version 9"),
])
def test_the_api_refuses_a_bad_pair_naming_it(iris, query, status, message):
    answer = api_client_for(team_member(get_user_model().objects.create_user(username="v"), Role.VIEWER)).get(
        f"/api/v1/models/iris/compare/?{query}")
    assert answer.status_code == status and message in answer.json()["detail"]


def test_outsiders_cannot_compare_another_teams_versions(iris):
    outsider = api_client_for(get_user_model().objects.create_user(username="stranger"))
    assert outsider.get("/api/v1/models/iris/compare/?a=1&b=2").status_code == 404
    page = Client()
    page.force_login(get_user_model().objects.get(username="stranger"))
    assert page.get("/models/iris/compare/?a=1&b=2").status_code == 404


def test_the_page_compares_the_two_newest_by_default_and_explains_a_bad_pair(iris):
    page = Client()
    page.force_login(team_member(get_user_model().objects.create_user(username="v"), Role.VIEWER))
    html = page.get("/models/iris/compare/").content.decode()
    assert "v1 → v2" in html and 'id="signature-verdict">breaking<' in html
    assert 'href="/models/iris/compare/"' in page.get("/models/iris/").content.decode()
    refused = page.get("/models/iris/compare/?a=1&b=7")
    assert refused.status_code == 400 and "iris has no version 7" in refused.content.decode()


@pytest.fixture
def serving_v1(iris):
    host = ServingHost.objects.create(name="gpu-0", inference_url="http://gpu-0:8000",
                                      last_heartbeat_at=timezone.now(), heartbeat={"runtime_live": True})
    DeploymentTarget.objects.create(deployment=Deployment.objects.create(model=iris[1].model, version=iris[1]),
                                    host=host, state=TargetState.READY)
    return host


def test_a_rollout_that_breaks_the_clients_of_the_version_it_replaces_needs_a_confirmation(serving_v1, iris):
    owner = api_client_for(team_member(get_user_model().objects.get(username="lead"), Role.OWNER))
    refused = owner.post("/api/v1/deployments/", {"model": "iris", "version": 2, "hosts": ["gpu-0"]}, format="json")
    assert refused.status_code == 409
    assert ("v2 breaks the signature of the version it replaces: v1 on gpu-0: input input: dims [-1, 4] → [-1, 5]"
            in refused.json()["detail"])
    assert Deployment.objects.count() == 1
    confirmed = owner.post("/api/v1/deployments/", {"model": "iris", "version": 2, "hosts": ["gpu-0"],
                                                    "confirm_breaking": True}, format="json")
    assert confirmed.status_code == 201 and Deployment.objects.count() == 2
    again = owner.post("/api/v1/deployments/", {"model": "iris", "version": 1, "hosts": ["gpu-0"]}, format="json")
    assert again.status_code == 201  # v1 replaces v1 there: nothing breaks


def test_the_rollout_form_warns_and_starts_only_once_confirmed(serving_v1, iris):
    page = Client()
    page.force_login(team_member(get_user_model().objects.get(username="lead"), Role.OWNER))
    form = {"version": "2", "hosts": ["gpu-0"], "batch_size": "1", "failure_policy": "pause"}
    warned = page.post("/deployments/new/iris/", form)
    assert warned.status_code == 200
    assert "breaks the signature of the version it replaces" in warned.content.decode()
    assert Deployment.objects.count() == 1
    started = page.post("/deployments/new/iris/", {**form, "confirm_breaking": "on"})
    assert started.status_code == 302 and Deployment.objects.count() == 2


def test_the_compare_page_costs_the_same_queries_for_two_versions_or_twelve(iris):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    page = Client()
    page.force_login(team_member(get_user_model().objects.create_user(username="v"), Role.VIEWER))

    def count() -> int:
        with CaptureQueriesContext(connection) as queries:
            assert page.get("/models/iris/compare/?a=1&b=2").status_code == 200
        return len(queries)

    few = count()
    for number in range(3, 13):
        ModelVersion.objects.create(model=iris[1].model, version=number, format="triton", artifact_key=f"k{number}",
                                    artifact_sha256=f"{number:064d}", artifact_size=1, config_text=CONFIG)
    assert count() == few
