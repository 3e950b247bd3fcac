"""Direct-to-S3 multipart upload of a large artifact, for ``modelyard register``.

The file is read once, front to back: each part is hashed (sha256 of the whole file) and handed
to a small thread pool that ``PUT``s it to a presigned S3 URL, so at most ``parallel + 1`` parts
are in memory. Parts already in S3 (``--resume``) are read and hashed but not sent again. The
server then verifies size and sha256 and registers the version; this module polls until it has.
"""

import hashlib
import sys
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from pathlib import Path

import requests
from tqdm import tqdm

PRESIGN_BATCH = 100
PART_ATTEMPTS = 3
PART_TIMEOUT_S = 600
POLL_INTERVAL_S = 0.25


class UploadFailed(Exception):
    """The upload could not finish; ``message`` says why and how to resume."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


def progress_bar(total: int, quiet: bool) -> tqdm:
    """A byte-counting progress bar on stderr (percent, bytes, rate), silent when ``quiet``."""
    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc="uploading", file=sys.stderr,
                disable=quiet, ascii=True, mininterval=0.2)


class PartSender:
    """PUTs parts to presigned URLs, one HTTP session per thread, retrying each part a few times."""

    def __init__(self):
        self._local = threading.local()

    def _session(self) -> requests.Session:
        if not hasattr(self._local, "session"):
            self._local.session = requests.Session()
        return self._local.session

    def put(self, number: int, url: str, data: bytes) -> int:
        """Send one part; return its size in bytes.

        Raises:
            UploadFailed: S3 refused it or could not be reached ``PART_ATTEMPTS`` times.
        """
        problem = ""
        for attempt in range(PART_ATTEMPTS):
            if attempt:
                time.sleep(2**attempt)
            try:
                answer = self._session().put(url, data=data, timeout=PART_TIMEOUT_S)
            except requests.RequestException as exc:
                problem = str(exc)
                continue
            if answer.status_code == 200:
                return len(data)
            problem = f"S3 answered HTTP {answer.status_code}: {answer.text[:300]}"
        raise UploadFailed(f"part {number} could not be uploaded after {PART_ATTEMPTS} attempts ({problem})")


def upload_file(client, model: str, path: Path, *, fields: dict, part_size: int | None, parallel: int,
                resume: str | None, quiet: bool, timeout: float) -> dict:
    """Upload ``path`` as a new version of ``model`` through a multipart upload; return the upload.

    Args:
        client: the CLI's REST client (``request(method, path, json=...)``).
        model: the registered model's name.
        path: the file to upload.
        fields: the version's fields (``metadata`` …) sent when the upload starts.
        part_size: bytes per part, or None for the server's default.
        parallel: how many parts are sent at once.
        resume: the id of an open upload of this same file to continue, or None to start one.
        quiet: no progress bar.
        timeout: seconds to wait for the server's verification.

    Returns:
        The upload as the API shows it, status ``completed`` (with ``version``).

    Raises:
        UploadFailed: a part could not be sent, the server refused the file, or the wait timed out;
            the message says how to resume when resuming can help.
        CLIError: (from ``client``) the server refused a request.
    """
    size = path.stat().st_size
    if resume:
        upload = client.request("GET", f"uploads/{resume}/")
        if upload["status"] != "open":
            raise UploadFailed(f"upload {resume} is {upload['status']}; only an open upload can be resumed")
        if upload["size"] != size:
            raise UploadFailed(f"upload {resume} expects {upload['size']} bytes but {path} has {size}")
    else:
        body = {"filename": path.name, "size": size, **fields}
        if part_size:
            body["part_size"] = part_size
        upload = client.request("POST", f"models/{model}/uploads/", json=body)
    upload_id = upload["id"]
    print(f"upload {upload_id}: {upload['part_count']} parts of {upload['part_size']} bytes "
          f"(if interrupted, add --resume {upload_id})", file=sys.stderr)
    present = {p["part_number"]: p["size"] for p in upload["parts"]}
    try:
        digest = _send_parts(client, upload, path, present, parallel, quiet)
    except UploadFailed as exc:
        raise UploadFailed(f"{exc.message}; resume with --resume {upload_id}") from exc
    client.request("POST", f"uploads/{upload_id}/complete/", json={"sha256": digest})
    return _wait_for_verification(client, upload_id, timeout)


def _send_parts(client, upload: dict, path: Path, present: dict[int, int], parallel: int, quiet: bool) -> str:
    """Read ``path`` once, hashing it and sending every part S3 lacks; return the sha256 hex digest."""
    part_size, count, upload_id = upload["part_size"], upload["part_count"], upload["id"]
    digest = hashlib.sha256()
    sender = PartSender()
    urls: dict[int, str] = {}
    slots = threading.BoundedSemaphore(parallel)
    pending: set[Future] = set()
    with path.open("rb") as fh, ThreadPoolExecutor(parallel) as pool, progress_bar(upload["size"], quiet) as bar:

        def sent(future: Future) -> None:
            slots.release()
            if future.exception() is None:
                bar.update(future.result())

        for number in range(1, count + 1):
            data = fh.read(part_size)
            digest.update(data)
            if present.get(number) == len(data):
                bar.update(len(data))
                continue
            if number not in urls:
                wanted = [n for n in range(number, min(count, number + PRESIGN_BATCH - 1) + 1)
                          if n not in present]
                answer = client.request("POST", f"uploads/{upload_id}/parts/", json={"part_numbers": wanted})
                urls.update({p["part_number"]: p["url"] for p in answer["parts"]})
            slots.acquire()
            failed = [f for f in pending if f.done() and f.exception() is not None]
            if failed:
                slots.release()
                raise failed[0].exception()
            future = pool.submit(sender.put, number, urls.pop(number), data)
            future.add_done_callback(sent)
            pending = {f for f in pending if not f.done()} | {future}
        done, _ = wait(pending, return_when=FIRST_EXCEPTION)
        for future in done:
            if future.exception() is not None:
                raise future.exception()
    return digest.hexdigest()


def _wait_for_verification(client, upload_id: str, timeout: float) -> dict:
    """Poll the upload until the server has verified it (``completed``) or refused it."""
    deadline = time.monotonic() + timeout
    while True:
        upload = client.request("GET", f"uploads/{upload_id}/")
        if upload["status"] == "completed":
            return upload
        if upload["status"] in ("failed", "aborted"):
            raise UploadFailed(f"the server refused the upload: {upload['error'] or upload['status']}")
        if time.monotonic() > deadline:
            raise UploadFailed(f"upload {upload_id} still {upload['status']} after {timeout:g} s")
        time.sleep(POLL_INTERVAL_S)
