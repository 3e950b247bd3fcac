"""Replays on the pages: the version page's panel, the replay page with its htmx progress, and who sees what."""

import html

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from accounts.services import create_team
from deployments.choices import JobStatus
from deployments.models import Replay, ServingHost
from deployments.replays import record_replay_report
from registry.models import ModelVersion, RegisteredModel
from tests.deployments.test_replays import finished_summary, heartbeat
from tests.factories import page_with_panels, team_member

pytestmark = pytest.mark.django_db
WORST_ID = "a" * 32


@pytest.fixture
def world(db):
    """thr v1 (served on edge) and v2; a finished replay of v2 against v1 and a running one."""
    model = RegisteredModel.objects.create(name="thr")
    v1, v2 = (ModelVersion.objects.create(model=model, version=n, format="triton", artifact_key=f"k{n}",
                                          artifact_sha256="0" * 64, artifact_size=1) for n in (1, 2))
    host = ServingHost.objects.create(name="edge", inference_url="http://edge:8080",
                                      last_heartbeat_at=timezone.now(), heartbeat=heartbeat())
    common = {"version": v2, "against": v1, "host": host, "tolerances": {"atol": 1e-5, "rtol": 1e-3,
                                                                        "argmax_outputs": []},
              "max_requests": 10, "pace": 20.0, "time_budget_s": 400}
    done = Replay.objects.create(**common)
    assert record_replay_report(done.pk, {"status": "running", "done": 5, "total": 10})
    assert record_replay_report(done.pk, {"status": "succeeded", "done": 10, "total": 10,
                                          "summary": finished_summary()})
    running = Replay.objects.create(**common)
    assert record_replay_report(running.pk, {"status": "running", "done": 3, "total": 10, "step": "comparing"})
    return Replay.objects.get(pk=done.pk), Replay.objects.get(pk=running.pk)


def login(client, role: str | None):
    """Sign ``client`` in as an owner, a viewer (member) of the model's team, or an outsider (None)."""
    user = get_user_model().objects.create_user(username=role or "outsider")
    if role:
        team_member(user, role=role)
    else:
        team_member(user, team=create_team(name="other"))
    client.force_login(user)


def test_the_version_page_lists_its_replays_with_status_and_agreement_linked_to_their_pages(client, world):
    done, running = world
    login(client, "viewer")
    page = page_with_panels(client, "/models/thr/versions/2/")
    assert "<h2>Replays</h2>" in page
    assert f'href="/replays/{done.pk}/"' in page and f'href="/replays/{running.pk}/"' in page
    assert "80.00%" in page and "10 / 10" in page and "3 / 10" in page
    panel = client.get("/replays/of/thr/2/").content.decode()
    assert 'hx-trigger="every 2s"' in panel  # one still runs: the panel refreshes itself
    Replay.objects.filter(pk=running.pk).update(status=JobStatus.FAILED, message="the copy did not load")
    panel = client.get("/replays/of/thr/2/").content.decode()
    assert "hx-trigger" not in panel and "the copy did not load" in panel
    assert "Not replayed yet" in client.get("/replays/of/thr/1/").content.decode()


def test_an_owner_sees_the_worst_disagreements_with_both_outputs(client, world):
    done, _ = world
    login(client, "owner")
    page = html.unescape(client.get(f"/replays/{done.pk}/").content.decode())
    assert "Done" in page and "80.00% of 10 compared" in page
    assert "p50 0 · p90 1 · p99 1 · max 1" in page
    assert '<th>Serving v1</th><td>2.000</td><td>4.000</td>' in page
    assert '<th>Candidate v2</th><td>2.500</td><td>5.000</td>' in page
    assert "Candidate p95 against the serving version's: +25.0 %" in page
    assert WORST_ID in page and '{"label":{"data":[1]}}' in page and '{"label":{"data":[0]}}' in page


def test_a_member_sees_the_aggregates_but_not_the_worst_disagreements(client, world):
    done, _ = world
    login(client, "viewer")
    page = client.get(f"/replays/{done.pk}/").content.decode()
    assert "80.00% of 10 compared" in page and "Latency on the host" in page
    assert WORST_ID not in page and "shown to owners of the model's team only" in page


def test_an_outsider_gets_404_for_the_page_its_progress_and_the_panel(client, world):
    done, running = world
    login(client, None)
    assert client.get(f"/replays/{done.pk}/").status_code == 404
    assert client.get(f"/replays/{running.pk}/progress/").status_code == 404
    assert client.get("/replays/of/thr/2/").status_code == 404
    assert client.get("/replays/999999/").status_code == 404


def test_a_running_replays_page_refreshes_with_the_same_partial_until_it_ends(client, world):
    _, running = world
    login(client, "owner")
    page = client.get(f"/replays/{running.pk}/").content.decode()
    fragment = client.get(f"/replays/{running.pk}/progress/").content.decode()
    assert f'hx-get="/replays/{running.pk}/progress/"' in page and 'hx-trigger="every 2s"' in fragment
    assert "3 of 10 requests · comparing" in fragment and fragment.strip() in page
    assert record_replay_report(running.pk, {"status": "failed", "done": 3, "total": 10, "message": "out of memory"})
    ended = client.get(f"/replays/{running.pk}/progress/").content.decode()
    assert "hx-trigger" not in ended and "out of memory" in ended and "Failed" in ended


def test_the_replay_page_costs_a_fixed_number_of_queries(client, world, django_assert_num_queries):
    done, _ = world
    login(client, "owner")
    with django_assert_num_queries(4):  # the model and the user's role in its team read in one query
        assert client.get(f"/replays/{done.pk}/").status_code == 200
