"""Forms of the registry pages."""

from django import forms


class AliasForm(forms.Form):
    """Set or move an alias of a model to one of its versions."""

    alias = forms.CharField(max_length=63, help_text="e.g. production, staging")
    version = forms.TypedChoiceField(coerce=int, choices=())

    def __init__(self, *args, versions=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["version"].choices = [(v, f"v{v}") for v in versions]
