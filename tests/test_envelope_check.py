"""The suite-wide check of API errors (tests/plugins/envelope.py) refuses what is not the envelope."""

import pytest
from django.http import HttpResponse, JsonResponse
from django.urls import path

from tests.plugins.envelope import envelope_problem

urlpatterns = [
    path("api/plain/", lambda request: HttpResponse("nope", status=400)),
    path("api/enveloped/", lambda request: JsonResponse({"detail": "no such thing", "code": "not_found"}, status=404)),
    path("pages/plain/", lambda request: HttpResponse("a page", status=404)),
]


@pytest.mark.urls("tests.test_envelope_check")
def test_a_test_client_call_that_gets_a_non_envelope_api_error_fails(client):
    with pytest.raises(AssertionError, match=r"GET /api/plain/ answered 400 without the error envelope: not JSON"):
        client.get("/api/plain/")
    assert client.get("/api/enveloped/").status_code == 404
    assert client.get("/pages/plain/").status_code == 404  # pages outside the API keep their HTML


@pytest.mark.parametrize(("body", "problem"), [
    (b"[]", "not an object"),
    (b'{"code": "not_found"}', "no detail sentence"),
    (b'{"detail": "x", "code": "oops"}', "is not one of"),
    (b'{"detail": "x", "code": "not_found", "fields": {}}', "fields on a 'not_found' answer"),
    (b'{"detail": "x", "code": "invalid"}', "an invalid answer without fields"),
])
def test_each_way_a_body_misses_the_envelope_is_named(body, problem):
    assert problem in envelope_problem(body)


def test_the_envelope_passes():
    assert envelope_problem(b'{"detail": "x", "code": "invalid", "fields": {"name": ["required"]}}') is None
