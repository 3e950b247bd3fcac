"""The five pages an operator reads most (fleet, model, host, rollout, version with its performance card) at
1,440 px and at 390 px in a real Chromium: nothing wider than the viewport, the first column and the key number
of each table in view without scrolling, and no console error, failed request or foreign request."""

import pytest

from deployments.models import Deployment

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

WIDTHS = (1440, 390)

# The page's width, and for each visible table its first cell and its key number's cell (the first cell marked
# ``data-key`` in its first body row, else its first numeric cell), where they lie against the viewport.
MEASURE = """() => {
    const box = el => { if (!el) { return null; } const r = el.getBoundingClientRect();
        return {left: Math.round(r.left), right: Math.round(r.right), text: el.textContent.trim().slice(0, 40)}; };
    const tables = [...document.querySelectorAll("table")].filter(t => t.offsetParent !== null).map(t => {
        const row = t.querySelector("tbody tr") || t.querySelector("tr");
        return {id: t.id || t.className, first: box(row && row.firstElementChild),
                key: box(row && (row.querySelector("[data-key]") || row.querySelector("td.num")))};
    });
    return {scroll: document.documentElement.scrollWidth, width: innerWidth, tables};
}"""


def pages() -> dict[str, str]:
    rollout = Deployment.objects.filter(model__name="iris", version__version=2).latest("created_at")
    return {"fleet": "/monitoring/", "model": "/models/iris/", "host": "/hosts/gpu-a/",
            "rollout": f"/deployments/{rollout.pk}/", "version": "/models/iris/versions/1/"}


@pytest.mark.parametrize("width", WIDTHS)
def test_each_page_fits_its_viewport_with_each_tables_first_column_and_key_number_in_view(
        page, watch, iris_cards, crowded, width):
    page.set_viewport_size({"width": width, "height": 900})
    problems = []
    for name, path in pages().items():
        page.goto(path)
        page.wait_for_load_state("networkidle")
        found = page.evaluate(MEASURE)
        if found["scroll"] > found["width"]:
            problems.append(f"{name}: the page is {found['scroll']} px wide")
        for table in found["tables"]:
            for part in ("first", "key"):
                cell = table[part]
                if cell and (cell["left"] < 0 or cell["right"] > width):
                    problems.append(f"{name}: {table['id']}'s {part} cell {cell} out of view")
    assert problems == [], "\n".join(problems)
    assert watch.problems() == []
