"""Forms of the account pages."""

import uuid

from django import forms

from accounts.choices import Scope
from accounts.models import Team
from accounts.tokens import DEFAULT_EXPIRY_DAYS, NAME_MAX_LENGTH, default_scopes
from modelyard.forms import KeepEveryCharacter

MAX_EXPIRY_DAYS = 3650


class ApiTokenForm(KeepEveryCharacter, forms.Form):
    """Make an API token from the browser; ``accounts.tokens.issue_token`` checks and stores it.

    The scopes offered are those the user may hold (``admin`` for administrators only); the teams
    offered are the user's own (every team for an administrator).
    """

    # One id per form shown: a resubmitted form (a reload of the page showing the secret) makes no second token.
    form_id = forms.CharField(widget=forms.HiddenInput, max_length=64, initial=lambda: uuid.uuid4().hex)
    name = forms.CharField(max_length=NAME_MAX_LENGTH, help_text="what the token is for, e.g. ci-iris or laptop")
    scopes = forms.MultipleChoiceField(widget=forms.CheckboxSelectMultiple, initial=[Scope.READ],
                                       help_text="every scope includes read")
    team = forms.ModelChoiceField(queryset=Team.objects.none(), required=False, empty_label="no limit",
                                  help_text="limit the token to one team's models (for a CI job of that team)")
    expires_in_days = forms.IntegerField(min_value=1, max_value=MAX_EXPIRY_DAYS, required=False,
                                         initial=DEFAULT_EXPIRY_DAYS, label="Expires in (days)",
                                         help_text="leave empty for a token that never expires")

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["scopes"].choices = [(s, Scope(s).label) for s in default_scopes(user)]
        teams = Team.objects.all() if user.is_staff else Team.objects.filter(memberships__user=user)
        self.fields["team"].queryset = teams.order_by("name")
