"""Account pages: your API tokens (list, make one and see its secret once, revoke one) and your teams."""

from datetime import timedelta

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import Count
from django.http import Http404
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.cache import never_cache

from accounts.access import Principal
from accounts.forms import ApiTokenForm
from accounts.models import ApiToken, Team
from accounts.tokens import issue_token, revoke_token, token_state
from modelyard.errors import DomainError


def _own_token(request, token_id: int) -> ApiToken:
    token = ApiToken.objects.select_related("team").filter(pk=token_id, user=request.user).first()
    if token is None:
        raise Http404(f"no API token {token_id} of yours")
    return token


TOKEN_PAGE_SIZE = 25


@login_required
def token_list(request):
    """Your API tokens, newest first, revoked and expired ones included, ``TOKEN_PAGE_SIZE`` a page
    (``?page=``; a count and one page's rows, whatever the number of tokens)."""
    tokens = ApiToken.objects.filter(user=request.user).select_related("team").order_by("-created_at", "-id")
    page = Paginator(tokens, TOKEN_PAGE_SIZE).get_page(request.GET.get("page"))
    now = timezone.now()
    for token in page.object_list:
        token.state = token_state(token, now)
    return render(request, "accounts/token_list.html", {"tokens": page.object_list, "page": page})


SENT_TOKEN_FORMS = "sent_token_forms"  # session key: ids of the last 20 token forms that made a token


@login_required
@never_cache
def token_create(request):
    """Make a token: GET shows the form, a valid POST shows the token's secret this once."""
    form = ApiTokenForm(request.POST or None, user=request.user)
    if request.method == "POST" and form.is_valid():
        sent = request.session.get(SENT_TOKEN_FORMS, [])
        if form.cleaned_data["form_id"] in sent:
            messages.info(request, "That form was sent already: its token was made and its secret shown once. "
                                   "If you lost the secret, revoke the token and make a new one.")
            return redirect("accounts:token-list")
        request.session[SENT_TOKEN_FORMS] = [*sent[-19:], form.cleaned_data["form_id"]]
        days = form.cleaned_data["expires_in_days"]
        try:
            token, plaintext = issue_token(
                user=request.user, name=form.cleaned_data["name"], scopes=form.cleaned_data["scopes"],
                team=form.cleaned_data["team"], expires_at=timezone.now() + timedelta(days=days) if days else None,
                actor=request.user)
        except DomainError as exc:
            form.add_error(None, exc.message)
        else:
            return render(request, "accounts/token_created.html", {"token": token, "plaintext": plaintext})
    return render(request, "accounts/token_form.html", {"form": form})


@login_required
def token_revoke(request, token_id: int):
    """Revoke one of your tokens: GET asks for confirmation, POST revokes (the row stays for the audit)."""
    token = _own_token(request, token_id)
    if request.method == "POST":
        revoke_token(token, request.user)
        messages.success(request, f"Token {token.name} (my_{token.prefix}…) revoked; it is refused from now on.")
        return redirect("accounts:token-list")
    return render(request, "accounts/token_confirm_revoke.html", {"token": token})


@login_required
def team_list(request):
    """Your teams with your role and every member's (administrators: every team); three queries.

    Memberships are changed by administrators (admin site or ``/api/v1/teams/``).
    """
    principal = Principal.of(request)
    ids = principal.team_ids()
    teams = Team.objects.prefetch_related("memberships__user").annotate(model_count=Count("models"))
    teams = list((teams if ids is None else teams.filter(pk__in=ids)).order_by("name"))
    for team in teams:
        team.my_role = next((m.role for m in team.memberships.all() if m.user_id == request.user.pk), None)
    return render(request, "accounts/team_list.html", {"teams": teams, "is_admin": principal.is_admin})
