"""The monitoring pages in a real browser: charts drawn with data, ranges, the fleet overview's
sorting, filtering and htmx refresh, the host's GPUs, and no console errors or foreign requests.

The live server reads a real Prometheus holding an hour of synthetic Triton and BentoML series
that keep growing (see tests/browser/conftest.py).
"""

import io
import re

import pytest
from PIL import Image
from playwright.sync_api import expect

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

CHART_UNITS = {
    "chart-throughput": "inferences/s",
    "chart-latency": "ms",
    "chart-errors": "% of requests",
    "chart-queue": "ms per request",
}
FIRST_DATASET_RGB = (0x1F, 0x6F, 0xEB)  # model_charts.js COLOURS[0]: the lowest version, v1 here
COLOUR_TOLERANCE = 40  # per channel, for antialiased edges
DRAWN = '#model-charts[data-drawn="true"]'
GPUS = {  # from tests/fixtures/data/triton_gpu_metrics.txt: uuid -> memory used, bytes
    "GPU-5c3f7a9e-1d2b-4c8e-9f60-3a7b2e4d1c85": 14_763_950_080,
    "GPU-b8e41d27-6f3a-4e95-a0c2-7d19e5b3f604": 9_531_555_840,
}
GPU_MEMORY_TOTAL = 85_899_345_920


def chart_config(page, canvas_id: str) -> dict:
    """The drawn chart's y axis title, x axis span (seconds) and drawing area (CSS pixels)."""
    return page.evaluate(
        """id => {
            const chart = Chart.getChart(document.getElementById(id));
            const y = chart.options.scales.y.title;
            const a = chart.chartArea;
            return {unit: y.display ? y.text : null, span: chart.scales.x.max - chart.scales.x.min,
                    area: {left: a.left, top: a.top, right: a.right, bottom: a.bottom}};
        }""",
        canvas_id,
    )


def points_drawn(page) -> dict[str, int]:
    return {cid: int(page.get_attribute(f"#{cid}", "data-points") or 0) for cid in CHART_UNITS}


def overview_rows(page) -> list[tuple[str, str]]:
    return [tuple(row) for row in page.eval_on_selector_all(
        "#overview-table tr.overview-row", "rows => rows.map(r => [r.dataset.model, r.dataset.version])")]


def test_the_model_page_draws_every_chart_with_data(page, watch, screenshots):
    page.goto("/models/iris/")
    page.wait_for_selector(DRAWN)

    assert all(n > 0 for n in points_drawn(page).values()), points_drawn(page)
    configs = {cid: chart_config(page, cid) for cid in CHART_UNITS}
    assert {cid: c["unit"] for cid, c in configs.items()} == CHART_UNITS
    assert all(c["span"] == pytest.approx(900, abs=1) for c in configs.values())

    page.screenshot(path=screenshots / "model_page.png", full_page=True)
    png = page.locator("#chart-throughput").screenshot(path=screenshots / "throughput_chart.png")
    # Count v1's colour inside the plotting area only: the legend box has that colour too.
    area = configs["chart-throughput"]["area"]
    image = Image.open(io.BytesIO(png)).convert("RGB")
    scale = image.width / page.eval_on_selector("#chart-throughput", "c => c.clientWidth")
    box = tuple(round(v * scale) for v in (area["left"] + 2, area["top"] + 2, area["right"] - 2, area["bottom"] - 2))
    plot = image.crop(box)
    rgb = plot.tobytes()
    columns = {
        (i // 3) % plot.width for i in range(0, len(rgb), 3)
        if all(abs(c - e) <= COLOUR_TOLERANCE for c, e in zip(rgb[i:i + 3], FIRST_DATASET_RGB, strict=True))
    }
    # v1 has served at 10 inferences/s for the whole hour: its line crosses the plot.
    assert len(columns) >= 0.8 * plot.width, f"v1's line covers {len(columns)} of {plot.width} pixel columns"
    assert page.locator("#chart-notice").is_hidden()


def test_switching_the_range_to_one_hour_reloads_and_draws_again(page, screenshots):
    page.goto("/models/iris/")
    page.wait_for_selector(DRAWN)

    with page.expect_response(lambda r: "/metrics/series/" in r.url and "range=1h" in r.url) as series:
        page.get_by_role("link", name="1h", exact=True).click()
        page.wait_for_url(re.compile(r"/models/iris/\?range=1h$"))
    page.wait_for_selector(DRAWN)

    assert series.value.ok
    assert page.locator(".ranges a.active").inner_text() == "1h"
    assert page.locator("h2 small").first.inner_text() == "last 1h"
    assert all(n > 0 for n in points_drawn(page).values()), points_drawn(page)
    assert chart_config(page, "chart-throughput")["span"] == pytest.approx(3600, abs=1)
    page.screenshot(path=screenshots / "model_page_1h.png", full_page=True)


def test_the_fleet_overview_lists_every_deployed_version_with_a_sparkline(page, screenshots):
    page.goto("/monitoring/")

    assert sorted(overview_rows(page)) == [("bento-iris", "1"), ("iris", "1"), ("iris", "2")]
    sparklines = page.eval_on_selector_all(
        "#overview-table tr.overview-row svg.sparkline polyline", "lines => lines.map(l => l.getAttribute('points'))")
    assert len(sparklines) == 3
    assert all(len(points.split()) >= 10 for points in sparklines), sparklines
    throughput = page.locator('tr[data-model="iris"][data-version="2"] td.throughput').inner_text()
    assert float(throughput) == pytest.approx(20, rel=0.15)
    page.screenshot(path=screenshots / "fleet_overview.png", full_page=True)


def test_clicking_the_throughput_header_sorts_the_rows_by_throughput(page):
    page.goto("/monitoring/")
    header = page.locator("#overview-table thead th a").filter(has_text=re.compile(r"^Throughput"))

    header.click()
    page.wait_for_url(re.compile(r"sort=throughput&order=desc"))
    assert overview_rows(page) == [("iris", "2"), ("iris", "1"), ("bento-iris", "1")]
    assert "▼" in header.inner_text()

    header.click()
    page.wait_for_url(re.compile(r"sort=throughput&order=asc"))
    assert overview_rows(page) == [("bento-iris", "1"), ("iris", "1"), ("iris", "2")]
    assert "▲" in header.inner_text()


def test_the_filter_form_narrows_the_rows(page):
    page.goto("/monitoring/")

    page.fill("input[name=q]", "bento")
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url(re.compile(r"q=bento"))
    assert overview_rows(page) == [("bento-iris", "1")]
    assert page.locator("#overview-table p.muted").first.inner_text().startswith("1 of 3 model versions")

    page.fill("input[name=q]", "")
    page.select_option("select[name=host]", "gpu-a")
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url(re.compile(r"host=gpu-a"))
    # v2 replaced v1 on gpu-a: the registry places only v2 there.
    assert overview_rows(page) == [("iris", "2")]


def test_the_overview_table_refreshes_itself_every_15_seconds(page):
    # A fake page clock lets the template's own `every 15s` poll fire without waiting for it.
    page.clock.install()
    page.goto("/monitoring/?q=bento")
    page.evaluate("""() => {
        document.querySelector('#overview-table table').dataset.stale = 'yes';
        window.swapped = [];
        htmx.on('htmx:afterSwap', e => window.swapped.push(e.detail.target.id));
    }""")

    with page.expect_response(lambda r: "/monitoring/table/" in r.url) as refresh:
        page.clock.fast_forward(15_500)
    # Not page.wait_for_function: its later polls eval() the predicate inside the page, which the
    # page's CSP (script-src 'self') refuses, so it failed whenever the first poll came before the swap.
    expect(page.locator("#overview-table table[data-stale]")).to_have_count(0)

    assert refresh.value.ok and "q=bento" in refresh.value.url
    assert page.evaluate("window.swapped") == ["overview-table"]
    assert page.locator("#overview-table table[data-stale]").count() == 0
    assert overview_rows(page) == [("bento-iris", "1")]


def test_the_host_page_shows_both_gpus_with_memory_meters(page, screenshots):
    page.goto("/hosts/gpu-a/")

    rows = page.locator("tr.gpu-row")
    assert rows.count() == 2
    meters = {}
    for i in range(2):
        row = rows.nth(i)
        meter = row.locator("meter")
        assert meter.is_visible() and meter.bounding_box()["width"] > 40
        meters[row.get_attribute("data-gpu")] = meter.evaluate("m => [m.value, m.max]")
    assert meters == {uuid: [used, GPU_MEMORY_TOTAL] for uuid, used in GPUS.items()}
    assert "80.0\xa0GiB" in rows.first.inner_text()
    page.screenshot(path=screenshots / "host_page.png", full_page=True)


def test_no_page_logs_a_console_error_or_a_failed_request_or_leaves_the_server(page, watch):
    for path in ("/models/", "/models/iris/", "/models/iris/?range=1h"):
        page.goto(path)
        if path.startswith("/models/iris/"):
            page.wait_for_selector(DRAWN)
    page.goto("/monitoring/")
    page.evaluate("() => htmx.ajax('GET', document.querySelector('#overview-table').getAttribute('hx-get'), "
                  "{target: '#overview-table', swap: 'innerHTML'})")
    for path in ("/hosts/", "/hosts/gpu-a/", "/hosts/bento-a/"):
        page.goto(path)

    assert watch.problems() == []
    assert any("/static/vendor/chart.js/" in url for url in watch.requests)
    assert any("/monitoring/table/" in url for url in watch.requests)
