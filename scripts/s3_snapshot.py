"""Keep the local S3 stand-in's objects across restarts.

The stand-in (moto's server) holds objects in memory only. ``save`` copies the objects of every
bucket to a directory before it stops; ``restore`` puts them back after it starts, so versions
registered earlier stay deployable.

``save`` is incremental: ``DIR/manifest.json`` records each saved object's ETag and size, and only
the objects the last snapshot lacks or holds another ETag of are downloaded (into a ``.part`` file,
renamed when complete, so an interrupted save leaves the last snapshot usable); files of objects
that are gone are removed. Each download shows a progress bar on stderr (bytes, rate) and the run
ends with a line of what was saved, kept and removed, and how long it took. A snapshot written
before the manifest existed is downloaded again once.

Usage: python scripts/s3_snapshot.py save|restore DIR   (endpoint from MODELYARD_S3_ENDPOINT_URL)
"""

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from tqdm import tqdm

MANIFEST = "manifest.json"
PARTIAL = ".part"
TRANSFER = TransferConfig(multipart_threshold=64 * 1024**2, multipart_chunksize=64 * 1024**2, max_concurrency=4)
RANGES_PER_OBJECT = 8


def _download_config(size: int) -> TransferConfig:
    """At most ``RANGES_PER_OBJECT`` ranged GETs of at least 64 MiB per object, four at a time: the
    stand-in copies the whole object for every ranged GET, so many small ranges of a large object
    cost far more than a few large ones (and a single GET streams slowly from it)."""
    chunk = max(64 * 1024**2, -(-size // RANGES_PER_OBJECT))
    return TransferConfig(multipart_threshold=64 * 1024**2, multipart_chunksize=chunk, max_concurrency=4)


@dataclass
class SaveReport:
    """What ``save`` did: objects downloaded (and their bytes), kept unchanged, files removed; seconds."""

    saved: int = 0
    saved_bytes: int = 0
    kept: int = 0
    removed: int = 0
    seconds: float = 0.0

    def line(self) -> str:
        return (f"s3 snapshot: saved {self.saved} objects ({self.saved_bytes / 1024**2:.1f} MiB), kept "
                f"{self.kept} unchanged, removed {self.removed}, in {self.seconds:.1f} s")


def _client():
    return boto3.client(
        "s3",
        endpoint_url=os.environ["MODELYARD_S3_ENDPOINT_URL"],
        region_name=os.environ.get("MODELYARD_S3_REGION", "us-east-1"),
        aws_access_key_id=os.environ.get("MODELYARD_S3_ACCESS_KEY_ID", "modelyard"),
        aws_secret_access_key=os.environ.get("MODELYARD_S3_SECRET_ACCESS_KEY", "modelyard-secret"),
        config=Config(s3={"addressing_style": "path"}, connect_timeout=5, read_timeout=60,
                      response_checksum_validation="when_required"),
    )


def _load_manifest(root: Path) -> dict[str, dict]:
    try:
        return json.loads((root / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}


def _write_manifest(root: Path, manifest: dict[str, dict]) -> None:
    staging = root / (MANIFEST + PARTIAL)
    staging.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    staging.replace(root / MANIFEST)


def save(root: Path, *, quiet: bool = False) -> SaveReport:
    """Bring ``root/<bucket>/<key>`` up to date with every object of every bucket.

    Args:
        root: the snapshot directory (created when missing).
        quiet: no progress bars (the summary is still returned).

    Returns:
        The report: objects downloaded and their bytes, objects kept because the snapshot already
        held the same ETag and size, files removed because their object is gone, and seconds taken.

    Raises:
        botocore.exceptions.BotoCoreError, ClientError: the endpoint failed; files saved so far stay.
        OSError: the directory cannot be written.
    """
    began = time.monotonic()
    client = _client()
    root.mkdir(parents=True, exist_ok=True)
    old = _load_manifest(root)
    manifest: dict[str, dict] = {}
    report = SaveReport()
    for bucket in client.list_buckets().get("Buckets", []):
        name = bucket["Name"]
        (root / name).mkdir(parents=True, exist_ok=True)
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=name):
            for item in page.get("Contents", []):
                entry = f"{name}/{item['Key']}"
                wanted = {"etag": item["ETag"], "size": item["Size"]}
                target = root / name / item["Key"]
                if old.get(entry) == wanted and target.is_file() and target.stat().st_size == item["Size"]:
                    manifest[entry] = wanted
                    report.kept += 1
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                partial = target.with_name(target.name + PARTIAL)
                with tqdm(total=item["Size"], unit="B", unit_scale=True, unit_divisor=1024, desc=entry[-40:],
                          file=sys.stderr, disable=quiet, ascii=True, mininterval=0.5, leave=False) as bar:
                    client.download_file(name, item["Key"], str(partial), Config=_download_config(item["Size"]),
                                         Callback=bar.update)
                partial.replace(target)
                manifest[entry] = wanted
                report.saved += 1
                report.saved_bytes += item["Size"]
                if report.saved % 50 == 0:
                    _write_manifest(root, {**old, **manifest})  # progress survives an interruption
    for path in sorted(p for p in root.glob("*/**/*") if p.is_file()):
        if path.relative_to(root).as_posix() not in manifest:  # its object is gone, or a save was cut short
            path.unlink()
            report.removed += 1
    _write_manifest(root, manifest)
    report.seconds = time.monotonic() - began
    return report


def restore(root: Path, *, quiet: bool = False) -> int:
    """Upload every file under ``root/<bucket>/`` back, each with a progress bar on stderr unless
    ``quiet``; returns the number of objects restored.

    Files a save left unfinished (``*.part``) are skipped.
    """
    if not root.is_dir():
        return 0
    client = _client()
    count = 0
    for bucket_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        existing = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
        if bucket_dir.name not in existing:
            client.create_bucket(Bucket=bucket_dir.name)
        for path in sorted(p for p in bucket_dir.rglob("*") if p.is_file() and not p.name.endswith(PARTIAL)):
            key = path.relative_to(bucket_dir).as_posix()
            with tqdm(total=path.stat().st_size, unit="B", unit_scale=True, unit_divisor=1024,
                      desc=f"{bucket_dir.name}/{key}"[-40:], file=sys.stderr, disable=quiet, ascii=True,
                      mininterval=0.5, leave=False) as bar:
                client.upload_file(str(path), bucket_dir.name, key, Config=TRANSFER, Callback=bar.update)
            count += 1
    return count


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in {"save", "restore"}:
        sys.exit(__doc__)
    action, directory = sys.argv[1], Path(sys.argv[2])
    if action == "save":
        print(f"s3 snapshot: saving the S3 stand-in's objects to {directory} (only what changed)", file=sys.stderr)
        print(save(directory).line())
    else:
        began = time.monotonic()
        restored = restore(directory)
        print(f"s3 snapshot: restored {restored} objects ({directory}) in {time.monotonic() - began:.1f} s")
