"""Why a chart of the model page has no point: ``monitoring.empty.empty_reasons`` over the series API's rows."""

from monitoring.empty import EMPTY_NO_SERIES, EMPTY_NOT_REPORTED, EMPTY_QUIET, empty_reasons


def row(*values):
    return {"version": "1", "points": [[1000 + 15 * n, v] for n, v in enumerate(values)]}


def test_no_series_of_the_model_names_every_metric():
    assert empty_reasons({"throughput": [], "latency_mean_ms": [], "queue_ms": []}) == dict.fromkeys(
        ("throughput", "latency_mean_ms", "queue_ms"), EMPTY_NO_SERIES)


def test_traffic_at_zero_leaves_the_ratios_without_points_as_no_request():
    series = {"throughput": [row(0.0, 0.0)], "latency_mean_ms": [row()], "queue_ms": [row()]}
    assert empty_reasons(series) == {"latency_mean_ms": EMPTY_QUIET, "queue_ms": EMPTY_QUIET}


def test_a_metric_without_rows_beside_traffic_is_one_the_runtime_does_not_report():
    series = {"throughput": [row(2.0)], "latency_mean_ms": [row(1.5)], "queue_ms": []}
    assert empty_reasons(series) == {"queue_ms": EMPTY_NOT_REPORTED}


def test_series_whose_points_were_all_left_out_read_as_no_request():
    assert empty_reasons({"throughput": [row()], "error_rate": []}) == {"throughput": EMPTY_QUIET,
                                                                          "error_rate": EMPTY_QUIET}
