"""``modelyard register``, ``model`` and ``alias``: new versions (uploaded whole or in parts), models
and aliases."""

import argparse
import gzip
import json
import tarfile
import tempfile
from pathlib import Path

from requests_toolbelt.multipart.encoder import MultipartEncoder, MultipartEncoderMonitor

from modelyard_cli.client import Client, CLIError
from modelyard_cli.multipart import UploadFailed, progress_bar, upload_file

MULTIPART_THRESHOLD = 32 * 1024**2


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


def _expected_alias_etag(client: Client, args) -> str | None:
    """With ``--expect-version N``: the alias's ETag, once its GET shows it names version N (else a
    CLIError); the change then goes with ``If-Match`` and is refused (412) if the alias moves meanwhile."""
    if args.expect_version is None:
        return None
    named = client.request("GET", f"models/{args.model}/aliases/{args.alias}/")["version"]
    if named != args.expect_version:
        raise CLIError(f"@{args.alias} of {args.model} names v{named}, not v{args.expect_version} "
                       "(--expect-version); nothing changed")
    return client.last_etag


def cmd_alias(client: Client, args) -> int:
    path = f"models/{args.model}/aliases/{args.alias}/"
    if args.action == "set":
        if args.version is None:
            raise CLIError("alias set needs a version number")
        sent = {"version": args.version, **({"reason": args.reason} if args.reason else {})}
        body = client.request("PUT", path, json=sent, if_match=_expected_alias_etag(client, args))
    elif args.action in ("lock", "unlock"):
        sent = {"protected": args.action == "lock", **({"reason": args.reason} if args.reason else {})}
        body = client.request("PATCH", path, json=sent, if_match=_expected_alias_etag(client, args))
    elif args.action == "delete":
        client.request("DELETE", path, if_match=_expected_alias_etag(client, args))
        body = {"model": args.model, "alias": args.alias, "deleted": True}
    else:
        body = client.request("GET", f"models/{args.model}/aliases/{args.alias}/")
    print(json.dumps(body))
    return 0


def add_register_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``modelyard register`` to the subcommands ``sub`` (the top-level parser's)."""
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


def add_model_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``modelyard model`` to the subcommands ``sub`` (the top-level parser's)."""
    model = sub.add_parser("model", help="create a registered model")
    model.add_argument("action", choices=["create"])
    model.add_argument("name")
    model.add_argument("--team", help="the owning team (may be left out when you maintain exactly one)")
    model.add_argument("--description")
    model.set_defaults(func=cmd_model)


def add_alias_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``modelyard alias`` to the subcommands ``sub`` (the top-level parser's)."""
    alias = sub.add_parser("alias", help="get, set, lock, unlock or delete an alias")
    alias.add_argument("action", choices=["get", "set", "lock", "unlock", "delete"])
    alias.add_argument("model")
    alias.add_argument("alias")
    alias.add_argument("version", nargs="?", type=int)
    alias.add_argument("--reason", help="why: needed to set a locked (protected) alias; kept in the audit log")
    alias.add_argument("--expect-version", type=int, metavar="N",
                       help="change the alias only if it names version N now, and nobody moves it before the "
                            "change lands (If-Match); otherwise exit 1 and change nothing")
    alias.set_defaults(func=cmd_alias)
