"""Helpers shared by the apps' page views."""

from collections.abc import Callable
from typing import TypeVar

from django.http import Http404

from modelyard.errors import NotFound

T = TypeVar("T")


def found_or_404(lookup: Callable[..., T], *args) -> T:
    """Call a service lookup (``get_model``, ``get_version``, ``get_host``…) for a page.

    Returns:
        What the lookup returns.

    Raises:
        Http404: the lookup raised ``NotFound``; its message becomes the 404's.
    """
    try:
        return lookup(*args)
    except NotFound as exc:
        raise Http404(exc.message) from exc
