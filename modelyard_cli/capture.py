"""``modelyard capture``: show, set or turn off a model's request capture."""

import argparse
import json
import sys

from modelyard_cli.arguments import SIZE_UNITS, TIME_UNITS, parse_quantity
from modelyard_cli.client import Client, CLIError


def cmd_capture(client: Client, args) -> int:
    """``modelyard capture show|off <model>`` and ``modelyard capture set <model> [--fraction F] [--max-bytes
    256MiB] [--retention 7d]``: print the model's capture (settings, each host's counts, warnings) as JSON."""
    path = f"models/{args.model}/capture/"
    given = [flag for flag, value in (("--fraction", args.fraction), ("--max-bytes", args.max_bytes),
                                      ("--retention", args.retention)) if value is not None]
    if given and args.action != "set":
        raise CLIError(f"capture {args.action} takes no {', '.join(given)}: only 'capture set' changes the settings")
    if args.action == "show":
        body = client.request("GET", path)
    else:
        change = {"fraction": 0.0} if args.action == "off" else {}
        if args.action == "set":
            if args.fraction is not None:
                change["fraction"] = args.fraction
            if args.max_bytes is not None:
                change["max_bytes"] = parse_quantity(args.max_bytes, SIZE_UNITS, "--max-bytes")
            if args.retention is not None:
                change["retention_seconds"] = parse_quantity(args.retention, TIME_UNITS, "--retention")
            if not change:
                raise CLIError("capture set needs --fraction, --max-bytes or --retention")
        body = client.request("PATCH", path, json=change)
    print(json.dumps(body))
    for warning in body.get("warnings") or []:
        print(f"modelyard: warning: {warning}", file=sys.stderr)
    return 0


def add_capture_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``modelyard capture`` to the subcommands ``sub`` (the top-level parser's)."""
    capture = sub.add_parser("capture", help="show, set or turn off a model's request capture (owners)")
    capture.add_argument("action", choices=["show", "set", "off"])
    capture.add_argument("model")
    capture.add_argument("--fraction", type=float, help="set: share of client infer requests captured, 0-1")
    capture.add_argument("--max-bytes", help="set: most bytes kept per host, e.g. 256MiB")
    capture.add_argument("--retention", help="set: how long requests are kept, e.g. 7d, 12h")
    capture.set_defaults(func=cmd_capture)
