"""Keep the local S3 stand-in's objects across restarts.

The stand-in (moto's server) holds objects in memory only. ``save`` copies every
object of every bucket to a directory before it stops; ``restore`` puts them back
after it starts, so versions registered earlier stay deployable.

Usage: python scripts/s3_snapshot.py save|restore DIR   (endpoint from MODELYARD_S3_ENDPOINT_URL)
"""

import os
import shutil
import sys
from pathlib import Path

import boto3
from botocore.config import Config


def _client():
    return boto3.client(
        "s3",
        endpoint_url=os.environ["MODELYARD_S3_ENDPOINT_URL"],
        region_name=os.environ.get("MODELYARD_S3_REGION", "us-east-1"),
        aws_access_key_id=os.environ.get("MODELYARD_S3_ACCESS_KEY_ID", "modelyard"),
        aws_secret_access_key=os.environ.get("MODELYARD_S3_SECRET_ACCESS_KEY", "modelyard-secret"),
        config=Config(s3={"addressing_style": "path"}, connect_timeout=5, read_timeout=60),
    )


def save(root: Path) -> int:
    """Copy every object to ``root/<bucket>/<key>``; returns the number of objects saved."""
    client = _client()
    staging = root.with_name(root.name + ".new")
    shutil.rmtree(staging, ignore_errors=True)
    count = 0
    for bucket in client.list_buckets().get("Buckets", []):
        name = bucket["Name"]
        (staging / name).mkdir(parents=True, exist_ok=True)
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=name):
            for item in page.get("Contents", []):
                target = staging / name / item["Key"]
                target.parent.mkdir(parents=True, exist_ok=True)
                client.download_file(name, item["Key"], str(target))
                count += 1
    shutil.rmtree(root, ignore_errors=True)
    staging.rename(root)
    return count


def restore(root: Path) -> int:
    """Upload every file under ``root/<bucket>/`` back; returns the number of objects restored."""
    if not root.is_dir():
        return 0
    client = _client()
    count = 0
    for bucket_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        existing = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
        if bucket_dir.name not in existing:
            client.create_bucket(Bucket=bucket_dir.name)
        for path in sorted(p for p in bucket_dir.rglob("*") if p.is_file()):
            client.upload_file(str(path), bucket_dir.name, path.relative_to(bucket_dir).as_posix())
            count += 1
    return count


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in {"save", "restore"}:
        sys.exit(__doc__)
    action, directory = sys.argv[1], Path(sys.argv[2])
    done = (save if action == "save" else restore)(directory)
    print(f"s3 snapshot: {action}d {done} objects ({directory})")
