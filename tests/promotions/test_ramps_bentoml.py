"""Progressive rollouts of a canary on BentoML hosts: each version runs in its own ``bentoml serve`` process,
whose series carry no version themselves; the version comes from the process's scrape target. A real
Prometheus holds those series (``tests.promotions.support.bento_exposition``), health probes included, and
the ramp must judge the canary on its own process's requests, errors and latency histogram."""

import pytest

from deployments.choices import CanaryState, Runtime
from deployments.models import ServingHost
from promotions.choices import Decision
from registry.choices import ArtifactFormat
from tests.promotions.support import FedPrometheus, bento_exposition
from tests.promotions.test_ramps import HOSTS, ramp_policy, run

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


@pytest.fixture(scope="module")
def bento_prometheus(tmp_path_factory):
    """A real Prometheus holding the four versions' BentoML series (one per module)."""
    fed = FedPrometheus(tmp_path_factory.mktemp("bento-ramps"), source=bento_exposition,
                        ready_query='count by (version)(bentoml_service_request_total{model="iris"})')
    yield fed
    fed.stop()


@pytest.fixture
def bento_hosts(db):
    """The two production hosts, as BentoML hosts."""
    for name in HOSTS:
        ServingHost.objects.create(name=name, runtime=Runtime.BENTOML, inference_url=f"http://{name}:3000")


def test_a_bentoml_canary_climbs_a_step_on_its_own_process_metrics(bento_prometheus, bento_hosts):
    policy, canary = ramp_policy(candidate=2, artifact_format=ArtifactFormat.BENTOML_MODEL)
    evaluation = run(policy, bento_prometheus)
    canary.refresh_from_db()
    assert (evaluation.decision, canary.canary_percent) == (Decision.ADVANCED, 25.0), evaluation.reason
    candidate, target = evaluation.metrics["candidate"], evaluation.metrics["target"]
    assert (candidate["version"], target["version"]) == (2, 1)
    # 20 requests/s of /classify in the 60 s window; the /readyz probes (1/s) are not requests.
    assert candidate["requests"] == pytest.approx(1200, rel=0.05)
    assert candidate["error_rate"] == 0
    assert candidate["latency_p95_ms"] == pytest.approx(10.5, rel=0.01)  # histogram_quantile of its own process


def test_a_bentoml_canary_that_errs_and_is_slow_is_held_and_rolled_back_when_the_policy_says_so(
        bento_prometheus, bento_hosts):
    policy, canary = ramp_policy(candidate=3, percent=25, artifact_format=ArtifactFormat.BENTOML_MODEL)
    evaluation = run(policy, bento_prometheus)
    canary.refresh_from_db()
    assert evaluation.decision == Decision.HELD and "the canary stays at 25 %" in evaluation.reason
    assert evaluation.metrics["candidate"]["error_rate"] == pytest.approx(0.05, rel=0.05)
    assert evaluation.metrics["candidate"]["latency_p95_ms"] == pytest.approx(30.0, rel=0.01)
    assert (canary.canary_percent, canary.canary_state) == (25.0, CanaryState.ACTIVE)

    policy.ramp_on_failure = "rollback"
    policy.save(update_fields=["ramp_on_failure"])
    evaluation = run(policy, bento_prometheus)
    canary.refresh_from_db()
    assert evaluation.decision == Decision.ROLLED_BACK, evaluation.reason
    assert canary.canary_state == CanaryState.ROLLED_BACK
