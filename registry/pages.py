"""Helpers of the page views about model versions."""

from accounts.access import Principal
from modelyard.views import found_or_404
from registry.services import get_version


def version_or_404(request, name: str, version: int):
    """Version ``version`` of model ``name`` for a page, if the user may read the model.

    Raises:
        Http404: no such (live) version, or a model the user cannot read.
    """
    return found_or_404(lambda: get_version(name, version, visible_to=Principal.of(request)))
