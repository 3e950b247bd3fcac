"""Clients for the promotion tests: an administrator, a member and an anonymous outsider."""

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from tests.factories import api_client_for


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    """A real Prometheus holding the known counters of ``tests.promotions.support`` (one per module)."""
    from tests.promotions.support import FedPrometheus

    fed = FedPrometheus(tmp_path_factory.mktemp("promotions"))
    yield fed
    fed.stop()




@pytest.fixture
def admin(db):
    return get_user_model().objects.create_user(username="ops", password="a-long-test-password", is_staff=True)


@pytest.fixture
def member(db):
    """A maintainer of the default team (where the tests' models live): may run policies, not change them."""
    from tests.factories import team_member

    engineer = get_user_model().objects.create_user(username="engineer", password="a-long-test-password")
    return team_member(engineer, "maintainer")


@pytest.fixture
def admin_api(admin) -> APIClient:
    return api_client_for(admin)


@pytest.fixture
def member_api(member) -> APIClient:
    return api_client_for(member)
