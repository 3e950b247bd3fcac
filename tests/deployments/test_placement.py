"""Placement by free GPU memory against a version's measured footprint."""

import pytest
from django.utils import timezone

from deployments.models import Deployment, DeploymentTarget, ServingHost
from deployments.placement import HostCapacity, choose_hosts, plan
from modelyard.errors import InvalidInput
from registry.choices import ArtifactFormat
from registry.models import ModelVersion, RegisteredModel

GIB = 1 << 30


def test_it_picks_the_hosts_with_the_most_free_memory_that_fit():
    candidates = [HostCapacity("a", 10 * GIB), HostCapacity("b", 30 * GIB), HostCapacity("c", 3 * GIB),
                  HostCapacity("d", 30 * GIB)]
    assert plan(candidates, footprint_bytes=4 * GIB, replicas=2) == ["b", "d"]
    assert plan(candidates, footprint_bytes=4 * GIB, replicas=3) == ["b", "d", "a"]


def test_it_says_how_many_fit_when_too_few_do():
    with pytest.raises(InvalidInput, match="only 1 of 2 matching online host"):
        plan([HostCapacity("a", GIB), HostCapacity("b", None)], footprint_bytes=GIB, replicas=2)


def test_an_unmeasured_version_fits_anywhere():
    assert plan([HostCapacity("a", None), HostCapacity("b", GIB)], footprint_bytes=None, replicas=2) == ["b", "a"]


@pytest.mark.django_db
def test_a_selector_with_replicas_uses_heartbeats_when_prometheus_is_down(settings):
    settings.PROMETHEUS_URL = "http://127.0.0.1:9"  # nothing listens on the discard port
    model = RegisteredModel.objects.create(name="iris", next_version=2)
    version = ModelVersion.objects.create(model=model, version=1, format=ArtifactFormat.TRITON_MODEL_DIR,
                                          artifact_key="k", artifact_sha256="0" * 64, artifact_size=1)
    now = timezone.now()
    for name, used in (("gpu-a", 70), ("gpu-b", 10), ("gpu-c", 75), ("cpu-d", None)):
        gpus = [] if used is None else [{"gpu_uuid": "GPU-1", "memory_total": 80 * GIB, "memory_used": used * GIB}]
        ServingHost.objects.create(name=name, inference_url=f"http://{name}:8000", labels={"pool": "gpu"},
                                   last_heartbeat_at=now, heartbeat={"runtime_live": True, "gpus": gpus})
    earlier = Deployment.objects.create(model=model, version=version, status="succeeded")
    DeploymentTarget.objects.create(deployment=earlier, host=ServingHost.objects.get(name="gpu-b"), state="ready",
                                    details={"footprint_bytes": {"gpu": 8 * GIB}})
    chosen = choose_hosts(version, {"pool": "gpu"}, replicas=2)
    assert [h.name for h in chosen] == ["gpu-b", "gpu-a"]  # 70 and 10 GiB free; gpu-c has 5, cpu-d none
    with pytest.raises(InvalidInput, match="only 2 of 4"):
        choose_hosts(version, {"pool": "gpu"}, replicas=3)


def test_a_fleet_plan_charges_each_placement_against_the_hosts_free_memory():
    from deployments.placement import plan_fleet

    hosts = [HostCapacity("a", 10 * GIB), HostCapacity("b", 8 * GIB)]
    first, second, third = plan_fleet(
        [("llm", 6 * GIB, 1), ("bert", 4 * GIB, 2), ("tiny", None, 2)], hosts, batch_size=1
    )
    assert first.hosts == ("a",)  # a: 4 GiB left
    assert second.hosts == ("b", "a") and second.batches == (0, 1)  # b had 8, a 4: both still fit 4
    assert set(third.hosts) == {"a", "b"}
    with pytest.raises(InvalidInput, match="big: only 0 host"):
        plan_fleet([("big", 20 * GIB, 1)], hosts)
