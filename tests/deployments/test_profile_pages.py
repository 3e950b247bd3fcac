"""The performance card on a version's page: the panel, starting and cancelling a profile, and "Roll out
with this config" filling in the rollout form."""

import html
import json
import re
from urllib.parse import unquote

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from deployments.models import Profile, ServingHost
from modelyard_agent.profiling.card import recommend
from registry.models import ModelVersion, RegisteredModel
from tests.deployments.test_profiling import CARD, IRIS_CONFIG
from tests.factories import page_with_panels, team_member

pytestmark = pytest.mark.django_db
PANEL = "/profiles/of/iris/1/"


@pytest.fixture
def version(db):
    model = RegisteredModel.objects.create(name="iris")
    return ModelVersion.objects.create(model=model, version=1, format="triton", artifact_key="k",
                                       artifact_sha256="0" * 64, artifact_size=1, config_text=IRIS_CONFIG)


@pytest.fixture
def staging(db):
    return ServingHost.objects.create(name="staging", inference_url="http://staging:8000",
                                      last_heartbeat_at=timezone.now(),
                                      heartbeat={"runtime_live": True, "agent": {"protocol": 3}})


@pytest.fixture
def maintainer(client):
    user = team_member(get_user_model().objects.create_user(username="ml"), role="maintainer")
    client.force_login(user)
    return user


def _card(version, host, **fields) -> Profile:
    return Profile.objects.create(version=version, host=host, sweep=CARD["sweep"], rows=CARD["rows"],
                                  slo_p99_ms=CARD["slo_p99_ms"], status="succeeded", finished_at=timezone.now(),
                                  **fields)


def test_the_version_page_shows_the_card_with_its_recommendation_and_front(client, maintainer, version, staging,
                                                                          django_assert_num_queries):
    profile = _card(version, staging)
    page = page_with_panels(client, "/models/iris/versions/1/")
    assert "Performance card" in page and f"Profile {profile.pk} on" in page
    best = recommend(CARD["rows"], CARD["slo_p99_ms"])
    assert f"Recommended for p99 ≤ {CARD['slo_p99_ms']:g} ms:" in html.unescape(page)
    assert best["config"]["label"] in html.unescape(page)
    table = re.search(r'<table class="grid profile-rows">.*?</table>', page, re.S).group(0)
    assert table.count("<tr") == 1 + len(CARD["rows"])  # the header and one row per measurement
    assert table.count(">recommended<") == 1 and "Pareto front" in table
    chart = json.loads(re.search(r'<script id="profile-chart-\d+" type="application/json">(.*?)</script>',
                                 page, re.S).group(1))
    assert sum(len(c["points"]) for c in chart["configs"]) == len(CARD["rows"]) and chart["front"]
    assert 'role="img"' in page and "aria-label=\"Throughput against client p99" in page
    with django_assert_num_queries(CARD_PANEL_QUERIES):
        assert client.get(PANEL).status_code == 200


def test_roll_out_with_this_config_fills_the_rollout_forms_overrides(client, maintainer, version, staging):
    from deployments.profiles import recommended_overrides

    _card(version, staging)
    panel = client.get(PANEL).content.decode()
    link = html.unescape(re.search(r'href="(/deployments/new/iris/\?[^"]+)">Roll out with this config', panel).group(1))
    overrides = json.loads(unquote(link.split("config_overrides=", 1)[1]))
    assert overrides == recommended_overrides(version)
    form = client.get(link).content.decode()
    textarea = re.search(r'<textarea name="config_overrides"[^>]*>(.*?)</textarea>', form, re.S).group(1)
    assert json.loads(html.unescape(textarea).strip()) == overrides


def test_a_running_profile_polls_itself_and_offers_a_cancel_that_asks_first(client, maintainer, version, staging):
    profile = Profile.objects.create(version=version, host=staging, sweep=CARD["sweep"], status="running",
                                     rows=CARD["rows"][:3], step="config 2 of 4: 1 instance, dynamic batching")
    panel = client.get(PANEL).content.decode()
    assert 'hx-trigger="every 2s"' in panel and "3 of 8 measurements" in panel and "<progress" in panel
    assert "Profile this version" not in panel  # no second profile while one runs
    confirm = client.get(f"/profiles/{profile.pk}/cancel/")
    assert confirm.status_code == 200 and b"Cancel the profile" in confirm.content
    Profile.objects.filter(pk=profile.pk).update(status="queued")
    answer = client.post(f"/profiles/{profile.pk}/cancel/")
    assert answer.status_code == 302 and answer["Location"] == "/models/iris/versions/1/"
    assert Profile.objects.get(pk=profile.pk).status == "cancelled"
    assert 'hx-trigger="every 2s"' not in client.get(PANEL).content.decode()


def test_the_form_starts_a_profile_or_says_why_not(client, maintainer, version, staging,
                                                   django_capture_on_commit_callbacks):
    panel = client.get(PANEL).content.decode()
    assert "Not profiled yet" in panel and '<option value="staging">' in panel
    with django_capture_on_commit_callbacks():
        answer = client.post("/profiles/of/iris/1/start/", {"host": "staging", "preset": "quick",
                                                            "slo_p99_ms": "20"}, follow=True)
    profile = Profile.objects.get()
    assert (profile.status, profile.slo_p99_ms, profile.sweep["request"]["preset"]) == ("queued", 20.0, "quick")
    assert f"Profile {profile.pk} queued on staging." in answer.content.decode()
    again = client.post("/profiles/of/iris/1/start/", {"host": "staging", "preset": "quick"}, follow=True)
    refused = again.content.decode()
    assert "The profile was not started:" in refused and "one profile at a time" in refused
    assert Profile.objects.count() == 1


def test_a_viewer_sees_the_card_but_no_form_or_controls(client, version, staging):
    client.force_login(team_member(get_user_model().objects.create_user(username="viewer"), role="viewer"))
    _card(version, staging)
    panel = client.get(PANEL).content.decode()
    assert "Recommended" in panel and "Roll out with this config" not in panel and "Profile this version" not in panel
    assert client.post("/profiles/of/iris/1/start/", {"host": "staging", "preset": "quick"}).status_code == 403
    assert not Profile.objects.exclude(status="succeeded").exists()


# The session and its user, the model with the user's role in its team (one query), the version, its model
# card, its aliases and its ensemble members. The performance card panel and the deployments load by htmx.
VERSION_PAGE_QUERIES = 7
# The session and its user, the model with the role (one query), the version, the newest profiles (host and
# author joined), the hosts the form offers, and the shown profile's version (for its config overrides).
CARD_PANEL_QUERIES = 7


def test_the_version_page_and_its_card_panel_cost_pinned_queries_for_one_profile_or_many(
        client, maintainer, version, staging, django_assert_num_queries):
    _card(version, staging)
    client.get("/models/iris/versions/1/")  # the session's first use
    with django_assert_num_queries(VERSION_PAGE_QUERIES):
        assert client.get("/models/iris/versions/1/").status_code == 200
    with django_assert_num_queries(CARD_PANEL_QUERIES):
        assert "Recommended for" in client.get(PANEL).content.decode()
    for n in range(12):
        _card(version, ServingHost.objects.create(name=f"staging-{n}", inference_url=f"http://staging-{n}:8000"))
    with django_assert_num_queries(VERSION_PAGE_QUERIES):
        assert client.get("/models/iris/versions/1/").status_code == 200
    with django_assert_num_queries(CARD_PANEL_QUERIES):
        assert "Earlier profiles" in client.get(PANEL).content.decode()
