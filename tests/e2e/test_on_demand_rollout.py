"""A model deployed on demand end to end: API, orchestrator and the host agent as installed (its loader in the
agent's own process), the agent's gateway in front of a real Triton. The rollout stages the version without
loading it, the first request through the gateway loads it, the heartbeat reports it REGISTERED while it is not
resident and the reconciler leaves it so; a second version of the resident model rolls as any other."""

import pytest
import requests
from django.test import override_settings

from deployments.footprints import version_footprint
from deployments.models import ServingHost
from deployments.reconcile import reconcile_fleet
from modelyard_agent.runtimes.triton import TritonRuntime
from registry.models import ModelVersion
from tests.deployments.test_gateway import BODY
from tests.e2e.support import Heartbeats, deploy_iris, gateway_stack
from tests.fixtures.services import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

HOST = "on-demand-host"


@pytest.fixture
def stack(s3_endpoint, start_triton, start_celery_worker, tmp_path):
    with gateway_stack(HOST, versions=2, s3_endpoint=s3_endpoint, start_triton=start_triton,
                       start_celery_worker=start_celery_worker, tmp_path=tmp_path,
                       agent_env={"MODELYARD_AGENT_MEMORY_BUDGET_BYTES": str(8 << 30)}) as stack:
        yield stack


def deploy(client, version: int, **fields) -> dict:
    return deploy_iris(client, HOST, version, **fields)


def reported(state: str):
    rows = ServingHost.objects.get(name=HOST).heartbeat.get("models", [])
    return {(row["name"], row["version"]) for row in rows if row.get("state") == state}


@override_settings(HEARTBEAT_INTERVAL=1.0)
def test_an_on_demand_model_is_staged_loaded_at_its_first_request_and_left_registered(stack):
    client, runtime = stack.client, TritonRuntime(stack.triton.http_url)
    with Heartbeats(interval=1.0):
        first = deploy(client, 1, residency="on_demand", cold_start_timeout=60)
        assert (first["residency"], first["pinned"], first["cold_start_timeout"]) == ("on_demand", False, 60.0)
        assert runtime.ready_versions("iris") == []  # staged, not loaded
        wait_for(lambda: reported("REGISTERED") == {("iris", 1)}, timeout=60, what="iris v1 reported REGISTERED")
        assert [r for r in reconcile_fleet() if r.host == HOST] == []  # registered is no drift

        answer = requests.post(f"{stack.gateway_url}/v2/models/iris/infer", json=BODY, timeout=90)
        assert answer.status_code == 200, answer.text
        assert answer.json()["model_version"] == "1" and runtime.ready_versions("iris") == [1]
        def residency():
            return client.get(f"/api/v1/deployments/{first['id']}/").json()["targets"][0]["residency"]

        wait_for(lambda: residency()["state"] == "resident", timeout=30, what="the API to show iris resident")
        assert residency()["pinned"] is False and residency()["failure"] is None
        assert ServingHost.objects.get(name=HOST).heartbeat["gateway"]["routes"]["iris"]["stable"] == 1
        # The loader measured version 1's load; the heartbeat brings the figure to the control plane, which sends
        # it with the version's next on-demand deployment to any host.
        def footprints():
            return ServingHost.objects.get(name=HOST).heartbeat["gateway"].get("footprints") or {}

        wait_for(lambda: "iris/1" in footprints(), timeout=30, what="iris v1's footprint in a heartbeat")
        measured = footprints()["iris/1"]
        assert set(measured) == {"cpu"} and measured["cpu"] > 1 << 20, measured
        assert version_footprint(ModelVersion.objects.get(model__name="iris", version=1)) == measured["cpu"]

        # A new version of the resident model rolls as any other: loaded beside, then the old one leaves.
        deploy(client, 2, residency="on_demand")
        assert runtime.ready_versions("iris") == [2]
        answer = requests.post(f"{stack.gateway_url}/v2/models/iris/infer", json=BODY, timeout=30)
        assert answer.status_code == 200 and answer.json()["model_version"] == "2"

        # Evicted (here: unloaded behind the agent's back): reported REGISTERED, not repaired, back at the next
        # request.
        runtime.unload("iris")
        wait_for(lambda: reported("REGISTERED") == {("iris", 2)}, timeout=60, what="iris v2 reported REGISTERED")
        assert [r for r in reconcile_fleet() if r.host == HOST] == []
        # The heartbeat reads Triton's index; the gateway learns it from the agent's reconciliation (every 2 s)
        # or from a request Triton refuses, whichever comes first: the request after that is held and loads it.
        answer = requests.post(f"{stack.gateway_url}/v2/models/iris/infer", json=BODY, timeout=90)
        if answer.status_code == 503 and "not at ready state" in answer.text:
            answer = requests.post(f"{stack.gateway_url}/v2/models/iris/infer", json=BODY, timeout=90)
        assert answer.status_code == 200 and answer.json()["model_version"] == "2", answer.text
        metrics = requests.get(f"{stack.gateway_url}/metrics", timeout=10).text
        assert 'modelyard_on_demand_requests_total{model="iris",outcome="cold"} 2' in metrics
        assert "modelyard_memory_budget_bytes 8589934592" in metrics

        # Unloaded from the host: no longer registered on demand, so its next request gets Triton's own answer
        # for a model it does not hold, and nothing loads it back.
        unloaded = client.post(f"/api/v1/hosts/{HOST}/models/iris/unload/")
        assert unloaded.status_code == 202, unloaded.content
        wait_for(lambda: runtime.ready_versions("iris") == [], timeout=60, what="iris unloaded")
        # Two requests: a model still registered would read cold after Triton refused the first (or after the
        # loader's reconciliation), and the second would load it back.
        for _ in range(2):
            after = requests.post(f"{stack.gateway_url}/v2/models/iris/infer", json=BODY, timeout=60)
            assert after.status_code != 200 and "X-Modelyard-Cold-Start" not in after.headers, after.text
        assert runtime.ready_versions("iris") == []
