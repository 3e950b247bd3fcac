"""A host agent's settings: command-line flags, each also readable from the environment.

The agent reads no database or S3 credentials and needs none; what it needs is the broker, its
host's name and runtime, where the runtime's files live and how long work may take. The HTTP
address clients use is not a setting: it comes with each task, from the host's registered
``inference_url``. On a Triton host with ``--triton-url``, the agent runs the host's gateway
(``runtimes.gateway``) at that address and reaches Triton itself at ``--triton-url``; canaries need it.

| flag | environment | default |
| --- | --- | --- |
| ``--host`` | ``MODELYARD_AGENT_HOST`` | required: the host's ``name`` as registered |
| ``--runtime`` | ``MODELYARD_AGENT_RUNTIME`` | ``triton`` (or ``bentoml``): tasks for another runtime are refused |
| ``--broker-url`` | ``CELERY_BROKER_URL`` | ``redis://127.0.0.1:6379/0`` |
| ``--model-repository`` | ``MODELYARD_AGENT_MODEL_REPOSITORY`` | ``var/model-repository`` (Triton) |
| ``--staging-dir`` | ``MODELYARD_AGENT_STAGING_DIR`` | ``.<repository>.modelyard`` beside the repository |
| ``--bentoml-root`` | ``MODELYARD_AGENT_BENTOML_ROOT`` | ``var/bentoml-agent`` (BentoML) |
| ``--triton-grpc-url`` | ``MODELYARD_AGENT_TRITON_GRPC_URL`` | empty: loads go over HTTP |
| ``--triton-url`` | ``MODELYARD_AGENT_TRITON_URL`` | empty: ``inference_url`` is Triton itself (no gateway) |
| ``--gateway-listen`` | ``MODELYARD_AGENT_GATEWAY_LISTEN`` | empty: ``inference_url``'s port, every address |
| ``--gateway-grpc-listen`` | ``MODELYARD_AGENT_GATEWAY_GRPC_LISTEN`` | empty: the gateway takes no gRPC |
| ``--max-request-bytes`` | ``MODELYARD_AGENT_MAX_REQUEST_BYTES`` | 67108864 (64 MiB): the gateway's body ceiling |
| ``--load-deadline`` | ``MODELYARD_AGENT_LOAD_TIMEOUT`` | 600 s, when the host sets none |
| ``--unload-deadline`` | ``MODELYARD_AGENT_UNLOAD_TIMEOUT`` | 120 s, when the host sets none |
| ``--heartbeat-interval`` | ``MODELYARD_HEARTBEAT_INTERVAL`` | 30 s between reports during long work |
| ``--lock-wait`` | ``MODELYARD_AGENT_LOCK_WAIT`` | 600 s a deployment waits for its model's lock |
| ``--task-time-limit`` | ``MODELYARD_TASK_TIME_LIMIT`` | 1800 s, after which a task is killed |
| ``--visibility-timeout`` | ``MODELYARD_BROKER_VISIBILITY_TIMEOUT`` | task time limit + 600 s |
| ``--labels`` | ``MODELYARD_AGENT_LABELS`` | ``{}``: labels the heartbeat reports |
| ``--concurrency`` | ``MODELYARD_AGENT_CONCURRENCY`` | 4 worker processes |
| ``--perf-analyzer`` | ``MODELYARD_AGENT_PERF_ANALYZER`` | ``perf_analyzer`` on PATH: profiles of Triton versions |
| ``--wrk`` | ``MODELYARD_AGENT_WRK`` | ``wrk`` on PATH: profiles of BentoML versions |
| ``--nginx-keepalive`` | ``MODELYARD_AGENT_NGINX_KEEPALIVE`` | BentoML: 75 s with nginx's Lua module, else 0 |
| ``--memory-budget-bytes`` | ``MODELYARD_AGENT_MEMORY_BUDGET_BYTES`` | empty: on-demand models are never evicted |
| ``--triton-metrics-url`` | ``MODELYARD_AGENT_TRITON_METRICS_URL`` | empty: footprints of on-demand loads unmeasured |
| ``--triton-metrics-interval-ms`` | ``MODELYARD_AGENT_TRITON_METRICS_INTERVAL_MS`` | 2000, Triton's default |
| ``--concurrent-loads`` | ``MODELYARD_AGENT_CONCURRENT_LOADS`` | 1 on-demand load at a time |
| ``--loglevel`` | ``MODELYARD_LOG_LEVEL`` | ``INFO`` |

Relative paths are taken from the working directory; give absolute ones under a service manager.
The staging directory must be on the same file system as the model repository (a staged version
directory is renamed into place in one step); the agent checks this when it starts.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from modelyard_agent.contract import (
    DEFAULT_MAX_REQUEST_BYTES,
    MAX_DEADLINE_SECONDS,
    MAX_REQUEST_BYTES,
    MIN_REQUEST_BYTES,
    Runtime,
)
from modelyard_agent.formats.names import NAME_PATTERN, NAME_RULE

MAX_SECONDS = float(MAX_DEADLINE_SECONDS)
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
HOST_PORT = re.compile(r"^[A-Za-z0-9.\-]+:[0-9]{1,5}$|^\[[0-9A-Fa-f:.]+\]:[0-9]{1,5}$")


class ConfigError(ValueError):
    """A flag or environment variable with a value the agent cannot use; the message names it."""


@dataclass(frozen=True)
class Setting:
    """One setting: its flag, environment variable, default (None: required or derived) and help."""

    name: str
    env: str
    default: str | None
    help: str


SETTINGS = (
    Setting("host", "MODELYARD_AGENT_HOST", None, "this host's name as registered (POST /api/v1/hosts/); its "
                                                  "queue is host.<name>"),
    Setting("runtime", "MODELYARD_AGENT_RUNTIME", Runtime.TRITON.value,
            "triton or bentoml: the host's registered runtime; tasks for another one are refused"),
    Setting("broker_url", "CELERY_BROKER_URL", "redis://127.0.0.1:6379/0", "the orchestrator's Redis broker"),
    Setting("model_repository", "MODELYARD_AGENT_MODEL_REPOSITORY", "var/model-repository",
            "Triton's model repository (Triton started with --model-control-mode=explicit)"),
    Setting("staging_dir", "MODELYARD_AGENT_STAGING_DIR", None,
            "downloads and staged versions, on the repository's file system (default: .<repository>.modelyard "
            "beside it)"),
    Setting("bentoml_root", "MODELYARD_AGENT_BENTOML_ROOT", "var/bentoml-agent",
            "the BentoML host's Bento Store, serve instances, nginx config and state file"),
    Setting("triton_grpc_url", "MODELYARD_AGENT_TRITON_GRPC_URL", "",
            "host:port of Triton's gRPC endpoint, for loads and unloads (empty: over HTTP, which stalls "
            "Triton's keep-alive clients during a load)"),
    Setting("triton_url", "MODELYARD_AGENT_TRITON_URL", "",
            "Triton's own HTTP endpoint behind the host's gateway, such as http://127.0.0.1:8000: the agent then runs "
            "the gateway (nginx) at the host's inference_url (empty: inference_url is Triton itself, with no gateway "
            "and no canaries)"),
    Setting("gateway_listen", "MODELYARD_AGENT_GATEWAY_LISTEN", "",
            "[host:]port where the gateway takes HTTP, such as 10.0.0.5:8080 (empty: the port of the host's "
            "registered inference_url on every address, or 127.0.0.1 for a loopback URL); needs --triton-url"),
    Setting("gateway_grpc_listen", "MODELYARD_AGENT_GATEWAY_GRPC_LISTEN", "",
            "[host:]port where the gateway passes Triton's gRPC protocol to --triton-grpc-url, such as 8011 "
            "(empty: no gRPC through the gateway); needs --triton-url and --triton-grpc-url"),
    Setting("max_request_bytes", "MODELYARD_AGENT_MAX_REQUEST_BYTES", str(DEFAULT_MAX_REQUEST_BYTES),
            "the most bytes of a request body the gateway passes to Triton: the limit of a model whose signature "
            "has a variable dimension or BYTES input, and the ceiling of every model's (a model with fixed dims "
            "gets the bound of its signature; a deployment may set its own)"),
    Setting("load_deadline", "MODELYARD_AGENT_LOAD_TIMEOUT", "600", "seconds a load may take, unless the host sets it"),
    Setting("unload_deadline", "MODELYARD_AGENT_UNLOAD_TIMEOUT", "120",
            "seconds an unload may take, unless the host sets it"),
    Setting("heartbeat_interval", "MODELYARD_HEARTBEAT_INTERVAL", "30", "seconds between reports during long work"),
    Setting("lock_wait", "MODELYARD_AGENT_LOCK_WAIT", "600",
            "seconds a deployment waits for another one of the same model on this host"),
    Setting("task_time_limit", "MODELYARD_TASK_TIME_LIMIT", "1800",
            "seconds after which a task is killed (longer than any load deadline)"),
    Setting("visibility_timeout", "MODELYARD_BROKER_VISIBILITY_TIMEOUT", None,
            "seconds after which the broker hands out again a task a killed agent took (default: the task time "
            "limit + 600)"),
    Setting("labels", "MODELYARD_AGENT_LABELS", "{}",
            "labels the heartbeat reports, a JSON object of strings (placement selects by the host's "
            "registered labels)"),
    Setting("concurrency", "MODELYARD_AGENT_CONCURRENCY", "4",
            "worker processes: models are deployed side by side, each under its own lock"),
    Setting("perf_analyzer", "MODELYARD_AGENT_PERF_ANALYZER", "perf_analyzer",
            "Triton's perf_analyzer, for performance cards (a path, or a name on PATH; "
            "scripts/install_perf_analyzer.sh installs it)"),
    Setting("wrk", "MODELYARD_AGENT_WRK", "wrk", "the wrk HTTP load generator, for performance cards of BentoML "
                                                 "versions (a path, or a name on PATH)"),
    Setting("nginx_keepalive", "MODELYARD_AGENT_NGINX_KEEPALIVE", None,
            "seconds the nginx in front of a BentoML host keeps an idle client connection open; 0 answers every "
            "request with Connection: close (default: 75 where nginx's Lua module drains each reload first, else 0)"),
    Setting("memory_budget_bytes", "MODELYARD_AGENT_MEMORY_BUDGET_BYTES", "",
            "the bytes of memory the models registered on demand may hold at once on each device (each GPU by its "
            "uuid, and CPU memory for models that raise no GPU's): the agent evicts the least asked-for to load "
            "another; empty: no budget"),
    Setting("triton_metrics_url", "MODELYARD_AGENT_TRITON_METRICS_URL", "",
            "Triton's Prometheus endpoint (http://127.0.0.1:8002/metrics), read around each on-demand load to "
            "measure the model's footprint"),
    Setting("triton_metrics_interval_ms", "MODELYARD_AGENT_TRITON_METRICS_INTERVAL_MS", "2000",
            "how often Triton refreshes its memory gauges, ms: its --metrics-interval-ms (2000 unless set); an "
            "on-demand load is measured once this long has passed since it ended, so its rise is in the gauges"),
    Setting("concurrent_loads", "MODELYARD_AGENT_CONCURRENT_LOADS", "1",
            "on-demand loads that may run at once on this host (1 to 16); a model whose footprint is not measured "
            "yet loads alone, so that its memory rise is its own"),
    Setting("loglevel", "MODELYARD_LOG_LEVEL", "INFO", f"the worker's log level: {', '.join(LOG_LEVELS)}"),
)


@dataclass(frozen=True)
class AgentConfig:
    """A host agent's settings, checked.

    Attributes:
        host: the host's name (the registry's name grammar).
        runtime: a ``contract.Runtime`` value.
        broker_url: the Redis URL of the orchestrator's broker.
        model_repository, bentoml_root: where the runtime's files live on this host.
        staging_dir: where Triton versions are downloaded and staged.
        triton_grpc_url: ``host:port``, or empty.
        triton_url: Triton's own HTTP base URL behind the gateway, or empty (no gateway).
        gateway_listen: ``[host:]port`` where the gateway takes HTTP, or empty (from ``inference_url``).
        gateway_grpc_listen: ``[host:]port`` where the gateway takes gRPC, or empty.
        max_request_bytes: the gateway's request body ceiling in bytes (``runtimes.gateway``).
        load_deadline, unload_deadline: default deadlines in seconds (a host's own come in payloads).
        heartbeat_interval: seconds between heartbeats sent while a task works.
        lock_wait: seconds a deployment waits for its (host, model) lock.
        task_time_limit: seconds after which a task is killed.
        visibility_timeout: seconds after which an unacknowledged task is handed out again.
        labels: labels the heartbeat reports.
        concurrency: worker processes.
        perf_analyzer, wrk: the load generators profiles run (paths or names on PATH; looked up
            when a profile starts, so a host that is never profiled needs neither).
        nginx_keepalive: seconds a BentoML host's nginx keeps idle client connections open, or None for
            its default (``bentoml_instances.front_for``).
        memory_budget_bytes: the memory on-demand models may hold at once on each device, bytes
            (``modelyard_agent.residency``), or None for no budget.
        triton_metrics_url: Triton's metrics endpoint, or empty.
        triton_metrics_interval_ms: how often Triton refreshes its memory gauges, ms (its ``--metrics-interval-ms``).
        concurrent_loads: on-demand loads that may run at once (``modelyard_agent.residency``).
        loglevel: the worker's log level, one of ``LOG_LEVELS``.
    """

    host: str
    runtime: str = Runtime.TRITON.value
    broker_url: str = "redis://127.0.0.1:6379/0"
    model_repository: Path = Path("var/model-repository")
    staging_dir: Path = Path("var/.model-repository.modelyard")
    bentoml_root: Path = Path("var/bentoml-agent")
    triton_grpc_url: str = ""
    triton_url: str = ""
    gateway_listen: str = ""
    gateway_grpc_listen: str = ""
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    load_deadline: float = 600.0
    unload_deadline: float = 120.0
    heartbeat_interval: float = 30.0
    lock_wait: float = 600.0
    task_time_limit: float = 1800.0
    visibility_timeout: float = 2400.0
    labels: dict[str, str] = field(default_factory=dict)
    concurrency: int = 4
    perf_analyzer: str = "perf_analyzer"
    wrk: str = "wrk"
    nginx_keepalive: float | None = None
    memory_budget_bytes: int | None = None
    triton_metrics_url: str = ""
    triton_metrics_interval_ms: int = 2000
    concurrent_loads: int = 1
    loglevel: str = "INFO"

    @classmethod
    def from_values(cls, values: Mapping[str, str | None], environ: Mapping[str, str] | None = None,
                    *, need_host: bool = True) -> AgentConfig:
        """Build the settings from flag values (None: not given), falling back to ``environ``
        (default ``os.environ``), then to each setting's default. ``need_host=False`` lets the host
        be missing (empty), for code that runs the agent's steps outside a worker.

        Raises:
            ConfigError: a required setting is missing, or a value is malformed (the message names
                the flag and its variable).
        """
        environ = os.environ if environ is None else environ
        raw: dict[str, str] = {}
        for setting in SETTINGS:
            value = values.get(setting.name)
            if value is None or value == "" and setting.name == "host":
                value = environ.get(setting.env) or setting.default
            raw[setting.name] = value
        if not raw["host"] and need_host:
            raise ConfigError(f"{_flag('host')} is required: {SETTINGS[0].help}")
        repository = Path(raw["model_repository"])
        time_limit = _seconds("task_time_limit", raw["task_time_limit"], maximum=7 * MAX_SECONDS)
        config = cls(
            host=_host(raw["host"] or ""),
            runtime=_choice("runtime", raw["runtime"], [r.value for r in Runtime]),
            broker_url=_broker(raw["broker_url"]),
            model_repository=repository,
            staging_dir=Path(raw["staging_dir"]) if raw["staging_dir"] else default_staging_dir(repository),
            bentoml_root=Path(raw["bentoml_root"]),
            triton_grpc_url=_host_port("triton_grpc_url", raw["triton_grpc_url"].strip()),
            triton_url=_http_url("triton_url", raw["triton_url"].strip()),
            gateway_listen=_listen("gateway_listen", raw["gateway_listen"].strip()),
            gateway_grpc_listen=_listen("gateway_grpc_listen", raw["gateway_grpc_listen"].strip()),
            max_request_bytes=_bytes("max_request_bytes", raw["max_request_bytes"].strip()),
            load_deadline=_seconds("load_deadline", raw["load_deadline"]),
            unload_deadline=_seconds("unload_deadline", raw["unload_deadline"]),
            heartbeat_interval=_seconds("heartbeat_interval", raw["heartbeat_interval"], minimum=0.5),
            lock_wait=_seconds("lock_wait", raw["lock_wait"]),
            task_time_limit=time_limit,
            visibility_timeout=(_seconds("visibility_timeout", raw["visibility_timeout"], maximum=7 * MAX_SECONDS)
                                if raw["visibility_timeout"] else time_limit + 600),
            labels=_labels(raw["labels"]),
            concurrency=_count("concurrency", raw["concurrency"]),
            perf_analyzer=raw["perf_analyzer"].strip() or "perf_analyzer",
            wrk=raw["wrk"].strip() or "wrk",
            nginx_keepalive=(_seconds("nginx_keepalive", raw["nginx_keepalive"].strip(), minimum=0.0)
                             if raw["nginx_keepalive"] and raw["nginx_keepalive"].strip() else None),
            memory_budget_bytes=_budget(raw["memory_budget_bytes"].strip()),
            triton_metrics_url=_metrics_url(raw["triton_metrics_url"].strip()),
            triton_metrics_interval_ms=_count("triton_metrics_interval_ms", raw["triton_metrics_interval_ms"].strip(),
                                              maximum=600_000),
            concurrent_loads=_count("concurrent_loads", raw["concurrent_loads"].strip(), maximum=16),
            loglevel=_choice("loglevel", raw["loglevel"].strip().upper(), list(LOG_LEVELS)),
        )
        if config.gateway_listen and not config.triton_url:
            raise ConfigError(f"{_flag('gateway_listen')} needs {_flag('triton_url')}: without it the agent runs no "
                              "gateway")
        if config.gateway_grpc_listen and not (config.triton_url and config.triton_grpc_url):
            raise ConfigError(f"{_flag('gateway_grpc_listen')} needs {_flag('triton_url')} (the gateway) and "
                              f"{_flag('triton_grpc_url')} (Triton's own gRPC address)")
        if config.load_deadline >= config.task_time_limit:
            raise ConfigError(f"{_flag('load_deadline')} ({config.load_deadline:g} s) must be shorter than "
                              f"{_flag('task_time_limit')} ({config.task_time_limit:g} s), which kills the task")
        return config

    def as_environ(self) -> dict[str, str]:
        """The settings as environment variables, for the worker processes the agent forks."""
        values = {
            "host": self.host, "runtime": self.runtime, "broker_url": self.broker_url,
            "model_repository": str(self.model_repository), "staging_dir": str(self.staging_dir),
            "bentoml_root": str(self.bentoml_root), "triton_grpc_url": self.triton_grpc_url,
            "triton_url": self.triton_url, "gateway_listen": self.gateway_listen,
            "gateway_grpc_listen": self.gateway_grpc_listen,
            "max_request_bytes": str(self.max_request_bytes),
            "load_deadline": f"{self.load_deadline:g}", "unload_deadline": f"{self.unload_deadline:g}",
            "heartbeat_interval": f"{self.heartbeat_interval:g}", "lock_wait": f"{self.lock_wait:g}",
            "task_time_limit": f"{self.task_time_limit:g}", "visibility_timeout": f"{self.visibility_timeout:g}",
            "labels": json.dumps(self.labels), "concurrency": str(self.concurrency),
            "perf_analyzer": self.perf_analyzer, "wrk": self.wrk,
            "nginx_keepalive": "" if self.nginx_keepalive is None else f"{self.nginx_keepalive:g}",
            "memory_budget_bytes": "" if self.memory_budget_bytes is None else str(self.memory_budget_bytes),
            "triton_metrics_url": self.triton_metrics_url,
            "triton_metrics_interval_ms": str(self.triton_metrics_interval_ms),
            "concurrent_loads": str(self.concurrent_loads),
            "loglevel": self.loglevel,
        }
        return {setting.env: values[setting.name] for setting in SETTINGS}

    def shown(self) -> dict[str, str]:
        """``as_environ`` with the broker URL's password masked, for printing."""
        shown = self.as_environ()
        parts = urlsplit(self.broker_url)
        if parts.password:
            netloc = parts.netloc.replace(f":{parts.password}@", ":****@")
            shown["CELERY_BROKER_URL"] = urlunsplit(parts._replace(netloc=netloc))
        return shown


def default_staging_dir(repository: Path) -> Path:
    """``.<repository name>.modelyard`` beside the repository (so on its file system when the
    repository is a plain directory; a mount point needs ``--staging-dir`` inside the mount)."""
    repository = repository.absolute()
    return repository.parent / f".{repository.name}.modelyard"


def _flag(name: str) -> str:
    setting = next(s for s in SETTINGS if s.name == name)
    return f"--{name.replace('_', '-')} ({setting.env})"


def _host(value: str) -> str:
    if value and not NAME_PATTERN.match(value):
        raise ConfigError(f"{_flag('host')} must be a registry name ({NAME_RULE}); got {value!r}")
    return value


def _choice(name: str, value: str, choices: list[str]) -> str:
    if value not in choices:
        raise ConfigError(f"{_flag(name)} must be one of {', '.join(choices)}; got {value!r}")
    return value


def _broker(value: str) -> str:
    parts = urlsplit(value)
    try:
        parts.port  # noqa: B018 - parsing the port is the check
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("redis", "rediss", "unix") or not (parts.hostname or parts.path):
        raise ConfigError(f"{_flag('broker_url')} must be a Redis URL such as redis://broker:6379/0; got {value!r}")
    if parts.scheme != "unix" and parts.path.strip("/") and not _digits(parts.path.strip("/")):
        raise ConfigError(f"{_flag('broker_url')} must end in a database number (redis://broker:6379/0); "
                          f"got {value!r}")
    return value


def _host_port(name: str, value: str) -> str:
    if value and not HOST_PORT.match(value):
        raise ConfigError(f"{_flag(name)} must be host:port (no scheme), such as 127.0.0.1:8001; got {value!r}")
    return value


def _listen(name: str, value: str) -> str:
    """``port`` or ``host:port`` for nginx's ``listen`` (a bare port is every address)."""
    if not value:
        return value
    port = value.rsplit(":", 1)[-1]
    host = value[: -len(port) - 1] if ":" in value else ""
    if not _digits(port) or not 0 < int(port) < 65536 or (":" in value and not HOST_PORT.match(value)):
        raise ConfigError(f"{_flag(name)} must be a port or host:port, such as 8011 or 127.0.0.1:8011; got {value!r}")
    return f"{host}:{int(port)}" if host else str(int(port))


def _http_url(name: str, value: str) -> str:
    if not value:
        return value
    parts = urlsplit(value)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "http" or not parts.hostname or not port or parts.path.strip("/"):
        raise ConfigError(f"{_flag(name)} must be an http URL with a host and a port and no path, such as "
                          f"http://127.0.0.1:8000; got {value!r}")
    return value.rstrip("/")


def _seconds(name: str, value: str, *, minimum: float = 1.0, maximum: float = MAX_SECONDS) -> float:
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not minimum <= number <= maximum:
        raise ConfigError(f"{_flag(name)} must be a number of seconds from {minimum:g} to {maximum:g}; got {value!r}")
    return number


def _digits(value: str) -> bool:
    """True for ASCII digits only: ``str.isdigit`` is also True for '²' or '٣', which ``int`` refuses or reads."""
    return value.isascii() and value.isdigit()


def _count(name: str, value: str, maximum: int = 64) -> int:
    if not _digits(value) or not 1 <= int(value) <= maximum:
        raise ConfigError(f"{_flag(name)} must be a whole number from 1 to {maximum}; got {value!r}")
    return int(value)


def _bytes(name: str, value: str) -> int:
    if not _digits(value) or not MIN_REQUEST_BYTES <= int(value) <= MAX_REQUEST_BYTES:
        raise ConfigError(f"{_flag(name)} must be a whole number of bytes from {MIN_REQUEST_BYTES} to "
                          f"{MAX_REQUEST_BYTES}; got {value!r}")
    return int(value)


def _budget(value: str) -> int | None:
    if not value:
        return None
    if not _digits(value) or int(value) < 1:
        raise ConfigError(f"{_flag('memory_budget_bytes')} must be a whole number of bytes, 1 or more; got {value!r}")
    return int(value)


def _metrics_url(value: str) -> str:
    parts = urlsplit(value)
    if value and (parts.scheme not in ("http", "https") or not parts.hostname):
        raise ConfigError(f"{_flag('triton_metrics_url')} must be an http URL such as http://127.0.0.1:8002/metrics; "
                          f"got {value!r}")
    return value


def _labels(value: str) -> dict[str, str]:
    try:
        labels = json.loads(value)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{_flag('labels')} is not JSON: {exc}") from exc
    if not isinstance(labels, dict) or not all(
            isinstance(k, str) and k.strip() and isinstance(v, str) for k, v in labels.items()):
        raise ConfigError(f"{_flag('labels')} must be a JSON object of non-empty string keys and string values; "
                          f"got {value!r}")
    return labels


@cache
def current() -> AgentConfig:
    """This process's settings, from the environment (the ``modelyard-agent`` command exports its
    flags there before the worker starts, so forked worker processes read the same).

    Raises:
        ConfigError: as ``AgentConfig.from_values``.
    """
    return AgentConfig.from_values({}, need_host=False)
