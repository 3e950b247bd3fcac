"""The ``modelyard`` command reads the server's error envelope by its ``code``, in process against a live server."""

import pytest
from django.contrib.auth import get_user_model

from modelyard_cli.main import main
from registry.models import RegisteredModel
from tests.factories import team_member, token_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def modelyard(live_server, monkeypatch, capsys):
    """Run ``modelyard <args>`` in this process as a team owner; returns ``(exit status, stderr)``."""
    user = team_member(get_user_model().objects.create_user(username="ci"))
    monkeypatch.setenv("MODELYARD_URL", live_server.url)
    monkeypatch.setenv("MODELYARD_TOKEN", token_for(user))

    def run(*args: str, token: str | None = None, url: str | None = None) -> tuple[int, str]:
        if token is not None:
            monkeypatch.setenv("MODELYARD_TOKEN", token)
        if url is not None:
            monkeypatch.setenv("MODELYARD_URL", url)
        capsys.readouterr()
        status = main(list(args))
        return status, capsys.readouterr().err

    return run


def test_not_found_exits_1_with_the_servers_sentence(modelyard):
    assert modelyard("alias", "get", "nothing", "production") == (
        1, "modelyard: HTTP 404: no model named 'nothing'\n")


def test_a_conflict_exits_1_with_the_servers_sentence(modelyard):
    RegisteredModel.objects.create(name="iris")
    status, stderr = modelyard("model", "create", "iris")
    assert status == 1 and stderr.startswith("modelyard: HTTP 409: ") and "already exists" in stderr


def test_invalid_prints_each_refused_field_on_a_line_of_its_own(modelyard):
    status, stderr = modelyard("model", "create", "iris", "--description", "x" * 20_000)
    assert status == 1
    assert stderr.splitlines()[0] == "modelyard: HTTP 400: the request has invalid field: description"
    assert stderr.splitlines()[1].startswith("  description: ")


def test_an_invalid_request_as_a_whole_prints_the_servers_sentence_alone(modelyard):
    RegisteredModel.objects.create(name="iris")
    status, stderr = modelyard("alias", "set", "iris", "latest", "1")
    assert status == 1 and stderr.startswith("modelyard: HTTP 400: ") and "reserved" in stderr
    assert len(stderr.splitlines()) == 1


def test_a_refused_token_says_which_token(modelyard):
    status, stderr = modelyard("alias", "get", "iris", "production", token="my_0123456789ab_" + "x" * 43)
    assert (status, stderr) == (1, "modelyard: HTTP 401: unknown API token (the token in MODELYARD_TOKEN)\n")


def test_an_answer_without_the_envelope_is_shown_as_it_came(modelyard, live_server):
    # /models/api/v1/... is a page path, not the API's: Django's HTML 404 page, as a proxy would answer.
    status, stderr = modelyard("alias", "get", "iris", "production", url=f"{live_server.url}/models")
    assert status == 1 and stderr.startswith("modelyard: HTTP 404: ") and "<" in stderr
