"""Forms of the promotions pages and admin."""

from django import forms

from modelyard.errors import InvalidInput
from modelyard.forms import FullLengthModelForm
from promotions.models import PromotionPolicy, Webhook
from promotions.webhooks import check_webhook_scope, check_webhook_url

POLICY_FORM_FIELDS = ["name", "candidate_alias", "target_alias", "schedule", "window_seconds", "min_requests",
                      "max_p95_ms", "max_error_rate", "max_regression", "max_profile_regression", "ramp_steps",
                      "ramp_on_failure", "requires_approval", "dry_run", "enabled"]


class PromotionPolicyForm(FullLengthModelForm):
    """Create or edit a policy from the browser; ``promotions.services`` checks and saves it."""

    class Meta:
        model = PromotionPolicy
        fields = POLICY_FORM_FIELDS
        labels = {"max_p95_ms": "Max p95 latency (ms)", "max_error_rate": "Max error rate (0..1)",
                  "max_regression": "Max regression vs target (0.1 = 10 %)",
                  "max_profile_regression": "Max throughput regression vs the target's performance card (0.1 = 10 %)",
                  "window_seconds": "Window (seconds)",
                  "ramp_steps": "Ramp steps (percents, e.g. [5, 25, 50, 100]; empty: no ramp)"}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["ramp_on_failure"].required = False  # the service's default: hold
        self.fields["ramp_steps"].required = False

    def validate_unique(self):
        """Uniqueness is the service's to answer (as a message), not the form's."""


class WebhookAdminForm(FullLengthModelForm):
    """The admin's webhook form: the URL is checked like the API's (no internal addresses)."""

    url = forms.URLField(max_length=500, assume_scheme="https")

    class Meta:
        model = Webhook
        fields = ["url", "secret", "events", "model", "team", "enabled"]

    def clean_url(self) -> str:
        try:
            return check_webhook_url(self.cleaned_data["url"])
        except InvalidInput as exc:
            raise forms.ValidationError(exc.message) from exc

    def clean(self) -> dict:
        data = super().clean()
        try:
            check_webhook_scope(data.get("model"), data.get("team"))
        except InvalidInput as exc:
            self.add_error("model", exc.message)
        return data
