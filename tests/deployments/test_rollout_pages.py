"""The rollout page, its htmx fragment and its controls."""

import html
import re
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from deployments import rollouts
from deployments.models import Deployment, ServingHost
from deployments.services import start_deployment
from deployments.targets import record_target_progress
from modelyard_agent.contract import CANARY_PROTOCOL
from registry.choices import ArtifactFormat
from registry.models import ModelVersion, RegisteredModel
from tests.factories import team_member

pytestmark = pytest.mark.django_db


def reported(seconds_ago: float = 1, live: bool = True) -> dict:
    """The fields of a host whose agent last reported ``seconds_ago``."""
    return {"last_heartbeat_at": timezone.now() - timedelta(seconds=seconds_ago), "heartbeat": {"runtime_live": live}}


@pytest.fixture
def deployment(django_capture_on_commit_callbacks) -> Deployment:
    model = RegisteredModel.objects.create(name="iris", next_version=2)
    ModelVersion.objects.create(model=model, version=1, format=ArtifactFormat.TRITON_MODEL_DIR, artifact_key="k",
                                artifact_sha256="0" * 64, artifact_size=1)
    for name in ("gpu-0", "gpu-1"):
        ServingHost.objects.create(name=name, inference_url=f"http://{name}:8000", **reported())
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


def test_a_host_whose_old_version_left_with_requests_in_flight_says_so(browser, deployment):
    target = deployment.targets.get(host__name="gpu-0")
    target.details = {"drain_error": "6 request(s) to iris v5 still in flight after 1 s",
                      "unload_error": "model 'iris' versions [5] still loaded or unloading after 1 s"}
    target.save(update_fields=["details"])
    page = html.unescape(browser.get(f"/deployments/{deployment.pk}/").content.decode())
    assert "left with requests still in flight: 6 request(s) to iris v5 still in flight after 1 s" in page
    assert "still unloading at the host's unload deadline: model 'iris' versions [5]" in page
    assert page.count("left with requests still in flight") == 1  # gpu-1 drained cleanly


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
        ({"version": "1", "hosts": ["gpu-1"], "replicas": "2"}, "give a selector, or tick the hosts instead"),
        ({"version": "1", "hosts": ["gpu-1"], "canary_percent": "120"}, "less than or equal to 100"),
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


def host_row(page: str, host: str) -> str:
    """The text of the rollout form's table row for ``host``, tags stripped."""
    row = re.search(rf'<tr class="host-choice[^"]*" data-host="{re.escape(host)}">(.*?)</tr>', page, re.S)
    assert row, f"no row for {host}"
    return " ".join(re.sub(r"<[^>]+>", " ", row.group(1)).split())


def test_the_rollout_form_shows_each_hosts_runtime_agent_version_and_production_mark(browser, deployment):
    record_target_progress(deployment.targets.get(host__name="gpu-0").pk, "ready")
    ServingHost.objects.filter(name="gpu-1").update(production=True)
    ServingHost.objects.create(name="gpu-2", inference_url="http://gpu-2:8000", **reported(seconds_ago=3600))
    ServingHost.objects.create(name="gpu-3", inference_url="http://gpu-3:8000")
    page = browser.get("/deployments/new/iris/").content.decode()
    assert host_row(page, "gpu-0") == "gpu-0 triton Online v1 —"
    assert host_row(page, "gpu-1") == "gpu-1 triton Online nothing production"
    assert "triton Never reported is its agent running on host.gpu-3 ? nothing —" in host_row(page, "gpu-3")
    assert "Offline no report since 1" in host_row(page, "gpu-2")
    assert page.count('type="checkbox" name="hosts"') == 4


def test_the_rollout_form_offers_only_the_hosts_whose_runtime_serves_the_models_formats(browser, deployment):
    ServingHost.objects.create(name="bento-0", runtime="bentoml", inference_url="http://bento-0:3000", **reported())
    triton_page = browser.get("/deployments/new/iris/").content.decode()
    assert 'data-host="bento-0"' not in triton_page and 'data-host="gpu-0"' in triton_page

    clf = RegisteredModel.objects.create(name="clf", next_version=2)
    ModelVersion.objects.create(model=clf, version=1, format=ArtifactFormat.BENTO, artifact_key="b",
                                artifact_sha256="1" * 64, artifact_size=1)
    bento_page = browser.get("/deployments/new/clf/").content.decode()
    assert 'data-host="bento-0"' in bento_page and 'data-host="gpu-0"' not in bento_page


def test_a_canary_and_a_shadow_start_from_the_form(browser, deployment, django_capture_on_commit_callbacks):
    # gpu-1 serves v1 through a live gateway, as a canary of v2 needs.
    record_target_progress(deployment.targets.get(host__name="gpu-1").pk, "ready")
    ServingHost.objects.filter(name="gpu-1").update(heartbeat={
        "runtime_live": True, "agent": {"protocol": CANARY_PROTOCOL}, "gateway": {"live": True}})
    ModelVersion.objects.create(model=deployment.model, version=2, format=ArtifactFormat.TRITON_MODEL_DIR,
                                artifact_key="k2", artifact_sha256="2" * 64, artifact_size=1)
    page = browser.get("/deployments/new/iris/").content.decode()
    assert 'name="canary_percent"' in page and 'name="shadow_percent"' in page
    assert "requests that name no version" in page and "no client sees its answers" in page
    with django_capture_on_commit_callbacks(execute=False):
        answer = browser.post("/deployments/new/iris/", {"version": "2", "hosts": ["gpu-1"], "batch_size": "1",
                                                         "failure_policy": "rollback", "canary_percent": "20",
                                                         "shadow_percent": "5"})
    assert answer.status_code == 302, answer.content.decode()[:2000]
    newest = Deployment.objects.order_by("-id").first()
    assert (newest.canary_percent, newest.shadow_percent) == (20, 5)


@pytest.mark.parametrize(("host", "last_report", "says"), [
    ("gpu-8", None, r"gpu-8: its agent never reported \(nothing consumes Celery queue host\.gpu-8\); its part fails "
                    r"after 180 s unless the agent starts by then\."),
    ("gpu-9", (900, True), r"gpu-9: offline \(no report for 90\d s, [-\d: ]+ UTC\); its part fails after 600 s "
                           r"unless it comes back\."),
    ("gpu-7", (1, False), r"gpu-7: offline \(its runtime was not live at its last report, "),
])
def test_a_host_that_is_offline_or_never_reported_is_refused_until_the_form_confirms_it(
    browser, deployment, settings, django_capture_on_commit_callbacks, host, last_report, says
):
    settings.UNREPORTED_HOST_TIMEOUT, settings.DISPATCH_TIMEOUT = 180, 600
    ServingHost.objects.create(name=host, inference_url=f"http://{host}:8000",
                               **(reported(*last_report) if last_report else {}))
    form = {"version": "1", "hosts": [host, "gpu-1"], "batch_size": "1", "failure_policy": "pause"}
    warned = browser.post("/deployments/new/iris/", form)
    page = warned.content.decode()
    assert warned.status_code == 200 and re.search(says, page) and "Tick the box to roll out anyway." in page
    assert "gpu-1:" not in page  # the online host gets no warning
    assert Deployment.objects.count() == 1
    assert re.search(rf'value="{host}" id="[^"]+" checked', page)  # the choice is kept for the second try
    with django_capture_on_commit_callbacks(execute=False):
        started = browser.post("/deployments/new/iris/", {**form, "confirm_unreachable": "on"})
    assert started.status_code == 302 and Deployment.objects.count() == 2
    newest = Deployment.objects.order_by("-id").first()
    assert sorted(newest.targets.values_list("host__name", flat=True)) == sorted([host, "gpu-1"])


def test_the_version_field_defaults_to_the_version_page_s_version_or_the_newest(browser, deployment):
    ModelVersion.objects.create(model=deployment.model, version=2, format=ArtifactFormat.TRITON_MODEL_DIR,
                                artifact_key="k2", artifact_sha256="2" * 64, artifact_size=1)
    selected = re.compile(r'<option value="(\d+)" selected>')
    assert selected.findall(browser.get("/deployments/new/iris/").content.decode()) == ["2"]
    assert selected.findall(browser.get("/deployments/new/iris/?version=1").content.decode()) == ["1"]
    version_page = browser.get("/models/iris/versions/1/").content.decode()
    assert 'href="/deployments/new/iris/?version=1">Roll out…</a>' in version_page


def test_a_viewer_gets_no_roll_out_action_on_the_version_page(client, deployment):
    client.force_login(team_member(get_user_model().objects.create_user(username="reader"), "viewer"))
    assert "Roll out…" not in client.get("/models/iris/versions/1/").content.decode()


def test_the_rollout_form_deploys_on_demand_and_says_what_is_wrong(browser, deployment,
                                                                 django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False):
        answer = browser.post("/deployments/new/iris/", {
            "version": "1", "hosts": ["gpu-1"], "batch_size": "1", "failure_policy": "pause",
            "residency": "on_demand", "pinned": "on", "cold_start_timeout": "15"})
    newest = Deployment.objects.order_by("-id").first()
    assert answer.status_code == 302, answer.content.decode()[:2000]
    assert newest.residency_settings() == {"residency": "on_demand", "pinned": True, "cold_start_timeout": 15.0}
    assert "on demand, pinned; requests wait up to 15.0 s" in browser.get(f"/deployments/{newest.pk}/").content.decode()
    refused = browser.post("/deployments/new/iris/", {"version": "1", "hosts": ["gpu-1"], "batch_size": "1",
                                                      "failure_policy": "pause", "pinned": "on"})
    assert refused.status_code == 200 and "apply to residency" in refused.content.decode()
    assert Deployment.objects.order_by("-id").first() == newest
