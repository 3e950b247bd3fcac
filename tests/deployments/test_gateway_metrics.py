"""What the gateway of a Triton host measures of the traffic it passes (modelyard_metrics.lua), on real nginx
in front of a real tritonserver, read back from its ``GET /metrics`` with prometheus_client's parser."""

import math
import time

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from modelyard_agent.runtimes.gateway import VERSION_HEADER
from tests.deployments.test_gateway import BODY, MODEL, gateway, infer
from tests.fixtures.services import wait_for

pytestmark = pytest.mark.integration
__all__ = ["gateway"]  # fixture

REQUESTS = "modelyard_gateway_requests_total"
LATENCY = "modelyard_gateway_request_duration_seconds"


def scrape(front) -> list:
    """Every sample the gateway exposes, parsed as Prometheus parses its text format."""
    answer = requests.get(f"{front.url}/metrics", timeout=10)
    assert answer.status_code == 200 and answer.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    return [sample for family in text_string_to_metric_families(answer.text) for sample in family.samples]


def scrape_logged(front, answered: int) -> list:
    """``scrape`` once the gateway has counted all ``answered`` answers its clients had. nginx counts a request in
    its log phase, which runs after the client has the answer: at once for most, but a shadowed request's only when
    its mirrored copy ends too, so a scrape sent on the client's last answer may miss that request."""
    samples: list = []

    def counted() -> bool:
        samples[:] = scrape(front)
        return sum(s.value for s in samples if s.name == REQUESTS and s.labels["role"] != "shadow") >= answered

    wait_for(counted, timeout=10, what=f"the gateway to count {answered} answers")
    return samples


def value(samples: list, name: str, **labels) -> float:
    """The sum of the samples named ``name`` whose labels include ``labels``; a sample must exist."""
    found = [s.value for s in samples if s.name == name and labels.items() <= s.labels.items()]
    assert found, (name, labels)
    return sum(found)


def triton_stats(front, version: int) -> dict:
    """Triton's own statistics of one version of the model: {"count", "ns"} of its successful inferences."""
    stats = requests.get(f"http://{front.triton}/v2/models/{MODEL}/versions/{version}/stats", timeout=10).json()
    success = stats["model_stats"][0]["inference_stats"]["success"]
    return {"count": int(success["count"]), "ns": int(success["ns"])}


def test_every_version_a_route_gives_has_its_series_at_zero_before_its_first_request(gateway):
    gateway.set_route(MODEL, stable=1, canary=2, percent=30)
    samples = scrape(gateway)
    for version, role in (("1", "stable"), ("2", "canary"), ("1", "pinned"), ("2", "pinned")):
        for code in ("2xx", "4xx", "5xx"):
            assert value(samples, REQUESTS, model=MODEL, version=version, role=role, code=code) == 0
        assert value(samples, LATENCY + "_count", model=MODEL, version=version, role=role) == 0
        assert value(samples, LATENCY + "_bucket", model=MODEL, version=version, role=role, le="+Inf") == 0


def test_each_answer_counts_under_its_version_role_and_status_class_with_a_latency_inside_the_clients(gateway):
    gateway.set_route(MODEL, stable=1, canary=2, percent=25)
    gateway.set_request_limit(MODEL, 64 * 1024)
    seen, client_seconds = {"1": 0, "2": 0}, 0.0
    with requests.Session() as session:
        for _ in range(400):
            started = time.monotonic()
            answer = infer(session, gateway)
            client_seconds += time.monotonic() - started
            assert answer.status_code == 200
            seen[answer.headers[VERSION_HEADER]] += 1
        for _ in range(50):
            started = time.monotonic()
            assert infer(session, gateway, version=1).status_code == 200
            client_seconds += time.monotonic() - started
        # Triton refuses an input it does not know (400); the gateway refuses a body over the model's limit.
        bad = [session.post(f"{gateway.url}/v2/models/{MODEL}/infer", json={"inputs": [{"name": "nope"}]},
                            timeout=30).status_code for _ in range(10)]
        too_large = session.post(f"{gateway.url}/v2/models/{MODEL}/infer", data=b"x" * (100 * 1024),
                                 headers={"Content-Type": "application/json"}, timeout=30).status_code
    assert set(bad) == {400} and too_large == 413

    samples = scrape_logged(gateway, 400 + 50 + 10 + 1)
    assert value(samples, REQUESTS, model=MODEL, version="1", role="stable", code="2xx") == seen["1"]
    assert value(samples, REQUESTS, model=MODEL, version="2", role="canary", code="2xx") == seen["2"]
    assert value(samples, REQUESTS, model=MODEL, version="1", role="pinned", code="2xx") == 50
    assert value(samples, REQUESTS, model=MODEL, role="stable", code="4xx") + value(
        samples, REQUESTS, model=MODEL, role="canary", code="4xx") == 10
    assert value(samples, REQUESTS, model=MODEL, version="", role="refused", code="4xx") == 1
    assert value(samples, REQUESTS, model=MODEL, code="5xx") == 0

    for version, role in (("1", "stable"), ("2", "canary"), ("1", "pinned")):
        labels = {"model": MODEL, "version": version, "role": role}
        buckets = sorted((float(s.labels["le"]), s.value) for s in samples
                         if s.name == LATENCY + "_bucket" and labels.items() <= s.labels.items())
        counts = [count for _, count in buckets]
        assert buckets[-1][0] == math.inf and counts == sorted(counts), buckets  # cumulative
        assert counts[-1] == value(samples, LATENCY + "_count", **labels) == value(samples, REQUESTS, **labels)
    # The gateway's clock runs inside the client's and around Triton's own.
    gateway_seconds = sum(value(samples, LATENCY + "_sum", model=MODEL, version=version, role=role)
                          for version, role in (("1", "stable"), ("2", "canary"), ("1", "pinned")))
    triton_seconds = sum(triton_stats(gateway, version)["ns"] for version in (1, 2)) / 1e9
    assert triton_seconds < gateway_seconds < client_seconds, (triton_seconds, gateway_seconds, client_seconds)


def test_shadow_copies_count_as_the_shadows_and_triton_saw_each_of_them(gateway):
    gateway.set_route(MODEL, stable=1, shadow=2, shadow_percent=40)
    with requests.Session() as session:
        for _ in range(500):
            answer = infer(session, gateway)
            assert answer.status_code == 200 and answer.headers[VERSION_HEADER] == "1"
    # A copy is logged once Triton answered it, which may be after its client had the answer.
    def counted() -> float:
        return value(scrape(gateway), REQUESTS, model=MODEL, version="2", role="shadow")

    wait_for(lambda: counted() == triton_stats(gateway, 2)["count"], timeout=30, what="every shadow copy counted",
             describe=lambda: f"the gateway counted {counted()} shadow copies; Triton {triton_stats(gateway, 2)}")
    samples = scrape_logged(gateway, 500)
    shadows = value(samples, REQUESTS, model=MODEL, version="2", role="shadow", code="2xx")
    assert abs(shadows - 200) <= 4.5 * math.sqrt(500 * 0.4 * 0.6), shadows  # binomial(500, 0.4)
    assert value(samples, REQUESTS, model=MODEL, version="1", role="stable", code="2xx") == 500
    assert value(samples, LATENCY + "_count", model=MODEL, version="2", role="shadow") == shadows


def test_a_model_without_a_route_counts_under_the_version_triton_answered_and_404s_add_no_series(gateway):
    with requests.Session() as session:
        for _ in range(20):
            assert infer(session, gateway).json()["model_version"] == "2"  # no route: Triton's newest
        assert infer(session, gateway, version=1).status_code == 200
        unknown = [infer(session, gateway, version=9).status_code for _ in range(3)]
        nobody = [session.post(f"{gateway.url}/v2/models/no-such-{n}/infer", json=BODY, timeout=30).status_code
                  for n in range(3)]
    assert set(unknown) == set(nobody) == {404}
    samples = scrape_logged(gateway, 20 + 1 + 3 + 3)
    assert value(samples, REQUESTS, model=MODEL, version="2", role="stable", code="2xx") == 20
    assert value(samples, REQUESTS, model=MODEL, version="1", role="pinned", code="2xx") == 1
    # Neither an unknown version nor an unknown model becomes a series of its own.
    assert value(samples, REQUESTS, model="", version="", role="refused", code="4xx") == 6
    labels = {(s.labels["model"], s.labels["version"]) for s in samples if s.name == REQUESTS}
    assert not {("iris", "9")} & labels and not [m for m, _ in labels if m.startswith("no-such")]


def test_a_body_triton_refuses_as_malformed_counts_as_a_client_error_whatever_status_triton_sent(gateway):
    malformed = (b'{"inputs": [', b'{"inputs": 5}')  # Triton: "failed to parse ...", "Unable to parse 'inputs'"
    headers = {"Content-Type": "application/json"}

    def send(session, path: str) -> list:
        return [session.post(gateway.url + path, data=body, headers=headers, timeout=30) for body in malformed]

    with requests.Session() as session:
        answers = send(session, f"/v2/models/{MODEL}/infer")  # no route yet
        gateway.set_route(MODEL, stable=1, canary=None, percent=0)
        answers += send(session, f"/v2/models/{MODEL}/infer") + send(session, f"/v2/models/{MODEL}/versions/1/infer")
        assert infer(session, gateway).status_code == 200
    # The client still gets Triton's own answer; only the count calls it the client's error.
    assert [a.status_code for a in answers] == [500] * 6 and "parse" in answers[0].json()["error"]
    samples = scrape_logged(gateway, 7)
    assert value(samples, REQUESTS, model=MODEL, role="unrouted", code="4xx") == 2
    assert value(samples, REQUESTS, model=MODEL, version="1", role="stable", code="4xx") == 2
    assert value(samples, REQUESTS, model=MODEL, version="1", role="pinned", code="4xx") == 2
    assert value(samples, REQUESTS, model=MODEL, version="1", role="stable", code="2xx") == 1
    assert sum(s.value for s in samples if s.name == REQUESTS and s.labels["code"] == "5xx") == 0
