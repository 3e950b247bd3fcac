"""Models on demand in a real Chromium at 1,440 and 390 px: the model page's on-demand panel and the host page's
on-demand section show what the test sent through a real gateway before a real Triton (one cold start and three
hits of panel_a, panel_b evicted for the budget), with each row's first cell and its hit rate in view."""

import pytest

from tests.monitoring.test_on_demand_panel import HOST, on_demand_host  # noqa: F401 - the fixture

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

IN_VIEW = """([row, width]) => [row.firstElementChild, row.querySelector("td.hit-rate")].every(cell => {
    const r = cell.getBoundingClientRect(); return r.left >= 0 && r.right <= width; })"""


@pytest.mark.parametrize("width", (1440, 390))
def test_the_on_demand_panel_and_the_host_section_show_what_was_sent(page, watch, request, width):
    request.getfixturevalue("on_demand_host")  # after ``page``: its Prometheus, not the fleet's, is the pages'
    page.set_viewport_size({"width": width, "height": 900})

    page.goto("/models/panel_a/")
    row = page.locator(f'#model-on-demand tr.on-demand-row[data-host="{HOST}"]')
    row.wait_for()
    assert row.get_attribute("data-state") == "resident"
    assert row.locator("td.hit-rate").inner_text() == "75.0%"
    assert row.locator("td.cold-starts").inner_text() == "1"
    assert page.evaluate(IN_VIEW, [row.element_handle(), width])

    page.goto(f"/hosts/{HOST}/")
    evicted = page.locator('.host-on-demand tr.on-demand-row[data-model="panel_b"]')
    evicted.wait_for()
    assert evicted.locator("td.evictions").inner_text() == "budget 1"
    resident = page.locator('.host-on-demand tr.on-demand-row[data-model="panel_a"]')
    assert resident.locator("td.hit-rate").inner_text() == "75.0%"
    assert page.evaluate(IN_VIEW, [resident.element_handle(), width])
    assert watch.problems() == []
