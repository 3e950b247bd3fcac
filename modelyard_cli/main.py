"""The ``modelyard`` command: register versions, move aliases, deploy and wait, from CI.

Configuration comes from the environment: ``MODELYARD_URL`` (default http://127.0.0.1:8080)
and ``MODELYARD_TOKEN`` (an API token, sent as ``Authorization: Bearer <token>``: make one on the
server's /account/tokens/ page, with ``POST /api/v1/tokens/``, or ``manage.py create_api_token <user>``).
Every command exits 0 on success, 1 when the server refused or the deployment failed, and
2 on bad usage; errors go to stderr as the server's own message.

A file larger than ``--multipart-threshold`` (default 32 MiB) goes straight to S3 as a multipart
upload through presigned part URLs, several parts at a time; ``--resume UPLOAD_ID`` continues one
that was interrupted, skipping the parts S3 already holds.

Examples::

    modelyard register iris ./model_repository/iris --metadata '{"commit": "abc123"}'
    modelyard register iris ./iris.onnx --max-batch-size 8
    modelyard register detector ./detector.pt --signature signature.json
    modelyard register resnet ./resnet.tar --resume 4f6c0d9e-…
    modelyard alias set iris production 3 [--reason "…"]   # lock, unlock: protect an alias
    modelyard deploy iris 3 --host gpu-0 --host gpu-1 --wait
    modelyard wait 42 --timeout 900
    modelyard promote run 7 --wait     # exit 1 unless the policy promoted
    modelyard replay start iris 4 --against production --max-requests 500 --argmax probabilities --wait
    modelyard replay show 12           # agreement, differences, latency of both versions
"""

import argparse
import json
import os
import sys

from modelyard_cli import deployments, profiles, promotions, registry
from modelyard_cli.arguments import SIZE_UNITS, TIME_UNITS, parse_quantity
from modelyard_cli.client import Client, CLIError
from modelyard_cli.jobs import wait_for_job


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="modelyard", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    registry.add_register_parser(sub)
    registry.add_model_parser(sub)
    registry.add_alias_parser(sub)
    deployments.add_deploy_parser(sub)
    deployments.add_wait_parser(sub)
    promotions.add_promote_parser(sub)

    profiles.add_profile_parser(sub)

    profiles.add_profiles_parser(sub)

    deployments.add_canary_parser(sub)

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

    capture = sub.add_parser("capture", help="show, set or turn off a model's request capture (owners)")
    capture.add_argument("action", choices=["show", "set", "off"])
    capture.add_argument("model")
    capture.add_argument("--fraction", type=float, help="set: share of client infer requests captured, 0-1")
    capture.add_argument("--max-bytes", help="set: most bytes kept per host, e.g. 256MiB")
    capture.add_argument("--retention", help="set: how long requests are kept, e.g. 7d, 12h")
    capture.set_defaults(func=cmd_capture)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``modelyard`` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        client = Client(os.environ.get("MODELYARD_URL", "http://127.0.0.1:8080"), os.environ.get("MODELYARD_TOKEN", ""))
        return args.func(client, args)
    except CLIError as exc:
        print(f"modelyard: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
