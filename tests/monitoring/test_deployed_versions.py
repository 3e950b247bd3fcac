"""What the fleet overview lists as served: each (model, version) with its hosts, read from the newest
ready target per host and model, loading only the columns it shows (no JSON field of a target, host or
version is read: on a fleet of hundreds their decoding cost more than Prometheus's answers)."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from deployments.choices import DeploymentStatus, TargetState
from deployments.models import Deployment, DeploymentTarget, ServingHost
from monitoring.services import deployed_versions
from registry.models import ModelVersion, RegisteredModel

pytestmark = pytest.mark.django_db


def test_the_overview_lists_what_each_host_serves_now_reading_no_json_column():
    iris = RegisteredModel.objects.create(name="iris")
    versions = {n: ModelVersion.objects.create(model=iris, version=n, format="triton", artifact_key=f"k{n}",
                                               artifact_sha256=f"{n}" * 64, artifact_size=1,
                                               signature={"inputs": [{"name": "input"}]}, metadata={"a": "b"})
                for n in (1, 2)}
    hosts = [ServingHost.objects.create(name=f"gpu-{n}", inference_url=f"http://gpu-{n}:8000",
                                        last_heartbeat_at=timezone.now(), heartbeat={"runtime_live": True})
             for n in range(3)]
    for version, on in ((versions[1], hosts), (versions[2], hosts[:1])):  # v2 replaced v1 on gpu-0
        deployment = Deployment.objects.create(model=iris, version=version, status=DeploymentStatus.SUCCEEDED)
        for host in on:
            DeploymentTarget.objects.create(deployment=deployment, host=host, state=TargetState.READY,
                                            details={"footprint_bytes": {"gpu": 1}})
    with CaptureQueriesContext(connection) as captured:
        found = deployed_versions()
    assert found == [{"model": "iris", "version": "1", "hosts": ["gpu-1", "gpu-2"], "on_demand": []},
                     {"model": "iris", "version": "2", "hosts": ["gpu-0"], "on_demand": []}]
    read = " ".join(query["sql"] for query in captured)
    for column in ("heartbeat", "details", "signature", "metadata", "config_overrides"):
        assert f'."{column}"' not in read, column


def test_beside_an_active_canary_the_stable_version_its_hosts_kept_is_served_too():
    from deployments.choices import CanaryState

    iris = RegisteredModel.objects.create(name="iris")
    v1, v2 = (ModelVersion.objects.create(model=iris, version=n, format="triton", artifact_key=f"k{n}",
                                          artifact_sha256=f"{n}" * 64, artifact_size=1) for n in (1, 2))
    hosts = [ServingHost.objects.create(name=f"gpu-{n}", inference_url=f"http://gpu-{n}:8000") for n in range(2)]
    stable = Deployment.objects.create(model=iris, version=v1, status=DeploymentStatus.SUCCEEDED)
    for host in hosts:
        DeploymentTarget.objects.create(deployment=stable, host=host, state=TargetState.READY)
    canary = Deployment.objects.create(model=iris, version=v2, status=DeploymentStatus.SUCCEEDED,
                                       canary_percent=10, canary_state=CanaryState.ACTIVE)
    DeploymentTarget.objects.create(deployment=canary, host=hosts[0], state=TargetState.READY, previous_version=v1)

    # Before: gpu-0's newest target was the canary's, so v1 read "not deployed now" there.
    assert deployed_versions() == [{"model": "iris", "version": "1", "hosts": ["gpu-0", "gpu-1"], "on_demand": []},
                                   {"model": "iris", "version": "2", "hosts": ["gpu-0"], "on_demand": []}]

    # Promoted: the canary is the only version on gpu-0 (v1 unloaded there), whatever previous_version says.
    Deployment.objects.filter(pk=canary.pk).update(canary_state=CanaryState.PROMOTED)
    assert deployed_versions() == [{"model": "iris", "version": "1", "hosts": ["gpu-1"], "on_demand": []},
                                   {"model": "iris", "version": "2", "hosts": ["gpu-0"], "on_demand": []}]
