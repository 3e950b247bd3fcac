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
import gzip
import json
import os
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import requests
from requests_toolbelt.multipart.encoder import MultipartEncoder, MultipartEncoderMonitor

from modelyard_cli.multipart import UploadFailed, progress_bar, upload_file

TERMINAL = {"succeeded", "failed", "cancelled", "rolled_back", "paused"}
MULTIPART_THRESHOLD = 32 * 1024**2


class CLIError(Exception):
    """A failure to report on stderr with exit status 1."""


class Client:
    """A thin REST client: base URL and token from the environment, JSON in and out.

    Raises ``CLIError`` with the server's ``detail`` (and, for ``invalid``, each field's messages) on any 4xx/5xx.
    """

    def __init__(self, url: str, token: str, timeout: float = 60.0):
        if not token:
            raise CLIError("MODELYARD_TOKEN is not set: make an API token on the server's /account/tokens/ page "
                           "or with 'manage.py create_api_token <user>'")
        self.url = url.rstrip("/")
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"
        self.timeout = timeout

    def request(self, method: str, path: str, **kwargs) -> dict | list | None:
        try:
            answer = self.session.request(method, f"{self.url}/api/v1/{path.lstrip('/')}", timeout=self.timeout,
                                          **kwargs)
        except requests.RequestException as exc:
            raise CLIError(f"cannot reach {self.url}: {exc}") from exc
        if answer.status_code >= 400:
            # The server's error envelope, {"detail", "code", "fields"}: switch on its stable code. A body
            # without one (a proxy's page, a server older than the envelope) is shown as it came.
            try:
                body = answer.json()
            except ValueError:
                body = None
            if body is None:
                message = answer.text[:500]
            elif not (isinstance(body, dict) and isinstance(body.get("code"), str)):
                message = body["detail"] if isinstance(body, dict) and "detail" in body else json.dumps(body)
            else:
                detail = str(body.get("detail", ""))
                match body["code"]:
                    case "invalid":
                        fields = body.get("fields") if isinstance(body.get("fields"), dict) else {}
                        message = "\n".join([detail, *(
                            f"  {name}: {' '.join(map(str, texts if isinstance(texts, list) else [texts]))}"
                            for name, texts in fields.items())])
                    case "not_authenticated" | "authentication_failed":
                        message = f"{detail} (the token in MODELYARD_TOKEN)"
                    case "throttled" if "Retry-After" in answer.headers:
                        message = f"{detail} (retry after {answer.headers['Retry-After']} s)"
                    case _:  # not_found, conflict, permission_denied, ...: the server's sentence says it all
                        message = detail
            raise CLIError(f"HTTP {answer.status_code}: {message}")
        return answer.json() if answer.content else None


def _archive(source: Path, workdir: Path) -> Path:
    """Return an uploadable archive: ``source`` itself if it is a file, else a .tar.gz of the directory.

    The .tar.gz of an unchanged directory is the same bytes every time (sorted members, no gzip
    timestamp), so an interrupted upload of it can be resumed.
    """
    if source.is_file():
        return source
    if not source.is_dir():
        raise CLIError(f"{source} is neither a file nor a directory")
    if not (source / "config.pbtxt").is_file():
        raise CLIError(f"{source} has no config.pbtxt: point at one Triton model directory")
    target = workdir / f"{source.name}.tar.gz"
    with target.open("wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as zipped, \
            tarfile.open(fileobj=zipped, mode="w") as tar:
        tar.add(source, arcname=source.name, filter=lambda info: None if "__pycache__" in info.name else info)
    return target


def _post_whole_file(client: Client, model: str, archive: Path, fields: dict[str, str], quiet: bool) -> dict:
    """Send a small artifact and its form ``fields`` through the web process in one multipart/form-data request."""
    with archive.open("rb") as fh, progress_bar(archive.stat().st_size, quiet) as bar:
        encoder = MultipartEncoder({"artifact": (archive.name, fh, "application/octet-stream"), **fields})
        bar.total = encoder.len
        monitor = MultipartEncoderMonitor(encoder, lambda m: bar.update(m.bytes_read - bar.n))
        return client.request("POST", f"models/{model}/versions/", data=monitor,
                              headers={"Content-Type": monitor.content_type})


def _signature(value: str | None) -> str | None:
    """The ``--signature`` JSON text: given inline, or read from the file it names (the server checks it)."""
    if value is None or value.lstrip().startswith("{"):
        return value
    path = Path(value)
    if not path.is_file():
        raise CLIError(f"--signature {value!r} is neither a JSON object nor a file")
    return path.read_text()


def cmd_register(client: Client, args) -> int:
    metadata = args.metadata or "{}"
    try:
        parsed = json.loads(metadata)
    except json.JSONDecodeError as exc:
        raise CLIError(f"--metadata is not valid JSON: {exc.msg}") from exc
    fields = {"metadata": metadata}
    if args.signature is not None:
        fields["signature"] = _signature(args.signature)
    if args.max_batch_size is not None:
        fields["max_batch_size"] = str(args.max_batch_size)
    if args.parallel < 1 or (args.part_size is not None and args.part_size < 1):
        raise CLIError("--parallel and --part-size must be positive")
    with tempfile.TemporaryDirectory(prefix="modelyard-") as tmp:
        archive = _archive(Path(args.path), Path(tmp))
        if args.resume or archive.stat().st_size > args.multipart_threshold:
            version_fields = {"metadata": parsed}
            if args.signature is not None:
                try:
                    version_fields["signature"] = json.loads(fields["signature"])
                except json.JSONDecodeError as exc:
                    raise CLIError(f"--signature is not valid JSON: {exc.msg}") from exc
            if args.max_batch_size is not None:
                version_fields["max_batch_size"] = args.max_batch_size
            try:
                upload = upload_file(client, args.model, archive, fields=version_fields,
                                     part_size=args.part_size, parallel=args.parallel, resume=args.resume,
                                     quiet=args.quiet, timeout=args.timeout)
            except UploadFailed as exc:
                raise CLIError(exc.message) from exc
            body = {"model": upload["model"], "version": upload["version"], "status": "ready",
                    "artifact_sha256": upload["sha256"]}
        else:
            body = _post_whole_file(client, args.model, archive, fields, args.quiet)
    print(json.dumps({"model": body["model"], "version": body["version"], "status": body["status"],
                      "sha256": body["artifact_sha256"]}))
    return 0


def cmd_model(client: Client, args) -> int:
    body = client.request("POST", "models/", json={"name": args.name, "team": args.team or "",
                                                   "description": args.description or ""})
    print(json.dumps({"name": body["name"], "team": body["team"]}))
    return 0


def cmd_alias(client: Client, args) -> int:
    if args.action == "set":
        if args.version is None:
            raise CLIError("alias set needs a version number")
        sent = {"version": args.version, **({"reason": args.reason} if args.reason else {})}
        body = client.request("PUT", f"models/{args.model}/aliases/{args.alias}/", json=sent)
    elif args.action in ("lock", "unlock"):
        sent = {"protected": args.action == "lock", **({"reason": args.reason} if args.reason else {})}
        body = client.request("PATCH", f"models/{args.model}/aliases/{args.alias}/", json=sent)
    elif args.action == "delete":
        client.request("DELETE", f"models/{args.model}/aliases/{args.alias}/")
        body = {"model": args.model, "alias": args.alias, "deleted": True}
    else:
        body = client.request("GET", f"models/{args.model}/aliases/{args.alias}/")
    print(json.dumps(body))
    return 0


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
        request["config_overrides"] = _json_arg("--config-overrides", args.config_overrides)
    if args.config:
        request["config"] = args.config
    if args.canary is not None:
        request["canary_percent"] = args.canary
    if args.max_request_bytes is not None:
        request["max_request_bytes"] = parse_quantity(args.max_request_bytes, _SIZE_UNITS, "--max-request-bytes")
    if args.shadow is not None:
        request["shadow_percent"] = args.shadow
    body = client.request("POST", "deployments/", json=request)
    if not args.wait:
        print(json.dumps({"id": body["id"], "status": body["status"]}))
        return 0
    print(f"deployment {body['id']} started", file=sys.stderr)
    return wait_for_deployment(client, body["id"], args.timeout)


def _json_arg(flag: str, value: str):
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise CLIError(f"{flag} is not valid JSON: {exc.msg}") from exc


PROFILE_ENDED = {"succeeded", "failed", "cancelled"}


def wait_for_profile(client: Client, profile_id: int, timeout: float, interval: float = 1.0) -> int:
    """Poll a profile until it ends: 0 when it succeeded, else 1.

    Prints each step and the measurements done to stderr, then the card as a table (config,
    concurrency, throughput in inferences/s, p50/p99 and the server's queue and compute time in ms,
    memory in MiB) and the final status, message and recommendation as JSON to stdout.

    Raises:
        CLIError: the timeout (seconds) passed first.
    """
    deadline = time.monotonic() + timeout
    last = None
    while True:
        body = client.request("GET", f"profiles/{profile_id}/")
        progress = body["progress"]
        shown = (body["status"], progress["done"], progress["step"])
        if shown != last:
            last = shown
            step = f" — {progress['step']}" if progress["step"] else ""
            print(f"profile {profile_id}: {body['status']}, {progress['done']}/{progress['total']} measured{step}",
                  file=sys.stderr)
        if body["status"] in PROFILE_ENDED:
            _print_card(body["rows"])
            print(json.dumps({k: body[k] for k in ("id", "status", "message", "slo_p99_ms", "recommended")}))
            return 0 if body["status"] == "succeeded" else 1
        if time.monotonic() > deadline:
            raise CLIError(f"profile {profile_id} still {body['status']} after {timeout:g} s")
        time.sleep(interval)


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
        request["sweep"] = _json_arg("--sweep", args.sweep)
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


_SIZE_UNITS = {"": 1, "b": 1, "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4, "kb": 1000, "mb": 1000**2,
               "gb": 1000**3, "tb": 1000**4}
_TIME_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_quantity(text: str, units: dict[str, int], what: str) -> int:
    """``text`` as a whole number of base units: ``256MiB`` -> 268435456 (bytes), ``7d`` -> 604800 (seconds).

    Raises:
        CLIError: not a number followed by one of ``units`` (the message names them).
    """
    clean = text.strip().lower()
    number = clean.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = clean[len(number):]
    try:
        value = float(number)
    except ValueError:
        value = -1
    known = ", ".join(u for u in units if u)
    if unit not in units and value >= 0:
        raise CLIError(f"{what} {text!r}: unknown unit {unit!r}; the units are {known}")
    if unit not in units or value < 0:
        raise CLIError(f"{what} {text!r} must be a number with one of the units {known}")
    return round(value * units[unit])


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
                change["max_bytes"] = parse_quantity(args.max_bytes, _SIZE_UNITS, "--max-bytes")
            if args.retention is not None:
                change["retention_seconds"] = parse_quantity(args.retention, _TIME_UNITS, "--retention")
            if not change:
                raise CLIError("capture set needs --fraction, --max-bytes or --retention")
        body = client.request("PATCH", path, json=change)
    print(json.dumps(body))
    for warning in body.get("warnings") or []:
        print(f"modelyard: warning: {warning}", file=sys.stderr)
    return 0


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


REPLAY_ENDED = {"succeeded", "failed", "cancelled"}


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
    deadline = time.monotonic() + timeout
    last = None
    while True:
        body = client.request("GET", f"replays/{replay_id}/")
        progress = body["progress"]
        shown = (body["status"], progress["done"], progress["step"])
        if shown != last:
            last = shown
            step = f" — {progress['step']}" if progress["step"] else ""
            print(f"replay {replay_id}: {body['status']}, {progress['done']}/{progress['total']} requests{step}",
                  file=sys.stderr)
        if body["status"] in REPLAY_ENDED:
            print(replay_summary(body))
            return 0 if body["status"] == "succeeded" else 1
        if time.monotonic() > deadline:
            raise CLIError(f"replay {replay_id} still {body['status']} after {timeout:g} s")
        time.sleep(interval)


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
    reg = sub.add_parser("register", help="upload a model (directory, archive or single file) as a new version")
    reg.add_argument("model")
    reg.add_argument("path", help="a Triton model directory (config.pbtxt + one version dir) or a .tar.gz/.zip, "
                                  "a .onnx, .pt or .plan file, or a .bentomodel/.bento export")
    reg.add_argument("--metadata", help="a JSON object stored with the version")
    reg.add_argument("--signature", metavar="FILE_OR_JSON",
                     help='inputs and outputs of a .onnx/.pt/.plan file: {"inputs": [{"name", "data_type", '
                          '"dims"}], "outputs": [...]} (required for .pt and .plan)')
    reg.add_argument("--max-batch-size", type=int, metavar="N",
                     help="single files: the batch limit; the first dim of every tensor is the batch (default 0)")
    reg.add_argument("--quiet", action="store_true", help="no progress bar")
    reg.add_argument("--multipart-threshold", type=int, default=MULTIPART_THRESHOLD, metavar="BYTES",
                     help="files larger than this go straight to S3 in parts (default 32 MiB; 0: always)")
    reg.add_argument("--part-size", type=int, metavar="BYTES", help="bytes per part (default: the server's)")
    reg.add_argument("--parallel", type=int, default=4, help="parts sent at once (default 4)")
    reg.add_argument("--resume", metavar="UPLOAD_ID", help="continue an interrupted multipart upload")
    reg.add_argument("--timeout", type=float, default=1800, help="seconds to wait for verification")
    reg.set_defaults(func=cmd_register)
    model = sub.add_parser("model", help="create a registered model")
    model.add_argument("action", choices=["create"])
    model.add_argument("name")
    model.add_argument("--team", help="the owning team (may be left out when you maintain exactly one)")
    model.add_argument("--description")
    model.set_defaults(func=cmd_model)
    alias = sub.add_parser("alias", help="get, set, lock, unlock or delete an alias")
    alias.add_argument("action", choices=["get", "set", "lock", "unlock", "delete"])
    alias.add_argument("model")
    alias.add_argument("alias")
    alias.add_argument("version", nargs="?", type=int)
    alias.add_argument("--reason", help="why: needed to set a locked (protected) alias; kept in the audit log")
    alias.set_defaults(func=cmd_alias)
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
    deploy.add_argument("--wait", action="store_true", help="wait; exit 1 unless the rollout succeeds")
    deploy.add_argument("--timeout", type=float, default=900, help="seconds to wait (default 900)")
    deploy.set_defaults(func=cmd_deploy)
    wait = sub.add_parser("wait", help="wait for a deployment; exit 1 if it fails")
    wait.add_argument("deployment", type=int)
    wait.add_argument("--timeout", type=float, default=900)
    wait.set_defaults(func=cmd_wait)
    promote = sub.add_parser("promote", help="run a promotion policy's evaluation now")
    promote.add_argument("action", choices=["run"])
    promote.add_argument("policy", type=int, help="the policy's id")
    promote.add_argument("--wait", action="store_true", help="wait for the decision; exit 1 unless promoted")
    promote.add_argument("--timeout", type=float, default=600, help="seconds to wait (default 600)")
    promote.set_defaults(func=cmd_promote)

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

    profiles = sub.add_parser("profiles", help="follow or cancel a profile")
    profiles.add_argument("action", choices=["wait", "cancel"])
    profiles.add_argument("profile", type=int, help="the profile's id")
    profiles.add_argument("--timeout", type=float, default=3900, help="seconds to wait (default 3900)")
    profiles.set_defaults(func=cmd_profiles)

    canary = sub.add_parser("canary", help="change a canary's percent or shadow percent, promote it, or roll it back")
    canary.add_argument("action", choices=["set", "shadow", "promote", "rollback"])
    canary.add_argument("deployment", type=int, help="the canary deployment's id")
    canary.add_argument("percent", type=float, nargs="?", help="with set or shadow: the new percent, 0-100")
    canary.add_argument("--wait", action="store_true", help="promote, rollback: wait; exit 1 unless it succeeds")
    canary.add_argument("--timeout", type=float, default=900, help="seconds to wait (default 900)")
    canary.set_defaults(func=cmd_canary)

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
