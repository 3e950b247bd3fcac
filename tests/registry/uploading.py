"""Helpers for multipart upload tests: drive the API the way a client does, with real PUTs to S3."""

import hashlib
from pathlib import Path

import requests

from registry.storage import ArtifactStore

PART = 5 * 1024**2


def start(api_client, path: Path, model: str = "iris", **fields):
    """POST a new upload of ``path`` (5 MiB parts) and return the response."""
    body = {"filename": path.name, "size": path.stat().st_size, "part_size": PART, **fields}
    return api_client.post(f"/api/v1/models/{model}/uploads/", body, format="json")


def part_bytes(path: Path, number: int, part_size: int = PART) -> bytes:
    """The bytes of part ``number`` (1-based) of ``path``."""
    with path.open("rb") as fh:
        fh.seek((number - 1) * part_size)
        return fh.read(part_size)


def put_parts(api_client, upload_id: str, path: Path, numbers: list[int], part_size: int = PART) -> None:
    """Ask for presigned URLs for ``numbers`` and PUT each part of ``path`` to S3 with requests."""
    answer = api_client.post(f"/api/v1/uploads/{upload_id}/parts/", {"part_numbers": numbers}, format="json")
    assert answer.status_code == 200, answer.content
    for item in answer.json()["parts"]:
        sent = requests.put(item["url"], data=part_bytes(path, item["part_number"], part_size), timeout=30)
        assert sent.status_code == 200, sent.text


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def bucket_keys(prefix: str = "") -> set[str]:
    store = ArtifactStore()
    answer = store.client.list_objects_v2(Bucket=store.bucket, Prefix=prefix)
    return {item["Key"] for item in answer.get("Contents", [])}


def open_multipart_ids() -> set[str]:
    store = ArtifactStore()
    answer = store.client.list_multipart_uploads(Bucket=store.bucket)
    return {item["UploadId"] for item in answer.get("Uploads", [])}



def upload_object_left(upload_id) -> bool:
    """Whether the upload's object (``uploads/<id>``) is still in the bucket."""
    return f"uploads/{upload_id}" in bucket_keys(f"uploads/{upload_id}")
