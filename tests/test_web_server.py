"""The web server's own refusals, on the gunicorn that docker-compose.yml starts: in the API's error envelope.

gunicorn refuses a request line past its limit (414) or a header past its limit (431) before Django sees
the request; its own answer was an HTML page. The web app is started as docker-compose.yml starts it
(its arguments, bound to a free port with one worker), so the test reads what the product ships.
"""

import json
import socket
import sys
from pathlib import Path

import pytest
import requests
import yaml

from modelyard.api_errors import ERROR_CODES
from tests.fixtures.services import _spawn, free_port, wait_for

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parent.parent
CONFIG_ARGUMENTS = ("-c", "python:modelyard.gunicorn_config")


def compose_web_command() -> list[str]:
    """docker-compose.yml's command of the ``web`` service."""
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]["web"]["command"]


@pytest.fixture(scope="module")
def web(tmp_path_factory) -> str:
    """gunicorn as docker-compose.yml runs it, on 127.0.0.1 with one worker; its base URL."""
    command = compose_web_command()
    port = free_port()
    command[command.index("--bind") + 1] = f"127.0.0.1:{port}"
    command[command.index("--workers") + 1] = "1"
    gunicorn = str(Path(sys.executable).parent / "gunicorn")
    service = _spawn("gunicorn", [gunicorn, *command[1:]], tmp_path_factory.mktemp("gunicorn"))

    def listening() -> bool:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return "Booting worker" in service.log_text()

    wait_for(listening, timeout=60, what="gunicorn to listen", describe=service.log_text)
    yield f"http://127.0.0.1:{port}"
    service.stop()


def envelope(answer: requests.Response) -> dict:
    """The answer's body, checked to be the API's error envelope with a known code for its status."""
    assert answer.headers["Content-Type"] == "application/json", answer.text[:300]
    body = json.loads(answer.content)
    assert set(body) == {"detail", "code"} and body["detail"], body
    assert ERROR_CODES[body["code"]][0] == answer.status_code, body
    return body


def test_every_start_of_the_web_app_names_the_config_that_writes_the_envelope():
    assert tuple(compose_web_command()[1:3]) == CONFIG_ARGUMENTS
    assert '"-c", "python:modelyard.gunicorn_config"' in (REPO / "Dockerfile").read_text()
    assert "gunicorn -c python:modelyard.gunicorn_config modelyard.wsgi" in (REPO / "scripts/stack.sh").read_text()


def test_a_request_line_past_the_limit_is_414_in_the_envelope(web):
    answer = requests.get(f"{web}/api/v1/teams/", params={"x": "a" * 10_000}, timeout=10)
    assert answer.status_code == 414
    body = envelope(answer)
    assert body["code"] == "request_line_too_long" and "4094" in body["detail"], body


def test_a_header_past_the_limit_is_431_in_the_envelope(web):
    answer = requests.get(f"{web}/api/v1/teams/", headers={"X-Long": "a" * 9_000}, timeout=10)
    assert answer.status_code == 431
    assert envelope(answer)["code"] == "headers_too_large"


def test_a_request_under_the_limits_reaches_the_app(web):
    answer = requests.get(f"{web}/api/v1/teams/", params={"x": "a" * 3_000}, timeout=10)
    assert envelope(answer)["code"] == "not_authenticated"  # Django's answer: no token
