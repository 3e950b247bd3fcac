"""The PromQL catalogue: ranges, steps and query shapes."""

import pytest

from monitoring import promql


@pytest.mark.parametrize("text,seconds", [("15m", 900), ("1h", 3600), ("6h", 21600), ("24h", 86400), ("7d", 604800)])
def test_it_parses_the_ranges_the_pages_offer(text, seconds):
    assert promql.parse_range(text) == seconds


@pytest.mark.parametrize("text", ["", "15", "m15", "0m", "30s", "31d", "1w", "15m;drop", "1.5h", "15m\n"])
def test_it_refuses_a_malformed_or_out_of_bounds_range(text):
    with pytest.raises(promql.InvalidRange):
        promql.parse_range(text)


@pytest.mark.parametrize("seconds", [60, 900, 3600, 21600, 86400, 604800, 30 * 86400])
def test_the_step_keeps_every_series_at_300_points_or_fewer(seconds):
    step = promql.step_for(seconds)
    assert step >= promql.MIN_STEP_SECONDS
    assert seconds // step <= promql.MAX_POINTS


COUNTER_METRICS = ("throughput", "latency_mean_ms", "error_rate", "queue_ms", "compute_ms")


# A counter of each runtime that every counter metric reads.
READ_COUNTERS = {
    "throughput": ("nv_inference_count", "bentoml_service_request_total"),
    "latency_mean_ms": ("nv_inference_request_duration_us", "bentoml_service_request_duration_seconds_sum"),
    "error_rate": ("nv_inference_request_failure", "bentoml_service_request_total"),
    "queue_ms": ("nv_inference_queue_duration_us",),
    "compute_ms": ("nv_inference_compute_infer_duration_us", "nv_cache_num_hits_per_model"),
}


@pytest.mark.parametrize("key", COUNTER_METRICS)
def test_counters_are_summed_by_model_and_version_and_count_a_series_first_seen_inside_the_window_whole(key):
    query = promql.METRICS_BY_KEY[key].build({"model": "iris"}, 60)
    assert "sum by (model, version)" in query
    assert 'model="iris"' in query
    # rate() and increase() alone lose what a series' first sample held (a burst before its first scrape).
    assert "rate(" not in query
    for counter in READ_COUNTERS[key]:
        series = counter + ('{model="iris",endpoint!~"/livez|/readyz|/healthz|/metrics"}'
                            if counter.startswith("bentoml") else '{model="iris"}')
        assert (f"(({series} unless {series} offset 60s) unless resets({series}[60s]) > 0)"
                f" or increase({series}[60s])") in query, counter


def test_a_rate_is_the_counters_rise_over_the_windows_seconds():
    query = promql.throughput({"model": "iris"}, 900)
    series = 'nv_inference_count{model="iris"}'
    assert query.startswith(f"(sum by (model, version)((({series} unless {series} offset 900s)"
                            f" unless resets({series}[900s]) > 0) or increase({series}[900s])) / 900)")


@pytest.mark.parametrize("metric", promql.MODEL_METRICS, ids=lambda m: m.key)
def test_every_metric_has_a_unit_and_builds_for_one_model_or_the_whole_fleet(metric):
    assert metric.unit
    assert 'model="iris"' in metric.build({"model": "iris"}, 60)
    assert "model=" not in metric.build({}, 60)


@pytest.mark.parametrize("key", ["throughput", "latency_mean_ms", "latency_p95_ms", "error_rate", "pending_requests"])
def test_triton_and_bentoml_series_share_one_meaning(key):
    query = promql.METRICS_BY_KEY[key].build({}, 60)
    assert "nv_inference" in query and "bentoml_service_request" in query
    assert 'endpoint!~"/livez|/readyz|/healthz|/metrics"' in query


def test_the_rate_window_never_drops_below_four_scrapes():
    assert "[30s]" in promql.throughput({}, 5)


def test_label_values_are_escaped():
    assert 'model="a\\"b"' in promql.throughput({"model": 'a"b'}, 60)


@pytest.mark.parametrize("value,text", [(None, "—"), (512, "512 bytes"), (1536, "1.5\xa0KiB"),
                                        (85899345920, "80.0\xa0GiB"), (3 * 1024**4, "3.0\xa0TiB")])
def test_byte_counts_are_shown_in_binary_units(value, text):
    from monitoring.templatetags.monitoring_tags import binary_bytes

    assert binary_bytes(value) == text


def test_the_request_count_is_an_increase_over_the_window_of_successes_and_failures_per_version():
    query = promql.requests_in_window({"model": "iris"}, 600)
    series = '{model="iris",__name__=~"nv_inference_request_success|nv_inference_request_failure"}'
    assert (f"(({series} unless {series} offset 600s) unless resets({series}[600s]) > 0)"
            f" or increase({series}[600s])") in query
    assert "sum by (model, version)" in query and "bentoml_service_request_total" in query
