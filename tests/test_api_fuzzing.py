"""Schemathesis against the OpenAPI schema: no 5xx and no answer that breaks the schema.

The schema is loaded from ``/api/schema/`` of the Django WSGI app in-process (no server). Every
operation gets generated cases (valid ones against objects that exist, valid ones with generated
path parameters, and invalid ones), sent with a staff token; each answer must not be a server
error, except a 503 the operation documents (Triton unreachable), and must match the schema of
its status when the schema has one. Generation is derandomized (a fixed seed), so a CI failure
reproduces. S3 is the moto server, Prometheus a real (empty) one; the one Triton host points at a
closed port. Each operation runs in its own savepoint, rolled back afterwards.
"""

import dataclasses
import json
import os
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.db import transaction

from accounts.tokens import issue_token
from demo.iris import build_iris_archive
from deployments import hosts
from deployments import services as deployment_services
from deployments.choices import TargetState
from deployments.models import DeploymentTarget
from registry import uploads
from registry.aliases import set_alias
from registry.registered_models import create_model, get_model
from registry.versions import register_version
from tests.factories import team_member, token_for
from tests.fixtures.services import free_port
from tests.fuzzing import FuzzWorld, fuzz_api

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

# bench/api_fuzz.py runs this test longer through these variables and reads the report it writes.
CASES_PER_OPERATION = int(os.environ.get("MODELYARD_FUZZ_CASES_PER_OPERATION", "25"))
REPORT_PATH = os.environ.get("MODELYARD_FUZZ_REPORT", "")
MIN_TOTAL_CASES = 1000


def test_every_operation_answers_without_server_errors_and_within_its_schema(fuzz_world: FuzzWorld):
    report = fuzz_api(fuzz_world, cases_per_operation=CASES_PER_OPERATION)
    if REPORT_PATH:
        Path(REPORT_PATH).write_text(json.dumps(report.as_dict(), indent=2))
    assert report.failures == {}, report.describe_failures()
    assert report.total_cases >= MIN_TOTAL_CASES, report.counts


MEMBER_CASES_PER_OPERATION = int(os.environ.get("MODELYARD_FUZZ_MEMBER_CASES_PER_OPERATION", "10"))


def test_every_operation_answers_a_team_member_without_server_errors_and_within_its_schema(fuzz_world: FuzzWorld):
    """The same checks with a maintainer's token of the team that owns ``iris``: the refusals of what only
    administrators and owners may do (403) must be documented, carry the error envelope and fit the schema."""
    member = team_member(get_user_model().objects.create_user(username="fuzz-member"), "maintainer")
    report = fuzz_api(dataclasses.replace(fuzz_world, token=token_for(member)),
                      cases_per_operation=MEMBER_CASES_PER_OPERATION)
    assert report.failures == {}, report.describe_failures()
    refused = {label for label, statuses in report.statuses.items() if statuses.get(403)}
    assert "POST /api/v1/hosts/" in refused, sorted(refused)  # registering hosts is the administrators'


@pytest.fixture
def fuzz_world(s3_endpoint, start_prometheus_with_config, tmp_path, settings) -> FuzzWorld:
    """A staff token and one of each object: model ``iris`` (version 1, alias ``production``), host
    ``local`` (Triton at a closed port), a deployment and an open upload; Prometheus real and empty."""
    prometheus = start_prometheus_with_config({"global": {"scrape_interval": "15s"}, "scrape_configs": []})
    settings.PROMETHEUS_URL = prometheus.url
    staff = get_user_model().objects.create_user(username="fuzzer", is_staff=True)
    create_model(name="iris", actor=staff)
    archive = build_iris_archive(tmp_path / "iris.tar.gz")
    version = register_version(
        model=get_model("iris"), artifact_path=archive, filename="iris.tar.gz", actor=staff)
    set_alias(model_name="iris", alias="production", version=version.version, actor=staff)
    hosts.register_host(name="local", inference_url=f"http://127.0.0.1:{free_port()}", actor=staff)
    deployment = deployment_services.start_deployment(model_name="iris", version=1, host_names=["local"],
                                                      actor=staff)
    DeploymentTarget.objects.filter(deployment=deployment).update(state=TargetState.READY)  # "served" by local
    upload = uploads.start_upload(model_name="iris", filename="big.tar.gz", size=20 * 1024 * 1024, actor=staff)
    token = token_for(staff)
    other_token, _plaintext = issue_token(user=staff, name="to-revoke", scopes=["read"])  # not the fuzzer's own
    return FuzzWorld(token=token, path_parameters={
        "/api/v1/": {"model_name": "iris", "name": "iris", "version": 1, "alias": "production",
                     "id": deployment.pk, "upload_id": str(upload.pk)},
        "/api/v1/hosts/": {"name": "local", "model_name": "iris"},
        "/api/v1/tokens/": {"id": other_token.pk},
    }, bodies={
        "POST /api/v1/tokens/": {"name": "fuzz", "scopes": ["read", "write"]},
        "POST /api/v1/models/{model_name}/infer/": {"host": "local", "inputs": {"input": [[5.1, 3.5, 1.4, 0.2]]}},
        "POST /api/v1/deployments/": {"model": "iris", "version": 1, "hosts": ["local"]},
        "POST /api/v1/hosts/": {"name": "other", "inference_url": "http://127.0.0.1:9/"},
        "POST /api/v1/models/{model_name}/uploads/": {"filename": "iris.onnx", "size": 1000},
        "PUT /api/v1/models/{model_name}/aliases/{alias}/": {"version": 1},
    })


STATEFUL_SCENARIOS = int(os.environ.get("MODELYARD_FUZZ_STATEFUL_SCENARIOS", "25"))


def test_chains_of_operations_answer_without_server_errors_and_within_their_schema(fuzz_world: FuzzWorld):
    """Stateful: schemathesis chains operations along the links it finds between them (create, then
    read, change and delete what was created), with the same checks as above."""
    from hypothesis import HealthCheck, Phase
    from hypothesis import settings as hypothesis_settings

    from tests.fuzzing import CHECKS, load_schema, shared_connection

    headers = {"Authorization": f"Token {fuzz_world.token}"}
    calls: list[tuple[str, int]] = []
    with shared_connection():
        schema = load_schema()
        machine = schema.as_state_machine()
        transitions = schema.statistic.transitions.total  # links schemathesis inferred between operations

        class Chains(machine):
            def get_call_kwargs(self, case):
                return {"headers": headers}

            def after_call(self, response, case):
                calls.append((case.operation.label, response.status_code))

            def validate_response(self, response, case, additional_checks=None, **kwargs):
                case.validate_response(response, checks=CHECKS, headers=headers)

        with transaction.atomic():
            try:
                Chains.run(settings=hypothesis_settings(
                    max_examples=STATEFUL_SCENARIOS, derandomize=True, database=None, deadline=None,
                    stateful_step_count=6, suppress_health_check=list(HealthCheck),
                    phases=[Phase.generate]))
            finally:
                transaction.set_rollback(True)
    chained = {label for label, _status in calls}
    print(f"stateful: {len(calls)} calls over {len(chained)} operations along {transitions} links")
    assert transitions > 0
    # Chains reach operations on a created or existing object (a path parameter taken from an
    # earlier answer); which ones depends on what the chains created first.
    assert calls and any("{" in label for label in chained), sorted(chained)
