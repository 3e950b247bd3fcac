"""Forms of the deployments pages."""

from django import forms

from deployments.choices import Runtime
from modelyard.jsonobject import parse_json_object


class ServingHostForm(forms.Form):
    """Register a serving host from the browser; the service does the validation."""

    name = forms.CharField(max_length=63, help_text="lower-case letters, digits, '-' and '_'")
    runtime = forms.ChoiceField(choices=Runtime.choices, initial=Runtime.TRITON)
    inference_url = forms.CharField(max_length=200, help_text="e.g. http://gpu-0:8000")
    metrics_url = forms.CharField(max_length=200, required=False, help_text="e.g. http://gpu-0:8002/metrics")
    parameters = forms.CharField(
        label="Config overrides: parameters", required=False, widget=forms.Textarea(attrs={"rows": 3}),
        help_text='Per-host model parameters as JSON, e.g. {"EXECUTION_ENV_PATH": "/opt/envs/py311"}',
    )

    def clean_parameters(self) -> dict:
        raw = self.cleaned_data["parameters"].strip()
        if not raw:
            return {}
        try:
            return parse_json_object(raw)
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from exc
