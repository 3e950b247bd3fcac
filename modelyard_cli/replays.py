"""``modelyard replay``: replay captured requests against a candidate version; show, list or cancel
replays."""

import argparse
import json
import sys

from modelyard_cli.client import Client, CLIError
from modelyard_cli.jobs import wait_for_job


def _fmt(value, digits: int = 3, unit: str = "") -> str:
    return "-" if value is None else f"{value:.{digits}f}{unit}"


def _pct(value) -> str:
    return "-" if value is None else f"{value * 100:.2f} %"


def _clip(value, width: int = 120) -> str:
    text = json.dumps(value, separators=(",", ":")) if not isinstance(value, str) else value
    return text if len(text) <= width else text[: width - 1] + "…"


def replay_summary(body: dict) -> str:
    """A replay (``GET /api/v1/replays/<id>/``'s body) as lines for people.

    Shows status and progress, the agreement rate (agreeing over compared requests), the per-request
    maximum absolute differences (p50/p90/p99/max and the histogram), both versions' round trip in
    milliseconds (p50, p95, mean) and the candidate's p95 regression, and the worst disagreements
    (request id, output, difference, both outputs, each cut to 120 characters) when the body has them
    (``worst`` is null unless the caller owns the model's team).
    """
    progress = body.get("progress") or {}
    lines = [f"replay {body['id']}: {body['model']} v{body['version']} against v{body['against']} on {body['host']}",
             f"status      {body['status']}" + (f" — {body['message']}" if body.get("message") else ""),
             f"progress    {progress.get('done', 0)}/{progress.get('total', 0)} requests"
             + (f" — {progress['step']}" if progress.get("step") else ""),
             f"tolerances  atol {body['tolerances'].get('atol')}, rtol {body['tolerances'].get('rtol')}"
             + (f", argmax {', '.join(body['tolerances'].get('argmax_outputs') or [])}"
                if body["tolerances"].get("argmax_outputs") else ""),
             f"agreement   {_pct(body.get('agreement_rate'))} of {body.get('compared', 0)} compared"
             f" ({body.get('skipped', 0)} skipped)"]
    if body.get("disagreed_outputs"):
        lines.append("disagreed   " + ", ".join(f"{name}: {count}" for name, count in
                                                sorted(body["disagreed_outputs"].items())))
    differences = body.get("differences") or {}
    if differences:
        lines.append("max |diff|  " + ", ".join(f"{q} {_fmt(differences.get(q), 6)}" for q in ("p50", "p90", "p99",
                                                                                             "max"))
                     + (f", {differences['nonfinite']} not finite" if differences.get("nonfinite") else ""))
        buckets = [f"{'≤ ' + format(b['upto'], 'g') if b['upto'] is not None else '> last'}: {b['count']}"
                   for b in differences.get("histogram") or [] if b.get("count")]
        if buckets:
            lines.append("histogram   " + ", ".join(buckets))
    latency = body.get("latency_ms") or {}
    for side in ("serving", "candidate"):
        if latency.get(side):
            row = latency[side]
            lines.append(f"{side + ' ms':<13}p50 {_fmt(row.get('p50'))}, p95 {_fmt(row.get('p95'))}, "
                         f"mean {_fmt(row.get('mean'))} over {row.get('count', 0)}")
    if body.get("latency_regression") is not None:
        lines.append(f"regression  p95 {body['latency_regression'] * 100:+.1f} % (candidate against serving)")
    worst = body.get("worst")
    if worst:
        lines.append(f"worst disagreements ({len(worst)}):")
        for row in worst:
            lines.append(f"  {row.get('id')}  {row.get('output') or '-'}  |diff| {_fmt(row.get('max_abs_diff'), 6)}"
                         + (f"  {row['reason']}" if row.get("reason") else ""))
            lines.append(f"    serving:   {_clip(row.get('serving'))}")
            lines.append(f"    candidate: {_clip(row.get('candidate'))}")
    elif worst is None and body.get("status") == "succeeded":
        lines.append("worst disagreements: shown to owners of the model's team only")
    return "\n".join(lines)


def wait_for_replay(client: Client, replay_id: int, timeout: float, interval: float = 1.0) -> int:
    """Poll a replay until it ends: 0 when it succeeded, else 1.

    Prints the status and requests done to stderr as they change, then ``replay_summary`` to stdout.

    Raises:
        CLIError: the timeout (seconds) passed first.
    """
    return wait_for_job(client, f"replays/{replay_id}/", f"replay {replay_id}", "requests",
                        lambda body: print(replay_summary(body)), timeout, interval)


def cmd_replay(client: Client, args) -> int:
    """``modelyard replay start|show|list|cancel``: replays of captured requests (see ``replay_summary``)."""
    if args.action == "start":
        if len(args.target) != 2 or not args.target[1].isdigit():
            raise CLIError("replay start needs a model and a candidate version: "
                           "modelyard replay start <model> <version> --against <version|alias>")
        if not args.against:
            raise CLIError("replay start needs --against <version|alias>: the version whose answers are the reference")
        model, version = args.target[0], int(args.target[1])
        request: dict = {"against": args.against}
        if args.host:
            request["host"] = args.host
        if args.max_requests is not None:
            request["max_requests"] = args.max_requests
        if args.pace is not None:
            request["pace"] = args.pace
        tolerances = {key: value for key, value in (("atol", args.atol), ("rtol", args.rtol),
                                                    ("argmax_outputs", args.argmax)) if value is not None}
        if tolerances:
            request["tolerances"] = tolerances
        body = client.request("POST", f"models/{model}/versions/{version}/replays/", json=request)
        if not args.wait:
            print(json.dumps({k: body[k] for k in ("id", "status", "host", "against", "max_requests")}))
            return 0
        print(f"replay {body['id']} queued on {body['host']} against v{body['against']}", file=sys.stderr)
        return wait_for_replay(client, body["id"], args.timeout)
    if len(args.target) != 1 or (args.action != "list" and not args.target[0].isdigit()):
        what = "a model name" if args.action == "list" else "a replay id"
        raise CLIError(f"replay {args.action} takes {what}: modelyard replay {args.action} "
                       f"<{'model' if args.action == 'list' else 'id'}>")
    if args.action == "list":
        body = client.request("GET", "replays/", params={"model": args.target[0]})
        rows = body["results"] if isinstance(body, dict) else body
        if not rows:
            client.request("GET", f"models/{args.target[0]}/")  # an unknown model is a 404, not an empty list
        if args.json:
            print(json.dumps(rows))
            return 0
        print(f"{'id':>6} {'version':>7} {'against':>7} {'host':<20} {'status':<10} {'done':>11} {'agreement':>10} "
              f"{'p95 regr.':>9}  created")
        for row in rows:
            progress = row["progress"]
            regression = row.get("latency_regression")
            print(f"{row['id']:>6} {'v' + str(row['version']):>7} {'v' + str(row['against']):>7} {row['host']:<20} "
                  f"{row['status']:<10} {str(progress['done']) + '/' + str(progress['total']):>11} "
                  f"{_pct(row.get('agreement_rate')):>10} "
                  f"{'-' if regression is None else format(regression * 100, '+.1f') + ' %':>9}  {row['created_at']}")
        return 0
    replay_id = int(args.target[0])
    if args.action == "cancel":
        body = client.request("POST", f"replays/{replay_id}/cancel/")
        print(json.dumps({"id": body["id"], "status": body["status"], "step": body["progress"]["step"]}))
        return 0
    body = client.request("GET", f"replays/{replay_id}/")
    print(json.dumps(body) if args.json else replay_summary(body))
    return 0


def add_replay_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``modelyard replay`` to the subcommands ``sub`` (the top-level parser's)."""
    replay = sub.add_parser("replay", help="replay captured requests against a candidate version, show, list or "
                                           "cancel replays")
    replay.add_argument("action", choices=["start", "show", "list", "cancel"])
    replay.add_argument("target", nargs="+", metavar="ARG",
                        help="start: <model> <version>; show, cancel: <replay id>; list: <model>")
    replay.add_argument("--against", metavar="VERSION_OR_ALIAS",
                        help="start: the version (number or alias) whose answers are the reference")
    replay.add_argument("--host", help="start: the host to replay on (default: the one that captured the most)")
    replay.add_argument("--max-requests", type=int, metavar="N", help="start: captured requests, newest first "
                        "(default 1000)")
    replay.add_argument("--pace", type=float, metavar="PER_S", help="start: requests per second (default 20)")
    replay.add_argument("--atol", type=float, help="start: absolute tolerance of float outputs (default 1e-5)")
    replay.add_argument("--rtol", type=float, help="start: relative tolerance of float outputs (default 1e-3)")
    replay.add_argument("--argmax", action="append", metavar="OUTPUT",
                        help="start: compare this output by argmax over its last axis (repeat for more)")
    replay.add_argument("--wait", action="store_true", help="start: wait, print the summary; exit 1 unless it "
                        "succeeds")
    replay.add_argument("--timeout", type=float, default=3900, help="seconds to wait (default 3900)")
    replay.add_argument("--json", action="store_true", help="show, list: print the API's JSON")
    replay.set_defaults(func=cmd_replay)
