"""Forms of the registry pages."""

from django import forms

from modelyard.forms import KeepEveryCharacter


class AliasForm(KeepEveryCharacter, forms.Form):
    """Set or move an alias of a model to one of its versions."""

    alias = forms.CharField(max_length=63, help_text="e.g. production, staging")
    version = forms.TypedChoiceField(coerce=int, choices=())
    reason = forms.CharField(required=False, max_length=1000, help_text="why it moves; needed for a protected alias")

    def __init__(self, *args, versions=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["version"].choices = [(v, f"v{v}") for v in versions]


class VersionUploadForm(KeepEveryCharacter, forms.Form):
    """The upload page's fields: the file (sent straight to S3 by static/registry/upload.js, in
    parts, once its name says a kind the registry takes) and the version's metadata, sample input,
    tags and lineage (sent as JSON to the uploads API, which checks them)."""

    artifact = forms.FileField(help_text="A Triton model directory as .tar.gz, .tar or .zip (an ensemble too), "
                                         "a single .onnx, .pt or .plan file, or a BentoML .bento or .bentomodel export")
    metadata = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3}),
                               help_text='A JSON object, e.g. {"dataset": "2024-06"}')
    sample_input = forms.CharField(
        label="Sample input", required=False, widget=forms.Textarea(attrs={"rows": 3, "class": "mono"}),
        help_text='One request\'s input tensors by name, with the batch dimension, as a JSON object, e.g. '
                  '{"input": [[5.1, 3.5, 1.4, 0.2]]}. Each rollout sends it to the new version before it takes '
                  'traffic (the smoke inference), and "Try it" starts from it; kept as metadata.sample_input '
                  'and checked against the model\'s inputs')
    tags = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}),
                           help_text='String key/value tags as a JSON object, e.g. {"team": "vision"}')
    source_commit = forms.CharField(required=False, max_length=64)
    ci_run_url = forms.CharField(required=False, max_length=500, label="CI run URL")
    training_data_uri = forms.CharField(required=False, max_length=500, label="Training data URI")
    metrics = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}),
                              help_text='Evaluation metrics as a JSON object, e.g. {"accuracy": 0.97}')


class ModelCardForm(KeepEveryCharacter, forms.Form):
    """Edit a version's model card; ``registry.cards`` checks the fields (an SPDX license, at most 100
    datasets and results, finite numbers) and the page shows its message."""

    license = forms.CharField(required=False, max_length=200,
                              help_text="an SPDX license expression, e.g. Apache-2.0, MIT, CC-BY-4.0; or other")
    datasets = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3}),
                               help_text="one dataset name or URI per line")
    base_model = forms.CharField(required=False, max_length=200, label="Base model",
                                 help_text="what this model was trained or fine-tuned from, if anything")
    intended_use = forms.CharField(required=False, max_length=10_000, label="Intended use",
                                   widget=forms.Textarea(attrs={"rows": 4}),
                                   help_text="what it is for, and for whom")
    limitations = forms.CharField(required=False, max_length=10_000, widget=forms.Textarea(attrs={"rows": 4}),
                                  help_text="where it fails, what it must not be used for, known biases")
    evaluation_results = forms.CharField(
        required=False, label="Evaluation results", widget=forms.Textarea(attrs={"rows": 4, "class": "mono"}),
        help_text="one result per line: task | dataset | metric | value, e.g. classification | iris | accuracy | 0.97")

    def clean_datasets(self) -> list[str]:
        return [line.strip() for line in self.cleaned_data["datasets"].splitlines() if line.strip()]

    def clean_evaluation_results(self) -> list[dict]:
        results = []
        for number, line in enumerate(self.cleaned_data["evaluation_results"].splitlines(), start=1):
            if not line.strip():
                continue
            parts = [part.strip() for part in line.split("|")]
            if len(parts) != 4:
                raise forms.ValidationError(f"line {number}: write task | dataset | metric | value, not {line!r}")
            task, dataset, metric, value = parts
            try:
                score = float(value)
            except ValueError as exc:
                raise forms.ValidationError(f"line {number}: the value {value!r} is not a number") from exc
            results.append({"task": task, "dataset": dataset, "metric": metric,
                            "value": int(score) if score.is_integer() and "." not in value else score})
        return results

    @classmethod
    def initial_of(cls, card) -> dict:
        """The form's initial values for ``card`` (a ``registry.models.ModelCard``)."""
        return {
            "license": card.license, "datasets": "\n".join(card.datasets), "base_model": card.base_model,
            "intended_use": card.intended_use, "limitations": card.limitations,
            "evaluation_results": "\n".join(f"{r['task']} | {r['dataset']} | {r['metric']} | {r['value']}"
                                             for r in card.evaluation_results),
        }


class InferenceKeyForm(KeepEveryCharacter, forms.Form):
    """Make an inference key on a model's keys page: its name, the team's models it opens (the page's model
    checked) and how many days it lives (empty: no expiry); ``registry.inference_keys`` checks the rest."""

    name = forms.CharField(max_length=100, help_text='what calls with it, e.g. "checkout-service"')
    models = forms.MultipleChoiceField(choices=(), widget=forms.CheckboxSelectMultiple,
                                       help_text="the team's models the key opens")
    expires_in_days = forms.IntegerField(required=False, min_value=1, max_value=3650, label="Expires in (days)",
                                         help_text="empty: the key does not expire")

    def __init__(self, *args, model_names=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["models"].choices = [(name, name) for name in model_names]
