"""Middleware shared by every page."""

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent
from django.http import Http404
from django.shortcuts import render


class NulPathMiddleware:
    """Answer 404 to a path that holds a NUL character (``%00``), as to any path no page has: no name (of a
    model, host, team or user) can hold one, and PostgreSQL refuses it in a query (a ``DataError``, so a 500)
    wherever a view looks a name up. The API's answer is its error envelope (``modelyard.api_errors``)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if "\x00" in request.path:
            from modelyard.api_errors import handler404

            return handler404(request, Http404("no such path: it holds a NUL character, which no name can"))
        return self.get_response(request)


class FormBodyLimitMiddleware:
    """Answer a page form whose fields exceed Django's limits with a page that says so (HTTP 413).

    Django refuses a form body whose fields other than uploaded files exceed
    ``DATA_UPLOAD_MAX_MEMORY_SIZE`` bytes, or that has more than ``DATA_UPLOAD_MAX_NUMBER_FIELDS``
    fields, by raising while the CSRF check first reads ``request.POST``; left alone that becomes a
    bare HTML "Bad Request (400)". This middleware reads the form first (placed before
    ``CsrfViewMiddleware``) and answers such a request with ``form_too_large.html``: what the limit
    is, that nothing was saved, and a link back to the form. API paths (``/api/``) are left to DRF,
    whose exception handler answers JSON 413 (``modelyard.api_errors.exception_handler``).
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if request.method == "POST" and not request.path.startswith("/api/"):
            try:
                request.POST  # noqa: B018 - parsing is the check; Django caches the result
            except (RequestDataTooBig, TooManyFieldsSent) as exc:
                return render(request, "form_too_large.html", {
                    "reason": _reason(exc), "back": request.path,
                }, status=413)
        return self.get_response(request)


def _reason(exc: Exception) -> str:
    if isinstance(exc, TooManyFieldsSent):
        return f"The form has more than {settings.DATA_UPLOAD_MAX_NUMBER_FIELDS} fields."
    mib = settings.DATA_UPLOAD_MAX_MEMORY_SIZE / 1_048_576
    return (f"The form's fields are larger than {mib:g} MiB, the limit for everything but uploaded "
            "files.")
