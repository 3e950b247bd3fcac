"""gunicorn's settings for the web app: ``gunicorn -c python:modelyard.gunicorn_config modelyard.wsgi``.

gunicorn refuses some requests itself, before Django sees them: a request line longer than
``limit_request_line`` (414), a header longer than ``limit_request_field_size`` or more headers than
``limit_request_fields`` (431), a malformed request line or header (400). It answers those with an HTML
page of its own (``gunicorn.util.write_error``). Every worker answers them in the API's error envelope
instead (``modelyard.api_errors``), so a client, a CLI or a fuzzer reads one shape of error whoever refused.

The limits are gunicorn's defaults, named here so that they are documented (README, "Errors").
"""

import json

from gunicorn import util

limit_request_line = 4094  # bytes of "GET /path?query HTTP/1.1"
limit_request_fields = 100  # headers
limit_request_field_size = 8190  # bytes of one header


def write_error_envelope(sock, status_int: int, reason: str, mesg: str) -> None:
    """Write gunicorn's own refusal ``status_int`` (``reason``, ``mesg`` its message) on ``sock`` as the
    API's envelope, ``{"detail", "code"}``; stands in for ``gunicorn.util.write_error``. Closes the
    connection as gunicorn does."""
    from modelyard.api_errors import code_for_status, error_body

    detail = f"{reason}: {mesg}" if mesg else reason
    body = json.dumps(error_body(detail, code_for_status(status_int))).encode()
    head = (f"HTTP/1.1 {status_int} {reason}\r\nConnection: close\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n")
    util.write_nonblock(sock, head.encode("latin-1") + body)


def post_worker_init(worker) -> None:
    """gunicorn's hook, in each worker once it loaded the app: its refusals are written as the envelope."""
    util.write_error = write_error_envelope
