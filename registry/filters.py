"""Search filters for registered models, shared by the API and the models page."""

import django_filters
from django.core.exceptions import ValidationError
from django.db.models.fields.json import KeyTextTransform

from registry.models import ModelVersion, RegisteredModel


def filter_by_tag(queryset, value: str):
    """Rows whose ``tags`` have the key (``key``) or the key with that value (``key=value``).

    Raises:
        ValidationError: an empty key.
    """
    key, sep, tag_value = value.partition("=")
    if not key:
        raise ValidationError("tag must be 'key' or 'key=value'")
    if sep:
        # A key transform, not a "tags__<key>" lookup: a key like "a__contains" stays a key.
        return queryset.annotate(_tag_value=KeyTextTransform(key, "tags")).filter(_tag_value=tag_value)
    return queryset.filter(tags__has_key=key)


class RegisteredModelFilter(django_filters.FilterSet):
    """Filters: ``search`` (name or description substring), ``tag`` (``key`` or ``key=value``),
    ``alias`` (models that have that alias), ``created_after`` / ``created_before`` (ISO 8601)."""

    search = django_filters.CharFilter(method="filter_search")
    tag = django_filters.CharFilter(method="filter_tag")
    alias = django_filters.CharFilter(field_name="aliases__name", distinct=True)
    created_after = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    created_before = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="lt")

    class Meta:
        model = RegisteredModel
        fields = ["search", "tag", "alias", "created_after", "created_before"]

    def filter_search(self, queryset, name, value):
        from django.db.models import Q

        return queryset.filter(Q(name__icontains=value) | Q(description__icontains=value))

    def filter_tag(self, queryset, name, value):
        return filter_by_tag(queryset, value)


class ModelVersionFilter(django_filters.FilterSet):
    """Filters of a model's versions: ``source_commit`` (prefix), ``tag``, ``alias``,
    ``created_after`` / ``created_before``."""

    source_commit = django_filters.CharFilter(field_name="source_commit", lookup_expr="startswith")
    tag = django_filters.CharFilter(method="filter_tag")
    alias = django_filters.CharFilter(field_name="aliases__name")
    created_after = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    created_before = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="lt")

    class Meta:
        model = ModelVersion
        fields = ["source_commit", "tag", "alias", "created_after", "created_before"]

    def filter_tag(self, queryset, name, value):
        return filter_by_tag(queryset, value)
