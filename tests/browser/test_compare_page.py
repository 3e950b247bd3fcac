"""Comparing two versions in a real browser, with a real Prometheus holding both versions' traffic:
the signature changes marked compatible or breaking, the config and lineage side by side, and both
versions' serving metrics over the same window."""

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
