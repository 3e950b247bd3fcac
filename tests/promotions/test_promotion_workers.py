"""Promotion end to end on real processes: a Celery worker makes the evaluations, Celery beat schedules
them, a real Prometheus holds known counters (``tests.promotions.support``), the ``modelyard`` command
runs a policy as CI does, and a webhook receiver on 127.0.0.1 checks every signature.

Loopback webhooks are allowed here only through ``MODELYARD_WEBHOOK_ALLOW_PRIVATE`` (the test setting).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.test import override_settings
from django_celery_beat.models import IntervalSchedule

from accounts.choices import Role
from accounts.services import set_membership
from deployments.models import Deployment
from promotions import evaluations, policies
from promotions.choices import Decision, DeliveryStatus, EvaluationTrigger
from promotions.models import PromotionEvaluation, WebhookDelivery
from promotions.webhooks import create_webhook
from registry.models import Alias
from tests.factories import token_for
from tests.fixtures.services import free_port, wait_for
from tests.promotions.support import WebhookReceiver, following, iris_with_aliases

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
CLI = Path(sys.executable).parent / "modelyard"
SECRET = "a-webhook-secret-of-some-length"
GATES = {"window_seconds": 60, "min_requests": 600, "max_p95_ms": 20, "max_error_rate": 0.01, "max_regression": 0.1}


@pytest.fixture
def receiver():
    hook = WebhookReceiver(SECRET)
    yield hook
    hook.stop()


def production() -> int:
    return Alias.objects.get(model__name="iris", name="production").version.version


def test_ci_runs_a_policy_a_worker_promotes_the_good_candidate_and_webhooks_report_it_signed(
    prometheus, receiver, live_server, s3_endpoint, start_celery_worker
):
    model = iris_with_aliases(production=1, staging=2)
    following(model, "production", ["gpu-prod"])
    policy = policies.create_policy(model_name="iris", candidate_alias="staging", target_alias="production", **GATES)
    with override_settings(WEBHOOK_ALLOW_PRIVATE=True):
        create_webhook(url=receiver.url, secret=SECRET, events=["promotion", "rollout.succeeded", "rollout.failed"])
    start_celery_worker("default", env={"MODELYARD_PROMETHEUS_URL": prometheus.url,
                                        "MODELYARD_S3_ENDPOINT_URL": s3_endpoint,
                                        "MODELYARD_WEBHOOK_ALLOW_PRIVATE": "true"})
    ci = get_user_model().objects.create_user(username="ci")
    set_membership(team=model.team, user=ci, role=Role.MAINTAINER)  # CI may run the policy, the gates decide
    env = {**os.environ, "MODELYARD_URL": live_server.url, "MODELYARD_TOKEN": token_for(ci)}

    run = subprocess.run([str(CLI), "promote", "run", str(policy.pk), "--wait", "--timeout", "120"], env=env,
                         capture_output=True, text=True, timeout=180)

    assert run.returncode == 0, run.stdout + run.stderr
    decided = json.loads(run.stdout)
    assert decided["decision"] == "promoted" and decided["candidate_version"] == 2
    assert decided["metrics"]["candidate"]["latency_p95_ms"] == pytest.approx(10.5)
    assert production() == 2
    # Moving production started the rollout of what follows it; its artifact is not in S3, so it fails.
    wait_for(lambda: Deployment.objects.filter(trigger="alias", status="failed").exists(), timeout=60,
             what="the rollout that follows production to fail")
    wait_for(lambda: {"promotion", "rollout.failed"} <= set(receiver.events())
             and not WebhookDelivery.objects.filter(status=DeliveryStatus.PENDING).exists(),
             timeout=60, what="both webhook deliveries")
    assert all(r["signature_ok"] for r in receiver.received)
    promotion = WebhookDelivery.objects.get(event="promotion")
    assert (promotion.status, promotion.attempts) == (DeliveryStatus.DELIVERED, 2)  # the first got a 503
    body = next(r["body"] for r in receiver.received if r["event"] == "promotion")
    assert body["data"]["from_version"] == 1 and body["data"]["to_version"] == 2
    assert body["data"]["policy"] == policy.pk
    failed = next(r["body"] for r in receiver.received if r["event"] == "rollout.failed")
    assert failed["data"]["version"] == 2 and failed["data"]["follow_alias"] == "production"

    again = subprocess.run([str(CLI), "promote", "run", str(policy.pk), "--wait", "--timeout", "120"], env=env,
                           capture_output=True, text=True, timeout=180)
    assert again.returncode == 1  # nothing left to promote: exit 1 unless promoted
    assert json.loads(again.stdout)["decision"] == "skipped"


def test_a_worker_holds_a_bad_candidate_and_records_an_error_while_prometheus_is_down(
    prometheus, start_celery_worker
):
    iris_with_aliases(production=1, staging=3)
    policy = policies.create_policy(model_name="iris", candidate_alias="staging", target_alias="production", **GATES)
    worker = start_celery_worker("default", env={"MODELYARD_PROMETHEUS_URL": prometheus.url})
    held = evaluations.request_evaluation(policy.pk)
    wait_for(lambda: PromotionEvaluation.objects.get(pk=held.pk).decision != Decision.PENDING, timeout=60,
             what="the worker's evaluation")
    held.refresh_from_db()
    assert held.decision == Decision.HELD and "error rate" in held.reason
    worker.stop()
    start_celery_worker("default", env={"MODELYARD_PROMETHEUS_URL": f"http://127.0.0.1:{free_port()}"})
    blind = evaluations.request_evaluation(policy.pk)
    wait_for(lambda: PromotionEvaluation.objects.get(pk=blind.pk).decision != Decision.PENDING, timeout=60,
             what="an evaluation made without Prometheus")
    error = PromotionEvaluation.objects.get(pk=blind.pk)
    assert error.decision == Decision.ERROR
    assert "metrics unavailable" in error.reason and error.metrics["candidate"]["version"] == 3
    assert production() == 1


def test_celery_beat_runs_a_policy_on_its_schedule_and_picks_up_an_edit_without_a_restart(
    prometheus, start_celery_worker, start_celery_beat
):
    """A crontab's finest step is a minute, too slow for a test: beat starts with the policy on a
    once-a-year crontab, then the policy's PeriodicTask is switched to a two-second interval while
    beat runs. The database scheduler notices the change (it checks every few seconds)."""
    iris_with_aliases(production=1, staging=2)
    policy = policies.create_policy(model_name="iris", candidate_alias="staging", target_alias="production",
                                    schedule="0 0 1 1 *", **GATES)
    dead_s3 = f"http://127.0.0.1:{free_port()}"  # beat also sends the project's own periodic tasks
    start_celery_worker("default", env={"MODELYARD_PROMETHEUS_URL": prometheus.url,
                                        "MODELYARD_S3_ENDPOINT_URL": dead_s3})
    start_celery_beat()
    every_two_seconds, _ = IntervalSchedule.objects.get_or_create(every=2, period=IntervalSchedule.SECONDS)
    task = policy.periodic_task
    task.crontab, task.interval = None, every_two_seconds
    task.save()
    wait_for(lambda: PromotionEvaluation.objects.filter(policy=policy, trigger=EvaluationTrigger.SCHEDULE)
             .exclude(decision=Decision.PENDING).exists(), timeout=60, what="beat to run the policy")
    first = PromotionEvaluation.objects.filter(policy=policy).order_by("id").first()
    assert first.decision == Decision.PROMOTED, first.reason
    assert production() == 2
