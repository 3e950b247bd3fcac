"""Prometheus adapter: the only module that talks to Prometheus (through prometheus-api-client)."""

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import requests
import urllib3
from django.conf import settings
from prometheus_api_client import PrometheusApiClientException, PrometheusConnect
from urllib3.util.retry import Retry


def _is_timeout(exc: requests.RequestException) -> bool:
    """True when the request timed out; with retries off, urllib3 wraps timeouts in a ConnectionError."""
    if isinstance(exc, requests.Timeout):
        return True
    reason = getattr(exc.args[0], "reason", None) if exc.args else None
    if isinstance(reason, urllib3.exceptions.NewConnectionError):  # a refused connection, despite its base class
        return False
    return isinstance(reason, TimeoutError | urllib3.exceptions.TimeoutError)


class PrometheusUnavailable(Exception):
    """Prometheus could not be reached, timed out, or refused the query; the message says which."""


@dataclass(frozen=True)
class Sample:
    """One series' value at one instant: its labels and the value."""

    labels: dict[str, str]
    value: float


@dataclass(frozen=True)
class Series:
    """One series over a range: its labels, its (unix seconds, value) points, and how many of its points were
    left out because Prometheus computed no number there (``undefined``: NaN or ±Inf)."""

    labels: dict[str, str]
    points: list[tuple[float, float]]
    undefined: int = 0


class Samples(list):
    """An instant query's finite samples (a list of ``Sample``), with ``undefined``: the label sets of the
    series whose value was NaN or ±Inf, as ``(labels, "NaN" | "+Inf" | "-Inf")``."""

    def __init__(self, samples=(), undefined=()):
        super().__init__(samples)
        self.undefined: list[tuple[dict[str, str], str]] = list(undefined)


def undefined_reason(value_text: str) -> str:
    """Why a figure whose PromQL value was ``value_text`` ("NaN", "+Inf", "-Inf") is given as null."""
    if value_text == "NaN":
        return "no number: Prometheus computed NaN (0/0: nothing of this kind in the range)"
    return (f"no number: Prometheus computed {value_text} (a division by 0: e.g. time spent on requests while "
            "none succeeded in the range)")


MAX_PARALLEL_QUERIES = 6


class PrometheusClient:
    """Runs PromQL against one Prometheus server.

    Args:
        url: the server's base URL; defaults to ``settings.PROMETHEUS_URL``.
        timeout: seconds per request; defaults to ``settings.PROMETHEUS_TIMEOUT``.
    """

    def __init__(self, url: str | None = None, timeout: float | None = None):
        self.url = url or settings.PROMETHEUS_URL
        self.timeout = timeout or settings.PROMETHEUS_TIMEOUT
        self._conn = PrometheusConnect(url=self.url, disable_ssl=True, retry=Retry(total=0), timeout=self.timeout)

    def _call(self, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except requests.RequestException as exc:
            if _is_timeout(exc):
                raise PrometheusUnavailable(
                    f"Prometheus at {self.url} did not answer within {self.timeout} s"
                ) from exc
            raise PrometheusUnavailable(f"Prometheus at {self.url} is unreachable") from exc
        except PrometheusApiClientException as exc:
            raise PrometheusUnavailable(f"Prometheus refused the query: {exc}") from exc

    def instant(self, query: str) -> list[Sample]:
        """Evaluate ``query`` now.

        Returns:
            One Sample per series with a finite value; the series whose value is NaN (0/0) or ±Inf (x/0) are
            in ``undefined``: no number to show, and none that JSON can carry.

        Raises:
            PrometheusUnavailable: unreachable, timed out, or the query failed.
        """
        result = self._call(self._conn.custom_query, query)
        samples = Samples()
        for item in result:
            text = item["value"][1]
            value = float(text)
            if math.isfinite(value):
                samples.append(Sample(labels=dict(item["metric"]), value=value))
            else:
                samples.undefined.append((dict(item["metric"]), text))
        return samples

    def range(self, query: str, *, seconds: int, step: int, end: datetime | None = None) -> list[Series]:
        """Evaluate ``query`` over the last ``seconds`` seconds every ``step`` seconds.

        Returns:
            One Series per label set; points whose value is NaN or ±Inf are left out and counted in its
            ``undefined``.

        Raises:
            PrometheusUnavailable: unreachable, timed out, or the query failed.
        """
        end = end or datetime.now(UTC)
        start = end - timedelta(seconds=seconds)
        result = self._call(self._conn.custom_query_range, query, start_time=start, end_time=end, step=f"{step}s")
        series = []
        for item in result:
            values = [(float(t), float(v)) for t, v in item["values"]]
            points = [(t, v) for t, v in values if math.isfinite(v)]
            series.append(Series(labels=dict(item["metric"]), points=points, undefined=len(values) - len(points)))
        return series

    def gather(self, jobs: dict) -> dict:
        """Run independent queries concurrently; a page's panels then wait for the slowest, not the sum.

        Args:
            jobs: key -> a no-argument callable issuing one query (``lambda: client.instant(q)``).

        Returns:
            key -> that callable's result.

        Raises:
            PrometheusUnavailable: from the first job that failed.
        """
        if len(jobs) <= 1:
            return {key: job() for key, job in jobs.items()}
        with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL_QUERIES, len(jobs))) as pool:
            futures = {key: pool.submit(job) for key, job in jobs.items()}
            return {key: future.result() for key, future in futures.items()}
