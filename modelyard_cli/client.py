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

    Raises ``CLIError`` with the server's ``detail`` (or per-field errors) on any 4xx/5xx.
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
            try:
                body = answer.json()
                message = body.get("detail") if isinstance(body, dict) and "detail" in body else json.dumps(body)
            except ValueError:
                message = answer.text[:500]
            raise CLIError(f"HTTP {answer.status_code}: {message}")
        return answer.json() if answer.content else None
