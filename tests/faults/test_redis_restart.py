"""Redis (the Celery broker) restarted in the middle of a rollout: the rollout finishes.

The broker here is a redis-server of this test's own on a free port (the machine's shared Redis is
left alone), with append-only persistence as docker-compose runs it, so queued messages survive the
restart. It is restarted while the host agent loads the new version.
"""

import shutil
import signal
import time

import pytest
import redis

from deployments.models import DeploymentTarget
from tests.e2e.support import Traffic, wait_deployment
from tests.fixtures.services import Service, _spawn, free_port, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


class RestartableRedis:
    """A redis-server on a fixed port with its append-only file in ``workdir``."""

    def __init__(self, workdir):
        self.port = free_port()
        self.workdir = workdir
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.service: Service | None = None

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not installed")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.service = _spawn("redis", [binary, "--port", str(self.port), "--bind", "127.0.0.1",
                                        "--appendonly", "yes", "--save", "", "--dir", str(self.workdir)],
                              self.workdir)
        wait_for(lambda: redis.Redis.from_url(self.url).ping(), timeout=30, what="redis-server")

    def stop(self) -> None:
        if self.service is not None:
            self.service.stop(sig=signal.SIGTERM)


@pytest.fixture
def restartable_redis(tmp_path):
    server = RestartableRedis(tmp_path / "redis")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def fleet_broker(restartable_redis) -> str:
    return restartable_redis.url


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
