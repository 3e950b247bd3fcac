"""Forms of the promotions pages and admin."""

from django import forms

from modelyard.errors import InvalidInput
from modelyard.forms import FullLengthModelForm
from promotions.models import PromotionPolicy, Webhook
from promotions.webhooks import check_webhook_scope, check_webhook_url

POLICY_FORM_FIELDS = ["name", "candidate_alias", "target_alias", "schedule", "window_seconds", "min_requests",
                      "max_p95_ms", "max_error_rate", "max_regression", "max_profile_regression", "min_agreement",
                 "max_latency_regression", "replay_atol", "replay_rtol", "replay_argmax_outputs", "replay_max_requests",
                 "replay_pace", "ramp_steps",
                      "ramp_on_failure", "requires_approval", "dry_run", "enabled"]


class PromotionPolicyForm(FullLengthModelForm):
    """Create or edit a policy from the browser; ``promotions.policies`` checks and saves it."""

    class Meta:
        model = PromotionPolicy
        fields = POLICY_FORM_FIELDS
        labels = {"max_p95_ms": "Max p95 latency (ms)", "max_error_rate": "Max error rate (0..1)",
                  "max_regression": "Max regression vs target (0.1 = 10 %)",
                  "max_profile_regression": "Max throughput regression vs the target's performance card (0.1 = 10 %)",
                  "window_seconds": "Window (seconds)",
                  "min_agreement": "Min agreement on replayed requests (0..1)",
                  "max_latency_regression": "Max replayed p95 latency regression (0.2 = 20 %)",
                  "replay_atol": "Replay absolute tolerance", "replay_rtol": "Replay relative tolerance",
                  "replay_argmax_outputs": "Outputs compared by argmax (e.g. [\"probabilities\"])",
                  "replay_max_requests": "Captured requests per replay",
                  "replay_pace": "Replay pace (captured requests per second, 1..1000)",
                  "ramp_steps": "Ramp steps (percents, e.g. [5, 25, 50, 100]; empty: no ramp)"}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["ramp_on_failure"].required = False  # the service's default: hold
        self.fields["ramp_steps"].required = False
        self.fields["replay_argmax_outputs"].required = False
        for name in ("replay_atol", "replay_rtol", "replay_max_requests", "replay_pace"):
            self.fields[name].required = False  # left empty: the field's default

    def clean(self) -> dict:
        data = super().clean()
        for name in ("replay_atol", "replay_rtol", "replay_max_requests", "replay_pace"):
            if data.get(name) is None:
                data[name] = PromotionPolicy._meta.get_field(name).default
        if data.get("replay_argmax_outputs") is None:
            data["replay_argmax_outputs"] = []
        return data

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
