"""Host heartbeats: what agents report and how hosts show online or offline."""

from datetime import timedelta

import pytest
from django.utils import timezone

from deployments.heartbeats import record_heartbeat
from deployments.models import ServingHost
from registry.models import RegisteredModel

pytestmark = pytest.mark.django_db

REPORT = {"runtime_live": True, "runtime_version": "2.51.0", "models": [{"name": "iris", "version": 2,
          "state": "READY"}], "gpus": [], "disk_free_bytes": 10**10, "labels": {"zone": "a"}, "errors": []}


@pytest.fixture
def host(db) -> ServingHost:
    return ServingHost.objects.create(name="gpu-0", inference_url="http://gpu-0:8000")


def test_a_host_is_online_after_a_recent_report_from_a_live_runtime(host):
    assert not host.is_online()
    assert record_heartbeat("gpu-0", REPORT)
    host.refresh_from_db()
    assert host.is_online() and host.heartbeat["models"][0]["state"] == "READY"
    assert not host.is_online(now=timezone.now() + timedelta(seconds=91))


def test_a_host_whose_runtime_is_down_is_offline_even_with_a_fresh_report(host):
    record_heartbeat("gpu-0", {**REPORT, "runtime_live": False})
    host.refresh_from_db()
    assert not host.is_online()


def test_a_report_for_an_unknown_host_is_ignored(db):
    assert record_heartbeat("gone", REPORT) is False


def test_the_hosts_page_and_api_show_the_status(host, client, user, api_client):
    ServingHost.objects.create(name="ghost", inference_url="http://ghost:8000")
    record_heartbeat("gpu-0", REPORT)
    client.force_login(user)
    page = client.get("/hosts/").content.decode()
    assert "Online" in page and "Triton 2.51.0" in page and "Never reported" in page
    hosts = {h["name"]: h for h in api_client.get("/api/v1/hosts/").json()["results"]}
    assert hosts["gpu-0"]["online"] is True and hosts["ghost"]["online"] is False
    assert "iris" not in client.get("/hosts/gpu-0/").content.decode()  # no model of the user's teams
    RegisteredModel.objects.create(name="iris")  # in the default team, which the user owns
    assert "iris" in client.get("/hosts/gpu-0/").content.decode()


def test_a_host_whose_agent_is_away_gets_one_pending_request_not_a_backlog(db, settings):
    import redis

    from deployments.tasks import request_heartbeats
    from modelyard.celery import app
    from tests.fixtures.services import TEST_BROKER_URL

    ServingHost.objects.create(name="ghost", inference_url="http://ghost:8000")
    settings.CELERY_BROKER_URL = TEST_BROKER_URL
    app.conf.broker_url = TEST_BROKER_URL
    broker = redis.Redis.from_url(TEST_BROKER_URL)
    broker.delete("host.ghost")
    try:
        assert [request_heartbeats() for _ in range(3)] == [1, 0, 0]
        assert broker.llen("host.ghost") == 1
    finally:
        broker.delete("host.ghost")


def test_between_heartbeats_only_hosts_whose_runtime_was_down_are_asked_again(db, broker):
    from deployments.tasks import request_recovery_heartbeats

    for name, live, age in (("down", False, 10), ("up", True, 10), ("gone-quiet", False, 600), ("never", None, None)):
        host = ServingHost.objects.create(name=name, inference_url=f"http://{name}:8000")
        if live is not None:
            record_heartbeat(name, {**REPORT, "runtime_live": live})
            ServingHost.objects.filter(pk=host.pk).update(last_heartbeat_at=timezone.now() - timedelta(seconds=age))
    assert request_recovery_heartbeats() == 1
    assert [key.decode() for key in broker.keys("host.*")] == ["host.down"]
    assert request_recovery_heartbeats() == 0  # its request is still queued: not another
