"""The registry's pages in a real browser at the benchmark's scale: the models list, a search by tag and a model
page, each opened in headless Chromium (Debian's, driven by Playwright) logged in with a session cookie, timed
with the browser's own Navigation Timing (W3C, https://www.w3.org/TR/navigation-timing-2/) and checked to show
the rows the registry holds.

For each page, over ``rounds`` visits after ``warmup`` (static files cached, as a returning user has them):

- ``load``: from the navigation's start to the end of its ``load`` event (the document, its styles and scripts,
  parsed and rendered), ms;
- ``panels``: from the same start to the last answer of the panels the page loads as it opens (htmx's
  ``hx-trigger="load"``), ms; the model page's Prometheus panels answer "unreachable" at once here (no
  Prometheus runs beside the benchmark), so this is the registry's part of them.

The rows checked: the models list shows the first page of model names in order, the search the first models
tagged ``team=team-3`` in order, the model page its versions newest first.
"""

from __future__ import annotations

from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run"]
TAG_TEAM = 3  # the team whose tag the search asks for (models i with i mod 10 == 3)
MODEL = 7  # the model whose page is opened
_NAMES = "tr > td:first-child > a[href^='/models/']"  # a row's model name, in the list's first column

# The navigation's load end and the last panel answer, ms from the navigation's start.
_TIMING = """() => {
    const nav = performance.getEntriesByType("navigation")[0];
    const panels = performance.getEntriesByType("resource").filter(r => r.initiatorType === "xmlhttprequest"
        || r.initiatorType === "fetch");
    return {load: nav.loadEventEnd, panels: Math.max(nav.loadEventEnd, ...panels.map(r => r.responseEnd))};
}"""


def pages(model_name, models: int, versions: int, page_size: int) -> dict:
    """``{label: (path, the texts its rows must show in order, the CSS selector of those texts)}``."""
    tagged = [model_name(i) for i in range(models) if i % 10 == TAG_TEAM][:page_size]
    return {
        "models list": ("/models/", [model_name(i) for i in range(min(models, page_size))], _NAMES),
        "search by tag": (f"/models/?tag=team%3Dteam-{TAG_TEAM}", tagged, _NAMES),
        "a model page": (f"/models/{model_name(MODEL)}/", [f"v{n}" for n in range(versions, 0, -1)],
                         f"tr > td:first-child > a[href^='/models/{model_name(MODEL)}/versions/']"),
    }


def _distinct(texts: list[str]) -> list[str]:
    """``texts`` without repeats, in first-seen order (a row may link its name twice)."""
    seen: dict[str, None] = {}
    for text in texts:
        seen.setdefault(text.strip(), None)
    return list(seen)


def browse(base_url: str, cookie_name: str, cookie: str, page_specs: dict, *, warmup: int, rounds: int,
           stats_ms) -> dict:
    """Open each page of ``page_specs`` (``pages``) ``warmup + rounds`` times and time the last ``rounds``.

    Returns:
        ``{label: {"path", "load": stats_ms(...), "panels": stats_ms(...), "rows_shown", "rows_expected",
        "rows_right": bool}}``; times in ms.

    Raises:
        RuntimeError: a page answered anything but 200.
    """
    from playwright.sync_api import sync_playwright

    results = {}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1440, "height": 900})
            context.add_cookies([{"name": cookie_name, "value": cookie, "url": base_url}])
            page = context.new_page()
            for label, (path, expected, selector) in page_specs.items():
                loads, panels = [], []
                for visit in range(warmup + rounds):
                    answer = page.goto(f"{base_url}{path}", wait_until="load")
                    if answer is None or answer.status != 200:
                        raise RuntimeError(f"{path} answered {answer.status if answer else 'nothing'}")
                    page.wait_for_load_state("networkidle")  # the panels are in
                    timing = page.evaluate(_TIMING)
                    if visit >= warmup:
                        loads.append(timing["load"] / 1000)
                        panels.append(timing["panels"] / 1000)
                shown = _distinct(page.locator(selector).all_inner_texts())[:len(expected)]
                results[label] = {"path": path, "load": stats_ms(loads), "panels": stats_ms(panels),
                                  "rows_shown": len(shown), "rows_expected": len(expected),
                                  "rows_right": shown == expected}
        finally:
            browser.close()
    return results


def markdown(browser: dict, budget_ms: float) -> list[str]:
    """The results' section for ``browse``'s figures (or its error), against a render budget of ``budget_ms``."""
    lines = ["## The pages in a browser (Modelyard only)", ""]
    if "error" in browser:
        return lines + [f"Not measured: {browser['error']}", ""]
    lines += [f"Headless Chromium, logged in, 1,440 × 900, static files cached; Navigation Timing from the "
              f"navigation's start (`bench/registry_pages.py`). Budget: {budget_ms:g} ms to the `load` event.", "",
              "| page | load p50 ms | load p95 ms | panels in, p50 ms | rows right | within budget |",
              "|---|---|---|---|---|---|"]
    for label, row in browser.items():
        within = "yes" if row["load"]["p95_ms"] <= budget_ms else "**no**"
        right = f"{row['rows_shown']} of {row['rows_expected']}" + ("" if row["rows_right"] else " (**wrong**)")
        lines.append(f"| {label} (`{row['path']}`) | {row['load']['p50_ms']} | {row['load']['p95_ms']} | "
                     f"{row['panels']['p50_ms']} | {right} | {within} |")
    return lines + [""]
