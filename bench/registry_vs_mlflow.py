"""Benchmark: the registry API against an MLflow tracking server, both on PostgreSQL (10,000 models × 5 versions by
default; ``--models 100000 --versions 10`` for the large registry).

What it runs, all on this machine, on free ports and in dedicated databases:

1. MLflow from PyPI in its own virtualenv (``bench/.mlflow-venv``, created on first use; MLflow pins
   many packages, so it never goes into the project's ``.venv``), serving
   ``mlflow server --backend-store-uri postgresql+psycopg2://…/bench_mlflow`` in each configuration of
   ``MLFLOW_CONFIGS`` (uvicorn with 1 and 2 workers, gunicorn with 2), telemetry off. Filled by
   ``bench/mlflow_populate.py``: 100 models through MLflow's store API (timed), the rest in bulk with
   PostgreSQL's ``COPY`` into MLflow's own tables (as its SQLAlchemy models define them).
2. Modelyard under gunicorn (``--workers``), ``MODELYARD_DEBUG=false``, database ``bench_registry``
   (``manage.py migrate``), filled with bulk ORM inserts: rows only, no S3 objects (no read here reads an
   artifact).
3. Each model has a tag ``team=team-<i mod 10>``, each version ``stage=bench``. For each operation the two
   servers get the same request in turn, ``--warmup`` times, then ``--requests`` timed times, once over one
   keep-alive session each and once with a fresh TCP connection per request; p50/p95 in ms. The operations
   (``operations``): the floor (ours: ``/api/v1/whoami/``; MLflow's: ``/health``), one page of 50 models,
   search by tag, search by a name substring, the page after 1,000 pages (or all but the last), a model's
   versions by tag, and one version.
4. SQL queries per list page, counted in-process with Django's ``CaptureQueriesContext`` at
   ``page_size`` 5 and 50.
5. Modelyard only (MLflow's UI is a JavaScript application over the same search API): the HTML models
   list ``GET /models/`` (50 models a page, with the serving and alias columns), as a logged-in user
   with a session cookie, ``--requests`` timed times after the warm-ups; p50/p95 in ms and its SQL
   queries. Every model has aliases ``production`` (its newest version) and ``staging`` (the one
   before), and the first ``SERVED_MODELS`` models serve their newest version on one of
   ``SERVING_HOSTS`` hosts, so the first page fills both columns.
6. Modelyard only: the models list, a search by tag and a model page opened in headless Chromium, timed with
   the browser's Navigation Timing and checked to show the right rows (``registry_pages``), against
   ``PAGE_BUDGET_MS``.

Verdict PASS when, in both connection modes, every read's p50 and p95 are at least ``--target-ratio`` times
faster than MLflow's fastest configuration for that read, or our p50 is within ``FLOOR_FACTOR`` of our floor's.
Nothing here asserts it.

Usage::

    python bench/registry_vs_mlflow.py                        # 10k x 5: bench/results/registry_vs_mlflow.md
    python bench/registry_vs_mlflow.py --models 100000 --versions 10 --requests 100 \
        --json bench/results/registry_vs_mlflow_100k.json --markdown bench/results/registry_vs_mlflow_100k.md
"""

import argparse
import base64
import json
import os
import random
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote

import registry_pages
import requests
from overview import free_port, machine, stats_ms

REPO = Path(__file__).resolve().parents[1]
MLFLOW_VENV = REPO / "bench" / ".mlflow-venv"
# Named apart by MODELYARD_BENCH_DB_SUFFIX where two checkouts run it at once (each drops its databases first).
OUR_DATABASE = "bench_registry" + os.environ.get("MODELYARD_BENCH_DB_SUFFIX", "")
MLFLOW_DATABASE = "bench_mlflow" + os.environ.get("MODELYARD_BENCH_DB_SUFFIX", "")
TEAMS = 10
PAGE_SIZE = 50
SERVED_MODELS = 100
SERVING_HOSTS = 10
# What "within the floor" allows (issue 48): an operation's p50 over the floor's p50, in the same run and mode.
FLOOR_FACTOR = 1.5
# Issue 48: the model list, a search and a model page render in under this many ms at 100k x 10 (browser check).
PAGE_BUDGET_MS = 150
# MLflow's server as its documentation offers it: uvicorn (the default since MLflow 3) with 1 and 2 workers,
# and gunicorn (``--gunicorn-opts``) with 2; telemetry off. The fastest one per operation is the anchor.
MLFLOW_CONFIGS = (("uvicorn", 1), ("uvicorn", 2), ("gunicorn", 2))
MODES = ("keep-alive", "fresh")
# Telemetry and the job runner (MLflow 3.5+ starts one with the server) off, as for a registry in production.
MLFLOW_ENV = {"MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def log(message: str) -> None:
    print(f"[registry] {message}", file=sys.stderr, flush=True)


def psycopg_connect(database: str):
    import psycopg

    return psycopg.connect(f"postgresql://postgres@127.0.0.1:5432/{database}", autocommit=True)


def admin_sql(*statements: str) -> None:
    with psycopg_connect("postgres") as conn:
        for statement in statements:
            conn.execute(statement)


def recreate_databases() -> None:
    for name in (OUR_DATABASE, MLFLOW_DATABASE):
        admin_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)", f"CREATE DATABASE {name}")


def drop_databases() -> None:
    for name in (OUR_DATABASE, MLFLOW_DATABASE):
        admin_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def mlflow_python() -> Path:
    """MLflow's own virtualenv, created (``pip install mlflow psycopg2-binary``) when missing."""
    python = MLFLOW_VENV / "bin" / "python"
    if not (MLFLOW_VENV / "bin" / "mlflow").exists():
        log(f"installing MLflow into {MLFLOW_VENV}")
        subprocess.run([sys.executable, "-m", "venv", str(MLFLOW_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "mlflow", "psycopg2-binary"], check=True)
    return python


def mlflow_version(python: Path) -> str:
    return subprocess.run([str(python), "-c", "import mlflow; print(mlflow.__version__)"], capture_output=True,
                          text=True, check=True).stdout.strip()


class Server:
    """A server subprocess in its own process group, logging to a file."""

    def __init__(self, name: str, args: list[str], env: dict, health_url: str, log_dir: Path):
        self.name, self.health_url = name, health_url
        self.base_url = ""  # where to send requests, when the starter knows it
        self.log_path = log_dir / f"{name}.log"
        self.process = subprocess.Popen(args, cwd=REPO, env=env, stdout=self.log_path.open("wb"),
                                        stderr=subprocess.STDOUT, start_new_session=True)

    def wait(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {self.log_path.read_text()[-2000:]}")
            try:
                if requests.get(self.health_url, timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.name} did not answer {self.health_url} within {timeout} s")

    def stop(self) -> None:
        import signal

        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)


def modelyard_env(database: str) -> dict:
    """The environment of our server (and of this process's Django) on ``database``: production settings
    (``MODELYARD_DEBUG=false``), a fresh secret key, plain HTTP on 127.0.0.1, warnings only in the log."""
    return {**os.environ, "DATABASE_URL": f"postgres://postgres@127.0.0.1:5432/{database}",
            "MODELYARD_DEBUG": "false", "MODELYARD_SECRET_KEY": uuid.uuid4().hex * 2,
            "MODELYARD_SSL_REDIRECT": "false", "MODELYARD_LOG_LEVEL": "WARNING",
            "DJANGO_SETTINGS_MODULE": "modelyard.settings"}


def migrate(env: dict) -> float:
    """``manage.py migrate``, then ``collectstatic`` (the pages' styles and scripts, which the server gives with
    ``MODELYARD_DEBUG=false`` only from there, as a deployment has them), with ``env``; returns the seconds the
    migration took."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput"], cwd=REPO, env=env, check=True,
                   capture_output=True)
    took = round(time.perf_counter() - started, 1)
    subprocess.run([sys.executable, "manage.py", "collectstatic", "--noinput"], cwd=REPO, env=env, check=True,
                   capture_output=True)
    return took


def start_modelyard(env: dict, workers: int, log_dir: Path) -> "Server":
    """gunicorn serving ``modelyard.wsgi`` with ``workers`` workers and the shipped configuration
    (``modelyard.gunicorn_config``) on a free port of 127.0.0.1, started with
    ``env`` and answering ``/healthz``; its ``base_url`` is where to send requests.

    Raises:
        RuntimeError: it exited or did not answer within 180 s (the server is stopped).
    """
    port = free_port()
    server = Server("modelyard", [str(Path(sys.executable).parent / "gunicorn"), "-c",
                                  "python:modelyard.gunicorn_config", "modelyard.wsgi", "-b", f"127.0.0.1:{port}",
                                  "--workers", str(workers)],
                    env, f"http://127.0.0.1:{port}/healthz", log_dir)
    server.base_url = f"http://127.0.0.1:{port}"
    try:
        server.wait()
    except BaseException:
        server.stop()
        raise
    return server


def model_name(i: int) -> str:
    return f"model-{i:05d}"


def populate_ours(models: int, versions: int) -> dict:
    """Bulk ORM inserts: models with a team tag, READY versions (rows only), a user with a token."""
    from django.contrib.auth import get_user_model
    from django.db import transaction

    from accounts.choices import Role
    from accounts.services import default_team, set_membership
    from accounts.tokens import default_scopes, issue_token
    from registry.choices import ArtifactFormat
    from registry.models import ModelVersion, RegisteredModel

    started = time.perf_counter()
    with transaction.atomic():
        user = get_user_model().objects.create_user(username="bench", password=uuid.uuid4().hex)
        # an owner of the team the models go to, as a user of the product would be (not an administrator,
        # whose lists skip the team filter)
        set_membership(team=default_team(), user=user, role=Role.OWNER)
        token = issue_token(user=user, name="bench", scopes=default_scopes(user))[1]
        for low in range(0, models, 2000):
            rows = RegisteredModel.objects.bulk_create(
                RegisteredModel(name=model_name(i), tags={"team": f"team-{i % TEAMS}"}, next_version=versions + 1,
                                created_by=user)
                for i in range(low, min(low + 2000, models))
            )
            ModelVersion.objects.bulk_create(
                ModelVersion(model=m, version=v, format=ArtifactFormat.TRITON_MODEL_DIR,
                             artifact_key=f"sha256/{m.name}/{v}", artifact_sha256=uuid.uuid4().hex * 2,
                             artifact_size=50_000_000, created_by=user, tags={"stage": "bench"})
                for m in rows for v in range(1, versions + 1)
            )
        serve_and_alias(user, versions)
    return {"populate_s": round(time.perf_counter() - started, 1), "token": token}


def serve_and_alias(user, versions: int) -> None:
    """Aliases ``production`` (newest version) and ``staging`` (the one before) on every model, and the
    newest version of the first ``SERVED_MODELS`` models ready on one of ``SERVING_HOSTS`` hosts."""
    from deployments.choices import DeploymentStatus, TargetState
    from deployments.models import Deployment, DeploymentTarget, ServingHost
    from registry.models import Alias, ModelVersion

    newest = {v.model_id: v for v in ModelVersion.objects.filter(version=versions)}
    before = {v.model_id: v for v in ModelVersion.objects.filter(version=max(versions - 1, 1))}
    Alias.objects.bulk_create([Alias(model_id=m, name="production", version=v, updated_by=user)
                               for m, v in newest.items()], batch_size=2000)
    Alias.objects.bulk_create([Alias(model_id=m, name="staging", version=v, updated_by=user)
                               for m, v in before.items()], batch_size=2000)
    hosts = ServingHost.objects.bulk_create(ServingHost(name=f"gpu-{n}", inference_url=f"http://gpu-{n}:8000")
                                            for n in range(SERVING_HOSTS))
    served = sorted(newest.values(), key=lambda v: v.model_id)[:SERVED_MODELS]
    deployments = Deployment.objects.bulk_create(
        Deployment(model_id=v.model_id, version=v, status=DeploymentStatus.SUCCEEDED, created_by=user)
        for v in served)
    DeploymentTarget.objects.bulk_create(
        DeploymentTarget(deployment=d, host=hosts[i % SERVING_HOSTS], state=TargetState.READY)
        for i, d in enumerate(deployments))


def session_cookie(username: str) -> str:
    """A logged-in session of ``username`` (Django's ``force_login``, stored in the database the
    server reads): the value of the ``sessionid`` cookie."""
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.test import Client

    client = Client()
    client.force_login(get_user_model().objects.get(username=username))
    return client.cookies[settings.SESSION_COOKIE_NAME].value


def count_page_queries(cookie: str) -> int:
    """SQL queries of the HTML models list (its first page of 50), counted in-process after a warm-up."""
    from django.conf import settings
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client()
    client.cookies[settings.SESSION_COOKIE_NAME] = cookie
    assert client.get("/models/", HTTP_HOST="127.0.0.1").status_code == 200
    with CaptureQueriesContext(connection) as captured:
        answer = client.get("/models/", HTTP_HOST="127.0.0.1")
    assert answer.status_code == 200 and answer.content.count(b'<a href="/models/model-') >= PAGE_SIZE
    return len(captured)


def measure_page(ours: str, cookie: str, *, warmup: int, rounds: int) -> dict:
    """p50/p95 (ms) of ``GET /models/`` on the running server, logged in by ``cookie``."""
    from django.conf import settings

    session = requests.Session()
    session.cookies.set(settings.SESSION_COOKIE_NAME, cookie)
    timings = []
    for round_number in range(warmup + rounds):
        started = time.perf_counter()
        answer = session.get(f"{ours}/models/", timeout=60, allow_redirects=False)
        elapsed = time.perf_counter() - started
        if answer.status_code != 200 or "Serving" not in answer.text:
            raise RuntimeError(f"the models page answered {answer.status_code}: {answer.text[:300]}")
        if round_number >= warmup:
            timings.append(elapsed)
    return {**stats_ms(timings), "models_on_page": answer.text.count('<a href="/models/model-'),
            "bytes": len(answer.content)}


def browse_pages(ours: str, cookie: str, *, models: int, versions: int) -> dict:
    """``registry_pages.browse`` of the models list, a search and a model page (20 visits each after 3), or
    ``{"error": ...}`` when the browser could not run: the API's figures stand without it."""
    from django.conf import settings

    from registry.views import MODEL_PAGE_SIZE

    try:
        return registry_pages.browse(ours, settings.SESSION_COOKIE_NAME, cookie,
                                     registry_pages.pages(model_name, models, versions, MODEL_PAGE_SIZE),
                                     warmup=3, rounds=20, stats_ms=stats_ms)
    except Exception as exc:  # a missing Chromium, a page that failed: said in the results
        log(f"the browser's check did not run: {type(exc).__name__}: {exc}")
        return {"error": f"{type(exc).__name__}: {exc}"}


def count_sql_queries(token: str) -> dict:
    """SQL queries of one list page at page_size 5 and 50, counted in-process."""
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
    urls = {"list models": "/api/v1/models/?page_size={n}",
            "search by tag": "/api/v1/models/?tag=team%3Dteam-3&page_size={n}",
            "list versions": f"/api/v1/models/{model_name(7)}/versions/?page_size={{n}}"}
    counts = {}
    # A token's first use in a minute records its last use (one UPDATE); warm it up so the count is a page's.
    assert client.get("/api/v1/models/?page_size=1", HTTP_HOST="127.0.0.1").status_code == 200
    for label, url in urls.items():
        counts[label] = {}
        for n in (5, 50):
            with CaptureQueriesContext(connection) as captured:
                assert client.get(url.format(n=n), HTTP_HOST="127.0.0.1").status_code == 200
            counts[label][str(n)] = len(captured)
    return counts


def mlflow_command(kind: str, workers: int, backend: str, port: int, workdir: Path) -> list[str]:
    """``mlflow server`` on ``port`` with ``workers`` workers of uvicorn (its default server) or gunicorn."""
    command = [str(MLFLOW_VENV / "bin" / "mlflow"), "server", "--backend-store-uri", backend,
               "--default-artifact-root", f"file://{workdir}/mlartifacts", "--host", "127.0.0.1", "--port", str(port)]
    if kind == "gunicorn":
        return [*command, "--gunicorn-opts", f"--workers {workers}"]
    return [*command, "--workers", str(workers)]


def page_tokens(models: int) -> tuple[str, str, int]:
    """Cursors to the page after ``pages`` pages of ``PAGE_SIZE`` models (1,000, or as many as the registry
    holds less one): ours (DRF's cursor: the last name seen) and MLflow's (its page token: an offset)."""
    pages = min(1000, models // PAGE_SIZE - 1)
    ours = base64.b64encode(f"p={model_name(pages * PAGE_SIZE - 1)}".encode()).decode()
    theirs = base64.b64encode(json.dumps({"offset": pages * PAGE_SIZE}).encode()).decode()
    return quote(ours), quote(theirs), pages


def operations(ours: str, mlflow: str, models: int, versions: int, rng: random.Random):
    """Yield (operation, our URL, MLflow URL) for one round: the floor first (ours: an authenticated constant
    answer through the whole stack; MLflow's: its health check), then every read."""
    team = f"team-{rng.randrange(TEAMS)}"
    name, version = model_name(rng.randrange(models)), rng.randrange(1, versions + 1)
    digits = f"{rng.randrange(models):05d}"[1:]  # a 4-digit substring of about models/10,000 names
    our_cursor, their_token, _ = page_tokens(models)
    yield ("floor", f"{ours}/api/v1/whoami/", f"{mlflow}/health")
    yield ("list one page", f"{ours}/api/v1/models/?page_size={PAGE_SIZE}",
           f"{mlflow}/api/2.0/mlflow/registered-models/search?max_results={PAGE_SIZE}")
    yield ("search by tag", f"{ours}/api/v1/models/?tag=team%3D{team}&page_size={PAGE_SIZE}",
           f"{mlflow}/api/2.0/mlflow/registered-models/search?max_results={PAGE_SIZE}"
           f"&filter=tags.team%20%3D%20%27{team}%27")
    yield ("search by a name substring", f"{ours}/api/v1/models/?name={digits}&page_size={PAGE_SIZE}",
           f"{mlflow}/api/2.0/mlflow/registered-models/search?max_results={PAGE_SIZE}"
           f"&filter=name%20ILIKE%20%27%25{digits}%25%27")
    yield ("the page after many pages", f"{ours}/api/v1/models/?page_size={PAGE_SIZE}&cursor={our_cursor}",
           f"{mlflow}/api/2.0/mlflow/registered-models/search?max_results={PAGE_SIZE}&page_token={their_token}")
    yield ("search versions by tag", f"{ours}/api/v1/models/{name}/versions/?tag=stage%3Dbench&page_size={PAGE_SIZE}",
           f"{mlflow}/api/2.0/mlflow/model-versions/search?max_results={PAGE_SIZE}"
           f"&filter=name%3D%27{name}%27%20and%20tags.stage%3D%27bench%27")
    yield ("get a version", f"{ours}/api/v1/models/{name}/versions/{version}/",
           f"{mlflow}/api/2.0/mlflow/model-versions/get?name={name}&version={version}")


def rows_in(label: str, body: dict) -> int:
    if label in ("get a version", "floor"):
        return 1
    return len(body.get("results", body.get("registered_models", body.get("model_versions", []))))


def measure(ours: str, mlflow: str, token: str, *, models: int, versions: int, warmup: int, rounds: int,
            fresh: bool = False) -> dict:
    """p50/p95 per operation of both servers, asked in turn. ``fresh``: a new TCP connection per request
    (``Connection: close``), as a CI job's one-off ``curl`` makes; else one keep-alive session per server."""
    sessions = {"modelyard": requests.Session(), "mlflow": requests.Session()}
    headers = {"modelyard": {"Authorization": f"Bearer {token}"}, "mlflow": {}}
    if fresh:
        for side in headers:
            headers[side]["Connection"] = "close"
    rng = random.Random(7)
    timings: dict[str, dict[str, list[float]]] = {}
    rows: dict[str, dict[str, int]] = {}
    for round_number in range(warmup + rounds):
        for label, our_url, mlflow_url in operations(ours, mlflow, models, versions, rng):
            for side, url in (("modelyard", our_url), ("mlflow", mlflow_url)):
                session = requests.Session() if fresh else sessions[side]
                started = time.perf_counter()
                answer = session.get(url, headers=headers[side], timeout=60)
                elapsed = time.perf_counter() - started
                if fresh:
                    session.close()
                if answer.status_code != 200:
                    raise RuntimeError(f"{side} answered {answer.status_code} to {url}: {answer.text[:300]}")
                if round_number >= warmup:
                    timings.setdefault(label, {}).setdefault(side, []).append(elapsed)
                    rows.setdefault(label, {})[side] = rows_in(label, answer.json() if label != "floor"
                                                               or side == "modelyard" else {})
    return {label: {side: {**stats_ms(values), "rows": rows[label][side]} for side, values in sides.items()}
            for label, sides in timings.items()}


def best_of(runs: dict) -> dict:
    """Per connection mode and operation, the MLflow configuration with the lowest p50, beside our figures from
    the same run (the two servers were asked in turn there): ``{mode: {operation: {"modelyard", "mlflow",
    "mlflow_config"}}}``."""
    out: dict = {}
    for config, modes in runs.items():
        for mode, measurement in modes.items():
            for label, sides in measurement.items():
                held = out.setdefault(mode, {}).get(label)
                if held is None or sides["mlflow"]["p50_ms"] < held["mlflow"]["p50_ms"]:
                    out[mode][label] = {**sides, "mlflow_config": config}
    return out


def verdict(best: dict, target: float, floor_factor: float = FLOOR_FACTOR) -> tuple[str, str, dict]:
    """PASS when, in both connection modes, every read's p50 and p95 are ``target`` times faster than MLflow's
    fastest configuration, or, where not, our p50 is within ``floor_factor`` of our floor's (the same server,
    middleware and authentication answering a constant: what is left is the read itself)."""
    ratios, short = {}, []
    for mode, operations in best.items():
        floor = operations["floor"]["modelyard"]["p50_ms"]
        for label, sides in operations.items():
            if label == "floor":
                continue
            ratio = {q: round(sides["mlflow"][f"{q}_ms"] / sides["modelyard"][f"{q}_ms"], 2) for q in ("p50", "p95")}
            ratio["over_floor"] = round(sides["modelyard"]["p50_ms"] / floor, 2)
            ratios.setdefault(mode, {})[label] = ratio
            if min(ratio["p50"], ratio["p95"]) < target and ratio["over_floor"] > floor_factor:
                short.append(f"{label} ({mode}) p50 ×{ratio['p50']}, p95 ×{ratio['p95']}, "
                             f"{ratio['over_floor']}× our floor")
    if short:
        return "fail", (f"neither {target:g}× faster than MLflow at its fastest nor within {floor_factor:g}× of our "
                        f"floor on: {'; '.join(short)}"), ratios
    return "pass", (f"every read is {target:g}× faster than MLflow's fastest configuration, or within "
                    f"{floor_factor:g}× of our floor, in both connection modes"), ratios


def markdown(r: dict) -> str:
    lines = ["# Registry API against MLflow", "", f"Run {r['finished_at']} on {r['machine']}.", "",
             f"**Verdict: {r['verdict'].upper()}** — {r['verdict_reason']}", ""]
    s = r.get("setup", {})
    lines += [
        "## Setup", "",
        f"- {s.get('models')} models × {s.get('versions')} versions in each registry, every model tagged "
        f"`team=team-<i mod {TEAMS}>`; both on PostgreSQL on this machine, {s.get('workers')} server workers each.",
        f"- MLflow {s.get('mlflow_version')} (`mlflow server`, own virtualenv): schema in "
        f"{s.get('mlflow', {}).get('schema_s')} s; {s.get('mlflow', {}).get('api_sample_models')} models through its "
        f"store API in {s.get('mlflow', {}).get('api_sample_s')} s "
        f"({s.get('mlflow', {}).get('api_per_model_ms')} ms per model with its versions), the rest in bulk through "
        f"its tables (`COPY`) in {s.get('mlflow', {}).get('bulk_s')} s.",
        f"- Modelyard (gunicorn, `MODELYARD_DEBUG=false`): migrated in {s.get('migrate_s')} s, rows (no S3 objects) "
        f"bulk-inserted with the ORM in {s.get('populate_s')} s, with aliases `production` and `staging` on every "
        f"model and the first {SERVED_MODELS} models serving on {SERVING_HOSTS} hosts (Modelyard only). "
        "`VACUUM ANALYZE` on both databases after filling (as autovacuum would after a bulk insert).",
        f"- {r.get('rounds')} timed requests per operation and server after {r.get('warmup')} warm-ups, the two "
        "servers asked in turn, once over one keep-alive session each and once with a fresh connection per "
        "request; each MLflow configuration in turn beside the same Modelyard server.", "",
    ]
    best = r.get("best")
    for mode in MODES if best else ():
        lines += [f"## Results, {mode} connections (ms)", "",
                  "| operation | Modelyard p50 | Modelyard p95 | MLflow's fastest p50 | p95 | its configuration "
                  "| ratio p50 | ratio p95 | ours ÷ our floor | rows |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for label, sides in best[mode].items():
            ours, theirs = sides["modelyard"], sides["mlflow"]
            ratio = r["ratios"].get(mode, {}).get(label, {})
            lines.append(f"| {label} | {ours['p50_ms']} | {ours['p95_ms']} | {theirs['p50_ms']} | {theirs['p95_ms']} "
                         f"| {sides['mlflow_config']} | {ratio.get('p50', '—')}× | {ratio.get('p95', '—')}× "
                         f"| {ratio.get('over_floor', 1.0)}× | {ours['rows']} / {theirs['rows']} |")
        lines += ["", "Ratio: MLflow's time over Modelyard's (above 1: Modelyard is faster). The floor row is ours: "
                  "`GET /api/v1/whoami/` (the same server, middleware and token authentication, a constant body); "
                  "MLflow's beside it is its `/health`.", ""]
    if r.get("runs"):
        lines += ["## Every MLflow configuration (p50 ms, keep-alive / fresh)", "",
                  "| operation | " + " | ".join(r["runs"]) + " |", "|---|" + "---|" * len(r["runs"])]
        labels = next(iter(next(iter(r["runs"].values())).values()))
        for label in labels:
            cells = [f"{modes['keep-alive'][label]['mlflow']['p50_ms']} / {modes['fresh'][label]['mlflow']['p50_ms']}"
                     for modes in r["runs"].values()]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines += ["", "MLflow's environment: " + ", ".join(f"`{k}={v}`" for k, v in MLFLOW_ENV.items())
                  + " (telemetry and the job runner off).", ""]
    q = r.get("sql_queries_per_page")
    if q:
        lines += ["## SQL queries per list page (Modelyard)", "", "| page | page_size 5 | page_size 50 |",
                  "|---|---|---|"]
        lines += [f"| {label} | {n['5']} | {n['50']} |" for label, n in q.items()]
        lines += ["", "Constant in the page size; pinned in tests/registry/test_pagination.py.", ""]
    page = r.get("models_page")
    if page:
        lines += ["## The HTML models list (Modelyard only)", "",
                  "`GET /models/` as a logged-in user (session cookie), the first page: "
                  f"{page['models_on_page']} models with their serving and alias columns, {page['bytes']} bytes. "
                  "MLflow has no server-rendered list to set beside it (its UI calls the search API above).", "",
                  "| page | p50 ms | p95 ms | max ms | SQL queries |", "|---|---|---|---|---|",
                  f"| /models/ | {page['p50_ms']} | {page['p95_ms']} | {page['max_ms']} | "
                  f"{r.get('models_page_sql_queries')} |", "",
                  "Not part of the verdict. The query count is pinned in tests/registry/test_serving_at_a_glance.py.",
                  ""]
    if r.get("browser"):
        lines += registry_pages.markdown(r["browser"], PAGE_BUDGET_MS)
    if r.get("timings_s"):
        lines += ["## Run time (s)", "", ", ".join(f"{k} {v}" for k, v in r["timings_s"].items()), ""]
    if r.get("notes"):
        lines += ["## Reading these figures", "", *[f"- {note}" for note in r["notes"]], ""]
    return "\n".join(lines)


def write_results(result: dict, json_path: Path, markdown_path: Path, render=None) -> None:
    """Write both files through ``.tmp`` names, so a failed run leaves the previous results intact. ``render``
    makes the Markdown from ``result`` (default: this benchmark's ``markdown``)."""
    for path, text in ((json_path, json.dumps(result, indent=2) + "\n"), (markdown_path, (render or markdown)(result))):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, default=REPO / "bench/results/registry_vs_mlflow.json")
    parser.add_argument("--markdown", type=Path, default=REPO / "bench/results/registry_vs_mlflow.md")
    parser.add_argument("--models", type=int, default=10_000)
    parser.add_argument("--versions", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--target-ratio", type=float, default=5.0)  # issue 48: 5x MLflow at its best, or the floor
    parser.add_argument("--keep", action="store_true", help="keep the databases")
    args = parser.parse_args(argv)

    import tempfile

    workdir = Path(tempfile.mkdtemp(prefix="modelyard-bench-registry-"))
    result: dict = {"benchmark": "registry_vs_mlflow", "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
                    "machine": machine(), "warmup": args.warmup, "rounds": args.requests,
                    "target_ratio": args.target_ratio}
    timings: dict[str, float] = {}
    servers: list[Server] = []
    clock = time.perf_counter()
    try:
        python = mlflow_python()
        timings["mlflow_venv"] = round(time.perf_counter() - clock, 1)
        recreate_databases()
        env = modelyard_env(OUR_DATABASE)
        setup = {"models": args.models, "versions": args.versions, "workers": args.workers,
                 "mlflow_version": mlflow_version(python), "migrate_s": migrate(env)}
        result["setup"] = setup
        os.environ.update(env)
        sys.path.insert(0, str(REPO))
        import django

        django.setup()
        log(f"filling Modelyard: {args.models} models × {args.versions} versions")
        ours = populate_ours(args.models, args.versions)
        setup["populate_s"] = ours["populate_s"]
        log(f"filling MLflow: {args.models} models × {args.versions} versions")
        mlflow_uri = f"postgresql+psycopg2://postgres@127.0.0.1:5432/{MLFLOW_DATABASE}"
        filled = subprocess.run([str(python), str(REPO / "bench" / "mlflow_populate.py"), mlflow_uri,
                                 str(args.models), str(args.versions), str(TEAMS)],
                                capture_output=True, text=True, check=True)
        setup["mlflow"] = json.loads(filled.stdout.strip().splitlines()[-1])
        for database in (OUR_DATABASE, MLFLOW_DATABASE):  # what autovacuum would do after the bulk fill: planner
            with psycopg_connect(database) as conn:  # statistics, the visibility map, GIN pending lists merged
                conn.execute("VACUUM ANALYZE")
        timings["populate"] = round(time.perf_counter() - clock - timings["mlflow_venv"], 1)
        log(f"populated: {setup}")
        result["sql_queries_per_page"] = count_sql_queries(ours["token"])
        cookie = session_cookie("bench")
        result["models_page_sql_queries"] = count_page_queries(cookie)

        servers.append(start_modelyard(env, args.workers, workdir))
        our_url = servers[0].base_url
        started = time.perf_counter()
        runs: dict = {}
        for kind, workers in MLFLOW_CONFIGS:
            config = f"{kind}, {workers} worker{'s' if workers > 1 else ''}"
            log(f"measuring against MLflow ({config})")
            mlflow_port = free_port()
            mlflow_url = f"http://127.0.0.1:{mlflow_port}"
            server = Server(f"mlflow-{kind}-{workers}", mlflow_command(kind, workers, mlflow_uri, mlflow_port, workdir),
                            {**os.environ, "PATH": f"{MLFLOW_VENV / 'bin'}:{os.environ['PATH']}",
                             **MLFLOW_ENV},
                            f"{mlflow_url}/health", workdir)
            servers.append(server)
            server.wait()
            runs[config] = {mode: measure(our_url, mlflow_url, ours["token"], models=args.models,
                                          versions=args.versions, warmup=args.warmup, rounds=args.requests,
                                          fresh=mode == "fresh") for mode in MODES}
            server.stop()
            servers.remove(server)
        result["runs"], result["best"] = runs, best_of(runs)
        timings["measure"] = round(time.perf_counter() - started, 1)
        log("measuring the HTML models list")
        started = time.perf_counter()
        result["models_page"] = measure_page(our_url, cookie, warmup=args.warmup, rounds=args.requests)
        timings["measure_page"] = round(time.perf_counter() - started, 1)
        log("opening the pages in a browser")
        started = time.perf_counter()
        result["browser"] = browse_pages(our_url, cookie, models=args.models, versions=args.versions)
        timings["browser"] = round(time.perf_counter() - started, 1)
        result["verdict"], result["verdict_reason"], result["ratios"] = verdict(result["best"], args.target_ratio)
    except Exception as exc:
        result["verdict"], result["verdict_reason"] = "not run", f"{type(exc).__name__}: {exc}"
        for server in servers:
            log(f"{server.name} log tail: {server.log_path.read_text()[-1500:] if server.log_path.exists() else ''}")
        raise
    finally:
        for server in servers:
            server.stop()
        timings["total"] = round(time.perf_counter() - clock, 1)
        result["timings_s"] = timings
        result["finished_at"] = datetime.now(UTC).isoformat(timespec="seconds")
        if "django" in sys.modules:
            from django.db import connections

            connections.close_all()
        if not args.keep:
            drop_databases()
        write_results(result, args.json, args.markdown)
        log(f"{result['verdict']}: {result['verdict_reason']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
