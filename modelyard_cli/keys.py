"""``modelyard key``: make, list and revoke a team's inference keys."""

import argparse
import json
import sys
from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode

from modelyard_cli.arguments import TIME_UNITS, parse_quantity
from modelyard_cli.client import Client, CLIError

LIST_PAGE_SIZE = 200  # the API's largest page


def cmd_key(client: Client, args) -> int:
    """``modelyard key create <name> --model M [--model M2 …] [--expires-in 30d]``: print the new key's JSON,
    whose ``key`` is shown this once (a reminder goes to stderr); ``modelyard key list [--model M] [--team T]``:
    print every key as JSON lines, newest first (never a secret); ``modelyard key revoke <id>``: print the
    revoked key's JSON. Returns 0; raises CLIError for bad usage or the server's refusal."""
    if args.action == "create":
        if not args.name or not args.model:
            raise CLIError("key create needs a name and at least one --model")
        body = {"name": args.name, "models": args.model}
        if args.expires_in is not None:
            seconds = parse_quantity(args.expires_in, TIME_UNITS, "--expires-in")
            body["expires_at"] = (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat()
        created = client.request("POST", "inference-keys/", json=body)
        print(json.dumps(created))
        print("modelyard: the key is shown only this once: store it now", file=sys.stderr)
        return 0
    if args.action == "revoke":
        if not (args.name or "").isdigit():
            raise CLIError("key revoke needs the key's id (see 'modelyard key list')")
        print(json.dumps(client.request("POST", f"inference-keys/{args.name}/revoke/")))
        return 0
    query = {"page_size": LIST_PAGE_SIZE, **{k: v for k, v in (("model", args.model and args.model[0]),
                                                               ("team", args.team)) if v}}
    path = f"inference-keys/?{urlencode(query)}"
    while path:
        page = client.request("GET", path)
        for key in page["results"]:
            print(json.dumps(key))
        path = page["next"].split("/api/v1/", 1)[1] if page["next"] else None  # the server's link, whole
    return 0


def add_key_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``modelyard key`` to the subcommands ``sub`` (the top-level parser's)."""
    key = sub.add_parser("key", help="make, list or revoke inference keys (making and revoking: team owners)")
    key.add_argument("action", choices=["create", "list", "revoke"])
    key.add_argument("name", nargs="?", help="create: the key's name; revoke: the key's id")
    key.add_argument("--model", action="append", help="create: a model the key opens (repeat for more); "
                                                      "list: only keys that open this model")
    key.add_argument("--team", help="list: only this team's keys")
    key.add_argument("--expires-in", help="create: how long the key lives, e.g. 30d, 12h (default: no expiry)")
    key.set_defaults(func=cmd_key)
