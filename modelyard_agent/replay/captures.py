"""Reading the requests a Triton host's gateway captured for a model.

The gateway (nginx) appends captured requests to ``<gateway directory>/capture/<model>/*.ndjson``, one
JSON object a line::

    {"id": "<nginx $request_id, 32 hex>", "time": <epoch seconds>, "model": "<name>",
     "version": <the version that answered>, "content_type": "<Content-Type>" | null,
     "header_length": <Inference-Header-Content-Length> | null, "body": "<base64 of the request body>"}

A file may be being appended to while it is read, so its last line may be cut short: a reader skips
a last line that is not valid JSON (and counts any other line it cannot read, which should not happen).
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from pathlib import Path

from modelyard_agent.capture import capture_files


@dataclass(frozen=True)
class CapturedRequest:
    """One captured inference request.

    Attributes:
        id: the gateway's request id (nginx ``$request_id``, 32 hex characters).
        time: when it was captured, epoch seconds.
        model: the model it was sent to.
        version: the version that answered the client.
        content_type: the request's Content-Type header, or None.
        header_length: its ``Inference-Header-Content-Length`` (bytes of JSON before binary inputs), or None.
        body: the request body, as the client sent it.
    """

    id: str
    time: float
    model: str
    version: int | None
    content_type: str | None
    header_length: int | None
    body: bytes

    def headers(self) -> dict[str, str]:
        """The headers to send it again with: Content-Type and Inference-Header-Content-Length when captured."""
        headers = {"Content-Type": self.content_type or "application/json"}
        if self.header_length is not None:
            headers["Inference-Header-Content-Length"] = str(self.header_length)
        return headers

    def as_line(self) -> str:
        """The capture file line for this request (the contract's JSON, without a newline)."""
        return json.dumps({"id": self.id, "time": self.time, "model": self.model, "version": self.version,
                           "content_type": self.content_type, "header_length": self.header_length,
                           "body": base64.b64encode(self.body).decode()})


@dataclass(frozen=True)
class CaptureRead:
    """What ``read_captured`` found: the requests (newest first), the lines it could not read (other than a
    file's cut-short last line) and the files it read."""

    requests: list[CapturedRequest]
    unreadable: int
    files: int


def _parse(line: str) -> CapturedRequest:
    """One line as a request; raises ValueError (or KeyError/TypeError) when it is not the contract's JSON."""
    data = json.loads(line)
    header_length = data.get("header_length")
    version = data.get("version")
    return CapturedRequest(
        id=str(data["id"]), time=float(data["time"]), model=str(data["model"]),
        version=None if version is None else int(version), content_type=data.get("content_type"),
        header_length=None if header_length is None else int(header_length),
        body=base64.b64decode(data["body"], validate=True))


def read_captured(directory: Path, *, model: str, limit: int) -> CaptureRead:
    """The newest ``limit`` requests captured for ``model`` in ``directory``.

    Files are read newest first (by modification time) until ``limit`` requests are in hand; the
    requests are then ordered by capture time, newest first. Lines of other models are left out.

    Args:
        directory: the model's capture directory (``TritonGateway.capture_directory(model)``).
        model: the model's name.
        limit: the most requests to return, at least 1.

    Returns:
        A ``CaptureRead``; no requests when the directory does not exist.
    """
    if not directory.is_dir():
        return CaptureRead([], 0, 0)
    files = sorted((p for p in capture_files(directory) if p.is_file()), key=lambda p: p.stat().st_mtime,
                   reverse=True)
    found: list[CapturedRequest] = []
    unreadable = read_files = 0
    for path in files:
        if len(found) >= limit:
            break
        try:
            lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
        except FileNotFoundError:  # deleted by retention meanwhile
            continue
        read_files += 1
        last = len(lines) - 1
        while last >= 0 and not lines[last].strip():
            last -= 1
        for index, line in enumerate(lines[:last + 1]):
            if not line.strip():
                continue
            try:
                request = _parse(line)
            except (ValueError, KeyError, TypeError, binascii.Error):
                if index != last:
                    unreadable += 1
                continue
            if request.model == model:
                found.append(request)
    found.sort(key=lambda r: r.time, reverse=True)
    return CaptureRead(found[:limit], unreadable, read_files)
