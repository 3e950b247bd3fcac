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
