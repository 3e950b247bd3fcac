"""Answers the API fuzzer found breaking the OpenAPI schema or failing with 500, checked one by one.

Each request goes through the same checks as tests/test_api_fuzzing.py (no undocumented 5xx, the
body matches the schema of its status).
"""

import datetime

import pytest
from django.contrib.auth import get_user_model

from demo.iris import build_iris_archive
from deployments import hosts, rollouts
from deployments import services as deployment_services
from deployments.choices import TargetState
from deployments.models import DeploymentTarget
from registry.aliases import set_alias
from registry.registered_models import create_model, get_model
from registry.versions import register_version
from tests.factories import token_for
from tests.fuzzing import call_and_check

pytestmark = pytest.mark.django_db


@pytest.fixture
def token(db) -> str:
    staff = get_user_model().objects.create_user(username="admin", is_staff=True)
    return token_for(staff)


@pytest.fixture
def iris_v1(s3_endpoint, tmp_path):
    """Model iris and its version 1, registered by no user (as the seed or a deleted account leaves
    them) and without a CI run URL."""
    model = create_model(name="iris")
    archive = build_iris_archive(tmp_path / "iris.tar.gz")
    return register_version(model=model, artifact_path=archive, filename="iris.tar.gz")


def test_objects_with_no_creator_and_events_with_no_model_answer_as_the_schema_says(token, iris_v1):
    set_alias(model_name="iris", alias="production", version=1)
    hosts.register_host(name="gpu-1", inference_url="http://127.0.0.1:9/")
    deployment = deployment_services.create_rollout(
        model_version=iris_v1, hosts=[hosts.get_host("gpu-1")], trigger="reconciler")

    audit = call_and_check("GET", "/api/v1/audit/", token=token).json()["results"]
    assert any(event["model"] is None for event in audit)  # the host's registration
    model = call_and_check("GET", "/api/v1/models/{name}/", token=token, path_parameters={"name": "iris"}).json()
    version = call_and_check("GET", "/api/v1/models/{model_name}/versions/{version}/", token=token,
                             path_parameters={"model_name": "iris", "version": 1}).json()
    alias = call_and_check("GET", "/api/v1/models/{model_name}/aliases/", token=token,
                           path_parameters={"model_name": "iris"}).json()[0]
    rollout = call_and_check("GET", "/api/v1/deployments/{id}/", token=token,
                             path_parameters={"id": deployment.pk}).json()
    assert model["created_by"] is None and version["created_by"] is None
    assert version["ci_run_url"] == ""
    assert alias["updated_by"] is None and rollout["created_by"] is None


def test_a_deployment_id_that_is_not_a_number_is_not_found(token):
    for action in ("pause", "resume", "cancel", "rollback"):
        answer = call_and_check("POST", f"/api/v1/deployments/{{id}}/{action}/", token=token,
                                path_parameters={"id": "\u00ad5\u00b9"})
        assert answer.status_code == 404


def test_a_rollback_answers_the_list_of_rollback_deployments_as_documented(token, iris_v1):
    hosts.register_host(name="gpu-1", inference_url="http://127.0.0.1:9/")
    first = deployment_services.start_deployment(model_name="iris", version=1, host_names=["gpu-1"])
    DeploymentTarget.objects.filter(deployment=first).update(state=TargetState.READY)
    rollouts.cancel_rollout(first.pk)

    answer = call_and_check("POST", "/api/v1/deployments/{id}/rollback/", token=token,
                            path_parameters={"id": first.pk})
    assert answer.status_code == 200 and isinstance(answer.json(), list)


@pytest.mark.parametrize("path, parameter", [
    ("/api/v1/audit/", "since"), ("/api/v1/audit/", "until"),
    ("/api/v1/models/", "created_before"), ("/api/v1/models/", "created_after"),
])
def test_a_time_filter_with_any_offset_or_year_is_answered_without_a_server_error(token, path, parameter):
    # +20:56 is a valid ISO 8601 offset that PostgreSQL refuses; year 1 at +01:00 is year 0 in UTC.
    for value, expected in (("0201-05-12T03:37:37+20:56", 200), ("2030-01-01T00:00:00-23:59", 200),
                            ("0001-01-01T00:30:00+01:00", 400)):
        answer = call_and_check("GET", path, token=token, query={parameter: value})
        assert answer.status_code == expected, (value, answer.content)
    assert "out of range" in str(answer.json())


def test_a_time_filter_compares_in_utc(token):
    create_model(name="iris")
    created = get_model("iris").created_at
    shifted = created.astimezone(datetime.timezone(datetime.timedelta(hours=20, minutes=56)))
    names = [m["name"] for m in call_and_check("GET", "/api/v1/models/", token=token,
                                               query={"created_after": shifted.isoformat()}).json()["results"]]
    assert names == ["iris"]
