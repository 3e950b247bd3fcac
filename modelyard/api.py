"""REST API wiring shared by the apps: input checks, error documentation, upload helpers, pagination.

The error handler and the error envelope live in ``modelyard.api_errors``.
"""

import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import DataError
from django_filters.rest_framework import DjangoFilterBackend
from rest_framework import pagination, serializers
from rest_framework.exceptions import NotFound, ValidationError


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
    """An error answer, the envelope of ``modelyard.api_errors``: ``{"detail", "code", "fields"}``.

    Only its name reaches the schema: ``modelyard.schema`` replaces the ``Error`` component with
    the whole envelope (``code``'s enum of ``ERROR_CODES``, and ``fields``, a name DRF's
    ``Serializer.fields`` keeps from being declared here).
    """

    detail = serializers.CharField()
    code = serializers.CharField()


def error_responses(*statuses: int) -> dict:
    """OpenAPI responses for errors: ``{status: ErrorSerializer}`` for each HTTP status given."""
    return dict.fromkeys(statuses, ErrorSerializer)


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

    def paginate_queryset(self, queryset, request, view=None):
        """DRF's page, where a cursor whose position its ordering column cannot hold (a crafted ``p=abc`` on a
        list ordered by a number, or a number past the column's range) is the 404 of an invalid cursor, as an
        unreadable one is, not a server error.

        Raises:
            NotFound: the cursor cannot be read, or names a position the ordering column cannot hold (HTTP 404).
        """
        try:
            return super().paginate_queryset(queryset, request, view)
        except (ValueError, TypeError, DjangoValidationError, DataError) as exc:
            if request.query_params.get(self.cursor_query_param) is None:
                raise  # not the cursor's doing
            raise NotFound(self.invalid_cursor_message) from exc

    def get_ordering(self, request, queryset, view):
        ordering = getattr(view, "ordering", None)
        if ordering:
            return (ordering,) if isinstance(ordering, str) else tuple(ordering)
        return super().get_ordering(request, queryset, view)




class FilterBackend(DjangoFilterBackend):
    """django-filter's backend, which leaves a queryset as it is without building its FilterSet when the request
    names none of the FilterSet's filters: a FilterSet given no value filters nothing (each filter skips an
    empty value), but building one deep-copies its filters and its form's fields, a tenth of a page of models."""

    def filter_queryset(self, request, queryset, view):
        filterset_class = self.get_filterset_class(view, queryset)
        if filterset_class is not None and not any(name in request.query_params
                                                   for name in filterset_class.base_filters):
            return queryset
        return super().filter_queryset(request, queryset, view)
