"""Prometheus adapter: the only module that talks to Prometheus (through prometheus-api-client)."""

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
    """One series over a range: its labels and (unix seconds, value) points."""

    labels: dict[str, str]
    points: list[tuple[float, float]]


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
            One Sample per series; NaN values are dropped.

        Raises:
            PrometheusUnavailable: unreachable, timed out, or the query failed.
        """
        result = self._call(self._conn.custom_query, query)
        samples = []
        for item in result:
            value = float(item["value"][1])
            if value == value:  # NaN from 0/0 means "no data", not a number to show
                samples.append(Sample(labels=dict(item["metric"]), value=value))
        return samples

    def range(self, query: str, *, seconds: int, step: int, end: datetime | None = None) -> list[Series]:
        """Evaluate ``query`` over the last ``seconds`` seconds every ``step`` seconds.

        Returns:
            One Series per label set, NaN points dropped.

        Raises:
            PrometheusUnavailable: unreachable, timed out, or the query failed.
        """
        end = end or datetime.now(UTC)
        start = end - timedelta(seconds=seconds)
        result = self._call(self._conn.custom_query_range, query, start_time=start, end_time=end, step=f"{step}s")
        series = []
        for item in result:
            points = [(float(t), float(v)) for t, v in item["values"] if float(v) == float(v)]
            series.append(Series(labels=dict(item["metric"]), points=points))
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
