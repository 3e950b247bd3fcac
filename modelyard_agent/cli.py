"""``modelyard-agent``: start a host agent on a serving host.

    modelyard-agent --host gpu-0 --runtime triton --broker-url redis://broker:6379/0 \\
        --model-repository /srv/triton/models --triton-grpc-url 127.0.0.1:8001

Every flag can also come from the environment (``modelyard_agent.config``). The command checks its
settings and the host (the model repository and staging directory share a file system; a
BentoML host has ``bentoml`` installed), exports the settings for the worker processes, then runs
a Celery worker that consumes ``host.<host>`` only, until it is stopped (SIGTERM: a warm shutdown
that lets running tasks finish).

Exit status: 0 after a shutdown, 1 when the worker stopped on an error (an unreachable broker
after its retries, say), 2 for bad settings, as argparse does.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

from modelyard_agent.config import SETTINGS, AgentConfig, ConfigError
from modelyard_agent.contract import PROTOCOL_VERSION, Runtime, host_queue


def parser() -> argparse.ArgumentParser:
    """The command's argument parser: one flag per ``config.SETTINGS`` entry, plus ``--print-config``."""
    parse = argparse.ArgumentParser(
        prog="modelyard-agent", description="Run the Modelyard host agent of one serving host.",
        epilog=f"Speaks orchestrator protocol {PROTOCOL_VERSION}. Needs no database or S3 credentials, but must "
               "reach the broker and the S3 endpoint that the orchestrator signs download URLs for "
               "(MODELYARD_S3_HOST_ENDPOINT_URL on the orchestrator, else its own MODELYARD_S3_ENDPOINT_URL).")
    for setting in SETTINGS:
        default = "required" if setting.name == "host" else f"default {setting.default or 'see above'}"
        parse.add_argument(f"--{setting.name.replace('_', '-')}", dest=setting.name, default=None,
                           help=f"{setting.help} [${setting.env}; {default}]")
    parse.add_argument("--print-config", action="store_true",
                       help="print the settings as environment variables (the broker's password masked) and exit")
    return parse


def check_host(config: AgentConfig) -> None:
    """Refuse to start on a host that cannot carry out the work.

    Raises:
        ConfigError: Triton: the model repository is not a directory, or the staging directory is on
            another file system (staged versions could not be renamed into place); BentoML: the
            ``bentoml`` package is missing (``pip install ./modelyard_agent[bentoml]``).
    """
    if config.runtime == Runtime.BENTOML:
        if importlib.util.find_spec("bentoml") is None:
            raise ConfigError("--runtime bentoml needs the bentoml package: pip install './modelyard_agent[bentoml]'")
        return
    repository = Path(config.model_repository)
    if not repository.is_dir():
        raise ConfigError(f"--model-repository {repository} is not a directory; create it (Triton serves from it)")
    staging = Path(config.staging_dir)
    try:
        staging.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--staging-dir {staging} cannot be created ({exc.strerror}); pick a writable directory "
                          "on the model repository's file system") from exc
    if staging.stat().st_dev != repository.stat().st_dev:
        raise ConfigError(f"--staging-dir {staging} is on another file system than --model-repository {repository}; "
                          "staged versions are renamed into place, so pick one on the same file system")


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv``, check the settings and the host, and run the worker until it is stopped.

    Returns:
        The worker's exit status: 0 after a warm shutdown, 1 when it stopped on an error; 2 (by
        ``SystemExit``, from argparse) for bad settings.
    """
    parse = parser()
    args = parse.parse_args(argv)
    try:
        config = AgentConfig.from_values(vars(args))
        if not args.print_config:
            check_host(config)
    except ConfigError as exc:
        parse.error(str(exc))
    if args.print_config:
        for name, value in sorted(config.shown().items()):
            print(f"{name}={value}")
        return 0
    # The environment is how the settings reach the worker processes Celery forks (``config.current`` reads
    # them there): the command writes it, and only ``config`` reads it.
    os.environ.update(config.as_environ())
    from celery.utils.nodenames import host_format

    from modelyard_agent.config import current

    current.cache_clear()
    from modelyard_agent.worker import app  # configured from the settings just exported

    if config.runtime == Runtime.TRITON:
        from modelyard_agent.adapters.triton import start_loader

        start_loader()  # threads of this process, not of the worker processes Celery forks

    worker = app.Worker(
        queues=[host_queue(config.host)], hostname=host_format(f"agent-{config.host}@%h"),
        concurrency=config.concurrency,
        loglevel=config.loglevel, without_gossip=True, without_mingle=True,
    )
    worker.start()
    return worker.exitcode or 0


if __name__ == "__main__":
    sys.exit(main())
