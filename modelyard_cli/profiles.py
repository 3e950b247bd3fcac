"""``modelyard profile`` and ``profiles``: measure a version's performance card on a host, follow or
cancel the measurement."""

import argparse
import json
import sys

from modelyard_cli.arguments import json_arg
from modelyard_cli.client import Client, CLIError
from modelyard_cli.jobs import wait_for_job


def wait_for_profile(client: Client, profile_id: int, timeout: float, interval: float = 1.0) -> int:
    """Poll a profile until it ends: 0 when it succeeded, else 1.

    Prints each step and the measurements done to stderr, then the card as a table (config,
    concurrency, throughput in inferences/s, p50/p99 and the server's queue and compute time in ms,
    memory in MiB) and the final status, message and recommendation as JSON to stdout.

    Raises:
        CLIError: the timeout (seconds) passed first.
    """
    return wait_for_job(client, f"profiles/{profile_id}/", f"profile {profile_id}", "measured", _show_profile,
                        timeout, interval)


def _show_profile(body: dict) -> None:
    _print_card(body["rows"])
    print(json.dumps({k: body[k] for k in ("id", "status", "message", "slo_p99_ms", "recommended")}))


def _print_card(rows: list[dict]) -> None:
    def cell(value, digits: int = 2) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    print(f"{'config':<44} {'conc':>4} {'infer/s':>9} {'p50 ms':>7} {'p99 ms':>7} {'queue':>6} {'compute':>7} "
          f"{'MiB':>6}", file=sys.stderr)
    for row in rows:
        label = row["config"].get("label", "")
        if row.get("error"):
            print(f"{label:<44} {row.get('concurrency') or '-':>4} {row['error']}", file=sys.stderr)
            continue
        mib = row.get("memory_bytes")
        print(f"{label:<44} {row['concurrency']:>4} {cell(row['throughput'], 1):>9} {cell(row['p50_ms']):>7} "
              f"{cell(row['p99_ms']):>7} {cell(row.get('queue_ms')):>6} {cell(row.get('compute_ms')):>7} "
              f"{cell(mib / 2**20 if mib is not None else None, 0):>6}", file=sys.stderr)


def cmd_profile(client: Client, args) -> int:
    if args.sweep and args.preset:
        raise CLIError("give --preset or --sweep, not both")
    request: dict = {"host": args.host}
    if args.sweep:
        request["sweep"] = json_arg("--sweep", args.sweep)
    elif args.preset:
        request["sweep"] = args.preset
    if args.slo_p99_ms is not None:
        request["slo_p99_ms"] = args.slo_p99_ms
    body = client.request("POST", f"models/{args.model}/versions/{args.version}/profiles/", json=request)
    if not args.wait:
        print(json.dumps({"id": body["id"], "status": body["status"]}))
        return 0
    print(f"profile {body['id']} queued on {args.host} ({body['progress']['total']} measurements)", file=sys.stderr)
    return wait_for_profile(client, body["id"], args.timeout)


def cmd_profiles(client: Client, args) -> int:
    if args.action == "cancel":
        body = client.request("POST", f"profiles/{args.profile}/cancel/")
        print(json.dumps({"id": body["id"], "status": body["status"]}))
        return 0
    return wait_for_profile(client, args.profile, args.timeout)


def add_profile_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``modelyard profile`` to the subcommands ``sub`` (the top-level parser's)."""
    profile = sub.add_parser("profile", help="measure a version's performance card on a host with perf_analyzer")
    profile.add_argument("model")
    profile.add_argument("version", type=int)
    profile.add_argument("--host", required=True, help="the serving host to measure on (a staging host)")
    profile.add_argument("--preset", choices=["quick", "standard"], help="a named sweep (default quick)")
    profile.add_argument("--sweep", metavar="JSON", help="a sweep object: instance_counts, dynamic_batching, "
                         "concurrency, measurement_interval_ms, time_budget_s, ...")
    profile.add_argument("--slo-p99-ms", type=float, help="the client p99 target the recommendation meets")
    profile.add_argument("--wait", action="store_true", help="wait; print the card; exit 1 unless it succeeds")
    profile.add_argument("--timeout", type=float, default=3900, help="seconds to wait (default 3900)")
    profile.set_defaults(func=cmd_profile)


def add_profiles_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``modelyard profiles`` to the subcommands ``sub`` (the top-level parser's)."""
    profiles = sub.add_parser("profiles", help="follow or cancel a profile")
    profiles.add_argument("action", choices=["wait", "cancel"])
    profiles.add_argument("profile", type=int, help="the profile's id")
    profiles.add_argument("--timeout", type=float, default=3900, help="seconds to wait (default 3900)")
    profiles.set_defaults(func=cmd_profiles)
