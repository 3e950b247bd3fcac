"""Every API error is one envelope, ``{"detail": str, "code": str, "fields": {name: [str]}}``, with a stable code.

Each code is provoked through a real request where one can be made on demand; the rest (a throttle, which
no view sets, and the domain errors raised deep in services) go through the exception handler itself.
"""

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from rest_framework import exceptions
from rest_framework.test import APIClient

from accounts.tokens import TokenRejected
from deployments.models import ServingHost
from deployments.services import BreakingSignature
from modelyard.api_errors import ERROR_CODES, exception_handler, validation_body
from modelyard.errors import DomainError, InvalidInput
from modelyard.states import IllegalTransition
from registry.models import RegisteredModel
from tests.factories import api_client_for, team_member, token_for

pytestmark = pytest.mark.django_db


def envelope(answer, status: int, code: str) -> dict:
    """The answer's body, checked to be the envelope with ``status`` and ``code``."""
    assert answer.status_code == status, answer.content
    assert answer["Content-Type"].startswith("application/json"), answer["Content-Type"]
    body = answer.json()
    assert body["code"] == code and isinstance(body["detail"], str) and body["detail"], body
    assert set(body) <= {"detail", "code", "fields"}, body
    assert ("fields" in body) == (code == "invalid"), body
    return body


def test_a_refused_field_is_named_in_fields_with_its_messages(api_client):
    body = envelope(api_client.post("/api/v1/models/", {"name": "iris", "descripton": "typo"}, format="json"),
                    400, "invalid")
    assert list(body["fields"]) == ["descripton"] and "unknown field" in body["fields"]["descripton"][0]
    assert body["detail"] == "the request has invalid field: descripton"


def test_a_nested_field_is_named_by_its_path(api_client):
    body = envelope(api_client.post("/api/v1/models/", {"name": "iris", "tags": {"team": None}}, format="json"),
                    400, "invalid")
    assert body["fields"] == {"tags.team": ["This field may not be null."]}


def test_several_refused_fields_are_each_named(api_client):
    body = envelope(api_client.post("/api/v1/tokens/", {"scopes": "read", "expires_at": "soon"}, format="json"),
                    400, "invalid")
    assert {"name", "expires_at"} <= set(body["fields"]), body
    assert body["detail"].startswith("the request has invalid fields: ")


def test_an_invalid_filter_is_invalid_with_the_filter_named(api_client):
    body = envelope(api_client.get("/api/v1/audit/?since=yesterday"), 400, "invalid")
    assert list(body["fields"]) == ["since"] and body["fields"]["since"]


def test_an_invalid_page_size_is_invalid_with_the_parameter_named(api_client):
    body = envelope(api_client.get("/api/v1/models/?page_size=0"), 400, "invalid")
    assert "from 1 to 200" in body["fields"]["page_size"][0]


def test_a_service_refusing_the_input_is_invalid_with_no_field_named(api_client):
    RegisteredModel.objects.create(name="iris")
    body = envelope(api_client.put("/api/v1/models/iris/aliases/latest/", {"version": 1}, format="json"),
                    400, "invalid")
    assert "reserved" in body["detail"] and body["fields"] == {}


def test_errors_about_the_request_as_a_whole_become_the_detail():
    body = validation_body({"non_field_errors": ["give either parts or part_numbers"], "parts": {0: ["bad md5"]}})
    assert body == {"detail": "give either parts or part_numbers", "code": "invalid",
                    "fields": {"parts.0": ["bad md5"]}}
    assert validation_body(["tag must be 'key' or 'key=value'"]) == {
        "detail": "tag must be 'key' or 'key=value'", "code": "invalid", "fields": {}}
    assert validation_body({"__all__": ["since is after until"]})["detail"] == "since is after until"
    many = validation_body([{}, {"md5": ["not hex"]}])  # a list serializer: the second item refused
    assert many["fields"] == {"1.md5": ["not hex"]}


def test_malformed_json_is_a_parse_error(api_client):
    envelope(api_client.post("/api/v1/models/", '{"name": ', content_type="application/json"), 400, "parse_error")


def test_no_token_is_not_authenticated_with_the_challenge():
    answer = APIClient().get("/api/v1/models/")
    envelope(answer, 401, "not_authenticated")
    assert answer["WWW-Authenticate"].startswith("Bearer")


def test_an_unknown_token_is_authentication_failed_with_the_challenge():
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer my_0123456789ab_" + "x" * 43)
    answer = client.get("/api/v1/models/")
    assert envelope(answer, 401, "authentication_failed")["detail"] == "unknown API token"
    assert answer["WWW-Authenticate"].startswith("Bearer")


def test_a_token_without_the_scope_is_permission_denied(user):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token_for(user, ['read'], name='reader')}")
    body = envelope(client.post("/api/v1/models/", {"name": "iris"}, format="json"), 403, "permission_denied")
    assert "lacks the 'write' scope" in body["detail"]


def test_a_role_too_low_in_the_team_is_permission_denied():
    RegisteredModel.objects.create(name="iris")
    viewer = api_client_for(team_member(get_user_model().objects.create_user(username="viewer"), role="viewer"))
    body = envelope(viewer.patch("/api/v1/models/iris/", {"description": "x"}, format="json"), 403,
                    "permission_denied")
    assert "role" in body["detail"]


def test_an_unknown_object_endpoint_or_cursor_is_not_found(api_client):
    assert "'nothing'" in envelope(api_client.get("/api/v1/models/nothing/"), 404, "not_found")["detail"]
    assert envelope(api_client.get("/api/v1/deployments/999/"), 404, "not_found")["detail"] == "no deployment 999"
    envelope(api_client.get("/api/v1/models/?cursor=garbage"), 404, "not_found")
    assert "/api/v1/nothing/" in envelope(api_client.post("/api/v1/nothing/"), 404, "not_found")["detail"]


def test_a_path_under_api_outside_v1_is_not_found_in_the_envelope_too(api_client):
    body = envelope(api_client.get("/api/nothing/"), 404, "not_found")
    assert body["detail"] == "no API endpoint at /api/nothing/; see /api/schema/"


def test_a_path_under_api_outside_v1_is_the_envelope_with_debug_on_too(api_client, settings):
    settings.DEBUG = True  # the local default, under which Django's handler404 is not used
    body = envelope(api_client.get("/api/"), 404, "not_found")
    assert body["detail"] == "no API endpoint at /api/; see /api/schema/"


def test_a_page_that_does_not_exist_is_still_the_html_404_page(client):
    answer = client.get("/nothing/")
    assert answer.status_code == 404 and answer["Content-Type"].startswith("text/html")


def test_a_method_the_path_does_not_take_is_method_not_allowed(api_client):
    answer = api_client.put("/api/v1/models/", {"name": "iris"}, format="json")
    envelope(answer, 405, "method_not_allowed")
    assert "GET" in answer["Allow"]


def test_an_accept_header_no_renderer_meets_is_not_acceptable(api_client):
    envelope(api_client.get("/api/v1/models/", HTTP_ACCEPT="application/xml"), 406, "not_acceptable")


def test_a_name_taken_is_a_conflict(api_client):
    assert api_client.post("/api/v1/models/", {"name": "iris"}, format="json").status_code == 201
    body = envelope(api_client.post("/api/v1/models/", {"name": "iris"}, format="json"), 409, "conflict")
    assert "already exists" in body["detail"]


def test_a_body_over_the_limit_is_request_too_large(api_client, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1024
    envelope(api_client.post("/api/v1/models/", {"name": "b", "description": "a" * 4096}), 413, "request_too_large")


def test_a_body_of_a_media_type_not_taken_is_unsupported_media_type(api_client):
    envelope(api_client.post("/api/v1/models/", "name=iris", content_type="text/csv"), 415, "unsupported_media_type")


def test_prometheus_out_of_reach_is_service_unavailable(api_client, settings):
    from tests.fixtures.services import free_port

    settings.PROMETHEUS_URL, settings.PROMETHEUS_TIMEOUT = f"http://127.0.0.1:{free_port()}", 1
    RegisteredModel.objects.create(name="iris")
    envelope(api_client.get("/api/v1/models/iris/metrics/?range=15m"), 503, "service_unavailable")


def test_a_form_with_too_many_fields_is_a_bad_request_under_the_api(user, settings):
    settings.DATA_UPLOAD_MAX_NUMBER_FIELDS = 10
    client = Client(raise_request_exception=False, HTTP_AUTHORIZATION=f"Bearer {token_for(user)}")
    answer = client.post("/api/v1/models/", {f"field{n}": "x" for n in range(20)})
    envelope(answer, 400, "bad_request")


def test_an_unexpected_failure_is_a_server_error_that_says_nothing_of_it(api_client, user, monkeypatch):
    from registry.api import views

    def crash(*args, **kwargs):
        raise RuntimeError("secret connection string")

    monkeypatch.setattr(views, "create_model", crash)  # a fault no real request provokes on demand
    client = Client(raise_request_exception=False, HTTP_AUTHORIZATION=f"Bearer {token_for(user)}")
    answer = client.post("/api/v1/models/", {"name": "iris"}, content_type="application/json")
    body = envelope(answer, 500, "server_error")
    assert "secret" not in body["detail"]


def test_a_throttled_request_keeps_its_retry_after():
    answer = exception_handler(exceptions.Throttled(wait=7), {})
    assert answer.status_code == 429 and answer["Retry-After"] == "7"
    assert answer.data["code"] == "throttled" and "7 seconds" in answer.data["detail"]


@pytest.mark.parametrize(("error", "status", "code"), [
    (InvalidInput("bad archive"), 400, "invalid"),
    (TokenRejected("unknown API token"), 401, "authentication_failed"),
    (IllegalTransition("upload 3 is aborted; it cannot become verifying"), 409, "conflict"),
    (BreakingSignature("v2 breaks the signature of the version it replaces"), 409, "breaking_signature"),
])
def test_a_domain_error_answers_its_own_status_and_code(error, status, code):
    answer = exception_handler(error, {})
    assert answer.status_code == status
    assert answer.data == {"detail": error.message, "code": code, **({"fields": {}} if code == "invalid" else {})}


def _subclasses(cls) -> list[type]:
    return [cls, *(grand for sub in cls.__subclasses__() for grand in _subclasses(sub))]


def test_every_domain_error_names_a_listed_code_of_its_status():
    classes = _subclasses(DomainError)
    assert {cls.__name__ for cls in classes} >= {"InvalidInput", "Forbidden", "NotFound", "Conflict",
                                                 "ServiceUnavailable", "TokenRejected", "BreakingSignature"}
    for cls in classes:
        assert cls.code in ERROR_CODES, cls
        assert ERROR_CODES[cls.code][0] == cls.status_code, cls


def test_the_schema_documents_every_error_with_the_envelope_and_its_codes(api_client):
    schema = api_client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    error = schema["components"]["schemas"]["Error"]
    assert error["required"] == ["detail", "code"]
    assert error["properties"]["code"]["enum"] == list(ERROR_CODES)
    assert all(f"`{code}`" in error["description"] for code in ERROR_CODES)
    refs = {response["content"]["application/json"]["schema"]["$ref"]
            for item in schema["paths"].values() for operation in item.values() if isinstance(operation, dict)
            for status, response in operation.get("responses", {}).items() if status[0] in "45"}
    assert refs == {"#/components/schemas/Error"}


def test_the_readme_lists_every_code():
    from pathlib import Path

    readme = (Path(__file__).parent.parent / "README.md").read_text()
    for code, (status, _meaning) in ERROR_CODES.items():
        assert f"| `{code}` | {status} |" in readme, code


@pytest.mark.parametrize("path", [
    "/api/v1/hosts/%00/residency/", "/api/v1/hosts/a%00b/", "/api/v1/teams/%00/",
    "/api/v1/teams/%00/members/bob/", "/api/v1/models/%00/",
])
def test_a_name_holding_a_nul_is_no_such_object_in_the_envelope_not_a_server_error(api_client, path):
    ServingHost.objects.create(name="a", inference_url="http://a:8000")
    answer = api_client.get(path)
    assert answer.status_code == 404, answer.content
    assert answer.json()["code"] == "not_found", answer.json()


def test_a_page_whose_path_holds_a_nul_is_the_404_page(db):
    user = get_user_model().objects.create_user(username="nul-page", is_staff=True)
    client = Client()
    client.force_login(user)
    assert client.get("/hosts/%00/").status_code == 404


def test_a_number_in_digits_other_than_ascii_is_refused_by_the_pages_not_a_server_error(user):
    # '²'.isdigit() is True but int('²') raises: the pages checked isdigit() and then called int().
    model = RegisteredModel.objects.create(name="iris")
    from registry.models import ModelVersion

    for number in (1, 2):
        ModelVersion.objects.create(model=model, version=number, format="onnx", artifact_key=f"k{number}",
                                    artifact_sha256=f"{number}" * 64, artifact_size=1)
    client = Client()
    client.force_login(user)
    compare = client.get("/models/iris/compare/?a=1&b=%C2%B2")
    assert compare.status_code == 400 and "must be a version number" in compare.content.decode()
    assert client.get("/deployments/of/iris/?version=%C2%B2").status_code == 404
    assert client.get("/profiles/of/iris/1/?profile=%C2%B2").status_code == 200
