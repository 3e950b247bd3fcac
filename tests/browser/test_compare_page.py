"""Comparing two versions in a real browser, with a real Prometheus holding both versions' traffic:
the signature changes marked compatible or breaking, the config and lineage side by side, and both
versions' serving metrics over the same window; their performance cards side by side."""

import pytest

from registry.models import ModelVersion

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def signature(dims: list[int], outputs: tuple[str, ...] = ("label",)) -> dict:
    return {"inputs": [{"name": "input", "data_type": "TYPE_FP32", "dims": dims}],
            "outputs": [{"name": name, "data_type": "TYPE_INT64", "dims": [1]} for name in outputs],
            "max_batch_size": 8}


def test_the_compare_page_marks_each_change_and_shows_both_versions_serving(page, watch, screenshots):
    ModelVersion.objects.filter(model__name="iris", version=1).update(
        signature=signature([4]), metrics={"accuracy": 0.95}, source_commit="aaa111")
    ModelVersion.objects.filter(model__name="iris", version=2).update(
        signature=signature([-1], outputs=("label", "probabilities")), metrics={"accuracy": 0.97},
        source_commit="bbb222")
    # The model page links here (tests/registry/test_compare.py); the page opens on the two newest.
    page.goto("/models/iris/compare/?a=2&b=1")
    page.wait_for_selector("#compare-metrics tr.metric-row")
    page.select_option("select[name=a]", "1")
    page.select_option("select[name=b]", "2")
    page.get_by_role("button", name="Compare").click()
    page.wait_for_url("**/models/iris/compare/?a=1&b=2*")

    assert page.locator("#signature-verdict").inner_text() == "compatible"
    verdicts = dict(page.eval_on_selector_all(
        "tr.tensor-row", "rows => rows.map(r => [r.dataset.name, r.querySelector('.verdict').textContent])"))
    assert verdicts == {"input": "compatible", "label": "same", "probabilities": "compatible",
                        "max_batch_size": "same"}
    assert page.locator('table.compare-lineage tr.changed[data-field="source_commit"]').count() == 1
    assert page.locator('table.compare-metrics tr[data-metric="accuracy"] td.delta').inner_text() == "+0.02"
    page.wait_for_selector("#compare-metrics tr.metric-row")
    rows = page.eval_on_selector_all(
        "#compare-metrics tr.metric-row", "rows => rows.map(r => [r.dataset.version, r.querySelector('.throughput')"
        ".textContent])")
    assert [version for version, _ in rows] == ["1", "2"]
    throughput = {version: float(value) for version, value in rows}
    assert throughput["1"] == pytest.approx(10, rel=0.15) and throughput["2"] == pytest.approx(20, rel=0.15)
    page.screenshot(path=screenshots / "compare_page.png", full_page=True)
    assert not watch.problems(), watch.problems()


def card_cells(page, field: str) -> list[str]:
    return page.eval_on_selector_all(
        f'.compare-card-host[data-host="staging-a"] tr[data-field="{field}"] > *',
        "cells => cells.map(c => c.innerText.trim())")


def test_the_compare_page_sets_both_cards_side_by_side_with_their_ratios(page, watch, iris_cards):
    page.goto("/models/iris/compare/?a=1&b=2")
    page.wait_for_selector("#compare-metrics tr.metric-row")  # leaving earlier would abort the panel's request
    cards = page.locator("#compare-cards")
    cards.scroll_into_view_if_needed()
    assert cards.locator("h2").inner_text() == "Performance cards"
    assert cards.locator(".no-card").count() == 0
    assert card_cells(page, "throughput") == ["Inferences/s", "6,526", "9,789", "1.50×"]
    assert card_cells(page, "p99") == ["p99 ms", "0.833", "0.666", "0.80×"]
    assert card_cells(page, "config")[3] == "same"
    assert cards.locator(".card-ratio").inner_text() == (
        "v2 against v1: 1.50× the inferences/s, 0.80× the p99, at the same recommended config.")
    profile_links = cards.locator('tr[data-field="profile"] a')
    assert profile_links.all_inner_texts() == [str(iris_cards[1].pk), str(iris_cards[2].pk)]
    profile_links.first.click()
    page.wait_for_url("**/models/iris/versions/1/#version-profiles")
    page.wait_for_selector(f"#version-profiles >> text=Profile {iris_cards[1].pk} on")
    assert not watch.problems(), watch.problems()


def test_a_version_without_a_card_links_to_where_it_is_profiled(page, watch):
    page.goto("/models/iris/compare/?a=1&b=2")
    page.wait_for_selector("#compare-metrics tr.metric-row")  # leaving earlier would abort the panel's request
    missing = page.locator("#compare-cards .no-card")
    assert missing.count() == 2
    assert "modelyard profile iris 1 --host <host> --wait" in missing.first.inner_text()
    missing.first.get_by_role("link", name="its page").click()
    page.wait_for_url("**/models/iris/versions/1/#version-profiles")
    page.wait_for_selector("#version-profiles >> text=Not profiled yet.")
    assert not watch.problems(), watch.problems()
