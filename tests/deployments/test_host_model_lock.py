"""The per-(host, model) lock: a second deployment of a model on a host waits for the first."""

import base64
import json

from modelyard_agent.coordination import host_model_lock
from modelyard_agent.worker import deploy_version_on_host


def _reports(client) -> list[list]:
    """The record_target_report calls queued for the orchestrator: [target_id, state, message, details].

    Kombu keeps each message in the queue's Redis list as JSON whose ``body`` is the base64 of
    Celery's JSON ``[args, kwargs, embed]``.
    """
    messages = [json.loads(raw) for raw in client.lrange("default", 0, -1)]
    return [json.loads(base64.b64decode(m["body"]))[0] for m in messages]


def test_a_deployment_waits_while_another_holds_the_model_and_gives_up_after_the_lock_wait(broker, agent_settings):
    agent_settings(lock_wait=10)
    payload = {"target_id": 7, "host": "gpu-0", "model": "iris", "version": 2,
               "artifact_url": "http://127.0.0.1:1/never-fetched", "sha256": "0" * 64, "size": 1,
               "config_text": "", "parameters": {}, "inference_url": "http://127.0.0.1:1"}
    held = host_model_lock("gpu-0", "iris")
    assert held.acquire(blocking=False)
    try:
        deploy_version_on_host.apply(args=[payload])
    finally:
        held.release()
    (report,) = _reports(broker)
    assert report[:2] == [7, "failed"]
    assert "stayed locked on this host by another deployment" in report[2]


def test_the_lock_is_per_host_and_model(broker):
    first = host_model_lock("gpu-0", "iris")
    assert first.acquire(blocking=False)
    try:
        assert not host_model_lock("gpu-0", "iris").acquire(blocking=False)
        other_model = host_model_lock("gpu-0", "resnet")
        other_host = host_model_lock("gpu-1", "iris")
        assert other_model.acquire(blocking=False) and other_host.acquire(blocking=False)
        other_model.release()
        other_host.release()
    finally:
        first.release()
