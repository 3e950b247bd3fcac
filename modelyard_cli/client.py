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

    def request(self, method: str, path: str, **kwargs) -> dict | list | None:
        try:
            answer = self.session.request(method, f"{self.url}/api/v1/{path.lstrip('/')}", timeout=self.timeout,
                                          **kwargs)
        except requests.RequestException as exc:
            raise CLIError(f"cannot reach {self.url}: {exc}") from exc
        if answer.status_code >= 400:
            raise CLIError(f"HTTP {answer.status_code}: {error_message(answer)}")
        return answer.json() if answer.content else None


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
        case "throttled" if "Retry-After" in answer.headers:
            return f"{detail} (retry after {answer.headers['Retry-After']} s)"
        case _:  # not_found, conflict, permission_denied, ...: the server's sentence says it all
            return detail
