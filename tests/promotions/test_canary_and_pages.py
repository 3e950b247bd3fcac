"""Canary deployments (an alias followed on a subset of hosts) and the promotion pages."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from deployments.models import Deployment
from deployments.rollouts import follow_alias
from deployments.services import start_deployment
from promotions import policies
from promotions.choices import Decision
from promotions.models import PromotionEvaluation, PromotionPolicy
from registry.aliases import set_alias
from tests.factories import page_with_panels
from tests.promotions.support import iris_with_aliases

pytestmark = pytest.mark.django_db


def hosts_of(deployment: Deployment) -> list[str]:
    return sorted(deployment.targets.values_list("host__name", flat=True))


def test_a_canary_is_a_deployment_that_follows_the_candidate_alias_on_a_subset_of_hosts(
    django_capture_on_commit_callbacks
):
    from deployments.models import ServingHost

    model = iris_with_aliases(production=1, canary=1)
    for name in ("gpu-canary", "gpu-prod-1", "gpu-prod-2"):
        ServingHost.objects.create(name=name, inference_url=f"http://{name}:8000")
    with django_capture_on_commit_callbacks(execute=False):
        start_deployment(model_name="iris", alias="canary", host_names=["gpu-canary"])
        start_deployment(model_name="iris", alias="production", host_names=["gpu-prod-1", "gpu-prod-2"])
        set_alias(model_name="iris", alias="canary", version=2)
    canary = follow_alias(model.pk, "canary")
    assert (canary.version.version, hosts_of(canary)) == (2, ["gpu-canary"])
    assert follow_alias(model.pk, "production") is None  # production did not move: its hosts are left alone
    with django_capture_on_commit_callbacks(execute=False):
        set_alias(model_name="iris", alias="production", version=2)  # what a passing policy does
    promoted = follow_alias(model.pk, "production")
    assert (promoted.version.version, hosts_of(promoted)) == (2, ["gpu-prod-1", "gpu-prod-2"])


@pytest.fixture
def policy(db):
    iris_with_aliases(production=1, staging=2)
    return policies.create_policy(model_name="iris", candidate_alias="staging", target_alias="production",
                                  max_p95_ms=25, window_seconds=600)


def evaluation(policy, decision, reason="", checks=()):
    return PromotionEvaluation.objects.create(
        policy=policy, decision=decision, reason=reason, checks=list(checks),
        candidate_version=policy.model.versions.get(version=2), target_version=policy.model.versions.get(version=1),
    )


def test_the_model_page_shows_each_policy_with_its_latest_evaluations_and_reasons(client, admin, policy):
    evaluation(policy, Decision.HELD, "held: p95 latency 30.0 ms", checks=[
        {"gate": "max_p95_ms", "passed": False, "value": 30.0, "limit": 25, "message": "p95 latency 30.0 ms (above "
                                                                                        "the maximum of 25.0 ms)"}])
    evaluation(policy, Decision.AWAITING_APPROVAL, "every gate passed; promoting v2 to @production awaits approval")
    client.force_login(admin)
    page = page_with_panels(client, "/models/iris/")
    assert "@staging</span> → <span class=\"tag alias\">@production" in page
    assert "p95 latency 30.0 ms (above the maximum of 25.0 ms)" in page
    assert "awaits approval" in page and "Approve</button>" in page and "Run now</button>" in page
    assert "New policy…" in page


def test_the_policies_section_costs_the_same_queries_however_many_evaluations_and_policies(client, admin, policy):
    client.force_login(admin)
    evaluation(policy, Decision.HELD)
    client.get("/promotions/models/iris/")
    with CaptureQueriesContext(connection) as few:
        client.get("/promotions/models/iris/")
    other = policies.create_policy(model_name="iris", candidate_alias="canary", target_alias="production")
    for _ in range(8):
        evaluation(policy, Decision.HELD)
        evaluation(other, Decision.PROMOTED)
    with CaptureQueriesContext(connection) as many:
        page = client.get("/promotions/models/iris/").content.decode()
    assert len(many) == len(few)
    assert page.count('class="evaluation-row"') == 10  # the latest five of each policy


def test_an_administrator_creates_and_edits_a_policy_from_the_browser(client, admin):
    iris_with_aliases(production=1, staging=2)
    client.force_login(admin)
    form = {"name": "nightly", "candidate_alias": "staging", "target_alias": "production", "schedule": "0 2 * * *",
            "window_seconds": 3600, "min_requests": 1000, "max_p95_ms": "", "max_error_rate": "0.02",
            "max_regression": "", "enabled": "on"}
    assert client.post("/promotions/models/iris/new/", form).status_code == 302
    policy = PromotionPolicy.objects.get()
    assert (policy.max_error_rate, policy.max_p95_ms, policy.periodic_task.crontab.hour) == (0.02, None, "2")
    refused = client.post(f"/promotions/policies/{policy.pk}/edit/", {**form, "schedule": "whenever"})
    assert refused.status_code == 200 and "five fields" in refused.content.decode()
    assert client.post(f"/promotions/policies/{policy.pk}/edit/", {**form, "dry_run": "on"}).status_code == 302
    assert PromotionPolicy.objects.get().dry_run is True


def test_maintainers_may_run_a_policy_from_the_page_but_not_create_edit_or_approve(client, member, policy,
                                                                                    django_capture_on_commit_callbacks):
    client.force_login(member)
    assert client.get("/promotions/models/iris/new/").status_code == 403
    assert client.get(f"/promotions/policies/{policy.pk}/edit/").status_code == 403
    assert client.post(f"/promotions/policies/{policy.pk}/pause/").status_code == 403
    waiting = evaluation(policy, Decision.AWAITING_APPROVAL)
    assert client.post(f"/promotions/evaluations/{waiting.pk}/approve/").status_code == 403
    with django_capture_on_commit_callbacks(execute=False):
        assert client.post(f"/promotions/policies/{policy.pk}/run/").status_code == 302
    assert PromotionEvaluation.objects.filter(decision=Decision.PENDING, requested_by=member).count() == 1
    assert "Approve</button>" not in page_with_panels(client, "/models/iris/")
