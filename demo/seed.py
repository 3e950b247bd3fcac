"""Seed a running Modelyard the way a CI pipeline would: through the REST API only.

Steps, each skipped when already done, so the command can run any number of times:

1. register the model (``POST /api/v1/models/``) unless ``GET /api/v1/models/<name>/`` finds it;
2. register the serving host ``local`` (Triton) unless ``GET /api/v1/hosts/`` lists it, with the
   host's EXECUTION_ENV_PATH as a per-host config override;
3. upload a version built by ``demo.iris.build_iris_archive`` unless one is READY;
4. deploy that version to ``local`` and follow the deployment until every target is ready,
   unless Triton itself reports that version ready;
5. with ``--bento-inference-url``, the same for BentoML: the model ``iris-bento``, the host
   ``local-bento`` (runtime ``bentoml``, its agent's nginx at that URL), a Bento built by
   ``demo.iris_bento.build_iris_bento`` (a ``@bentoml.service`` around the same classifier), deployed
   unless the host's nginx already answers for that version;
6. send a burst of inference requests to each runtime over about 20 s (at the same time), so the
   model pages show live throughput and latency.

Usage::

    python -m demo.seed [--api URL] [--token-file var/admin.token] [--model iris]
                        [--inference-url http://127.0.0.1:8010]
                        [--metrics-url http://127.0.0.1:8002/metrics]
                        [--execution-env .stack/triton-env] [--requests 200]
                        [--bento-inference-url http://127.0.0.1:3000] [--bento-model iris-bento]

Exits 0 on success; 1 with the HTTP status and response body on any API error, a failed
deployment or a failed inference.
"""

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from demo import iris_bento
from demo.iris import SAMPLE_INPUT, build_iris_archive

REPO_DIR = Path(__file__).resolve().parent.parent
HOST_NAME = "local"
BENTO_HOST_NAME = "local-bento"
DEPLOY_TIMEOUT_S = 300.0
POLL_INTERVAL_S = 2.0
BURST_SECONDS = 20.0
# Connect and read timeouts in seconds; uploads and Triton calls are local and small.
HTTP_TIMEOUT = (5.0, 60.0)
# Class indices of scikit-learn's iris data set.
IRIS_CLASSES = ("setosa", "versicolor", "virginica")


class SeedError(Exception):
    """A step failed; the message says which and why."""


def describe_response(response: requests.Response) -> str:
    """Return ``"<METHOD> <url> -> <status>: <body>"`` with the body cut to 2000 characters."""
    body = response.text.strip()
    if len(body) > 2000:
        body = body[:2000] + " ..."
    return f"{response.request.method} {response.url} -> HTTP {response.status_code}: {body or '(empty body)'}"


class Api:
    """A small client of the Modelyard REST API, authenticated with an API token."""

    def __init__(self, base_url: str, token: str) -> None:
        self.base_url = base_url.rstrip("/")
        self.session = requests.Session()
        self.session.headers.update({"Authorization": f"Bearer {token}", "Accept": "application/json"})

    def url(self, path: str) -> str:
        """Return the absolute URL of ``path`` (absolute URLs pass through)."""
        if path.startswith(("http://", "https://")):
            return path
        return f"{self.base_url}/api/v1/{path.lstrip('/')}"

    def request(self, method: str, path: str, expected: tuple[int, ...] = (200,), **kwargs) -> requests.Response:
        """Send one request and return the response when its status is in ``expected``.

        Raises:
            SeedError: the API could not be reached or answered another status.
        """
        try:
            response = self.session.request(method, self.url(path), timeout=HTTP_TIMEOUT, **kwargs)
        except requests.RequestException as exc:
            raise SeedError(f"{method} {self.url(path)} failed: {exc}") from exc
        if response.status_code not in expected:
            raise SeedError(describe_response(response))
        return response

    def list_all(self, path: str) -> Iterator[dict]:
        """Yield every item of a paginated list (``{"results": [...], "next": url|null}``)."""
        url: str | None = path
        while url:
            page = self.request("GET", url).json()
            if isinstance(page, list):  # an unpaginated list
                yield from page
                return
            yield from page.get("results", [])
            url = page.get("next")


def read_token(token_file: Path) -> str:
    """Return the API token key stored in ``token_file``.

    Raises:
        SeedError: the file is missing or empty.
    """
    try:
        token = token_file.read_text().strip()
    except FileNotFoundError as exc:
        raise SeedError(
            f"{token_file} does not exist; `scripts/stack.sh start` writes it "
            "(manage.py bootstrap_local --token-file ...)"
        ) from exc
    if not token:
        raise SeedError(f"{token_file} is empty")
    return token


def ensure_model(
    api: Api, name: str,
    description: str = "Iris species classifier (scikit-learn logistic regression, ONNX), served by Triton.",
) -> None:
    """Register model ``name`` unless it exists. Idempotent."""
    response = api.request("GET", f"models/{name}/", expected=(200, 404))
    if response.status_code == 200:
        print(f"model {name}: exists")
        return
    payload = {"name": name, "description": description, "tags": {"team": "demo"}}
    response = api.request("POST", "models/", expected=(201, 400, 409), json=payload)
    if response.status_code != 201 and "exist" not in response.text.lower():
        raise SeedError(describe_response(response))
    print(f"model {name}: registered")


def ensure_host(api: Api, inference_url: str, metrics_url: str, execution_env: Path) -> None:
    """Register the Triton serving host ``local`` unless it exists. Idempotent."""
    if not (execution_env / "bin" / "python").exists():
        print(f"  warning: {execution_env} does not look like a Python environment (run `make install`)")
    register_host(api, {
        "name": HOST_NAME,
        "runtime": "triton",
        "inference_url": inference_url,
        "metrics_url": metrics_url,
        "config_overrides": {"parameters": {"EXECUTION_ENV_PATH": str(execution_env)}},
    })


def register_host(api: Api, payload: dict) -> None:
    """Register the serving host ``payload`` describes (``POST /api/v1/hosts/``) unless one of that name
    exists. Idempotent."""
    name, inference_url = payload["name"], payload["inference_url"]
    for host in api.list_all("hosts/"):
        if host.get("name") == name:
            print(f"host {name}: exists ({host.get('inference_url')})")
            if host.get("inference_url", "").rstrip("/") != inference_url.rstrip("/"):
                print(
                    f"  note: host {name} points at {host.get('inference_url')}, not {inference_url}; "
                    "the registered URL is used for deployments"
                )
            return
    response = api.request("POST", "hosts/", expected=(201, 400, 409), json=payload)
    if response.status_code != 201 and "exist" not in response.text.lower():
        raise SeedError(describe_response(response))
    print(f"host {name}: registered ({payload['runtime']} at {inference_url})")


def live_version(api: Api, model: str, host: str = HOST_NAME) -> int | None:
    """Return the version the newest successful deployment of ``model`` put on ``host``, or None."""
    for deployment in api.list_all(f"deployments/?model__name={model}"):
        for target in deployment["targets"]:
            if target["host"] == host and target["state"] == "ready":
                return deployment["version"]
    return None


def latest_ready_version(api: Api, model: str) -> int | None:
    """Return the highest READY version number of ``model``, or None."""
    ready = [v["version"] for v in api.list_all(f"models/{model}/versions/") if v.get("status") == "ready"]
    return max(ready, default=None)


def upload_version(api: Api, model: str) -> int:
    """Build the iris archive and register it as a new version of ``model``; return its number."""

    return _upload(api, model, lambda tmp: build_iris_archive(tmp / f"{model}.tar.gz", name=model), {})


def upload_bento_version(api: Api, model: str) -> int:
    """Build the iris Bento (named ``model``) and register it as a new version of ``model``; return its
    number. Its ``sample_input`` is sent to the new process before it takes traffic."""
    return _upload(api, model, lambda tmp: iris_bento.build_iris_bento(tmp, name=model),
                   {"sample_input": iris_bento.SAMPLE_INPUT})


def _upload(api: Api, model: str, build: Callable[[Path], Path], metadata: dict) -> int:
    """Build an artifact with ``build(temporary folder) -> file`` and register it as a new version."""
    with tempfile.TemporaryDirectory(prefix="modelyard-seed-") as tmp:
        archive = build(Path(tmp))
        metadata = {"source": "demo.seed", "dataset": "sklearn iris", **metadata}
        with archive.open("rb") as artifact:
            response = api.request(
                "POST",
                f"models/{model}/versions/",
                expected=(201,),
                files={"artifact": (archive.name, artifact, "application/octet-stream")},
                data={"metadata": json.dumps(metadata)},
            )
    body = response.json()
    version = int(body["version"])
    print(f"version {model}/{version}: uploaded ({body.get('status')}, {archive.name})")
    return version


def served_by_triton(inference_url: str, model: str, version: int) -> bool:
    """True when Triton at ``inference_url`` reports ``model`` version ``version`` ready."""
    url = f"{inference_url.rstrip('/')}/v2/models/{model}/versions/{version}/ready"
    try:
        return requests.get(url, timeout=HTTP_TIMEOUT).status_code == 200
    except requests.RequestException:
        return False


def served_by_bento_host(inference_url: str, model: str, version: int) -> bool:
    """True when the BentoML host's nginx at ``inference_url`` routes ``model`` to ``version`` and it is ready."""
    try:
        answer = requests.get(f"{inference_url.rstrip('/')}/{model}/readyz", timeout=HTTP_TIMEOUT)
    except requests.RequestException:
        return False
    return answer.status_code == 200 and answer.headers.get("X-Modelyard-Version") == str(version)


def deploy(api: Api, model: str, version: int, host: str = HOST_NAME) -> None:
    """Deploy ``model`` version ``version`` to ``host`` and wait until it is ready.

    Raises:
        SeedError: a target failed, or not every target was ready within 300 s.
    """
    payload = {"model": model, "version": version, "hosts": [host]}
    deployment = api.request("POST", "deployments/", expected=(201,), json=payload).json()
    deployment_id = deployment["id"]
    print(f"deployment {deployment_id}: {model}/{version} -> {host}")
    deadline = time.monotonic() + DEPLOY_TIMEOUT_S
    last_states: dict[str, str] = {}
    while True:
        targets = deployment.get("targets", [])
        states = {t["host"]: t["state"] for t in targets}
        if states != last_states:
            print("  " + ", ".join(f"{host}: {state}" for host, state in sorted(states.items())))
            last_states = states
        failed = [t for t in targets if t["state"] == "failed"]
        if failed:
            errors = "; ".join(f"{t['host']}: {t.get('error') or 'no error message'}" for t in failed)
            raise SeedError(f"deployment {deployment_id} failed: {errors}")
        if targets and all(t["state"] == "ready" for t in targets):
            print(f"deployment {deployment_id}: ready")
            return
        if time.monotonic() > deadline:
            raise SeedError(
                f"deployment {deployment_id} not ready after {DEPLOY_TIMEOUT_S:.0f}s (states: {states}); "
                f"check var/log/orchestrator.log and the agent's log ({host}) in var/log/"
            )
        time.sleep(POLL_INTERVAL_S)
        deployment = api.request("GET", f"deployments/{deployment_id}/").json()


def sample_rows() -> list[list[float]]:
    """Return the demo input rows (cm), one flower per row."""
    return [[float(x) for x in row] for row in SAMPLE_INPUT]


def infer_once(session: requests.Session, url: str, row: list[float]) -> dict:
    """Send one KServe v2 inference request of shape [1, 4] and return the decoded response.

    Raises:
        SeedError: Triton answered with an error.
    """
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 4], "data": row}]}
    try:
        response = session.post(url, json=body, timeout=HTTP_TIMEOUT)
    except requests.RequestException as exc:
        raise SeedError(f"POST {url} failed: {exc}") from exc
    if response.status_code != 200:
        raise SeedError(describe_response(response))
    return response.json()


def output_data(result: dict, name: str) -> list:
    """Return the flat data of output ``name`` in a KServe v2 response."""
    for output in result.get("outputs", []):
        if output.get("name") == name:
            return output.get("data", [])
    raise SeedError(f"inference response has no output {name!r}: {json.dumps(result)[:500]}")


def wait_for_scrapes(prometheus_url: str, host: str, timeout: float = 60.0) -> bool:
    """Wait until Prometheus has scraped ``host`` twice (a rate needs two samples); True when it has.

    Prometheus discovers the host through the app within one refresh interval; counters that
    grow before its first scrape would never show as throughput.
    """
    query = f'count_over_time(up{{host="{host}"}}[5m])'
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            answer = requests.get(f"{prometheus_url.rstrip('/')}/api/v1/query", params={"query": query}, timeout=5)
            result = answer.json().get("data", {}).get("result", [])
            if result and float(result[0]["value"][1]) >= 2:
                print(f"prometheus: scraping {host}")
                return True
        except (requests.RequestException, ValueError, KeyError, IndexError):
            pass
        time.sleep(2)
    print(f"prometheus: not scraping {host} after {timeout:g} s; sending the requests anyway")
    return False


def inference_burst(inference_url: str, model: str, count: int) -> None:
    """Send ``count`` inference requests spread over about 20 s, cycling through the sample rows."""
    if count <= 0:
        return
    url = f"{inference_url.rstrip('/')}/v2/models/{model}/infer"
    rows = sample_rows()
    interval = BURST_SECONDS / count
    session = requests.Session()
    say(f"inference: {count} requests to {url} over ~{BURST_SECONDS:.0f}s")
    started = time.monotonic()
    for i in range(count):
        row = rows[i % len(rows)]
        result = infer_once(session, url, row)
        if i == 0:
            labels = output_data(result, "label")
            names = [IRIS_CLASSES[int(x)] if 0 <= int(x) < len(IRIS_CLASSES) else str(x) for x in labels]
            say(f"  first request {row} -> label {labels} ({', '.join(names)})")
        # Pace against the start time so slow responses do not stretch the burst.
        delay = started + (i + 1) * interval - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    say(f"inference: {count} requests to {model} done in {time.monotonic() - started:.1f}s")


def bento_burst(inference_url: str, model: str, count: int) -> None:
    """Send ``count`` requests to the Bento's ``classify`` API through the host's nginx over about 20 s.

    Raises:
        SeedError: an answer other than 200.
    """
    if count <= 0:
        return
    url = f"{inference_url.rstrip('/')}/{model}/classify"
    rows, session = sample_rows(), requests.Session()
    say(f"inference: {count} requests to {url} over ~{BURST_SECONDS:.0f}s")
    started = time.monotonic()
    for i in range(count):
        try:
            response = session.post(url, json={"features": [rows[i % len(rows)]]}, timeout=HTTP_TIMEOUT)
        except requests.RequestException as exc:
            raise SeedError(f"POST {url} failed: {exc}") from exc
        if response.status_code != 200:
            raise SeedError(describe_response(response))
        if i == 0:
            served_by = response.headers.get("X-Modelyard-Version")
            say(f"  first request {rows[0]} -> {response.json()} (version {served_by})")
        delay = started + (i + 1) * BURST_SECONDS / count - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    say(f"inference: {count} requests to {model} done in {time.monotonic() - started:.1f}s")


def say(line: str) -> None:
    """Print one line in a single write, so the bursts' threads do not interleave within lines."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m demo.seed", description=__doc__.split("\n\n")[0])
    parser.add_argument("--api", default="http://127.0.0.1:8080", help="base URL of the web app")
    parser.add_argument("--token-file", type=Path, default=REPO_DIR / "var" / "admin.token")
    parser.add_argument("--model", default="iris")
    parser.add_argument("--inference-url", default="http://127.0.0.1:8010",
                        help="the Triton host's inference URL: its agent's gateway (make run: port 8010)")
    parser.add_argument("--metrics-url", default="http://127.0.0.1:8002/metrics", help="Triton metrics endpoint")
    parser.add_argument(
        "--execution-env",
        type=Path,
        default=REPO_DIR / ".stack" / "triton-env",
        help="python-backend execution environment on the serving host",
    )
    parser.add_argument("--requests", type=int, default=200, help="inference requests to send (0: none)")
    parser.add_argument("--bento-inference-url", default="",
                        help="the local BentoML host's nginx (its agent's inference URL); empty: no BentoML part")
    parser.add_argument("--bento-model", default="iris-bento", help="the BentoML model's (and Bento's) name")
    parser.add_argument("--prometheus-url", default="",
                        help="wait (up to 60 s) until this Prometheus scrapes the host before sending requests, "
                             "so the burst shows up as throughput (empty: do not wait)")
    return parser.parse_args(argv)


def seed(args: argparse.Namespace) -> None:
    """Run every step; see the module docstring.

    Raises:
        SeedError: a step failed.
    """
    api = Api(args.api, read_token(args.token_file))
    model = args.model
    ensure_model(api, model)
    ensure_host(api, args.inference_url, args.metrics_url, args.execution_env.resolve())

    version = choose_version(api, model, HOST_NAME, lambda: upload_version(api, model))
    if served_by_triton(args.inference_url, model, version):
        print(f"triton: {model}/{version} already ready on {HOST_NAME}; not deploying")
    else:
        deploy(api, model, version)

    bursts = [(HOST_NAME, lambda: inference_burst(args.inference_url, model, args.requests))]
    if args.bento_inference_url:
        bento = args.bento_model
        ensure_model(api, bento, "Iris species classifier (scikit-learn logistic regression), a BentoML service.")
        register_host(api, {"name": BENTO_HOST_NAME, "runtime": "bentoml", "inference_url": args.bento_inference_url})
        bento_version = choose_version(api, bento, BENTO_HOST_NAME, lambda: upload_bento_version(api, bento))
        if served_by_bento_host(args.bento_inference_url, bento, bento_version):
            print(f"bentoml: {bento}/{bento_version} already serving on {BENTO_HOST_NAME}; not deploying")
        else:
            deploy(api, bento, bento_version, BENTO_HOST_NAME)
        bursts.append((BENTO_HOST_NAME, lambda: bento_burst(args.bento_inference_url, bento, args.requests)))

    if args.prometheus_url:
        for host, _ in bursts:
            wait_for_scrapes(args.prometheus_url, host)
    with ThreadPoolExecutor(max_workers=len(bursts)) as pool:
        for future in [pool.submit(burst) for _, burst in bursts]:
            future.result()


def choose_version(api: Api, model: str, host: str, upload: Callable[[], int]) -> int:
    """The version of ``model`` to serve on ``host``: after a restart the one live there before (not
    merely the newest, which may be one that failed), else the newest READY one, else ``upload()``'s."""
    version = live_version(api, model, host)
    if version is not None:
        print(f"version {model}/{version}: the one last deployed to {host}")
        return version
    version = latest_ready_version(api, model)
    if version is None:
        return upload()
    print(f"version {model}/{version}: ready in the registry")
    return version


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        seed(args)
    except SeedError as exc:
        print(f"seed failed: {exc}", file=sys.stderr)
        return 1
    print("seed: done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
