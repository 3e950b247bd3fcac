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


def declare(number: int, data: bytes) -> dict:
    """A part declaration as a client sends it: its number and the MD5 and SHA-256 of ``data``."""
    return {"part_number": number, "md5": hashlib.md5(data).hexdigest(), "sha256": hashlib.sha256(data).hexdigest()}


def put_parts(api_client, upload_id: str, path: Path, numbers: list[int], part_size: int = PART, *,
              digests: bool = True, sent_instead: dict[int, bytes] | None = None) -> None:
    """Ask for presigned URLs for ``numbers`` and PUT each part of ``path`` to S3 with requests.

    With ``digests`` (as the CLI and the upload page do) each part is declared with its MD5 and
    SHA-256 and sent with the headers the URL is signed for; without, only the numbers are sent,
    as older clients did. ``sent_instead`` maps part numbers to other bytes to send than the ones
    declared (what a transfer that changed the bytes looks like; moto checks no header).
    """
    if digests:
        body = {"parts": [declare(n, part_bytes(path, n, part_size)) for n in numbers]}
    else:
        body = {"part_numbers": numbers}
    answer = api_client.post(f"/api/v1/uploads/{upload_id}/parts/", body, format="json")
    assert answer.status_code == 200, answer.content
    for item in answer.json()["parts"]:
        number = item["part_number"]
        data = (sent_instead or {}).get(number, part_bytes(path, number, part_size))
        sent = requests.put(item["url"], data=data, headers=item["headers"], timeout=30)
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
