"""A version deployed with no route (a plain deployment, no canary, shadow or capture) by a Triton host agent, on a
real Triton behind its real gateway: counted from its first request."""

import pytest
import requests

from modelyard_agent.runtimes.base import ServingRuntimeError
from tests.deployments.test_gateway import BODY
from tests.deployments.test_gateway_canary import host
from tests.deployments.test_gateway_metrics import LATENCY, REQUESTS, scrape, scrape_logged, value
from tests.deployments.triton_host import artifacts

pytestmark = pytest.mark.integration
__all__ = ["artifacts", "host"]  # fixtures

MODEL = "iris"


def infer_burst(url: str, count: int) -> None:
    """``count`` requests that name no version, as a client of the model sends them, each answered 200."""
    with requests.Session() as session:
        for _ in range(count):
            answer = session.post(f"{url}/v2/models/{MODEL}/infer", json=BODY, timeout=30)
            assert answer.status_code == 200, answer.text


def test_a_version_deployed_without_a_route_has_its_series_at_zero_before_its_first_request(host):
    result = host.deploy(1)
    assert result["details"]["route"] is None and "series_error" not in result["details"], result
    samples = scrape(host)
    for role in ("stable", "pinned"):
        labels = {"model": MODEL, "version": "1", "role": role}
        for code in ("2xx", "4xx", "5xx"):
            assert value(samples, REQUESTS, code=code, **labels) == 0
        assert value(samples, LATENCY + "_count", **labels) == 0
        assert value(samples, LATENCY + "_sum", **labels) == 0
        assert value(samples, LATENCY + "_bucket", le="+Inf", **labels) == 0

    # Told again (a redeployment of the same version), the gateway keeps what it counted.
    infer_burst(host.url, 20)
    assert host.gateway.create_series(MODEL, [1]) == {MODEL: [1]}
    samples = scrape_logged(host, 20)
    assert value(samples, REQUESTS, model=MODEL, version="1", role="stable", code="2xx") == 20
    assert value(samples, LATENCY + "_count", model=MODEL, version="1", role="stable") == 20


def test_the_gateway_refuses_series_that_are_not_model_names_with_version_numbers(host):
    host.gateway.ensure_running()
    for body in ([1], {MODEL: "1"}, {MODEL: [0]}, {MODEL: [1.5]}, {MODEL: {"1": 1}}, {"a\tb": [1]}, {"a/b": [1]}):
        with pytest.raises(ServingRuntimeError, match="series must be a JSON object of model names"):
            host.gateway._control("POST", body, path="/series")
    assert "modelyard_gateway_requests_total{" not in requests.get(f"{host.url}/metrics", timeout=10).text
