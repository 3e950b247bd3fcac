"""``modelyard promote``: run a promotion policy's evaluation and wait for its decision."""

import argparse
import json
import sys
import time

from modelyard_cli.client import Client, CLIError


def wait_for_evaluation(client: Client, evaluation_id: int, timeout: float, interval: float = 2.0) -> int:
    """Poll a promotion evaluation until its decision is final; 0 when it promoted, else 1.

    Prints the evaluation (decision, reason, metrics) as JSON to stdout. An evaluation awaiting
    approval keeps being polled until someone approves or rejects it, or the timeout passes.

    Raises:
        CLIError: the timeout (seconds) passed first.
    """
    deadline = time.monotonic() + timeout
    while True:
        body = client.request("GET", f"promotion-evaluations/{evaluation_id}/")
        if body["final"]:
            print(json.dumps({k: body[k] for k in ("id", "decision", "reason", "candidate_version",
                                                  "target_version", "metrics")}))
            return 0 if body["decision"] in ("promoted", "approved") else 1
        if time.monotonic() > deadline:
            raise CLIError(f"evaluation {evaluation_id} still {body['decision']} after {timeout:g} s")
        time.sleep(interval)


def cmd_promote(client: Client, args) -> int:
    body = client.request("POST", f"promotion-policies/{args.policy}/run/")
    if not args.wait:
        print(json.dumps({"id": body["id"], "decision": body["decision"]}))
        return 0
    print(f"evaluation {body['id']} queued", file=sys.stderr)
    return wait_for_evaluation(client, body["id"], args.timeout)


def add_promote_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``modelyard promote`` to the subcommands ``sub`` (the top-level parser's)."""
    promote = sub.add_parser("promote", help="run a promotion policy's evaluation now")
    promote.add_argument("action", choices=["run"])
    promote.add_argument("policy", type=int, help="the policy's id")
    promote.add_argument("--wait", action="store_true", help="wait for the decision; exit 1 unless promoted")
    promote.add_argument("--timeout", type=float, default=600, help="seconds to wait (default 600)")
    promote.set_defaults(func=cmd_promote)
