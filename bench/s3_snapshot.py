"""Benchmark: ``make stop``'s save of the local S3 stand-in (``scripts/s3_snapshot.py save``) with large objects.

What it runs, all real: one ``moto_server`` (its temporary files on ``--s3-scratch``, a tmpfs by
default), holding one object of ``--size`` bytes (random, default 2 GB, as a large model version
leaves it) and ``--small`` objects of 64 KiB. Then, in order:

1. With ``--with-old-save`` only: what the save did before it was incremental, boto3
   ``download_file`` of every object with boto3's TransferConfig defaults (8 MiB ranges), into an
   empty directory. The stand-in copies the whole object for every ranged GET, so at 2 GB this
   takes minutes (it is what looked like a hang).
2. ``scripts/s3_snapshot.py save DIR`` (a subprocess, as ``make stop`` runs it) into an empty
   directory: everything is downloaded. This is the baseline the incremental saves are judged
   against.
3. The same again, nothing changed: everything is kept.
4. One small object rewritten and one deleted, then the save again: one download, one removal.

Each run's wall time is measured around it; the save's own closing line (what it saved, kept and
removed, and its seconds) is recorded as printed. Nothing here asserts a verdict beyond writing it:
the incremental save (3) must take under a tenth of the full one (2).

Usage::

    python bench/s3_snapshot.py --json bench/results/s3_snapshot.json --markdown bench/results/s3_snapshot.md
"""

import argparse
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import boto3
import requests
from boto3.s3.transfer import TransferConfig
from botocore.config import Config

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
BUCKET = "modelyard-bench-snapshot"
MIB = 1024**2


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run(args) -> dict:
    work = Path(tempfile.mkdtemp(prefix="bench-snapshot-", dir=args.tmp))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = (work / "s3.log").open("wb")
    s3 = subprocess.Popen([str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)], stdout=log,
                          stderr=subprocess.STDOUT, env={**os.environ, "TMPDIR": args.s3_scratch},
                          start_new_session=True)
    result: dict = {"started": datetime.now(UTC).isoformat(timespec="seconds"), "large_bytes": args.size,
                    "small_objects": args.small}
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if requests.get(url, timeout=2).ok:
                    break
            except requests.RequestException:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.3)
        env = {**os.environ, "MODELYARD_S3_ENDPOINT_URL": url}
        client = boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="modelyard",
                              aws_secret_access_key="modelyard-secret",
                              config=Config(s3={"addressing_style": "path"},
                                            response_checksum_validation="when_required"))
        client.create_bucket(Bucket=BUCKET)
        large = work / "large.bin"
        with large.open("wb") as out:
            left = args.size
            while left > 0:
                out.write(os.urandom(min(8 * MIB, left)))
                left -= min(8 * MIB, left)
        client.upload_file(str(large), BUCKET, "uploads/large", Config=TransferConfig(
            multipart_threshold=64 * MIB, multipart_chunksize=64 * MIB))
        large.unlink()
        for number in range(args.small):
            client.put_object(Bucket=BUCKET, Key=f"sha256/{number:02x}/small-{number}", Body=os.urandom(64 * 1024))

        if args.with_old_save:
            began = time.monotonic()
            baseline = work / "baseline"
            for item in client.list_objects_v2(Bucket=BUCKET).get("Contents", []):
                target = baseline / item["Key"]
                target.parent.mkdir(parents=True, exist_ok=True)
                client.download_file(BUCKET, item["Key"], str(target))
            result["baseline_s"] = round(time.monotonic() - began, 2)
            shutil.rmtree(baseline)

        snapshot = work / "s3-snapshot"

        def save(label: str) -> None:
            began = time.monotonic()
            done = subprocess.run([sys.executable, str(REPO / "scripts/s3_snapshot.py"), "save", str(snapshot)],
                                  env=env, capture_output=True, text=True, timeout=3600, check=True)
            result[label] = {"seconds": round(time.monotonic() - began, 2),
                             "printed": done.stdout.strip().splitlines()[-1]}

        save("full_save")
        save("unchanged_save")
        client.put_object(Bucket=BUCKET, Key="sha256/00/small-0", Body=os.urandom(64 * 1024))
        client.delete_object(Bucket=BUCKET, Key="sha256/01/small-1")
        save("one_changed_save")
    finally:
        os.killpg(s3.pid, 15)
        s3.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)
    result["incremental_vs_full"] = round(result["unchanged_save"]["seconds"] / result["full_save"]["seconds"], 3)
    if "baseline_s" in result:
        result["full_vs_baseline"] = round(result["full_save"]["seconds"] / result["baseline_s"], 3)
    result["verdict"] = "pass" if result["incremental_vs_full"] < 0.1 else "fail"
    return result


def markdown(r: dict) -> str:
    rows = [("boto3 `download_file` of every object, its defaults (the save before it was incremental)",
             r["baseline_s"], "")] if "baseline_s" in r else []
    rows += [("`s3_snapshot.py save`, empty snapshot", r["full_save"]["seconds"], r["full_save"]["printed"]),
            ("`s3_snapshot.py save`, nothing changed", r["unchanged_save"]["seconds"], r["unchanged_save"]["printed"]),
            ("`s3_snapshot.py save`, one object rewritten and one deleted", r["one_changed_save"]["seconds"],
             r["one_changed_save"]["printed"])]
    lines = ["# Saving the local S3 stand-in (`make stop`)", "",
             f"Run {r['started']} on {platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}.", "",
             f"**Verdict: {r['verdict'].upper()}** — an unchanged save takes {r['incremental_vs_full']} of a full "
             "one (target < 0.1).", "",
             f"One object of {r['large_bytes']} bytes and {r['small_objects']} of 64 KiB in one moto_server "
             "(temporary files on a tmpfs). Times are wall-clock around each run, in the order below.", "",
             "| run | seconds | what the save printed |", "|---|---|---|"]
    lines += [f"| {label} | {seconds} | {printed} |" for label, seconds, printed in rows]
    if "full_vs_baseline" in r:
        lines += ["", f"- Full save / the old save: {r['full_vs_baseline']} (fewer, larger ranged GETs: the "
                  "stand-in copies the whole object for each one)."]
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, default=REPO / "bench/results/s3_snapshot.json")
    parser.add_argument("--markdown", type=Path, default=REPO / "bench/results/s3_snapshot.md")
    parser.add_argument("--size", type=int, default=2_000_000_000, help="bytes of the large object (default 2 GB)")
    parser.add_argument("--small", type=int, default=20, help="how many 64 KiB objects besides it")
    parser.add_argument("--with-old-save", action="store_true",
                        help="also time the save as it was before (minutes at 2 GB)")
    parser.add_argument("--tmp", default=tempfile.gettempdir())
    parser.add_argument("--s3-scratch", default="/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir())
    args = parser.parse_args(argv)
    result = run(args)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    args.markdown.write_text(markdown(result))
    print(f"unchanged save / full save = {result['incremental_vs_full']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
