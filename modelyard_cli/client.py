"""The REST client the ``modelyard`` commands share, and ``CLIError``, the failure each one reports.

``main`` builds one ``Client`` from ``MODELYARD_URL`` and ``MODELYARD_TOKEN`` and turns a ``CLIError``
into its message on stderr and exit status 1.
"""

import json

import requests


class CLIError(Exception):
    """A failure to report on stderr with exit status 1."""


class Client:
    """A thin REST client: base URL and token from the environment, JSON in and out.

    Raises ``CLIError`` with the server's ``detail`` (and, for ``invalid``, each field's messages) on any
    4xx/5xx (``error_message``).
    """

    def __init__(self, url: str, token: str, timeout: float = 60.0):
        if not token:
            raise CLIError("MODELYARD_TOKEN is not set: make an API token on the server's /account/tokens/ page "
                           "or with 'manage.py create_api_token <user>'")
        self.url = url.rstrip("/")
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"
        self.timeout = timeout
        # The last ETag and body of each GET, so a poll of an unchanged object is a 304 with no body.
        self._validators: dict[str, tuple[str, object]] = {}
        self.last_etag: str | None = None

    def request(self, method: str, path: str, *, if_match: str | None = None, **kwargs) -> dict | list | None:
        """Send one API request and return its JSON body (None when it has none).

        A GET sends ``If-None-Match`` with the ETag of the last answer to the same URL and, on a 304,
        returns that answer's body again. ``if_match`` is sent as ``If-Match`` (a change that is refused
        with 412 when the object changed since that ETag). ``last_etag`` is the answer's ``ETag``.

        Raises:
            CLIError: the server is unreachable or answered 4xx/5xx (``error_message``).
        """
        url = f"{self.url}/api/v1/{path.lstrip('/')}"
        headers = dict(kwargs.pop("headers", None) or {})
        cached = self._validators.get(url) if method == "GET" and not kwargs.get("params") else None
        if cached is not None:
            headers["If-None-Match"] = cached[0]
        if if_match is not None:
            headers["If-Match"] = if_match
        try:
            answer = self.session.request(method, url, timeout=self.timeout, headers=headers, **kwargs)
        except requests.RequestException as exc:
            raise CLIError(f"cannot reach {self.url}: {exc}") from exc
        if answer.status_code >= 400:
            raise CLIError(f"HTTP {answer.status_code}: {error_message(answer)}")
        self.last_etag = answer.headers.get("ETag")
        if answer.status_code == 304 and cached is not None:
            return cached[1]
        body = answer.json() if answer.content else None
        if method == "GET" and self.last_etag and not kwargs.get("params"):
            if len(self._validators) >= 64:
                self._validators.pop(next(iter(self._validators)))
            self._validators[url] = (self.last_etag, body)
        return body


def error_message(answer: requests.Response) -> str:
    """What to say of a refused request: the server's error envelope (``{"detail", "code", "fields"}``, the
    codes in README "Errors"), read by its stable code; a body without one (a proxy's page, a server older
    than the envelope) is shown as it came (its first 500 characters)."""
    try:
        body = answer.json()
    except ValueError:
        return answer.text[:500]
    if not (isinstance(body, dict) and isinstance(body.get("code"), str)):
        return body["detail"] if isinstance(body, dict) and "detail" in body else json.dumps(body)
    detail = str(body.get("detail", ""))
    match body["code"]:
        case "invalid":
            fields = body.get("fields") if isinstance(body.get("fields"), dict) else {}
            return "\n".join([detail, *(
                f"  {name}: {' '.join(map(str, texts if isinstance(texts, list) else [texts]))}"
                for name, texts in fields.items())])
        case "not_authenticated" | "authentication_failed":
            return f"{detail} (the token in MODELYARD_TOKEN)"
        case "precondition_failed":
            return f"{detail} (nothing changed)"
        case "throttled" if "Retry-After" in answer.headers:
            return f"{detail} (retry after {answer.headers['Retry-After']} s)"
        case _:  # not_found, conflict, permission_denied, ...: the server's sentence says it all
            return detail
