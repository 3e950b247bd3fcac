"""The rollout page, its htmx fragment and its controls."""

import pytest
from django.contrib.auth import get_user_model

from deployments import rollouts
from deployments.models import Deployment, ServingHost
from deployments.services import record_target_progress, start_deployment
from registry.choices import ArtifactFormat
from registry.models import ModelVersion, RegisteredModel
from tests.factories import team_member

pytestmark = pytest.mark.django_db


@pytest.fixture
def deployment(django_capture_on_commit_callbacks) -> Deployment:
    model = RegisteredModel.objects.create(name="iris", next_version=2)
    ModelVersion.objects.create(model=model, version=1, format=ArtifactFormat.TRITON_MODEL_DIR, artifact_key="k",
                                artifact_sha256="0" * 64, artifact_size=1)
    for name in ("gpu-0", "gpu-1"):
        ServingHost.objects.create(name=name, inference_url=f"http://{name}:8000")
    with django_capture_on_commit_callbacks(execute=False):
        deployment = start_deployment(model_name="iris", version=1, host_names=["gpu-0", "gpu-1"])
        rollouts.advance_rollout(deployment.pk)
    return deployment


@pytest.fixture
def browser(client):
    client.force_login(team_member(get_user_model().objects.create_user(username="ml-engineer"), "maintainer"))
    return client


def test_the_page_shows_each_host_batch_and_step_and_polls_while_running(browser, deployment):
    target = deployment.targets.get(host__name="gpu-0")
    record_target_progress(target.pk, "staging")
    page = browser.get(f"/deployments/{deployment.pk}/").content.decode()
    assert "gpu-0" in page and "gpu-1" in page and "waits for its batch" in page
    assert "staging" in page and 'hx-trigger="every 2s"' in page
    fragment = browser.get(f"/deployments/{deployment.pk}/progress/").content.decode()
    assert fragment.startswith('<div id="rollout-progress"') and "<html" not in fragment


def test_pause_then_cancel_after_a_confirmation(browser, deployment):
    answer = browser.post(f"/deployments/{deployment.pk}/pause/", follow=True)
    assert "Rollout paused" in answer.content.decode()
    confirm = browser.get(f"/deployments/{deployment.pk}/cancel/").content.decode()
    assert "Cancel rollout" in confirm
    deployment.refresh_from_db()
    assert deployment.status == "paused"  # a GET changes nothing
    browser.post(f"/deployments/{deployment.pk}/cancel/")
    deployment.refresh_from_db()
    assert deployment.status == "cancelled"
    page = browser.get(f"/deployments/{deployment.pk}/").content.decode()
    assert "every 2s" not in page  # finished: no more polling


def test_an_illegal_control_shows_a_message_and_changes_nothing(browser, deployment):
    answer = browser.post(f"/deployments/{deployment.pk}/resume/", follow=True)
    assert "not paused" in answer.content.decode()
    deployment.refresh_from_db()
    assert deployment.status == "running"
    assert browser.post(f"/deployments/{deployment.pk}/explode/").status_code == 404


def test_rollout_pages_need_a_login(client, deployment):
    answer = client.get(f"/deployments/{deployment.pk}/")
    assert answer.status_code == 302 and "/login/" in answer["Location"]


def test_a_rollout_starts_from_the_model_page_form(browser, deployment, django_capture_on_commit_callbacks):
    page = browser.get("/deployments/new/iris/").content.decode()
    assert "gpu-0" in page and "v1" in page
    with django_capture_on_commit_callbacks(execute=False):
        answer = browser.post("/deployments/new/iris/", {"version": "1", "hosts": ["gpu-1"], "batch_size": "1",
                                                         "failure_policy": "rollback"})
    newest = Deployment.objects.order_by("-id").first()
    assert answer.status_code == 302 and answer["Location"] == f"/deployments/{newest.pk}/"
    assert (newest.failure_policy, list(newest.targets.values_list("host__name", flat=True))) == ("rollback", ["gpu-1"])


@pytest.mark.parametrize(
    ("form", "message"),
    [
        ({"hosts": ["gpu-1"]}, "give a version to pin or an alias to follow"),
        ({"version": "1"}, "at least one serving host"),
        ({"version": "1", "selector": "pool"}, "key=value"),
        ({"version": "1", "hosts": ["gpu-1"], "config_overrides": "{"}, "not valid JSON"),
        ({"version": "1", "hosts": ["gpu-1"], "config_overrides": '{"input": []}'}, "may set only"),
    ],
)
def test_a_bad_rollout_form_says_why_and_starts_nothing(browser, deployment, form, message):
    answer = browser.post("/deployments/new/iris/", {"batch_size": "1", "failure_policy": "pause", **form})
    assert answer.status_code == 200 and message in answer.content.decode()
    assert Deployment.objects.count() == 1


def test_the_model_and_version_pages_load_their_deployments_panel(browser, deployment):
    from tests.factories import page_with_panels

    record_target_progress(deployment.targets.get(host__name="gpu-0").pk, "failed",
                           message="Triton could not load iris version 1")
    model_page = page_with_panels(browser, "/models/iris/")
    assert f'href="/deployments/{deployment.pk}/"' in model_page
    assert "Triton could not load iris version 1" in model_page
    assert f'href="/deployments/{deployment.pk}/"' in page_with_panels(browser, "/models/iris/versions/1/")
    assert "Never deployed." in browser.get("/deployments/of/iris/?version=9").content.decode()
    assert browser.get("/deployments/of/iris/?version=x").status_code == 404
    assert browser.get("/deployments/of/nope/").status_code == 404
