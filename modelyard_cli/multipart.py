"""Direct-to-S3 multipart upload of a large artifact, for ``modelyard register``.

The file is read once, front to back, on one thread that hashes the whole file (SHA-256, the
version's content address) and hands each part to a small thread pool. A pool thread computes the
part's MD5 and SHA-256, declares them to the server, which answers with a presigned URL signed for
them, and ``PUT``s the part with the ``Content-MD5`` and ``x-amz-checksum-sha256`` headers the URL
requires, so the store refuses a part that arrives other than it was read (AWS S3, MinIO) and the
server can check each part by the ETag the store computed. At most ``parallel + 1`` parts are in
memory. A part S3 already holds (``--resume``) is declared and skipped when its ETag is the MD5 of
the local part, and sent again otherwise. The server then verifies and registers the version;
this module polls until it has.
"""

import hashlib
import sys
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from pathlib import Path

import requests
from tqdm import tqdm

PART_ATTEMPTS = 3
PART_TIMEOUT_S = 600
POLL_INTERVAL_S = 0.1


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
    """Declares parts and PUTs them to presigned URLs, one HTTP session per thread, retrying each
    part a few times.

    Args:
        client: the CLI's REST client; its requests are serialised (one session, many threads).
        upload_id: the upload the parts belong to.
    """

    def __init__(self, client=None, upload_id: str = ""):
        self._local = threading.local()
        self._client, self._upload_id = client, upload_id
        self._client_lock = threading.Lock()

    def declare(self, number: int, data: bytes) -> tuple[str, str, dict[str, str]]:
        """Hash part ``number`` (MD5 and SHA-256 of ``data``) and declare it to the server.

        Returns:
            ``(md5 hex, presigned URL, headers the PUT must carry)``.

        Raises:
            CLIError: (from the client) the server refused the declaration.
        """
        md5 = hashlib.md5(data, usedforsecurity=False).hexdigest()
        declared = {"part_number": number, "md5": md5, "sha256": hashlib.sha256(data).hexdigest()}
        with self._client_lock:
            answer = self._client.request("POST", f"uploads/{self._upload_id}/parts/", json={"parts": [declared]})
        (part,) = answer["parts"]
        return md5, part["url"], part.get("headers", {})

    def send(self, number: int, data: bytes, held_etag: str | None = None) -> int:
        """Declare part ``number`` and PUT it, unless S3 already holds it (its ETag ``held_etag`` is the
        part's MD5); return its size in bytes.

        Raises:
            UploadFailed: S3 refused it or could not be reached ``PART_ATTEMPTS`` times.
            CLIError: the server refused the declaration.
        """
        md5, url, headers = self.declare(number, data)
        if held_etag == md5:
            return len(data)
        return self.put(number, url, data, headers)

    def _session(self) -> requests.Session:
        if not hasattr(self._local, "session"):
            self._local.session = requests.Session()
        return self._local.session

    def put(self, number: int, url: str, data: bytes, headers: dict[str, str] | None = None) -> int:
        """Send one part with ``headers`` (those its URL is signed for); return its size in bytes.

        Raises:
            UploadFailed: S3 refused it or could not be reached ``PART_ATTEMPTS`` times.
        """
        problem = ""
        for attempt in range(PART_ATTEMPTS):
            if attempt:
                time.sleep(2**attempt)
            try:
                answer = self._session().put(url, data=data, headers=headers, timeout=PART_TIMEOUT_S)
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
    present = {p["part_number"]: (p["size"], p.get("etag")) for p in upload["parts"]}
    try:
        digest = _send_parts(client, upload, path, present, parallel, quiet)
    except UploadFailed as exc:
        raise UploadFailed(f"{exc.message}; resume with --resume {upload_id}") from exc
    client.request("POST", f"uploads/{upload_id}/complete/", json={"sha256": digest})
    return _wait_for_verification(client, upload_id, timeout)


def _send_parts(client, upload: dict, path: Path, present: dict[int, tuple[int, str]], parallel: int,
                quiet: bool) -> str:
    """Read ``path`` once, hashing it and sending (with their digests) every part S3 lacks or holds
    other bytes of; return the file's sha256 hex digest."""
    part_size, count, upload_id = upload["part_size"], upload["part_count"], upload["id"]
    digest = hashlib.sha256()
    sender = PartSender(client, upload_id)
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
            size, etag = present.get(number, (None, None))
            slots.acquire()
            failed = [f for f in pending if f.done() and f.exception() is not None]
            if failed:
                slots.release()
                raise failed[0].exception()
            future = pool.submit(sender.send, number, data, etag if size == len(data) else None)
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
