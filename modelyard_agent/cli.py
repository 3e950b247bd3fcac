"""``modelyard-agent``: start a host agent on a serving host.

    modelyard-agent --host gpu-0 --runtime triton --broker-url redis://broker:6379/0 \\
        --model-repository /srv/triton/models --triton-grpc-url 127.0.0.1:8001

Every flag can also come from the environment (``modelyard_agent.config``). The command checks
its settings, exports them for the worker processes, then runs a Celery worker that consumes
``host.<host>`` only. Exit status 2 for bad settings, as argparse does.
"""

from __future__ import annotations

import argparse
import os
import sys

from modelyard_agent.config import SETTINGS, AgentConfig, ConfigError
from modelyard_agent.contract import PROTOCOL_VERSION, host_queue


def parser() -> argparse.ArgumentParser:
    """The command's argument parser: one flag per ``config.SETTINGS`` entry, plus ``--loglevel``
    and ``--print-config``."""
    parse = argparse.ArgumentParser(
        prog="modelyard-agent", description="Run the Modelyard host agent of one serving host.",
        epilog=f"Speaks orchestrator protocol {PROTOCOL_VERSION}. Needs no database or S3 credentials.")
    for setting in SETTINGS:
        default = "required" if setting.default is None else f"default {setting.default or 'empty'}"
        parse.add_argument(f"--{setting.name.replace('_', '-')}", dest=setting.name, default=None,
                           help=f"{setting.help} [${setting.env}; {default}]")
    parse.add_argument("--loglevel", default=os.environ.get("MODELYARD_LOG_LEVEL", "INFO"),
                       help="DEBUG, INFO, WARNING or ERROR [$MODELYARD_LOG_LEVEL; default INFO]")
    parse.add_argument("--print-config", action="store_true", help="print the settings as environment and exit")
    return parse


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv``, check the settings and run the worker until it is stopped.

    Returns:
        The worker's exit status (0 after a warm shutdown); 2 for bad settings.
    """
    parse = parser()
    args = parse.parse_args(argv)
    try:
        config = AgentConfig.from_values(vars(args))
    except ConfigError as exc:
        parse.error(str(exc))
    os.environ.update(config.as_environ())
    if args.print_config:
        for name, value in sorted(config.as_environ().items()):
            print(f"{name}={value}")
        return 0
    from modelyard_agent.worker import app  # reads the broker URL just exported

    app.worker_main([
        "worker", "-Q", host_queue(config.host), "-n", f"agent-{config.host}@%h",
        "--concurrency", str(config.concurrency), "--loglevel", args.loglevel,
        "--without-gossip", "--without-mingle",
    ])
    return 0


if __name__ == "__main__":
    sys.exit(main())
