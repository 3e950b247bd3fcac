"""Following a job the server runs in steps (a profile, a replay) until it ends."""

import sys
import time
from collections.abc import Callable

from modelyard_cli.client import Client, CLIError

ENDED = {"succeeded", "failed", "cancelled"}


def wait_for_job(client: Client, path: str, name: str, unit: str, show_result: Callable[[dict], None],
                 timeout: float, interval: float = 1.0) -> int:
    """Poll ``GET /api/v1/<path>`` until the job's status is one of ``ENDED``: 0 when it succeeded, else 1.

    Args:
        client: the REST client.
        path: the job's API path, such as ``profiles/6/``.
        name: the job as stderr names it, such as ``profile 6``.
        unit: what the job's ``progress`` counts, such as ``measured`` or ``requests``.
        show_result: called once with the final body (the job's own output).
        timeout: seconds to keep polling.
        interval: seconds between polls.

    Prints ``<name>: <status>, <done>/<total> <unit>`` (and the step) to stderr each time one of them
    changes, then calls ``show_result``. Reading a job changes nothing, so this may run any number of
    times.

    Raises:
        CLIError: the timeout passed first, or the server refused.
    """
    deadline = time.monotonic() + timeout
    last = None
    while True:
        body = client.request("GET", path)
        progress = body["progress"]
        shown = (body["status"], progress["done"], progress["step"])
        if shown != last:
            last = shown
            step = f" — {progress['step']}" if progress["step"] else ""
            print(f"{name}: {body['status']}, {progress['done']}/{progress['total']} {unit}{step}", file=sys.stderr)
        if body["status"] in ENDED:
            show_result(body)
            return 0 if body["status"] == "succeeded" else 1
        if time.monotonic() > deadline:
            raise CLIError(f"{name} still {body['status']} after {timeout:g} s")
        time.sleep(interval)
