"""Redis (the Celery broker) restarted in the middle of a rollout: the rollout finishes.

The broker here is a redis-server of this test's own on a free port (the machine's shared Redis is
left alone), with append-only persistence as docker-compose runs it, so queued messages survive the
restart. It is restarted while the host agent loads the new version, with two orchestrator workers taking the rollout's
steps (the control plane scaled out: docs/architecture.md, "Replicas").
"""

import time

import pytest

from deployments.models import DeploymentTarget
from tests.e2e.support import Traffic, wait_deployment
from tests.fixtures.services import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def fleet_broker(restartable_redis) -> str:
    return restartable_redis.url


@pytest.fixture
def fleet_orchestrators() -> int:
    return 2


@pytest.mark.parametrize("down_seconds", [0, 5])
def test_a_rollout_finishes_when_redis_restarts_while_the_agent_loads(one_host_fleet, restartable_redis, down_seconds):
    fleet = one_host_fleet
    with Traffic(fleet.triton.http_url) as traffic:
        rollout_id = fleet.deploy(2)
        target = DeploymentTarget.objects.get(deployment_id=rollout_id)

        def loading() -> bool:
            target.refresh_from_db()
            return target.state == "loading"

        wait_for(loading, timeout=120, what="the agent to start loading v2", interval=0.02)
        restartable_redis.stop()
        time.sleep(down_seconds)  # an outage, not a wait for a result
        restartable_redis.start()
        rollout = wait_deployment(fleet.client, rollout_id, timeout=180)
    assert rollout["status"] == "succeeded", (rollout, fleet.worker_logs())
    assert fleet.ready_versions() == [2]
    assert traffic.failures == []
