"""Domain errors shared by every app's services.

Services raise these; the API exception handler (``modelyard.api_errors``) and the
views turn them into HTTP answers, so no view needs to know which service
failed how. Each class names the ``code`` its API answer carries; a subclass may name its own
(``BreakingSignature``: ``breaking_signature``), which ``modelyard.api_errors.ERROR_CODES`` must list.
"""


class DomainError(Exception):
    """Base of every error a service raises on purpose.

    Attributes:
        message: a sentence safe to show to the user.
        status_code: the HTTP status an API answer should carry.
        code: the stable, machine-readable ``code`` of that answer (``modelyard.api_errors.ERROR_CODES``).
    """

    status_code = 400
    code = "invalid"

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class InvalidInput(DomainError):
    """The request itself is wrong (bad archive, bad name, unknown host): HTTP 400."""

    status_code = 400
    code = "invalid"


class Forbidden(DomainError):
    """The user is signed in but may not do this (delete someone else's version): HTTP 403."""

    status_code = 403
    code = "permission_denied"


class NotFound(DomainError):
    """A named object does not exist: HTTP 404."""

    status_code = 404
    code = "not_found"


class Conflict(DomainError):
    """The request clashes with existing state (name taken): HTTP 409."""

    status_code = 409
    code = "conflict"


class PreconditionFailed(DomainError):
    """A conditional change (``If-Match``, or a caller's expected state) found the state changed since
    the caller read it; nothing changed: HTTP 412."""

    status_code = 412
    code = "precondition_failed"


class ServiceUnavailable(DomainError):
    """A backing service (S3, Prometheus) cannot be reached; retrying may help: HTTP 503."""

    status_code = 503
    code = "service_unavailable"
