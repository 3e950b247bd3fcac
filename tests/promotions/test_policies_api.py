"""Promotion policies, evaluations and webhooks through the API: permissions, bad input, the schedule."""

import pytest
from django.test import override_settings
from django_celery_beat.models import PeriodicTask

from promotions.choices import Decision
from promotions.models import PromotionEvaluation, PromotionPolicy, Webhook
from registry.models import Alias
from tests.factories import api_client_for as client_for
from tests.promotions.support import iris_with_aliases

pytestmark = pytest.mark.django_db

POLICY = {"model": "iris", "candidate_alias": "staging", "target_alias": "production", "schedule": "*/5 * * * *",
          "window_seconds": 600, "min_requests": 500, "max_p95_ms": 25, "max_error_rate": 0.01,
          "max_regression": 0.1}


@pytest.fixture
def iris(db):
    return iris_with_aliases(production=1, staging=2)


def test_an_administrator_creates_a_policy_and_its_schedule_is_written_for_beat(admin_api, iris):
    answer = admin_api.post("/api/v1/promotion-policies/", POLICY, format="json")
    assert answer.status_code == 201, answer.content
    body = answer.json()
    assert body["model"] == "iris" and body["max_p95_ms"] == 25 and body["created_by"] == "ops"
    task = PeriodicTask.objects.get(name=f"promotion-policy-{body['id']}")
    assert task.task == "promotions.evaluate_policy" and task.args == f"[{body['id']}]" and task.enabled
    assert (task.crontab.minute, task.crontab.hour, task.crontab.day_of_week) == ("*/5", "*", "*")


def test_editing_pausing_and_resuming_a_policy_change_its_beat_entry(admin_api, iris):
    policy_id = admin_api.post("/api/v1/promotion-policies/", POLICY, format="json").json()["id"]
    edited = admin_api.patch(f"/api/v1/promotion-policies/{policy_id}/", {"schedule": "0 9 * * 1-5"}, format="json")
    assert edited.status_code == 200 and edited.json()["schedule"] == "0 9 * * 1-5"
    task = PeriodicTask.objects.get(name=f"promotion-policy-{policy_id}")
    assert (task.crontab.minute, task.crontab.hour, task.crontab.day_of_week) == ("0", "9", "1-5")
    assert admin_api.post(f"/api/v1/promotion-policies/{policy_id}/pause/").json()["enabled"] is False
    assert PeriodicTask.objects.get(pk=task.pk).enabled is False
    assert admin_api.post(f"/api/v1/promotion-policies/{policy_id}/resume/").json()["enabled"] is True
    assert PeriodicTask.objects.get(pk=task.pk).enabled is True
    assert admin_api.delete(f"/api/v1/promotion-policies/{policy_id}/").status_code == 204
    assert not PeriodicTask.objects.filter(pk=task.pk).exists()


@pytest.mark.parametrize("change,field", [
    ({"schedule": "every minute"}, "schedule"),
    ({"schedule": "61 * * * *"}, "schedule"),
    ({"target_alias": "staging"}, "differ"),
    ({"candidate_alias": "latest"}, "candidate_alias"),
    ({"candidate_alias": "Bad Alias!"}, "candidate_alias"),
    ({"window_seconds": 10}, "window_seconds"),
    ({"max_error_rate": 1.5}, "max_error_rate"),
    ({"max_p95_ms": -1}, "max_p95_ms"),
    ({"min_requests": -5}, "min_requests"),
])
def test_bad_policy_input_is_refused_with_a_400_naming_the_field_and_nothing_is_written(admin_api, iris, change,
                                                                                         field):
    answer = admin_api.post("/api/v1/promotion-policies/", {**POLICY, **change}, format="json")
    assert answer.status_code == 400
    assert field in str(answer.json())
    assert not PromotionPolicy.objects.exists() and not PeriodicTask.objects.filter(
        task="promotions.evaluate_policy").exists()


def test_an_unknown_model_is_a_404_and_a_second_policy_on_the_same_path_a_409(admin_api, iris):
    assert admin_api.post("/api/v1/promotion-policies/", {**POLICY, "model": "nope"}, format="json").status_code == 404
    assert admin_api.post("/api/v1/promotion-policies/", POLICY, format="json").status_code == 201
    clash = admin_api.post("/api/v1/promotion-policies/", POLICY, format="json")
    assert clash.status_code == 409 and "already has a policy" in clash.json()["detail"]
    assert PeriodicTask.objects.filter(task="promotions.evaluate_policy").count() == 1


def test_maintainers_read_and_run_policies_but_only_owners_change_or_approve_them(admin_api, member_api, iris,
                                                                                   django_capture_on_commit_callbacks):
    policy_id = admin_api.post("/api/v1/promotion-policies/", POLICY, format="json").json()["id"]
    assert member_api.get("/api/v1/promotion-policies/?model__name=iris").json()["results"][0]["id"] == policy_id
    assert member_api.post("/api/v1/promotion-policies/", POLICY, format="json").status_code == 403
    assert member_api.patch(f"/api/v1/promotion-policies/{policy_id}/", {"dry_run": True},
                            format="json").status_code == 403
    assert member_api.post(f"/api/v1/promotion-policies/{policy_id}/pause/").status_code == 403
    assert member_api.delete(f"/api/v1/promotion-policies/{policy_id}/").status_code == 403
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        run = member_api.post(f"/api/v1/promotion-policies/{policy_id}/run/")
    assert run.status_code == 202 and run.json()["decision"] == "pending" and run.json()["final"] is False
    assert len(callbacks) == 1  # the evaluation task, once committed
    evaluation_id = run.json()["id"]
    assert member_api.get(f"/api/v1/promotion-evaluations/{evaluation_id}/").json()["requested_by"] == "engineer"
    PromotionEvaluation.objects.filter(pk=evaluation_id).update(decision=Decision.AWAITING_APPROVAL)
    assert member_api.post(f"/api/v1/promotion-evaluations/{evaluation_id}/approve/").status_code == 403
    outsider = client_for(None)
    assert outsider.get("/api/v1/promotion-policies/").status_code in (401, 403)
    assert outsider.post(f"/api/v1/promotion-policies/{policy_id}/run/").status_code in (401, 403)


def test_approving_an_evaluation_that_is_not_awaiting_approval_is_a_409(admin_api, iris):
    policy_id = admin_api.post("/api/v1/promotion-policies/", POLICY, format="json").json()["id"]
    evaluation = PromotionEvaluation.objects.create(policy_id=policy_id, decision=Decision.HELD)
    answer = admin_api.post(f"/api/v1/promotion-evaluations/{evaluation.pk}/approve/")
    assert answer.status_code == 409 and "not awaiting approval" in answer.json()["detail"]
    assert admin_api.post("/api/v1/promotion-evaluations/999999/reject/").status_code == 404
    assert Alias.objects.get(name="production").version.version == 1


def test_an_approver_rejects_an_evaluation_with_a_reason(admin_api, iris):
    policy_id = admin_api.post("/api/v1/promotion-policies/", POLICY, format="json").json()["id"]
    evaluation = PromotionEvaluation.objects.create(policy_id=policy_id, decision=Decision.AWAITING_APPROVAL)
    answer = admin_api.post(f"/api/v1/promotion-evaluations/{evaluation.pk}/reject/", {"reason": "freeze week"},
                            format="json")
    assert answer.status_code == 200
    assert answer.json()["decision"] == "rejected" and answer.json()["reason"] == "rejected by ops: freeze week"
    assert answer.json()["decided_by"] == "ops" and answer.json()["final"] is True


@override_settings(WEBHOOK_ALLOW_PRIVATE=False)
def test_webhooks_of_every_team_are_for_administrators_and_internal_addresses_are_refused(admin_api, member_api):
    hook = {"url": "https://93.184.216.34/hooks", "events": ["promotion"], "secret": "s" * 20}
    assert member_api.post("/api/v1/webhooks/", hook, format="json").status_code == 403
    assert member_api.get("/api/v1/webhooks/").json()["results"] == []  # only those of teams they own
    for url in ("http://127.0.0.1:8080/x", "http://169.254.169.254/latest", "http://[::1]/x", "http://10.0.0.7/"):
        refused = admin_api.post("/api/v1/webhooks/", {**hook, "url": url}, format="json")
        assert refused.status_code == 400 and "address" in refused.json()["detail"]
    assert admin_api.post("/api/v1/webhooks/", {**hook, "events": ["nope"]}, format="json").status_code == 400
    assert admin_api.post("/api/v1/webhooks/", {**hook, "secret": "short"}, format="json").status_code == 400
    assert not Webhook.objects.exists()
    created = admin_api.post("/api/v1/webhooks/", {"url": hook["url"]}, format="json")
    assert created.status_code == 201
    assert len(created.json()["secret"]) >= 32 and created.json()["events"] == [
        "alias.moved", "model.tags_changed", "promotion", "rollout.failed", "rollout.succeeded", "version.corrupt",
        "version.deleted", "version.registered"]
    hook_id = created.json()["id"]
    assert "secret" not in admin_api.get(f"/api/v1/webhooks/{hook_id}/").json()
    moved = admin_api.patch(f"/api/v1/webhooks/{hook_id}/", {"url": "http://192.168.0.2/"}, format="json")
    assert moved.status_code == 400 and Webhook.objects.get(pk=hook_id).url == hook["url"]
    assert admin_api.get(f"/api/v1/webhooks/{hook_id}/deliveries/").json() == []


def test_with_the_task_queue_down_running_a_policy_is_a_503_that_writes_nothing(admin_api, iris, queue_down):
    policy_id = admin_api.post("/api/v1/promotion-policies/", POLICY, format="json").json()["id"]
    answer = admin_api.post(f"/api/v1/promotion-policies/{policy_id}/run/")
    assert answer.status_code == 503 and "the evaluation was not started" in answer.json()["detail"]
    assert not PromotionEvaluation.objects.exists()
