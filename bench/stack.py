"""A real deployment stack for the rollout benchmarks (``deploy_overhead``, ``rolling_update``).

``RolloutStack`` starts, on free ports and a dedicated database, what a rollout goes through:

- PostgreSQL: database ``<name>`` dropped, created and migrated (dropped again at the end unless
  ``keep``); Redis: the broker database given, flushed;
- the S3 stand-in (``moto_server``), its bucket created by the product's ``ArtifactStore``;
- one ``tritonserver`` per serving host (explicit model control, as ``tests/fixtures/triton.py``
  starts it, from the install of ``scripts/install_triton.sh``);
- a Celery orchestrator worker (queue ``default``, concurrency 2, as scripts/stack.sh) and one host
  agent per host (``modelyard-agent --host <name>``, concurrency 1, no database or S3 settings, as in
  the end-to-end tests);
- Django set up in this process against the same database and broker, so the benchmark calls the
  REST API through DRF's ``APIClient`` (in process, no gunicorn) with a staff user's token.

Each host is registered through ``POST /api/v1/hosts/`` with its metrics URL and the
``EXECUTION_ENV_PATH`` the iris python model needs. Nothing here measures anything.
"""

import argparse
import contextlib
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import redis
import requests

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# The same launchers the integration tests use: one way to start tritonserver and a subprocess.
from tests.fixtures.services import Service, _spawn, _without_service_credentials, free_port  # noqa: E402
from tests.fixtures.triton import START_ATTEMPTS, TritonInstall, TritonServer, _launch  # noqa: E402

BIN = Path(sys.executable).parent
MODEL = "iris"
DEFAULT_BROKER = "redis://127.0.0.1:6379/11"
READY_LINE = "ready."


def log(bench: str, message: str) -> None:
    """Print a progress line on stderr, prefixed with the benchmark's name."""
    print(f"[{bench}] {message}", file=sys.stderr, flush=True)


def wait_until(predicate, *, timeout: float, what: str, interval: float = 0.1) -> None:
    """Poll ``predicate`` until it returns True.

    Raises:
        RuntimeError: still False (or raising) after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):  # a service still starting refuses connections
            if predicate():
                return
        time.sleep(interval)
    raise RuntimeError(f"timed out after {timeout:g} s waiting for {what}")


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0..100) by linear interpolation between closest ranks; None when empty."""
    ordered = sorted(values)
    if not ordered:
        return None
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def machine() -> str:
    """One line describing where the benchmark ran."""
    return f"{platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"


def write_results(result: dict, markdown_text: str, json_path: Path, markdown_path: Path) -> None:
    """Write both result files through ``.tmp`` names, so a failed run leaves the previous ones intact."""
    for path, text in ((json_path, json.dumps(result, indent=2) + "\n"), (markdown_path, markdown_text)):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        tmp.replace(path)


def add_common_arguments(parser: argparse.ArgumentParser, *, name: str, database: str) -> None:
    """Add ``--json``, ``--markdown``, ``--database``, ``--broker`` and ``--keep`` with the benchmark's defaults."""
    parser.add_argument("--json", type=Path, default=REPO / f"bench/results/{name}.json")
    parser.add_argument("--markdown", type=Path, default=REPO / f"bench/results/{name}.md")
    parser.add_argument("--database", default=database, help=f"PostgreSQL database to create (default {database})")
    parser.add_argument("--broker", default=os.environ.get("MODELYARD_BENCH_BROKER_URL", DEFAULT_BROKER),
                        help=f"Redis database for the Celery broker, flushed (default {DEFAULT_BROKER})")
    parser.add_argument("--keep", action="store_true", help="keep the work directory and the database")


def finish(name: str, args: argparse.Namespace, result: dict, markdown_text: str) -> int:
    """Write the results where ``--json``/``--markdown`` say, log the verdict; return the exit status 0."""
    write_results(result, markdown_text, args.json, args.markdown)
    log(name, f"{result['verdict']}: {result['verdict_reason']}")
    return 0


def _admin_sql(sql: str) -> None:
    import psycopg

    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as conn:
        conn.execute(sql)


def start_s3_stand_in(logs: Path) -> Service:
    """Start the S3 stand-in, ``moto_server`` (in memory), on a free port of 127.0.0.1, logging under ``logs``;
    its ``url`` is the endpoint. It does not wait: ``wait_for_s3`` does."""
    port = free_port()
    service = _spawn("s3", [str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)], logs)
    service.url = f"http://127.0.0.1:{port}"
    return service


def wait_for_s3(service: Service) -> None:
    """Wait until the S3 stand-in answers (60 s at most); raises RuntimeError after that."""
    wait_until(lambda: requests.get(service.url, timeout=1).status_code < 500, timeout=60, what="moto_server")


def s3_settings(endpoint: str, database: str) -> dict[str, str]:
    """The product's S3 settings for the store at ``endpoint``, with a bucket named after ``database``."""
    return {"MODELYARD_S3_ENDPOINT_URL": endpoint, "MODELYARD_S3_BUCKET": f"{database.replace('_', '-')}-artifacts"}


@dataclass
class Host:
    """A serving host of the stack: its name, tritonserver and host agent."""

    name: str
    triton: TritonServer
    agent: Service | None = None
    gateway_port: int | None = None  # the host's gateway (nginx, run by its agent), when the stack has them

    @property
    def inference_url(self) -> str:
        """Where clients reach the host: its gateway, else Triton itself."""
        return f"http://127.0.0.1:{self.gateway_port}" if self.gateway_port else self.triton.http_url


class RolloutStack:
    """Start the stack described in the module docstring; a context manager that stops it all.

    Args:
        bench: the benchmark's name (log prefix).
        database: the PostgreSQL database to create (``modelyard_rbench...``).
        broker_url: the Redis database used as the Celery broker; flushed at start.
        hosts: serving host names, one tritonserver and agent each.
        keep: keep the work directory (model repositories, logs) and the database at the end;
            without it both are removed.
        gateway: each agent runs its host's gateway (``--triton-url``) on a port of its own, and that is the
            host's ``inference_url``, as on a host that takes canaries.
    """

    def __init__(self, *, bench: str, database: str, broker_url: str, hosts: tuple[str, ...], keep: bool = False,
                 gateway: bool = False):
        self.bench, self.database, self.broker_url = bench, database, broker_url
        self.gateway = gateway
        self.host_names, self.keep = hosts, keep
        self.workdir = Path(tempfile.mkdtemp(prefix=f"modelyard-bench-{bench}-"))
        self.logs = self.workdir / "logs"
        self.services: list[Service] = []
        self.hosts: dict[str, Host] = {}
        self.s3_url = ""
        self.client = None
        self.env: dict[str, str] = {}
        self.timings: dict[str, float] = {}
        self._database_created = False

    # ------------------------------------------------------------------ start and stop

    def __enter__(self) -> "RolloutStack":
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _start(self) -> None:
        started = time.monotonic()
        self.logs.mkdir(parents=True, exist_ok=True)
        s3 = start_s3_stand_in(self.logs)
        self.services.append(s3)
        self.s3_url = s3.url
        self.env = {
            "DATABASE_URL": f"postgres://postgres@127.0.0.1:5432/{self.database}",
            "CELERY_BROKER_URL": self.broker_url, **s3_settings(self.s3_url, self.database),
            "MODELYARD_S3_CREATE_BUCKET": "true", "MODELYARD_DEBUG": "false",
            "MODELYARD_SECRET_KEY": uuid.uuid4().hex * 2, "MODELYARD_LOG_LEVEL": "INFO",
            "DJANGO_SETTINGS_MODULE": "modelyard.settings",
        }
        _admin_sql(f"DROP DATABASE IF EXISTS {self.database} WITH (FORCE)")
        _admin_sql(f"CREATE DATABASE {self.database}")
        self._database_created = True
        migrated = subprocess.run([sys.executable, "manage.py", "migrate", "--noinput"], cwd=REPO,
                                  env={**os.environ, **self.env}, capture_output=True, text=True)
        if migrated.returncode != 0:
            raise RuntimeError(f"manage.py migrate failed: {migrated.stdout[-1000:]}{migrated.stderr[-2000:]}")
        redis.Redis.from_url(self.broker_url).flushdb()
        self.timings["migrate_s"] = round(time.monotonic() - started, 1)

        install = _triton_install()
        for name in self.host_names:
            self.hosts[name] = Host(name, self._start_triton(install, name))
        wait_for_s3(s3)

        os.environ.update(self.env)
        import django

        django.setup()
        from registry.storage import ArtifactStore

        ArtifactStore().ensure_bucket()

        workers = [self._spawn("orchestrator", self._worker_args("default", "orchestrator", concurrency=2))]
        for host in self.hosts.values():
            # A host agent runs as on a serving host: modelyard-agent, no database or S3 settings.
            gateway_flags = []
            if self.gateway:
                host.gateway_port = free_port()
                gateway_flags = ["--triton-url", host.triton.http_url, "--triton-grpc-url", host.triton.grpc_url]
            host.agent = _spawn(f"agent-{host.name}", [
                str(BIN / "modelyard-agent"), "--host", host.name, "--concurrency", "1",
                "--model-repository", str(host.triton.model_repository), *gateway_flags], self.logs,
                env=_without_service_credentials(os.environ), inherit=False)
            self.services.append(host.agent)
            workers.append(host.agent)
        for worker in workers:
            wait_until(lambda w=worker: READY_LINE in w.log_text() or w.process.poll() is not None, timeout=120,
                       what=f"Celery worker {worker.name}", interval=0.3)
            if worker.process.poll() is not None:
                raise RuntimeError(f"Celery worker {worker.name} exited: {worker.log_text()[-2000:]}")
        self._register_fleet()
        self.timings["start_s"] = round(time.monotonic() - started, 1)

    def _spawn(self, name: str, args: list[str], env: dict | None = None) -> Service:
        service = _spawn(name, args, self.logs, env={**self.env, **(env or {})})
        self.services.append(service)
        return service

    def _worker_args(self, queue: str, node: str, concurrency: int = 1) -> list[str]:
        return [str(BIN / "celery"), "-A", "modelyard", "worker", "-Q", queue,
                "-n", f"{node}-{uuid.uuid4().hex[:6]}@%h", "--concurrency", str(concurrency),
                "--loglevel", "INFO", "--without-gossip", "--without-mingle"]

    def _start_triton(self, install: TritonInstall, name: str) -> TritonServer:
        repository = self.workdir / name / "models"
        repository.mkdir(parents=True)
        for attempt in range(1, START_ATTEMPTS + 1):
            server = _launch(install, repository, self.logs / f"triton-{name}-{attempt}.log", [])
            if server is not None:
                return server
        raise RuntimeError(f"tritonserver for {name} found its ports taken {START_ATTEMPTS} times in a row")

    def _register_fleet(self) -> None:
        from django.contrib.auth import get_user_model
        from rest_framework.test import APIClient

        from accounts.tokens import default_scopes, issue_token

        user = get_user_model().objects.create_user(username="bench", is_staff=True, is_superuser=True)
        self.client = APIClient()
        _token, plaintext = issue_token(user=user, name="bench", scopes=default_scopes(user))
        self.client.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
        self.api("post", "/api/v1/models/", {"name": MODEL})
        for host in self.hosts.values():
            self.api("post", "/api/v1/hosts/", {
                "name": host.name, "runtime": "triton", "inference_url": host.inference_url,
                "metrics_url": host.triton.metrics_url,
                "config_overrides": {"parameters": {"EXECUTION_ENV_PATH": str(host.triton.execution_env)}},
            })

    def stop(self) -> None:
        """Stop every process started (workers first, then Triton); remove the work directory and drop the
        database unless ``keep``. Calling it again does nothing more."""
        for service in reversed(self.services):
            service.stop()
        for host in self.hosts.values():
            if host.gateway_port:  # a daemon of its own: it outlives its agent
                from modelyard_agent.config import default_staging_dir
                from modelyard_agent.runtimes.gateway import TritonGateway

                TritonGateway(default_staging_dir(host.triton.model_repository) / "gateway", host.gateway_port,
                              triton="").stop()
            host.triton.stop()
        if self._database_created and not self.keep:
            with contextlib.suppress(Exception):
                from django.db import connections

                connections.close_all()
            _admin_sql(f"DROP DATABASE IF EXISTS {self.database} WITH (FORCE)")
            self._database_created = False
        if self.keep:
            log(self.bench, f"kept {self.workdir} and database {self.database}")
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)

    # ------------------------------------------------------------------ the API

    def api(self, method: str, path: str, data: dict | None = None, **options) -> dict:
        """Call the REST API in process; return the JSON answer.

        Raises:
            RuntimeError: the answer is not 2xx.
        """
        answer = getattr(self.client, method)(path, data, format=options.pop("format", "json"), secure=True,
                                              **options)
        if answer.status_code >= 300:
            raise RuntimeError(f"{method.upper()} {path} answered {answer.status_code}: {answer.content[:500]!r}")
        return answer.json()

    def upload_iris(self, count: int) -> list[int]:
        """Register ``count`` versions of the demo iris model (each with the smoke-test sample input).

        Returns:
            The new version numbers.
        """
        from demo.iris import SAMPLE_INPUT, build_iris_archive

        archive = build_iris_archive(self.workdir / "iris.tar.gz")
        metadata = json.dumps({"sample_input": {"input": SAMPLE_INPUT}})
        versions = []
        for _ in range(count):
            with archive.open("rb") as fh:
                body = self.api("post", f"/api/v1/models/{MODEL}/versions/", {"artifact": fh, "metadata": metadata},
                                format="multipart")
            versions.append(body["version"])
        return versions

    def deploy(self, version: int, hosts: list[str], batch_size: int = 1) -> int:
        """``POST /api/v1/deployments/`` of an iris version; return the deployment's id."""
        return self.api("post", "/api/v1/deployments/",
                        {"model": MODEL, "version": version, "hosts": hosts, "batch_size": batch_size})["id"]

    def wait_finished(self, deployment_id: int, timeout: float = 240.0, interval: float = 0.05) -> str:
        """Poll the database until the deployment's rollout finishes; return its status.

        Raises:
            RuntimeError: still running after ``timeout`` seconds.
        """
        from deployments.choices import ACTIVE_DEPLOYMENT_STATUSES
        from deployments.models import Deployment

        status = ""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = Deployment.objects.values_list("status", flat=True).get(pk=deployment_id)
            if status not in ACTIVE_DEPLOYMENT_STATUSES:
                return status
            time.sleep(interval)
        raise RuntimeError(f"deployment {deployment_id} still {status} after {timeout:g} s")


def _triton_install() -> TritonInstall:
    stack_dir = Path(os.environ.get("MODELYARD_STACK_DIR") or REPO / ".stack")
    install = TritonInstall(stack_dir=stack_dir, server=stack_dir / "bin" / "tritonserver",
                            execution_env=stack_dir / "triton-env")
    if not os.access(install.server, os.X_OK):
        raise RuntimeError(f"{install.server} is missing: run scripts/install_triton.sh (make install-triton)")
    return install
