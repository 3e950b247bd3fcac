"""Layouts in a real browser: the models list fits 1440 px with its serving and alias columns, and at
390 px (a phone) the model page is one column with its charts the whole width, the navigation folds
into a menu, and each wide table scrolls inside its own box rather than the page."""

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

# Whether the page scrolls sideways, and every table wider than the box it is drawn in.
OVERFLOW = """() => {
    const root = document.documentElement;
    const tables = [...document.querySelectorAll("table")].map(t => ({
        cls: t.className, right: t.getBoundingClientRect().right, scroll: t.scrollWidth, client: t.clientWidth,
        overflowX: getComputedStyle(t).overflowX}));
    return {scroll: root.scrollWidth, client: root.clientWidth, width: innerWidth, tables};
}"""


def test_the_models_list_fits_1440_px_with_its_serving_and_alias_columns(page, watch, crowded, screenshots):
    page.set_viewport_size({"width": 1440, "height": 900})
    page.goto("/models/")
    headers = page.locator("table.models thead th").all_inner_texts()
    assert headers[2:4] == ["Serving", "Aliases"]
    iris = page.locator("tr.model-row", has=page.locator('a[href="/models/iris/"]'))
    assert iris.locator("td.serving").inner_text() == "v2 on gpu-a"
    assert "@production v2" in iris.locator("td.aliases").inner_text()
    page.screenshot(path=screenshots / "models-1440.png", full_page=True)
    measured = page.evaluate(OVERFLOW)
    assert measured["scroll"] <= measured["client"], measured
    (table,) = [t for t in measured["tables"] if "models" in t["cls"]]
    assert table["scroll"] <= table["client"] and table["right"] <= measured["width"], table
    # The top bar is not folded on a wide screen: the links show, the menu's summary does not.
    assert page.get_by_role("link", name="Hosts").is_visible()
    assert page.locator("#nav-menu > summary").is_hidden()
    assert watch.problems() == []


def test_the_model_page_at_390_px_is_one_column_with_a_folded_menu_and_tables_in_their_own_box(
    page, watch, crowded, screenshots
):
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto("/models/iris/")
    page.wait_for_selector('#model-charts[data-drawn="true"]')
    page.wait_for_selector("#model-serving table.serving-hosts")
    page.wait_for_selector("#model-deployments table, #model-deployments .empty")
    page.screenshot(path=screenshots / "model-390.png", full_page=True)

    # The navigation folds into a menu that opens on a tap.
    hosts_link = page.get_by_role("link", name="Hosts")
    assert hosts_link.is_hidden()
    page.locator("#nav-menu > summary").click()
    assert hosts_link.is_visible()
    box = hosts_link.bounding_box()
    assert box["x"] + box["width"] <= 390

    # One column of charts, each about as wide as the column.
    figures = page.locator("#model-charts figure")
    boxes = [figures.nth(i).bounding_box() for i in range(figures.count())]
    assert len(boxes) == 4 and len({round(b["x"]) for b in boxes}) == 1
    column = page.locator("#model-charts").bounding_box()
    assert all(b["width"] >= column["width"] - 1 and b["width"] >= 300 for b in boxes), boxes
    assert sorted(b["y"] for b in boxes) == [b["y"] for b in boxes]

    # Nothing scrolls the page sideways; a table wider than the screen scrolls in its own box.
    measured = page.evaluate(OVERFLOW)
    assert measured["scroll"] <= measured["client"], measured
    for table in measured["tables"]:
        assert table["right"] <= measured["width"] + 0.5, table
        if table["scroll"] > table["client"]:
            assert table["overflowX"] == "auto", table
    assert any(t["scroll"] > t["client"] for t in measured["tables"]), "no table was wider than the screen"
    assert watch.problems() == []


@pytest.mark.parametrize("path", ["/models/", "/models/iris/versions/2/", "/models/iris/compare/?a=1&b=2",
                                  "/monitoring/", "/deployments/new/iris/", "/models/iris/upload/", "/audit/"])
def test_no_page_scrolls_sideways_at_390_px(page, watch, crowded, path):
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(path)
    page.wait_for_load_state("networkidle")
    measured = page.evaluate(OVERFLOW)
    assert measured["scroll"] <= measured["client"], measured
    assert all(t["right"] <= measured["width"] + 0.5 for t in measured["tables"]), measured["tables"]
    assert page.get_by_role("link", name="Hosts").is_hidden()
