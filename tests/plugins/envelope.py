"""Every API error the suite provokes must be the error envelope, not only the ones a test looks at.

A session fixture wraps Django's test client (``django.test.Client.request``, which DRF's ``APIClient``
calls too): an answer of 400 or more to a path under ``/api/`` or to ``/metrics`` whose body is not
``{"detail": str, "code": <a key of modelyard.api_errors.ERROR_CODES>, "fields": {...}}`` (``fields`` on
``invalid`` answers only) fails the test at that call, naming the request and the body.
"""

from __future__ import annotations

import json

import pytest

API_PATHS = ("/api/", "/metrics")


def envelope_problem(content: bytes) -> str | None:
    """What keeps ``content`` (an error answer's body) from being the error envelope, or None when it is."""
    from modelyard.api_errors import ERROR_CODES

    try:
        body = json.loads(content or b"null")
    except ValueError:
        return f"not JSON: {content[:300]!r}"
    if not isinstance(body, dict):
        return f"not an object: {content[:300]!r}"
    if not isinstance(body.get("detail"), str):
        return f"no detail sentence: {content[:300]!r}"
    if body.get("code") not in ERROR_CODES:
        return f"code {body.get('code')!r} is not one of modelyard.api_errors.ERROR_CODES"
    if ("fields" in body) != (body["code"] == "invalid"):
        return f"fields on a {body['code']!r} answer" if "fields" in body else "an invalid answer without fields"
    return None


@pytest.fixture(autouse=True, scope="session")
def _every_api_error_is_the_envelope():
    from django.test import Client

    original = Client.request

    def request(self, **environ):
        response = original(self, **environ)
        path = environ.get("PATH_INFO", "")
        if response.status_code >= 400 and path.startswith(API_PATHS) and not getattr(response, "streaming", False):
            if problem := envelope_problem(response.content):
                raise AssertionError(f"{environ.get('REQUEST_METHOD', 'GET')} {path} answered {response.status_code} "
                                     f"without the error envelope: {problem}")
        return response

    Client.request = request
    yield
    Client.request = original
