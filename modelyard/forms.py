"""Helpers shared by the apps' forms."""

from django import forms


class KeepEveryCharacter:
    """Form mixin: text fields keep their ``max_length`` check but render without HTML ``maxlength``.

    A browser cuts text typed or pasted into an input with ``maxlength`` at that length without a
    word, so a 124-character name would arrive as 63 characters and be saved as if that were what
    was meant. Without the attribute the whole text reaches the server, and the form answers with an
    error naming the limit and the length given; nothing is saved.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for field in self.fields.values():
            field.widget.attrs.pop("maxlength", None)


class FullLengthModelForm(KeepEveryCharacter, forms.ModelForm):
    """A ModelForm whose inputs carry no ``maxlength`` (see :class:`KeepEveryCharacter`); the base of
    the admin site's forms."""
