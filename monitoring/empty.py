"""Why a chart of the model page has no point at all in its range: the series API's ``empty``."""

EMPTY_NO_SERIES = ("no data: Prometheus has no series of this model in the range (not served in it, or its hosts "
                   "not scraped yet)")
EMPTY_QUIET = "no data: the model answered no request in the range"
EMPTY_NOT_REPORTED = ("no data: its runtime reports none for this model (BentoML has no queue or compute time, "
                      "nor a pending count)")


def empty_reasons(series: dict[str, list]) -> dict[str, str]:
    """Why each metric without a single point has none.

    Args:
        series: ``{metric key: [{"version", "points": [[unix seconds, value], ...]}]}``, as
            ``monitoring.services.model_series`` builds it.

    Returns:
        ``{metric key: reason}`` for each key of ``series`` without a point: ``EMPTY_NO_SERIES`` for every key
        when throughput has no row at all (Prometheus holds nothing of the model), ``EMPTY_NOT_REPORTED`` for a
        metric without rows beside throughput's points (its runtime reports none), ``EMPTY_QUIET`` for rows
        whose every point was left out (ratios over no request) or for a model whose throughput rows had none.
    """
    if not any(row["points"] for row in series.get("throughput", [])):
        seen = any(series.get("throughput"))
        return {key: EMPTY_QUIET if seen else EMPTY_NO_SERIES for key in series}
    return {key: EMPTY_QUIET if rows else EMPTY_NOT_REPORTED
            for key, rows in series.items() if not any(row["points"] for row in rows)}
