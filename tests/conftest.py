"""Shared fixtures: users and API clients, plus the service fixtures in tests/fixtures."""

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from tests.factories import token_for

pytest_plugins = ["tests.fixtures.triton", "tests.fixtures.services", "tests.fixtures.expositions"]


@pytest.fixture(autouse=True, scope="session")
def _test_broker():
    """Point the in-process Celery app at the test broker before anything publishes."""
    from modelyard.celery import app
    from tests.fixtures.services import TEST_BROKER_URL

    app.conf.broker_url = TEST_BROKER_URL
    yield


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
