"""The PromQL catalogue: ranges, steps and query shapes."""

import pytest

from monitoring import promql


@pytest.mark.parametrize("text,seconds", [("15m", 900), ("1h", 3600), ("6h", 21600), ("24h", 86400), ("7d", 604800)])
def test_it_parses_the_ranges_the_pages_offer(text, seconds):
    assert promql.parse_range(text) == seconds


@pytest.mark.parametrize("text", ["", "15", "m15", "0m", "30s", "31d", "1w", "15m;drop", "1.5h"])
def test_it_refuses_a_malformed_or_out_of_bounds_range(text):
    with pytest.raises(promql.InvalidRange):
        promql.parse_range(text)


@pytest.mark.parametrize("seconds", [60, 900, 3600, 21600, 86400, 604800, 30 * 86400])
def test_the_step_keeps_every_series_at_300_points_or_fewer(seconds):
    step = promql.step_for(seconds)
    assert step >= promql.MIN_STEP_SECONDS
    assert seconds // step <= promql.MAX_POINTS


def test_counters_are_read_through_rate_and_summed_by_model_and_version():
    for query in (promql.throughput("iris", 60), promql.error_rate("iris", 60), promql.latency_mean_ms("iris", 60)):
        assert "rate(" in query
        assert "sum by (model, version)" in query
        assert 'model="iris"' in query


def test_label_values_are_escaped():
    assert 'model="a\\"b"' in promql.throughput('a"b', 60)
