"""Helpers of every app's page views: the model or version a page is about, once the signed-in user
may see it, and the 403 of a refused action."""

from django.core.exceptions import PermissionDenied
from django.http import Http404

from accounts.access import Action, Principal, check
from modelyard.errors import Forbidden, NotFound
from modelyard.views import found_or_404
from registry.access import model_for
from registry.versions import get_version


def version_or_404(request, name: str, version: int):
    """Version ``version`` of model ``name`` for a page, if the user may read the model.

    Raises:
        Http404: no such (live) version, or a model the user cannot read.
    """
    return found_or_404(lambda: get_version(name, version, visible_to=Principal.of(request)))


def model_or_404(request, name: str, action=None, **context):
    """The model called ``name`` for a page, once the signed-in user may do ``action`` on it.

    Args:
        request: the page's request.
        name: the model's name.
        action: an ``accounts.access.Action`` (default ``VIEW``); ``context`` as for ``accounts.access.check``.

    Returns:
        The RegisteredModel.

    Raises:
        Http404: no such model, or one of a team the user cannot read (the same page).
        PermissionDenied: the user may read it but not do ``action`` (HTTP 403 with the reason).
    """
    try:
        return model_for(Principal.of(request), name, action or Action.VIEW, **context)
    except NotFound as exc:
        raise Http404(exc.message) from exc
    except Forbidden as exc:
        raise PermissionDenied(exc.message) from exc


def forbidden_unless(request, action, **context) -> None:
    """Raise ``PermissionDenied`` (HTTP 403 with the reason) unless the user may do ``action``
    (see ``accounts.access.check``)."""
    reason = check(Principal.of(request), action, **context)
    if reason is not None:
        raise PermissionDenied(reason)
