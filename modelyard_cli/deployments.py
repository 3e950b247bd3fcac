"""``modelyard deploy``, ``wait`` and ``canary``: start rollouts, change canaries, and follow them to
the end."""

import argparse
import json
import sys
import time

from modelyard_cli.arguments import SIZE_UNITS, json_arg, parse_quantity
from modelyard_cli.client import Client, CLIError

TERMINAL = {"succeeded", "failed", "cancelled", "rolled_back", "paused"}


def wait_for_deployment(client: Client, deployment_id: int, timeout: float, interval: float = 2.0) -> int:
    """Poll a deployment until it succeeds (0) or fails, pauses, is cancelled or rolled back (1).

    Prints each host's state changes to stderr and the final status as JSON to stdout.

    Raises:
        CLIError: the timeout (seconds) passed first.
    """
    deadline = time.monotonic() + timeout
    seen: dict[str, str] = {}
    while True:
        body = client.request("GET", f"deployments/{deployment_id}/")
        for target in body["targets"]:
            if seen.get(target["host"]) != target["state"]:
                seen[target["host"]] = target["state"]
                line = f"{target['host']}: {target['state']}"
                print(line + (f" — {target['error']}" if target["error"] else ""), file=sys.stderr)
        if body["status"] in TERMINAL:
            print(json.dumps({"id": body["id"], "status": body["status"]}))
            return 0 if body["status"] == "succeeded" else 1
        if time.monotonic() > deadline:
            raise CLIError(f"deployment {deployment_id} still {body['status']} after {timeout:g} s")
        time.sleep(interval)


def _labels(pairs: list[str] | None) -> dict[str, str]:
    labels = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CLIError(f"--selector takes LABEL=VALUE, got {pair!r}")
        labels[key] = value
    return labels


def cmd_deploy(client: Client, args) -> int:
    if (args.version is None) == (args.alias is None):
        raise CLIError("give a version number or --alias ALIAS (to follow it), not both" if args.alias
                       else "give a version number or --alias ALIAS (to follow it)")
    if bool(args.host) == bool(args.selector):
        raise CLIError("choose hosts with --host (repeatable) or --selector LABEL=VALUE, not both" if args.host
                       else "choose hosts: --host NAME (repeatable) or --selector LABEL=VALUE")
    request = {"model": args.model, "batch_size": args.batch_size, "failure_policy": args.on_failure}
    request.update({"version": args.version} if args.version is not None else {"alias": args.alias})
    request.update({"hosts": args.host} if args.host else {"selector": _labels(args.selector)})
    if args.replicas is not None:
        request["replicas"] = args.replicas
    if args.config_overrides and args.config:
        raise CLIError("give --config-overrides or --config recommended, not both")
    if args.config_overrides:
        request["config_overrides"] = json_arg("--config-overrides", args.config_overrides)
    if args.config:
        request["config"] = args.config
    if args.canary is not None:
        request["canary_percent"] = args.canary
    if args.max_request_bytes is not None:
        request["max_request_bytes"] = parse_quantity(args.max_request_bytes, SIZE_UNITS, "--max-request-bytes")
    if args.shadow is not None:
        request["shadow_percent"] = args.shadow
    if args.on_demand:
        request.update(residency="on_demand", pinned=args.pinned)
        if args.cold_start_timeout is not None:
            request["cold_start_timeout"] = args.cold_start_timeout
    elif args.pinned or args.cold_start_timeout is not None:
        raise CLIError("--pinned and --cold-start-timeout go with --on-demand")
    body = client.request("POST", "deployments/", json=request)
    if not args.wait:
        print(json.dumps({"id": body["id"], "status": body["status"]}))
        return 0
    print(f"deployment {body['id']} started", file=sys.stderr)
    return wait_for_deployment(client, body["id"], args.timeout)


def cmd_canary(client: Client, args) -> int:
    """``modelyard canary set|shadow <id> <percent>``, ``promote <id>`` or ``rollback <id>`` (these two wait
    with --wait)."""
    if args.action in ("set", "shadow"):
        if args.percent is None:
            raise CLIError(f"canary {args.action} needs the new percent: modelyard canary {args.action} <id> <0-100>")
        field = "canary_percent" if args.action == "set" else "shadow_percent"
        body = client.request("PATCH", f"deployments/{args.deployment}/", json={field: args.percent})
        print(json.dumps({"id": body["id"], "canary_percent": body["canary_percent"],
                          "shadow_percent": body["shadow_percent"], "canary": body["canary"]}))
        return 0
    if args.percent is not None:
        raise CLIError(f"canary {args.action} takes no percent")
    if args.action == "promote":
        started = [client.request("POST", f"deployments/{args.deployment}/promote/")]
    else:
        started = client.request("POST", f"deployments/{args.deployment}/rollback/")
    print(json.dumps([{"id": body["id"], "version": body["version"], "status": body["status"]} for body in started]))
    if not args.wait:
        return 0
    return max([wait_for_deployment(client, body["id"], args.timeout) for body in started], default=0)


def cmd_wait(client: Client, args) -> int:
    return wait_for_deployment(client, args.deployment, args.timeout)


def add_deploy_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``modelyard deploy`` to the subcommands ``sub`` (the top-level parser's)."""
    deploy = sub.add_parser("deploy", help="roll a version (or the version an alias names) out to hosts")
    deploy.add_argument("model")
    deploy.add_argument("version", type=int, nargs="?", help="the version to pin (or give --alias)")
    deploy.add_argument("--alias", help="follow this alias: deploy its version now and again whenever it moves")
    deploy.add_argument("--host", action="append", help="a serving host (repeat for more)")
    deploy.add_argument("--selector", action="append", metavar="LABEL=VALUE",
                        help="choose hosts by label (repeat to require several)")
    deploy.add_argument("--replicas", type=int, help="with --selector: how many hosts, by free GPU memory")
    deploy.add_argument("--batch-size", type=int, default=1, help="hosts moved at once (default 1)")
    deploy.add_argument("--on-failure", choices=["pause", "rollback"], default="pause",
                        help="what the rollout does when a host fails (default pause)")
    deploy.add_argument("--config-overrides", help="JSON: instance_group, dynamic_batching, max_batch_size")
    deploy.add_argument("--config", choices=["recommended"],
                        help="serve with the config the version's performance card recommends")
    deploy.add_argument("--canary", type=float, metavar="PERCENT",
                        help="a canary: keep the version each host serves and send this share (0-100) of the "
                             "requests that name no version to the new one")
    deploy.add_argument("--shadow", type=float, metavar="PERCENT",
                        help="mirror this share (0-100) of the requests that name no version to the new one, its "
                             "answers discarded (without --canary: a shadow, which serves no client)")
    deploy.add_argument("--max-request-bytes", metavar="SIZE",
                        help="the most an infer request body may hold at the hosts' gateways, such as 4MiB (413 "
                             "beyond; default: derived from the version's signature)")
    deploy.add_argument("--on-demand", action="store_true",
                        help="register the model on each host but load it at its first request (held by the "
                             "gateway until then) and evict it when the host needs room (Triton hosts)")
    deploy.add_argument("--pinned", action="store_true", help="with --on-demand: never evicted once loaded")
    deploy.add_argument("--cold-start-timeout", type=float, metavar="SECONDS",
                        help="with --on-demand: how long a request waits for the load before a 503 (default 30)")
    deploy.add_argument("--wait", action="store_true", help="wait; exit 1 unless the rollout succeeds")
    deploy.add_argument("--timeout", type=float, default=900, help="seconds to wait (default 900)")
    deploy.set_defaults(func=cmd_deploy)


def add_wait_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``modelyard wait`` to the subcommands ``sub`` (the top-level parser's)."""
    wait = sub.add_parser("wait", help="wait for a deployment; exit 1 if it fails")
    wait.add_argument("deployment", type=int)
    wait.add_argument("--timeout", type=float, default=900)
    wait.set_defaults(func=cmd_wait)


def add_canary_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``modelyard canary`` to the subcommands ``sub`` (the top-level parser's)."""
    canary = sub.add_parser("canary", help="change a canary's percent or shadow percent, promote it, or roll it back")
    canary.add_argument("action", choices=["set", "shadow", "promote", "rollback"])
    canary.add_argument("deployment", type=int, help="the canary deployment's id")
    canary.add_argument("percent", type=float, nargs="?", help="with set or shadow: the new percent, 0-100")
    canary.add_argument("--wait", action="store_true", help="promote, rollback: wait; exit 1 unless it succeeds")
    canary.add_argument("--timeout", type=float, default=900, help="seconds to wait (default 900)")
    canary.set_defaults(func=cmd_canary)
