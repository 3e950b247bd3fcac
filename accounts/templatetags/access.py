"""``{% may "deploy" model as can_deploy %}``: whether the signed-in user may do an action, for hiding
buttons the server would refuse anyway (the views check again; hiding is only a courtesy)."""

from django import template

from accounts.access import Action, Principal, check

register = template.Library()


@register.simple_tag(takes_context=True)
def may(context, action: str, model=None, alias: str | None = None) -> bool:
    """True when the request's user may do ``action`` (an ``Action`` value name such as ``"deploy"``,
    ``"change"``, ``"manage_policy"``, ``"admin"``) on ``model`` (a RegisteredModel; not for ``admin``)."""
    request = context.get("request")
    if request is None:
        return False
    chosen = next((a for a in Action if a.value[0] == action), None)
    if chosen is None:
        raise template.TemplateSyntaxError(f"unknown action {action!r}")
    if chosen is not Action.ADMIN and model is None:
        return False
    return check(Principal.of(request), chosen, model=model, alias=alias) is None
