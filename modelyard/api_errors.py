"""The one error envelope of the API: ``{"detail": str, "code": str, "fields": {name: [str]}}``.

Every error an API path answers has this shape, whoever raised it: DRF (validation, authentication,
permissions, parsing, throttling), django-filter (a bad filter is a DRF ``ValidationError``), a
service's ``DomainError`` (``modelyard.errors``), Django's own 400/404/500 under ``/api/`` and the
``/metrics`` exporter (its refusals, and Django's 500 there). ``detail`` is a sentence for people;
``code`` one of ``ERROR_CODES``, stable, for programs to switch on; ``fields`` is present on
``invalid`` answers only, and on each of them: it maps each refused field (``name``, a nested
``config.max_batch_size``, a list item ``hosts.0``) to its messages, empty when the request as a
whole is refused.
"""

import re
from collections.abc import Iterator

from django.conf import settings
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig
from django.http import Http404, HttpRequest, JsonResponse
from django.urls import reverse
from django.views import defaults
from django.views.decorators.csrf import csrf_exempt
from kombu.exceptions import OperationalError as KombuOperationalError
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import exception_handler as drf_exception_handler

from modelyard.errors import DomainError

# The stable codes and what each means; README ("Errors") and the OpenAPI ``Error`` schema list them.
# A code is never renamed or reused for another meaning; a new kind of error gets a new one.
ERROR_CODES: dict[str, tuple[int, str]] = {
    "invalid": (400, "a value in the request is refused; `fields` names each field and why"),
    "parse_error": (400, "the body cannot be read: malformed JSON, JSON nested too deep, a broken multipart body"),
    "bad_request": (400, "the request was refused before any view read it (e.g. a form with too many fields)"),
    "not_authenticated": (401, "no API token (nor a browser session)"),
    "authentication_failed": (401, "the token is malformed, unknown, revoked or expired, or its user inactive"),
    "permission_denied": (403, "the token's scopes or the user's role in the team do not allow this"),
    "not_found": (404, "no such object (or one of a team the caller cannot read), endpoint or cursor"),
    "method_not_allowed": (405, "the path does not take this HTTP method; `Allow` lists those it takes"),
    "not_acceptable": (406, "no answer matches the `Accept` header"),
    "conflict": (409, "the change clashes with the current state: a name taken, a version an alias names, "
                      "a state that does not allow it (resuming a finished rollout)"),
    "breaking_signature": (409, "the version breaks the signature the replaced version's clients use; "
                                "send `confirm_breaking: true` to go on"),
    "precondition_failed": (412, "`If-Match` names a state that is no longer current (another client changed "
                                 "it since); nothing changed: read it again and decide"),
    "request_too_large": (413, "the body is over the size limit"),
    "request_line_too_long": (414, "the request line (method, path and query string) is over the server's "
                                   "limit, 4,094 bytes: send fewer or shorter query parameters"),
    "unsupported_media_type": (415, "the body's `Content-Type` is not one the operation takes"),
    "throttled": (429, "too many requests (no operation is throttled yet); `Retry-After` says in how many "
                       "seconds to retry"),
    "headers_too_large": (431, "a header is over the server's limit of 8,190 bytes, or there are more than 100"),
    "server_error": (500, "an unexpected failure on the server; it is logged"),
    "service_unavailable": (503, "S3, Prometheus, the task queue or a serving host does not answer; "
                                 "retrying later may help"),
}
# The code of an answer whose exception names none this table knows, by its HTTP status.
_CODE_FOR_STATUS = {400: "bad_request", 401: "not_authenticated", 403: "permission_denied", 404: "not_found",
                    405: "method_not_allowed", 406: "not_acceptable", 409: "conflict", 412: "precondition_failed",
                    413: "request_too_large", 414: "request_line_too_long", 415: "unsupported_media_type",
                    429: "throttled", 431: "headers_too_large",
                    503: "service_unavailable"}
_DEFAULT_NOT_FOUND = re.compile(r"No .+ matches the given query\.")
_NON_FIELD_KEYS = {api_settings.NON_FIELD_ERRORS_KEY, "__all__"}  # DRF's and Django forms' (django-filter)


def error_body(detail: str, code: str, fields: dict[str, list[str]] | None = None) -> dict:
    """The envelope: ``{"detail": detail, "code": code}``, with ``"fields"`` when ``fields`` is not None."""
    body = {"detail": detail, "code": code}
    if fields is not None:
        body["fields"] = fields
    return body


def error_json(detail: str, code: str, status_code: int, headers: dict[str, str] | None = None) -> JsonResponse:
    """The envelope as a plain Django answer, for views outside DRF (the exporter, Django's handlers)."""
    return JsonResponse(error_body(detail, code), status=status_code, headers=headers)


def code_for_status(status_code: int) -> str:
    """The ``ERROR_CODES`` entry for an error that names no code of its own: by status, else
    ``bad_request`` (4xx) or ``server_error`` (5xx)."""
    return _CODE_FOR_STATUS.get(status_code, "bad_request" if status_code < 500 else "server_error")


def _messages(detail, name: str = "") -> Iterator[tuple[str, str]]:
    """``(field name, message)`` for each message in a DRF error detail; name ``""`` is the request as a whole.

    Nested serializers give dotted names (``config.max_batch_size``), lists the item's index
    (``hosts.0``); a nested object's own ``non_field_errors`` belong to the object's name.
    """
    if isinstance(detail, dict):
        for key, value in detail.items():
            child = name if str(key) in _NON_FIELD_KEYS else f"{name}.{key}" if name else str(key)
            yield from _messages(value, child)
    elif isinstance(detail, list):
        for index, item in enumerate(detail):
            if isinstance(item, dict | list):
                yield from _messages(item, f"{name}.{index}" if name else str(index))
            else:
                yield name, str(item)
    else:
        yield name, str(detail)


def validation_body(detail) -> dict:
    """The envelope of a DRF ``ValidationError``'s ``detail`` (a message, a list or a per-field map).

    Returns:
        ``{"detail", "code": "invalid", "fields"}``: ``detail`` is the messages about the request as a
        whole, or else names the refused fields; ``fields`` maps each refused field to its messages
        (empty when none is about one field).
    """
    whole: list[str] = []
    fields: dict[str, list[str]] = {}
    for name, message in _messages(detail):
        if name:
            fields.setdefault(name, []).append(message)
        else:
            whole.append(message)
    if whole:
        summary = " ".join(whole)
    elif fields:
        summary = f"the request has invalid field{'s' if len(fields) > 1 else ''}: {', '.join(fields)}"
    else:
        summary = "the request is invalid"
    return error_body(summary, "invalid", fields)


def _text(detail) -> str:
    """An ``APIException``'s detail as one sentence (it may be a list or a map)."""
    if isinstance(detail, dict | list):
        return " ".join(f"{name}: {message}" if name else message for name, message in _messages(detail))
    return str(detail)


def api_exception_body(exc: exceptions.APIException, status_code: int) -> dict:
    """The envelope of a DRF exception answered with ``status_code``: its class's code (DRF's
    ``default_code``, e.g. ``not_authenticated``, ``throttled``) when ``ERROR_CODES`` has it."""
    if isinstance(exc, exceptions.ValidationError):
        return validation_body(exc.detail)
    code = getattr(type(exc), "default_code", "")
    return error_body(_text(exc.detail), code if code in ERROR_CODES else code_for_status(status_code))


def _named_not_found(exc: Http404, context) -> str | None:
    """For ``get_object_or_404``'s "No Replay matches the given query.": what was looked for instead."""
    if not _DEFAULT_NOT_FOUND.fullmatch(str(exc)):
        return None
    view = context.get("view")
    queryset = getattr(view, "queryset", None)
    lookup = getattr(view, "lookup_url_kwarg", None) or getattr(view, "lookup_field", "pk")
    key = getattr(view, "kwargs", {}).get(lookup)
    if queryset is None or key is None:
        return None
    return f"no {queryset.model._meta.verbose_name} {key}"


def exception_handler(exc, context):
    """DRF's ``EXCEPTION_HANDLER``: every error a view raises, as the envelope with its HTTP status.

    A service's ``DomainError`` answers its ``status_code`` and ``code``; a task queue lost after the
    check of ``modelyard.celery.require_broker`` a 503 ``service_unavailable``; Django's limit on
    form fields a 413 ``request_too_large``; everything DRF knows (``ValidationError``, ``NotFound``,
    ``Throttled``…, Django's ``Http404`` and ``PermissionDenied``) its own status and headers
    (``WWW-Authenticate``, ``Retry-After``) with the envelope as the body. Anything else is left to
    Django (None), whose ``handler500`` answers ``server_error``.
    """
    if isinstance(exc, DomainError):
        return Response(error_body(exc.message, exc.code, {} if exc.code == "invalid" else None),
                        status=exc.status_code)
    if isinstance(exc, KombuOperationalError):
        # The task queue stopped answering between a service's check (modelyard.celery.require_broker) and its
        # publish on commit: what the request wrote is recorded, its work not queued.
        return Response(error_body(f"the task queue (Redis) stopped answering ({exc}) after the change was "
                                   "recorded; its work was not queued: check the change and retry once the queue "
                                   "is back", "service_unavailable"), status=status.HTTP_503_SERVICE_UNAVAILABLE)
    if isinstance(exc, RequestDataTooBig):  # Django's own limit on form fields, which it answers in HTML
        return Response(error_body(f"the request body is larger than {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} "
                                   "bytes, the limit for fields other than uploaded files", "request_too_large"),
                        status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound(_named_not_found(exc, context) or str(exc) or None)
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied(str(exc) or None)
    response = drf_exception_handler(exc, context)
    if response is not None:
        response.data = api_exception_body(exc, response.status_code)
    return response


def _is_api(request: HttpRequest) -> bool:
    """True for the paths whose errors are the envelope: the API's and the exporter's (``/metrics``)."""
    return request.path.startswith("/api/") or request.path == reverse("metrics")


def _no_endpoint(request: HttpRequest) -> JsonResponse:
    hint = "; API paths end with '/'" if not request.path.endswith("/") else ""
    return error_json(f"no API endpoint at {request.path}{hint}; see /api/schema/", "not_found", 404)


@csrf_exempt  # it changes nothing; a POST to a wrong path must say 404, not fail the CSRF check
def api_not_found(request: HttpRequest) -> JsonResponse:
    """A path under ``/api/v1/`` that names no endpoint: 404 ``not_found``, like every other API error."""
    return _no_endpoint(request)


def handler400(request: HttpRequest, exception=None):
    """Django's 400 (a request refused before any view, e.g. too many form fields): the envelope under
    ``/api/`` and on ``/metrics``, Django's page elsewhere."""
    if _is_api(request):
        return error_json("the request was refused as malformed before the API read it", "bad_request", 400)
    return defaults.bad_request(request, exception)


def handler404(request: HttpRequest, exception=None):
    """Django's 404 (a path no URL pattern matches): the envelope under ``/api/``, the 404 page elsewhere."""
    if _is_api(request):
        return _no_endpoint(request)
    return defaults.page_not_found(request, exception)


def handler500(request: HttpRequest):
    """Django's 500 (an exception no handler answered, logged by Django): the envelope under ``/api/``
    and on ``/metrics``, the 500 page elsewhere. It says nothing of the exception: its message may hold secrets."""
    if _is_api(request):
        return error_json("the server failed to answer this request; the failure is logged", "server_error", 500)
    return defaults.server_error(request)
