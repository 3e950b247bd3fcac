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
    parts) and the version's metadata, tags and lineage (sent as JSON to the uploads API, which
    checks them)."""

    artifact = forms.FileField(help_text="A Triton model directory as .tar.gz, .tar or .zip (an ensemble too), "
                                         "a single .onnx, .pt or .plan file, or a BentoML .bento or .bentomodel export")
    metadata = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3}),
                               help_text='A JSON object, e.g. {"dataset": "2024-06"}')
    tags = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}),
                           help_text='String key/value tags as a JSON object, e.g. {"team": "vision"}')
    source_commit = forms.CharField(required=False, max_length=64)
    ci_run_url = forms.CharField(required=False, max_length=500, label="CI run URL")
    training_data_uri = forms.CharField(required=False, max_length=500, label="Training data URI")
    metrics = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}),
                              help_text='Evaluation metrics as a JSON object, e.g. {"accuracy": 0.97}')
