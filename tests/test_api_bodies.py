"""No request body makes the API answer 500 or HTML: over-deep, over-large and malformed JSON get a JSON 4xx."""

import pytest

from modelyard.parsers import MAX_JSON_DEPTH

pytestmark = pytest.mark.django_db

DEEP = "[" * 1000 + "]" * 1000
ENDPOINTS = [("post", "/api/v1/models/"), ("post", "/api/v1/tokens/"),
             ("put", "/api/v1/models/iris/aliases/production/")]


@pytest.fixture
def iris(api_client):
    assert api_client.post("/api/v1/models/", {"name": "iris"}, format="json").status_code == 201


@pytest.mark.parametrize("method,path", ENDPOINTS)
@pytest.mark.parametrize("body,status,says", [
    (DEEP, 400, f"nested deeper than {MAX_JSON_DEPTH} levels"),
    ('{"name": "a", "x": ' + "{" * 100 + "}" * 100 + "}", 400, "nested deeper"),
    ('{"name": ', 400, "JSON parse error"),
])
def test_a_bad_json_body_answers_a_json_4xx(api_client, iris, method, path, body, status, says):
    answer = getattr(api_client, method)(path, body, content_type="application/json")
    assert answer.status_code == status, answer.content
    assert answer["Content-Type"].startswith("application/json")
    assert says in answer.json()["detail"]


@pytest.mark.parametrize("method,path", ENDPOINTS)
def test_a_body_over_the_limit_answers_413_in_json(api_client, iris, settings, method, path):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1024
    answer = getattr(api_client, method)(path, '{"name": "' + "a" * 2048 + '"}', content_type="application/json")
    assert answer.status_code == 413
    assert "larger than 1024 bytes" in answer.json()["detail"]


def test_a_form_body_over_the_limit_answers_413_in_json_too(api_client, iris, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1024
    answer = api_client.post("/api/v1/models/", {"name": "b", "description": "a" * 4096})
    assert answer.status_code == 413 and "larger than 1024 bytes" in answer.json()["detail"]


def test_brackets_inside_strings_do_not_count_towards_the_depth(api_client):
    answer = api_client.post("/api/v1/models/", '{"name": "deep", "description": "' + "[{" * 100 + '\\"]"}',
                             content_type="application/json")
    assert answer.status_code == 201, answer.content


@pytest.mark.parametrize("method,path,body,field", [
    ("post", "/api/v1/models/", {"name": "mnist", "descripton": "typo"}, "descripton"),
    ("post", "/api/v1/tokens/", {"name": "ci", "scope": ["read"]}, "scope"),
    ("put", "/api/v1/models/iris/aliases/production/", {"version": 1, "force": True}, "force"),
    ("post", "/api/v1/deployments/", {"model": "iris", "version": 1, "hosts": ["h"], "canary_precent": 5},
     "canary_precent"),
])
def test_an_unknown_field_is_refused_naming_it(api_client, iris, method, path, body, field):
    answer = getattr(api_client, method)(path, body, format="json")
    assert answer.status_code == 400, answer.content
    refused = answer.json()
    assert refused["code"] == "invalid" and "unknown field" in refused["fields"][field][0]


def test_a_browser_session_reads_the_api_but_writes_only_with_the_csrf_token(user):
    from django.test import Client

    browser = Client(enforce_csrf_checks=True)
    browser.force_login(user)
    assert browser.get("/api/v1/models/").status_code == 200
    refused = browser.post("/api/v1/models/", {"name": "mnist"}, content_type="application/json")
    assert refused.status_code == 403 and "CSRF" in refused.json()["detail"]
    token = browser.get("/models/").cookies["csrftoken"].value
    made = browser.post("/api/v1/models/", {"name": "mnist"}, content_type="application/json",
                        HTTP_X_CSRFTOKEN=token)
    assert made.status_code == 201, made.content


@pytest.mark.parametrize("fields", [{"description": "a" * 4096}, {f"f{n}": "x" for n in range(40)}])
def test_a_page_form_over_the_limits_answers_a_page_that_says_so_and_saves_nothing(
        client, user, api_client, iris, settings, fields):
    from registry.models import RegisteredModel

    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1024
    settings.DATA_UPLOAD_MAX_NUMBER_FIELDS = 20
    client.force_login(user)
    answer = client.post("/models/iris/edit/", fields)
    assert answer.status_code == 413 and answer["Content-Type"].startswith("text/html")
    page = answer.content.decode()
    assert "Nothing was saved" in page and 'href="/models/iris/edit/"' in page
    assert ("larger than 0.000976562 MiB" in page) if "description" in fields else ("more than 20 fields" in page)
    assert RegisteredModel.objects.get(name="iris").description == ""
