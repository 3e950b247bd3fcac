"""The webhooks list (``GET /api/v1/webhooks/``) costs the same pinned SQL queries for one webhook or a
page of them, for a team's owner (who sees that team's webhooks only) and for an administrator."""

import pytest
from django.contrib.auth import get_user_model

from accounts.choices import Role
from accounts.models import Team
from accounts.services import set_membership
from promotions.webhooks import create_webhook
from registry.models import RegisteredModel
from tests.factories import api_client_for

pytestmark = pytest.mark.django_db

# The token and its user, and the page (model and team joined; the teams the owner owns in a subquery).
OWNER_LIST_QUERIES = 2
# The same two: an administrator's list skips the team filter.
ADMIN_LIST_QUERIES = 2


@pytest.fixture
def vision(db, settings):
    settings.WEBHOOK_ALLOW_PRIVATE = True  # the receivers below are on 127.0.0.1 and never called
    team = Team.objects.create(name="vision")
    return team, RegisteredModel.objects.create(name="iris", team=team)


def add_webhooks(team, model, count: int) -> None:
    for n in range(count):
        create_webhook(url=f"http://127.0.0.1:9/hook-{team.name}-{n}", team=team, model=model if n % 2 else None,
                       events=["version.registered", "alias.moved"])


def listed(client) -> list[str]:
    answer = client.get("/api/v1/webhooks/?page_size=50")
    assert answer.status_code == 200, answer.content
    return [hook["url"] for hook in answer.json()["results"]]


def test_the_webhooks_list_costs_pinned_queries_for_one_webhook_or_a_page(vision, django_assert_num_queries):
    team, model = vision
    nlp = Team.objects.create(name="nlp")
    users = get_user_model().objects
    owner = users.create_user(username="owner")
    set_membership(team=team, user=owner, role=Role.OWNER)
    set_membership(team=nlp, user=owner, role=Role.VIEWER)  # sees nlp, manages none of its webhooks
    clients = {"owner": api_client_for(owner), "admin": api_client_for(users.create_user(username="a", is_staff=True))}
    add_webhooks(team, model, 1)
    add_webhooks(nlp, RegisteredModel.objects.create(name="bert", team=nlp), 1)
    for client in clients.values():
        listed(client)  # a token's first use records it (one UPDATE)
    with django_assert_num_queries(OWNER_LIST_QUERIES):
        assert listed(clients["owner"]) == ["http://127.0.0.1:9/hook-vision-0"]
    with django_assert_num_queries(ADMIN_LIST_QUERIES):
        assert len(listed(clients["admin"])) == 2
    add_webhooks(team, model, 30)
    with django_assert_num_queries(OWNER_LIST_QUERIES):
        assert len(listed(clients["owner"])) == 31
    with django_assert_num_queries(ADMIN_LIST_QUERIES):
        assert len(listed(clients["admin"])) == 32
