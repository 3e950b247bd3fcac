"""The model page's charts can be read: legends that match the lines, a text alternative for each
chart, deployment markers that say what happened (and none for a rollout that reached no host), a log
scale when one spike would flatten the other lines, and sparklines with a scale on the fleet overview.

The live server reads a real Prometheus holding an hour of synthetic Triton and BentoML series
(see tests/browser/conftest.py).
"""

import io
import json
from datetime import timedelta

import pytest
from django.utils import timezone
from PIL import Image

from deployments.choices import DeploymentStatus, TargetState
from deployments.models import Deployment, DeploymentTarget, ServingHost
from monitoring.empty import EMPTY_NO_SERIES, EMPTY_NOT_REPORTED
from registry.models import ModelVersion
from tests.monitoring.synthetic import deploy_version

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

CHARTS = ("chart-throughput", "chart-latency", "chart-errors", "chart-queue")
DRAWN = '#model-charts[data-drawn="true"]'


def marker_grey(rgb) -> bool:
    """A pixel of a marker that did not fail (#57606a in model_charts.js), however antialiased against
    the white plot: a neutral grey darker than the light grid lines; the lines' blue and red are not."""
    return max(rgb) < 200 and max(rgb) - min(rgb) < 40


def datasets(page, canvas_id: str) -> list[dict]:
    return page.evaluate(
        """id => Chart.getChart(document.getElementById(id)).data.datasets.map((d, i) => ({
            label: d.label, colour: d.borderColor, dash: d.borderDash.join(' '),
            visible: Chart.getChart(document.getElementById(id)).isDatasetVisible(i)}))""",
        canvas_id,
    )


def legend(page, canvas_id: str) -> list[dict]:
    return page.eval_on_selector_all(
        f"#{canvas_id}-legend button",
        """buttons => buttons.map(b => { const l = b.querySelector('svg.swatch line');
            return {label: b.textContent, colour: l.getAttribute('stroke'),
                    dash: l.getAttribute('stroke-dasharray') || '', pressed: b.getAttribute('aria-pressed')}; })""",
    )


def test_every_legend_swatch_draws_its_lines_colour_and_dash_and_toggles_it(page):
    page.goto("/models/iris/")
    page.wait_for_selector(DRAWN)

    for canvas_id in CHARTS:
        lines = datasets(page, canvas_id)
        assert lines, canvas_id
        assert [{k: d[k] for k in ("label", "colour", "dash")} for d in lines] == \
            [{k: item[k] for k in ("label", "colour", "dash")} for item in legend(page, canvas_id)]
    latency = {d["label"]: d["dash"] for d in datasets(page, "chart-latency")}
    # One dash style per measure, the same for every version: v1's and v2's lines differ by colour.
    assert [latency[f"v1 {q}"] for q in ("mean", "p50", "p95", "p99")] == ["", "2 3", "6 3", "12 3 2 3"]
    assert [latency[f"v2 {q}"] for q in ("mean", "p50", "p95", "p99")] == ["", "2 3", "6 3", "12 3 2 3"]

    page.locator("#chart-latency-legend button", has_text="v1 p99").click()
    hidden = {d["label"]: d["visible"] for d in datasets(page, "chart-latency")}
    assert hidden["v1 p99"] is False and hidden["v1 p95"] is True
    assert page.locator("#chart-latency-legend button", has_text="v1 p99").get_attribute("aria-pressed") == "false"


def test_each_chart_is_an_image_described_by_a_text_alternative(page):
    page.goto("/models/iris/")
    page.wait_for_selector(DRAWN)

    for canvas_id in CHARTS:
        canvas = page.locator(f"#{canvas_id}")
        assert canvas.get_attribute("role") == "img"
        assert page.locator(f"#{canvas.get_attribute('aria-labelledby')}").inner_text()
        described = page.locator(f"#{canvas.get_attribute('aria-describedby')}").text_content()
        assert "v1" in described and "latest" in described, (canvas_id, described)
    throughput = page.locator("#chart-throughput-text").text_content()
    latest = float(throughput.split("v2: latest ", 1)[1].split(",", 1)[0])
    assert latest == pytest.approx(20, rel=0.25)  # iris v2 serves 20 inferences/s
    assert "inferences/s" in throughput and "v2 rolling out: 1 of 1 host" in throughput


def marker_columns(page, canvas_id: str, times: dict[str, float]) -> dict[str, float]:
    """For each marker time: the share of the plot's height that the marker colour covers in its pixel column."""
    area = page.evaluate("id => Chart.getChart(document.getElementById(id)).chartArea", canvas_id)
    xs = page.evaluate("""([id, times]) => {
        const x = Chart.getChart(document.getElementById(id)).scales.x;
        return Object.fromEntries(Object.entries(times).map(([k, t]) => [k, x.getPixelForValue(t)]));
    }""", [canvas_id, times])
    image = Image.open(io.BytesIO(page.locator(f"#{canvas_id}").screenshot())).convert("RGB")
    scale = image.width / page.eval_on_selector(f"#{canvas_id}", "c => c.clientWidth")
    top, bottom = round((area["top"] + 40) * scale), round(area["bottom"] * scale) - 2  # below the labels
    shares = {}
    for key, x in xs.items():
        hits = 0
        for y in range(top, bottom):
            column = [image.getpixel((round(x * scale) + dx, y)) for dx in (-2, -1, 0, 1, 2)]
            hits += any(marker_grey(p) for p in column)
        shares[key] = hits / (bottom - top)
    return shares


def test_a_rollout_cancelled_before_any_host_gets_no_marker_line_and_real_ones_say_what_happened(page):
    now = timezone.now()
    gpu = ServingHost.objects.get(name="gpu-a")
    v2 = ModelVersion.objects.get(model__name="iris", version=2)
    cancelled = Deployment.objects.create(model=v2.model, version=v2, status=DeploymentStatus.CANCELLED,
                                          finished_at=now - timedelta(minutes=9))
    DeploymentTarget.objects.create(deployment=cancelled, host=gpu, state=TargetState.CANCELLED)
    real = Deployment.objects.create(model=v2.model, version=v2, status=DeploymentStatus.SUCCEEDED)
    DeploymentTarget.objects.create(deployment=real, host=gpu, state=TargetState.READY)
    Deployment.objects.filter(pk=cancelled.pk).update(created_at=now - timedelta(minutes=10))
    Deployment.objects.filter(pk=real.pk).update(created_at=now - timedelta(minutes=5),
                                                 finished_at=now - timedelta(minutes=4))

    page.goto("/models/iris/")
    page.wait_for_selector(DRAWN)

    shares = marker_columns(page, "chart-errors", {"cancelled": (now - timedelta(minutes=10)).timestamp(),
                                                   "real": (now - timedelta(minutes=5)).timestamp()})
    assert shares["real"] > 0.8 and shares["cancelled"] < 0.2, shares
    text = page.locator("#chart-errors-text").text_content()
    assert "v2 cancelled before any host (no line drawn: it reached no host)." in text
    assert "v2 rolled out to 1 host." in text


def test_one_spike_starts_its_chart_on_a_log_scale_and_the_toggle_switches_back(page):
    def with_a_spike(route):
        answer = route.fetch()
        body = answer.json()
        v1 = next(row for row in body["series"]["throughput"] if row["version"] == "1")
        v1["points"][len(v1["points"]) // 2][1] *= 1000
        route.fulfill(response=answer, body=json.dumps(body))

    page.route("**/metrics/series/**", with_a_spike)
    page.goto("/models/iris/")
    page.wait_for_selector(DRAWN)

    toggle = page.locator('.scale-toggle[data-chart="chart-throughput"]')
    assert page.get_attribute("#chart-throughput", "data-scale") == "logarithmic"
    assert toggle.get_attribute("aria-pressed") == "true"
    assert page.get_attribute("#chart-latency", "data-scale") == "linear"  # no spike there
    toggle.click()
    assert page.get_attribute("#chart-throughput", "data-scale") == "linear"
    assert page.evaluate("Chart.getChart(document.getElementById('chart-throughput')).scales.y.type") == "linear"
    toggle.click()
    assert page.evaluate("Chart.getChart(document.getElementById('chart-throughput')).scales.y.type") == "logarithmic"


def test_the_charts_start_on_a_linear_scale_without_a_spike(page):
    page.goto("/models/iris/")
    page.wait_for_selector(DRAWN)
    assert [page.get_attribute(f"#{c}", "data-scale") for c in CHARTS] == ["linear"] * 4


def test_the_fleet_overview_gives_mean_latency_and_a_scale_on_each_sparkline(page):
    page.goto("/monitoring/")

    v1 = page.locator('tr[data-model="iris"][data-version="1"]')
    assert float(v1.locator("td.latency-mean").inner_text()) == pytest.approx(2.0, rel=0.1)
    peaks = page.eval_on_selector_all("#overview-table tr.overview-row .spark-scale", "s => s.map(e => e.textContent)")
    assert len(peaks) == 3 and all(p.startswith("peak ") for p in peaks)
    v2_peak = float(page.locator('tr[data-model="iris"][data-version="2"] .spark-scale').inner_text().split()[1])
    assert v2_peak == pytest.approx(20, rel=0.25)
    label = page.locator('tr[data-model="iris"][data-version="2"] svg.sparkline').get_attribute("aria-label")
    assert label.startswith("throughput over the last hour, from 0 to a peak of ")


def test_marker_labels_closer_than_their_width_collapse_and_show_while_the_pointer_is_over_their_line(page):
    now = timezone.now()
    gpu = ServingHost.objects.get(name="gpu-a")
    v2 = ModelVersion.objects.get(model__name="iris", version=2)
    starts = [now - timedelta(minutes=6) + timedelta(seconds=15 * n) for n in range(4)]
    for status, start in zip((DeploymentStatus.SUCCEEDED, DeploymentStatus.FAILED, DeploymentStatus.SUCCEEDED,
                              DeploymentStatus.SUCCEEDED), starts, strict=True):
        deployment = Deployment.objects.create(model=v2.model, version=v2, status=status)
        state = TargetState.FAILED if status == DeploymentStatus.FAILED else TargetState.READY
        DeploymentTarget.objects.create(deployment=deployment, host=gpu, state=state)
        Deployment.objects.filter(pk=deployment.pk).update(created_at=start, finished_at=start)

    page.goto("/models/iris/")
    page.wait_for_selector(DRAWN)

    canvas = page.locator("#chart-throughput")
    # Four labels about 100 px wide, 15 s (a few px) apart: three rows hold three, the fourth collapses.
    assert int(canvas.get_attribute("data-marker-labels-collapsed")) >= 1
    place = page.evaluate(
        """([id, t]) => {
            const c = document.getElementById(id), chart = Chart.getChart(c), r = c.getBoundingClientRect();
            const area = chart.chartArea;
            return {x: r.left + chart.scales.x.getPixelForValue(t), y: r.top + (area.top + area.bottom) / 2}; }""",
        ["chart-throughput", starts[3].timestamp()],
    )
    page.mouse.move(place["x"], place["y"])
    page.wait_for_selector('#chart-throughput[data-hovered-marker="v2 rolled out to 1 host"]')
    page.mouse.move(place["x"] + 200, place["y"])
    page.wait_for_selector('#chart-throughput[data-hovered-marker=""]')
    text = page.locator("#chart-throughput-text").text_content()
    assert text.count("v2 rolled out to 1 host.") == 3 and "v2 failed on 1 of 1 host" in text


def test_a_chart_without_a_point_says_why_under_it_and_in_words(page):
    deploy_version("never-scraped", 1, ServingHost.objects.get(name="gpu-a"))

    page.goto("/models/never-scraped/")
    page.wait_for_selector(DRAWN)
    for chart in CHARTS:  # Prometheus has no series of this model at all
        assert page.locator(f"#{chart}-empty").text_content() == EMPTY_NO_SERIES + ".", chart
        assert page.locator(f"#{chart}-text").text_content().startswith("No data: Prometheus has no series")

    page.goto("/models/bento-iris/")
    page.wait_for_selector(DRAWN)
    # BentoML reports throughput and latency but no queue or compute time.
    assert page.locator("#chart-queue-empty").text_content() == EMPTY_NOT_REPORTED + "."
    assert page.locator("#chart-throughput-empty").is_hidden()
    assert page.locator("#chart-throughput-empty").text_content() == ""
