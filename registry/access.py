"""Which registered models a principal may see and act on: the access decisions of ``accounts.access``
applied to the registry's models."""

from django.db.models import QuerySet

from accounts.access import Action, Principal, require, scope_team_filter
from accounts.choices import Scope
from registry.aliases import alias_is_protected
from registry.models import RegisteredModel
from registry.registered_models import get_model


def visible_models(principal: Principal) -> QuerySet:
    """The registered models ``principal`` may read, as a queryset."""
    return scope_team_filter(principal, RegisteredModel.objects.all())


def visible_model_names(principal: Principal) -> frozenset[str] | None:
    """Names of the models ``principal`` may read, or None for every model (an administrator).

    For filtering what does not come from the registry's own tables (a host agent's report, Prometheus
    series) so other teams' model names do not show. Looked up once per principal (so once per request:
    a list of hosts filters every host's report with one query).
    """
    cache = principal.visible_names_cache
    if "names" not in cache:
        everything = principal.team_ids() is None and principal.allows_scope(Scope.READ)
        cache["names"] = None if everything else frozenset(visible_models(principal).values_list("name", flat=True))
    return cache["names"]


def model_for(principal: Principal, name: str, action: Action = Action.VIEW, **context):
    """The model called ``name`` once ``principal`` may do ``action`` on it.

    Args:
        principal: who acts.
        name: the model's name.
        action: what it wants to do; ``context`` as for :func:`check` (``alias``, ``hosts``, ``version``);
            for ``MOVE_ALIAS`` whether the alias is protected is looked up here.

    Returns:
        The RegisteredModel.

    Raises:
        NotFound: no such model, or one the principal may not read (the same answer, HTTP 404).
        Forbidden: the principal may read it but not do ``action`` (HTTP 403).
    """
    model = get_model(name, visible_to=principal)
    if action is Action.MOVE_ALIAS and "protected" not in context:
        context["protected"] = alias_is_protected(model, context.get("alias"))
    require(principal, action, model=model, **context)
    return model
