"""Two versions' performance cards on the compare page and in the compare API: each version's newest
finished card per host, its recommendation, and b over a in throughput and p99 where both have one on a
host; a version without a card says how to make one. The page's SQL queries are pinned."""

import copy
import re

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from accounts.choices import Role
from deployments.models import ServingHost
from modelyard_agent.profiling.card import recommend
from registry.models import ModelVersion, RegisteredModel
from tests.deployments.test_profiling import CARD, IRIS_CONFIG
from tests.factories import api_client_for, profiled, team_member

pytestmark = pytest.mark.django_db
API = "/api/v1/models/iris/compare/?a=1&b=2"
PAGE = "/models/iris/compare/?a=1&b=2"
SLO = CARD["slo_p99_ms"]
BEST = recommend(CARD["rows"], SLO)  # i1-db8-q100 at concurrency 4: 6525.92 inferences/s, p99 0.833 ms


def scaled(rows: list[dict], *, throughput: float = 1.0, p99: float = 1.0) -> list[dict]:
    """``rows`` with every throughput and p99 multiplied (the same configs, measured faster or slower)."""
    out = copy.deepcopy(rows)
    for row in out:
        row["throughput"] *= throughput
        row["p99_ms"] *= p99
    return out


@pytest.fixture
def iris(db, settings):
    settings.PROMETHEUS_URL = "http://127.0.0.1:9"  # nothing listens: the serving part says so, cards do not care
    model = RegisteredModel.objects.create(name="iris", next_version=3)
    return {n: ModelVersion.objects.create(model=model, version=n, format="triton", artifact_key=f"k{n}",
                                           artifact_sha256=f"{n}" * 64, artifact_size=1, config_text=IRIS_CONFIG)
            for n in (1, 2)}


def reporting_host(name: str) -> ServingHost:
    return ServingHost.objects.create(name=name, inference_url=f"http://{name}:8000", last_heartbeat_at=timezone.now(),
                                      heartbeat={"runtime_live": True, "agent": {"protocol": 3}})


@pytest.fixture
def viewer():
    return team_member(get_user_model().objects.create_user(username="viewer"), Role.VIEWER)


@pytest.fixture
def page(viewer) -> Client:
    client = Client()
    client.force_login(viewer)
    return client


@pytest.fixture
def cards(iris):
    """v1 and v2 profiled on staging (v2 1.5× the throughput at 0.8× the p99; an older v1 card and a newer
    failed v1 profile there are not its card), and v2 alone on staging-2."""
    staging, second = reporting_host("staging"), reporting_host("staging-2")
    profiled(iris[1], staging, scaled(CARD["rows"], throughput=0.5), slo_p99_ms=SLO)  # superseded
    newest_v1 = profiled(iris[1], staging, CARD["rows"], slo_p99_ms=SLO)
    profiled(iris[1], staging, CARD["rows"][:2], slo_p99_ms=SLO, status="failed")
    v2 = profiled(iris[2], staging, scaled(CARD["rows"], throughput=1.5, p99=0.8), slo_p99_ms=SLO)
    v2_alone = profiled(iris[2], second, CARD["rows"], slo_p99_ms=SLO)
    return {"v1": newest_v1, "v2": v2, "v2_alone": v2_alone}


def test_the_api_sets_the_newest_cards_side_by_side_with_b_over_a_where_both_have_one(cards, viewer):
    answer = api_client_for(viewer).get(API)
    assert answer.status_code == 200, answer.content
    performance = answer.json()["performance"]
    assert performance["missing"] == {"a": "", "b": ""}
    staging, second = performance["hosts"]
    assert (staging["host"], staging["runtime"], second["host"]) == ("staging", "triton", "staging-2")
    assert staging["a"]["profile"] == cards["v1"].pk and staging["b"]["profile"] == cards["v2"].pk
    assert staging["a"]["recommended"] == {
        "config_key": BEST["config"]["key"], "config_label": BEST["config"]["label"],
        "concurrency": BEST["concurrency"], "throughput": BEST["throughput"], "p99_ms": BEST["p99_ms"],
        "memory_bytes": BEST["memory_bytes"], "memory_kind": "cpu"}
    assert staging["a"]["measurements"] == len(CARD["rows"]) and staging["a"]["slo_p99_ms"] == SLO
    assert staging["ratio"] == {"throughput": pytest.approx(1.5), "p99": pytest.approx(0.8), "same_config": True,
                                "same_slo": True}
    assert staging["why_no_ratio"] == ""
    assert second["a"] is None and second["b"]["profile"] == cards["v2_alone"].pk
    assert second["ratio"] is None and second["why_no_ratio"] == "v1 has no card on staging-2"


def test_a_version_without_a_card_is_told_how_to_profile_it(iris, viewer):
    profiled(iris[2], reporting_host("staging"), CARD["rows"], slo_p99_ms=SLO)
    performance = api_client_for(viewer).get(API).json()["performance"]
    assert performance["missing"]["b"] == ""
    assert performance["missing"]["a"] == ("v1 has no performance card: profile it from its page, or with "
                                           "`modelyard profile iris 1 --host <host> --wait` "
                                           "(POST /api/v1/models/iris/versions/1/profiles/)")
    assert [(row["host"], row["a"], row["ratio"]) for row in performance["hosts"]] == [("staging", None, None)]


def test_a_card_where_no_config_met_its_target_gives_no_ratio_and_says_why(iris, viewer):
    staging = reporting_host("staging")
    profiled(iris[1], staging, CARD["rows"], slo_p99_ms=SLO)
    profiled(iris[2], staging, scaled(CARD["rows"], p99=10), slo_p99_ms=SLO)
    row = api_client_for(viewer).get(API).json()["performance"]["hosts"][0]
    assert row["b"]["recommended"] is None and row["ratio"] is None
    assert row["why_no_ratio"] == "no config of v2's card on staging met its p99 target of 2 ms"


def test_recommendations_of_different_configs_and_targets_are_compared_and_marked_so(iris, viewer):
    staging = reporting_host("staging")
    profiled(iris[1], staging, CARD["rows"], slo_p99_ms=SLO)
    profiled(iris[2], staging, CARD["rows"], slo_p99_ms=0.5)  # within 0.5 ms: i1-nobatch at concurrency 1
    row = api_client_for(viewer).get(API).json()["performance"]["hosts"][0]
    assert row["b"]["recommended"]["config_key"] == "i1-nobatch" and row["b"]["recommended"]["concurrency"] == 1
    assert row["ratio"] == {"throughput": pytest.approx(4612.95 / BEST["throughput"]),
                            "p99": pytest.approx(0.354 / BEST["p99_ms"]), "same_config": False, "same_slo": False}


def cells(page_html: str, host: str, field: str) -> list[str]:
    """The text of the cells of one row (``field``) of one host's card table on the compare page."""
    block = re.search(rf'<div class="compare-card-host" data-host="{re.escape(host)}">(.*?)</table>', page_html, re.S)
    assert block, f"no card table for {host}"
    row = re.search(rf'<tr data-field="{field}">(.*?)</tr>', block.group(1), re.S)
    return [" ".join(re.sub(r"<[^>]+>", " ", cell).split())
            for cell in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", row.group(1), re.S)]


def test_the_page_shows_both_cards_and_the_ratios_host_by_host(cards, page):
    html = page.get(PAGE).content.decode()
    assert "<h2>Performance cards</h2>" in html and "no-card" not in html
    assert html.index("<h2>Performance cards</h2>") < html.index("<h2>Serving metrics")
    assert ("v2 against v1: <strong>1.50×</strong> the inferences/s, <strong>0.80×</strong> the p99, at the same "
            "recommended config.") in html
    assert cells(html, "staging", "config")[3] == "same"
    assert cells(html, "staging", "concurrency") == ["Concurrency", "4", "4", ""]
    assert cells(html, "staging", "throughput") == ["Inferences/s", "6,526", "9,789", "1.50×"]
    assert cells(html, "staging", "p99") == ["p99 ms", "0.833", "0.666", "0.80×"]
    assert cells(html, "staging", "memory")[1:3] == ["8.8 MiB cpu", "8.8 MiB cpu"]
    assert cells(html, "staging-2", "config")[1] == "no card · Profile v1…"
    assert cells(html, "staging-2", "throughput") == ["Inferences/s", "—", "6,526", "—"]
    assert "No ratio on staging-2: v1 has no card on staging-2." in html


def test_the_page_says_how_to_profile_a_version_without_a_card(iris, page):
    html = page.get(PAGE).content.decode()
    for number in (1, 2):
        assert f'<p class="empty no-card" data-version="{number}">v{number} has no performance card.' in html
        assert f'href="/models/iris/versions/{number}/#version-profiles"' in html
        assert f"<code>modelyard profile iris {number} --host &lt;host&gt; --wait</code>" in html
    assert 'class="compare-card-host"' not in html


# The session and its user, the model with the user's role in its team (one query), the live version numbers,
# the two versions (with their model and author), and the cards of both (one query, hosts joined).
COMPARE_PAGE_QUERIES = 6
# The token and its user, the model with the user's role (one query), each version with its model looked up
# again (two each), the cards of both, and the serving part's model and deployment targets.
COMPARE_API_QUERIES = 9


def test_the_compare_page_costs_the_same_pinned_queries_with_cards_or_without(iris, page, django_assert_num_queries):
    page.get(PAGE)  # the session's first use
    with django_assert_num_queries(COMPARE_PAGE_QUERIES):
        assert page.get(PAGE).status_code == 200
    for host in (reporting_host("staging"), reporting_host("staging-2")):
        for version in iris.values():
            for _ in range(3):
                profiled(version, host, CARD["rows"], slo_p99_ms=SLO)
    with django_assert_num_queries(COMPARE_PAGE_QUERIES):
        assert "compare-card-host" in page.get(PAGE).content.decode()


def test_the_compare_api_costs_the_same_pinned_queries_with_cards_or_without(iris, viewer, django_assert_num_queries):
    client = api_client_for(viewer)
    client.get(API)  # the token's first use records it
    with django_assert_num_queries(COMPARE_API_QUERIES):
        assert client.get(API).json()["performance"]["hosts"] == []
    staging = reporting_host("staging")
    for version in iris.values():
        for _ in range(3):
            profiled(version, staging, CARD["rows"], slo_p99_ms=SLO)
    with django_assert_num_queries(COMPARE_API_QUERIES):
        assert len(client.get(API).json()["performance"]["hosts"]) == 1
