"""REST API wiring shared by the apps: the error handler and upload helpers."""

import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import Http404, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from kombu.exceptions import OperationalError as KombuOperationalError
from rest_framework import pagination, serializers, status
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from modelyard.errors import DomainError

_DEFAULT_NOT_FOUND = re.compile(r"No .+ matches the given query\.")


class RefuseUnknownFields:
    """Mixin for input serializers: a field the serializer does not know is a 400 naming it.

    DRF drops unknown keys silently, so a typo (``canary_precent``) would do nothing and say nothing.
    Place it before the DRF base class: ``class XSerializer(RefuseUnknownFields, serializers.Serializer)``.

    Raises:
        ValidationError: ``{"<unknown field>": ["unknown field; ... takes a, b, c"]}``.
    """

    def to_internal_value(self, data):
        if isinstance(data, Mapping):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                known = ", ".join(sorted(name for name, field in self.fields.items() if not field.read_only))
                raise ValidationError({name: [f"unknown field; this request takes {known}"] for name in unknown})
        return super().to_internal_value(data)


class ErrorSerializer(serializers.Serializer):
    """An error answer: ``{"detail": "..."}``."""

    detail = serializers.CharField()


def error_responses(*statuses: int) -> dict:
    """OpenAPI responses for domain errors: ``{status: ErrorSerializer}`` for each HTTP status given.

    Document a status only where every answer with it is ``{"detail": ...}`` (a 400 may also carry
    per-field messages, so it is not documented this way).
    """
    return dict.fromkeys(statuses, ErrorSerializer)


@csrf_exempt  # it changes nothing; a POST to a wrong path must say 404, not fail the CSRF check
def api_not_found(request) -> JsonResponse:
    """A path under ``/api/v1/`` that names no endpoint: 404 ``{"detail": ...}``, like every other API error."""
    hint = "; API paths end with '/'" if not request.path.endswith("/") else ""
    return JsonResponse({"detail": f"no API endpoint at {request.path}{hint}; see /api/schema/"}, status=404)


def exception_handler(exc, context):
    """Turn a service's ``DomainError`` into ``{"detail": message}`` with its HTTP status, and a task queue lost
    after the check of ``modelyard.celery.require_broker`` into a 503 of the same shape.

    Everything else goes to DRF's own handler (validation errors keep their
    per-field shape).
    """
    if isinstance(exc, DomainError):
        return Response({"detail": exc.message}, status=exc.status_code)
    if isinstance(exc, Http404) and _DEFAULT_NOT_FOUND.fullmatch(str(exc)) and (view := context.get("view")):
        # get_object_or_404's "No Replay matches the given query.": name what was looked for instead.
        queryset, lookup = getattr(view, "queryset", None), getattr(view, "lookup_url_kwarg", None) or getattr(
            view, "lookup_field", "pk")
        key = getattr(view, "kwargs", {}).get(lookup)
        if queryset is not None and key is not None:
            return Response({"detail": f"no {queryset.model._meta.verbose_name} {key}"},
                            status=status.HTTP_404_NOT_FOUND)
    if isinstance(exc, KombuOperationalError):
        # The task queue stopped answering between a service's check (modelyard.celery.require_broker) and its
        # publish on commit: what the request wrote is recorded, its work not queued.
        return Response({"detail": f"the task queue (Redis) stopped answering ({exc}) after the change was "
                                   "recorded; its work was not queued: check the change and retry once the queue "
                                   "is back"}, status=status.HTTP_503_SERVICE_UNAVAILABLE)
    if isinstance(exc, RequestDataTooBig):  # Django's own limit on form fields, which it answers in HTML
        return Response({"detail": f"the request body is larger than {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} "
                                   "bytes, the limit for fields other than uploaded files"},
                        status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
    return drf_exception_handler(exc, context)





@contextmanager
def uploaded_file_path(uploaded) -> Iterator[Path]:
    """Yield a local path holding an uploaded file's bytes.

    Django spools large uploads to a temp file already; small ones live in
    memory and are copied to one here in 1 MiB chunks. The copy is removed on exit.
    """
    if hasattr(uploaded, "temporary_file_path"):
        yield Path(uploaded.temporary_file_path())
        return
    with tempfile.NamedTemporaryFile(prefix="modelyard-upload-", delete=True) as tmp:
        uploaded.seek(0)
        shutil.copyfileobj(uploaded, tmp, 1024 * 1024)
        tmp.flush()
        yield Path(tmp.name)


MAX_PAGE_SIZE = 200


class CursorPagination(pagination.CursorPagination):
    """Stable cursor pagination ordered by the view's ``ordering`` attribute.

    A cursor encodes a position, not an offset, so rows inserted while a client pages are neither
    skipped nor repeated; each view orders on a unique key that never changes (a model's name, a
    version's number within its model, an audit event's id). ``page_size`` (default 50) may be set
    per request from 1 to ``MAX_PAGE_SIZE``; a larger one is refused with 400, never cut silently.
    """

    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = MAX_PAGE_SIZE
    page_size_query_description = f"Results per page: 1 to {MAX_PAGE_SIZE} (default 50); more is refused with 400."

    def get_page_size(self, request) -> int:
        """The requested page size, or the default.

        Raises:
            ValidationError: ``page_size`` is not an integer from 1 to ``max_page_size`` (HTTP 400).
        """
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None or raw == "":
            return self.page_size
        try:
            size = int(raw)
        except ValueError:
            size = 0
        if not 1 <= size <= self.max_page_size:
            raise ValidationError({self.page_size_query_param: [f"must be an integer from 1 to {self.max_page_size}"]})
        return size

    def get_ordering(self, request, queryset, view):
        ordering = getattr(view, "ordering", None)
        if ordering:
            return (ordering,) if isinstance(ordering, str) else tuple(ordering)
        return super().get_ordering(request, queryset, view)


