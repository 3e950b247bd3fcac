"""A version's performance card in a real browser: the chart drawn from the panel htmx loads, its
points and Pareto front, and "Roll out with this config" landing on a filled-in rollout form."""

import json

import pytest
from django.utils import timezone

from deployments.models import Profile, ServingHost
from registry.models import ModelVersion
from tests.deployments.test_profiling import CARD

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
DRAWN = 'canvas.profile-chart[data-drawn="true"]'


@pytest.fixture
def card(deployed):
    """A finished profile of iris v1 on gpu-a: the real CPU card of tests/fixtures/data."""
    return Profile.objects.create(version=ModelVersion.objects.get(model__name="iris", version=1),
                                  host=ServingHost.objects.get(name="gpu-a"), sweep=CARD["sweep"], rows=CARD["rows"],
                                  slo_p99_ms=CARD["slo_p99_ms"], status="succeeded", finished_at=timezone.now())


def test_the_card_is_drawn_and_its_recommendation_fills_the_rollout_form(page, watch, card, screenshots):
    page.goto("/models/iris/versions/1/")
    page.wait_for_selector(DRAWN)
    drawn = page.evaluate("""() => {
        const chart = Chart.getChart(document.querySelector("canvas.profile-chart"));
        return {labels: chart.data.datasets.map(d => d.label),
                points: chart.data.datasets.map(d => d.data.length),
                x: chart.options.scales.x.title.text, y: chart.options.scales.y.title.text};
    }""")
    configs = {row["config"]["label"] for row in CARD["rows"]}
    assert set(drawn["labels"]) == configs | {"Pareto front", "p99 target"}
    assert sum(drawn["points"][:len(configs)]) == len(CARD["rows"])
    assert (drawn["x"], drawn["y"]) == ("client p99 latency (ms)", "throughput (inferences/s)")
    assert page.locator("table.profile-rows tbody tr").count() == len(CARD["rows"])
    page.screenshot(path=str(screenshots / "performance-card.png"), full_page=True)

    page.get_by_role("link", name="Roll out with this config…").click()
    page.wait_for_url("**/deployments/new/iris/**")
    overrides = json.loads(page.input_value("textarea[name=config_overrides]"))
    assert overrides["instance_group"][0]["count"] in {1, 2} and "dynamic_batching" in overrides
    assert page.input_value("select[name=version]") == "1"
    assert watch.problems() == []


def test_a_target_far_beyond_every_point_is_left_off_so_the_axis_fits_the_data(page, watch, card):
    Profile.objects.filter(pk=card.pk).update(slo_p99_ms=200.0)
    widest = max(row["p99_ms"] for row in CARD["rows"] if row.get("p99_ms") is not None)

    page.goto("/models/iris/versions/1/")
    page.wait_for_selector(DRAWN)
    drawn = page.evaluate("""() => {
        const chart = Chart.getChart(document.querySelector("canvas.profile-chart"));
        return {labels: chart.data.datasets.map(d => d.label), max: chart.scales.x.max};
    }""")
    # Before: the target's line stretched the axis to 200 ms and squashed every point into its first 1.5 %.
    assert "p99 target" not in drawn["labels"]
    assert widest <= drawn["max"] < 2 * widest, drawn
    assert page.locator("canvas.profile-chart").get_attribute("data-target") == "beyond the axis"
    assert "the p99 target (200 ms) lies far beyond every measured p99" in page.locator(
        ".profile-chart-figure figcaption").text_content()
    assert watch.problems() == []
