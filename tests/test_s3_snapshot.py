"""``scripts/s3_snapshot.py`` (what ``make stop`` and ``make start`` run) against the real S3 stand-in."""

import os
import re
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
from botocore.config import Config

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "s3_snapshot.py"
BUCKET = "snapshot-test"


@pytest.fixture
def s3(s3_endpoint):
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1", aws_access_key_id="modelyard",
                          aws_secret_access_key="modelyard-secret", config=Config(s3={"addressing_style": "path"}))
    client.create_bucket(Bucket=BUCKET)
    yield client
    for item in client.list_objects_v2(Bucket=BUCKET).get("Contents", []):
        client.delete_object(Bucket=BUCKET, Key=item["Key"])
    client.delete_bucket(Bucket=BUCKET)


def snapshot(action: str, directory: Path, endpoint: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "MODELYARD_S3_ENDPOINT_URL": endpoint}
    done = subprocess.run([sys.executable, str(SCRIPT), action, str(directory)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done


def test_a_save_downloads_only_what_the_last_one_lacks_and_says_what_it_did(s3, s3_endpoint, tmp_path):
    s3.put_object(Bucket=BUCKET, Key="sha256/aa/one", Body=b"1" * 1000)
    s3.put_object(Bucket=BUCKET, Key="uploads/two", Body=b"2" * 3000)
    root = tmp_path / "s3-snapshot"

    first = snapshot("save", root, s3_endpoint)
    # Other tests' buckets may hold objects too: the first save takes them all.
    assert re.search(r"^s3 snapshot: saved \d+ objects \([0-9.]+ MiB\), kept 0 unchanged, removed 0, in [0-9.]+ s$",
                     first.stdout, re.M), first.stdout
    assert (root / BUCKET / "uploads" / "two").read_bytes() == b"2" * 3000

    s3.put_object(Bucket=BUCKET, Key="uploads/two", Body=b"changed")
    s3.delete_object(Bucket=BUCKET, Key="sha256/aa/one")
    s3.put_object(Bucket=BUCKET, Key="uploads/three", Body=b"3")
    second = snapshot("save", root, s3_endpoint)
    assert "saved 2 objects" in second.stdout and "removed 1," in second.stdout
    assert (root / BUCKET / "uploads" / "two").read_bytes() == b"changed"
    assert not (root / BUCKET / "sha256" / "aa" / "one").exists()

    third = snapshot("save", root, s3_endpoint)
    assert "saved 0 objects" in third.stdout and "removed 0," in third.stdout


def test_restore_puts_the_saved_objects_back_and_skips_unfinished_files(s3, s3_endpoint, tmp_path):
    s3.put_object(Bucket=BUCKET, Key="sha256/bb/kept", Body=b"k" * 100)
    root = tmp_path / "s3-snapshot"
    snapshot("save", root, s3_endpoint)
    (root / BUCKET / "sha256" / "bb" / "cut.part").write_bytes(b"half")  # a save interrupted mid-download
    s3.delete_object(Bucket=BUCKET, Key="sha256/bb/kept")

    restored = snapshot("restore", root, s3_endpoint)
    assert "restored" in restored.stdout
    keys = {item["Key"] for item in s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])}
    assert "sha256/bb/kept" in keys and not any(key.endswith(".part") for key in keys)
    assert s3.get_object(Bucket=BUCKET, Key="sha256/bb/kept")["Body"].read() == b"k" * 100
