"""Shared fixtures: users and API clients, plus the service fixtures in tests/fixtures."""

from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from tests.factories import token_for
from tests.fixtures.services import traversable

pytest_plugins = [
    "tests.fixtures.services", "tests.fixtures.triton", "tests.fixtures.bentos", "tests.fixtures.expositions",
    "tests.fixtures.netns", "tests.fixtures.on_demand", "tests.fixtures.redis_server", "tests.fixtures.wheels",
    "tests.plugins.census",
    "tests.plugins.tiers", "tests.plugins.timing", "tests.plugins.order", "tests.plugins.envelope",
]

@pytest.fixture(autouse=True, scope="session")
def shipped_password_hashers() -> list[str]:
    """Hash test passwords with MD5 and yield the hashers the project ships (Django's defaults).

    The shipped PBKDF2 hasher spends ~0.3-0.6 s per hash on a 2-core machine, and the suite creates and
    logs in users thousands of times. The login form, the backend and the token checks stay real;
    ``test_passwords_are_kept_with_the_shipped_hasher_and_a_user_logs_in_with_one`` puts the shipped
    hashers back to check them."""
    from django.conf import settings

    shipped = list(settings.PASSWORD_HASHERS)
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    yield shipped
    settings.PASSWORD_HASHERS = shipped


@pytest.fixture
def tmp_path(tmp_path: Path) -> Path:
    """pytest's own per-test directory, made ``traversable``."""
    return traversable(tmp_path)


@pytest.fixture(autouse=True, scope="session")
def _test_broker():
    """Point the in-process Celery apps (the orchestrator's and the host agent's) at the test broker
    before anything publishes."""
    from modelyard.celery import app
    from modelyard_agent.worker import app as agent_app
    from tests.fixtures.services import TEST_BROKER_URL

    app.conf.broker_url = agent_app.conf.broker_url = TEST_BROKER_URL
    yield


@pytest.fixture
def queue_down():
    """The task queue's address pointed at a port where no Redis listens (a refused connection, for real); yields
    the real address, to bring the queue back within a test."""
    from modelyard.celery import app
    from tests.fixtures.services import free_port

    kept = app.conf.broker_url
    app.conf.broker_url = f"redis://127.0.0.1:{free_port()}/0"
    yield kept
    app.conf.broker_url = kept


@pytest.fixture
def broker():
    """A client of the test broker's Redis database, flushed before and after the test (queued tasks, locks,
    claims)."""
    import redis

    from tests.fixtures.services import TEST_BROKER_URL

    client = redis.Redis.from_url(TEST_BROKER_URL)
    client.flushdb()
    _forget_declared_queues()
    yield client
    client.flushdb()
    _forget_declared_queues()


def _forget_declared_queues() -> None:
    """Drop the connections and producers kombu pooled, and with them its memory of the queues it
    declared: after a flush it would otherwise skip re-declaring them and never write their
    ``_kombu.binding.*`` keys again, so what a test sees would hang on which test ran before it.

    kombu keys its pools by broker URL, so the orchestrator's and the agent's Celery apps share them:
    both forget theirs, or the one left holding a closed pool fails its next send ("Acquire on closed
    pool")."""
    import kombu.pools

    from modelyard.celery import app as orchestrator
    from modelyard_agent.app import app as agent

    kombu.pools.reset()
    for app in (orchestrator, agent):
        app._pool = None
        app.amqp._producer_pool = None


@pytest.fixture
def agent_settings(monkeypatch):
    """Factory: ``agent_settings(lock_wait=10, ...)`` sets this process's host-agent settings
    (``modelyard_agent.config``, by their environment variables) for agent code the test runs in
    process; they are reset afterwards."""
    from modelyard_agent import config

    def apply(**values) -> config.AgentConfig:
        for setting in config.SETTINGS:
            if setting.name in values:
                monkeypatch.setenv(setting.env, str(values.pop(setting.name)))
        assert not values, f"not agent settings: {sorted(values)}"
        config.current.cache_clear()
        return config.current()

    yield apply
    config.current.cache_clear()


@pytest.fixture(autouse=True, scope="session")
def _static_root():
    """WhiteNoise expects collectstatic's output directory; tests serve nothing from it."""
    from django.conf import settings

    settings.STATIC_ROOT.mkdir(parents=True, exist_ok=True)


@pytest.fixture
def user(db):
    """A signed-up user who owns the default team (where models created without a team go)."""
    from tests.factories import team_member

    return team_member(get_user_model().objects.create_user(username="engineer", password="a-long-test-password"))


@pytest.fixture
def api_client(user) -> APIClient:
    """An API client authenticated with ``user``'s token, as CI would be."""
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token_for(user)}")
    return client
