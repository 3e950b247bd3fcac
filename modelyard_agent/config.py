"""A host agent's settings: command-line flags, each also readable from the environment.

The agent reads no database or S3 credentials and needs none; what it needs is the broker, its
host's name and runtime, where the runtime's files live and how long a load may take.

| flag | environment | default |
| --- | --- | --- |
| ``--host`` | ``MODELYARD_AGENT_HOST`` | required: the host's name in the registry |
| ``--runtime`` | ``MODELYARD_AGENT_RUNTIME`` | ``triton`` (or ``bentoml``) |
| ``--broker-url`` | ``CELERY_BROKER_URL`` | ``redis://127.0.0.1:6379/0`` |
| ``--model-repository`` | ``MODELYARD_AGENT_MODEL_REPOSITORY`` | ``var/model-repository`` (Triton) |
| ``--bentoml-root`` | ``MODELYARD_AGENT_BENTOML_ROOT`` | ``var/bentoml-agent`` (BentoML) |
| ``--triton-grpc-url`` | ``MODELYARD_AGENT_TRITON_GRPC_URL`` | empty: loads go over HTTP |
| ``--load-deadline`` | ``MODELYARD_AGENT_LOAD_TIMEOUT`` | 600 s, when the host sets none |
| ``--unload-deadline`` | ``MODELYARD_AGENT_UNLOAD_TIMEOUT`` | 120 s, when the host sets none |
| ``--heartbeat-interval`` | ``MODELYARD_HEARTBEAT_INTERVAL`` | 30 s |
| ``--lock-wait`` | ``MODELYARD_DISPATCH_TIMEOUT`` | 600 s a deployment waits for its model's lock |
| ``--labels`` | ``MODELYARD_AGENT_LABELS`` | ``{}`` (JSON object of strings) |
| ``--concurrency`` | ``MODELYARD_AGENT_CONCURRENCY`` | 4 worker processes |

Triton keeps staged downloads beside its model repository (``.<repository>.modelyard/``), on the
same file system, so a staged version directory is renamed into place in one step.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from modelyard_agent.contract import Runtime
from modelyard_agent.formats.names import NAME_PATTERN


class ConfigError(ValueError):
    """A flag or environment variable with a value the agent cannot use; the message names it."""


@dataclass(frozen=True)
class Setting:
    """One setting: its flag, environment variable, default (None: required) and help."""

    name: str
    env: str
    default: str | None
    help: str


SETTINGS = (
    Setting("host", "MODELYARD_AGENT_HOST", None, "this host's name, as registered (its queue is host.<name>)"),
    Setting("runtime", "MODELYARD_AGENT_RUNTIME", Runtime.TRITON.value, "triton or bentoml"),
    Setting("broker_url", "CELERY_BROKER_URL", "redis://127.0.0.1:6379/0", "the orchestrator's Redis broker"),
    Setting("model_repository", "MODELYARD_AGENT_MODEL_REPOSITORY", "var/model-repository",
            "Triton's model repository (started with --model-control-mode=explicit)"),
    Setting("bentoml_root", "MODELYARD_AGENT_BENTOML_ROOT", "var/bentoml-agent",
            "the BentoML host's Bento Store, serve instances, nginx config and state file"),
    Setting("triton_grpc_url", "MODELYARD_AGENT_TRITON_GRPC_URL", "",
            "host:port of Triton's gRPC endpoint, for loads and unloads (empty: over HTTP)"),
    Setting("load_deadline", "MODELYARD_AGENT_LOAD_TIMEOUT", "600", "seconds a load may take, unless the host sets it"),
    Setting("unload_deadline", "MODELYARD_AGENT_UNLOAD_TIMEOUT", "120",
            "seconds an unload may take, unless the host sets it"),
    Setting("heartbeat_interval", "MODELYARD_HEARTBEAT_INTERVAL", "30", "seconds between reports during long work"),
    Setting("lock_wait", "MODELYARD_DISPATCH_TIMEOUT", "600",
            "seconds a deployment waits for another one of the same model on this host"),
    Setting("labels", "MODELYARD_AGENT_LABELS", "{}", "the host's labels, a JSON object of strings"),
    Setting("concurrency", "MODELYARD_AGENT_CONCURRENCY", "4",
            "worker processes: models are deployed side by side, each under its own lock"),
)


@dataclass(frozen=True)
class AgentConfig:
    """A host agent's settings, checked.

    Attributes:
        host: the host's name (the registry's name grammar).
        runtime: a ``contract.Runtime`` value.
        broker_url: the Redis URL of the orchestrator's broker.
        model_repository, bentoml_root: where the runtime's files live on this host.
        triton_grpc_url: ``host:port``, or empty.
        load_deadline, unload_deadline: default deadlines in seconds (a host's own come in payloads).
        heartbeat_interval: seconds between heartbeats sent while a task works.
        lock_wait: seconds a deployment waits for its (host, model) lock.
        labels: the host's labels.
        concurrency: worker processes.
    """

    host: str
    runtime: str = Runtime.TRITON.value
    broker_url: str = "redis://127.0.0.1:6379/0"
    model_repository: Path = Path("var/model-repository")
    bentoml_root: Path = Path("var/bentoml-agent")
    triton_grpc_url: str = ""
    load_deadline: float = 600.0
    unload_deadline: float = 120.0
    heartbeat_interval: float = 30.0
    lock_wait: float = 600.0
    labels: dict[str, str] = field(default_factory=dict)
    concurrency: int = 4

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
            if value is None:
                value = environ.get(setting.env) or setting.default
            if value is None and not need_host and setting.name == "host":
                value = ""
            if value is None:
                raise ConfigError(f"--{setting.name.replace('_', '-')} (or {setting.env}) is required")
            raw[setting.name] = value
        return cls(
            host=_host(raw["host"]),
            runtime=_choice("runtime", raw["runtime"], [r.value for r in Runtime]),
            broker_url=_broker(raw["broker_url"]),
            model_repository=Path(raw["model_repository"]),
            bentoml_root=Path(raw["bentoml_root"]),
            triton_grpc_url=raw["triton_grpc_url"].strip(),
            load_deadline=_seconds("load_deadline", raw["load_deadline"]),
            unload_deadline=_seconds("unload_deadline", raw["unload_deadline"]),
            heartbeat_interval=_seconds("heartbeat_interval", raw["heartbeat_interval"]),
            lock_wait=_seconds("lock_wait", raw["lock_wait"]),
            labels=_labels(raw["labels"]),
            concurrency=int(_seconds("concurrency", raw["concurrency"], whole=True)),
        )

    def as_environ(self) -> dict[str, str]:
        """The settings as environment variables, for the worker processes the agent forks."""
        values = {
            "host": self.host, "runtime": self.runtime, "broker_url": self.broker_url,
            "model_repository": str(self.model_repository), "bentoml_root": str(self.bentoml_root),
            "triton_grpc_url": self.triton_grpc_url, "load_deadline": f"{self.load_deadline:g}",
            "unload_deadline": f"{self.unload_deadline:g}", "heartbeat_interval": f"{self.heartbeat_interval:g}",
            "lock_wait": f"{self.lock_wait:g}", "labels": json.dumps(self.labels), "concurrency": str(self.concurrency),
        }
        return {setting.env: values[setting.name] for setting in SETTINGS}


def _flag(name: str) -> str:
    setting = next(s for s in SETTINGS if s.name == name)
    return f"--{name.replace('_', '-')} ({setting.env})"


def _host(value: str) -> str:
    if value and not NAME_PATTERN.match(value):
        raise ConfigError(f"{_flag('host')} must be a registry name (lower-case letters, digits, '-' and '_'), "
                          f"got {value!r}")
    return value


def _choice(name: str, value: str, choices: list[str]) -> str:
    if value not in choices:
        raise ConfigError(f"{_flag(name)} must be one of {', '.join(choices)}; got {value!r}")
    return value


def _broker(value: str) -> str:
    if not value.startswith(("redis://", "rediss://", "unix://")):
        raise ConfigError(f"{_flag('broker_url')} must be a Redis URL (redis://host:6379/0), got {value!r}")
    return value


def _seconds(name: str, value: str, *, whole: bool = False) -> float:
    try:
        number = int(value) if whole else float(value)
    except ValueError:
        number = 0
    if not number > 0:
        kind = "a positive whole number" if whole else "a positive number of seconds"
        raise ConfigError(f"{_flag(name)} must be {kind}, got {value!r}")
    return number


def _labels(value: str) -> dict[str, str]:
    try:
        labels = json.loads(value)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{_flag('labels')} is not JSON: {exc}") from exc
    if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
        raise ConfigError(f"{_flag('labels')} must be a JSON object of strings, got {value!r}")
    return labels


@cache
def current() -> AgentConfig:
    """This process's settings, from the environment (the ``modelyard-agent`` command exports its
    flags there before the worker starts, so forked worker processes read the same).

    Raises:
        ConfigError: as ``AgentConfig.from_values``.
    """
    return AgentConfig.from_values({}, need_host=False)
