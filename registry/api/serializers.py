"""Serializers of the registry API."""

from rest_framework import serializers

from modelyard.jsonobject import parse_json_object
from registry.models import Alias, AuditEvent, ModelVersion, RegisteredModel


class ErrorSerializer(serializers.Serializer):
    """An error answer: ``{"detail": "..."}``."""

    detail = serializers.CharField()


class RegisteredModelSerializer(serializers.ModelSerializer):
    """A registered model as the API shows it."""

    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    latest_version = serializers.IntegerField(read_only=True, allow_null=True)

    class Meta:
        model = RegisteredModel
        fields = ["name", "description", "tags", "latest_version", "created_by", "created_at", "updated_at"]
        read_only_fields = fields


class RegisteredModelCreateSerializer(serializers.Serializer):
    """Input of ``POST /api/v1/models/``."""

    name = serializers.CharField(max_length=200, trim_whitespace=False)
    description = serializers.CharField(required=False, allow_blank=True, default="")
    tags = serializers.DictField(child=serializers.CharField(allow_blank=True), required=False, default=dict)


class RegisteredModelUpdateSerializer(serializers.Serializer):
    """Input of ``PATCH /api/v1/models/<name>/``: either field may be left out."""

    description = serializers.CharField(required=False, allow_blank=True)
    tags = serializers.DictField(child=serializers.CharField(allow_blank=True), required=False)


class ModelVersionSerializer(serializers.ModelSerializer):
    """A model version as the API shows it; sizes in bytes."""

    model = serializers.SlugRelatedField(slug_field="name", read_only=True)
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)

    class Meta:
        model = ModelVersion
        fields = [
            "model", "version", "status", "format", "artifact_sha256", "artifact_size", "artifact_filename",
            "signature", "metadata", "tags", "source_commit", "ci_run_url", "training_data_uri", "metrics",
            "created_by", "created_at",
        ]
        read_only_fields = fields


class JSONObjectField(serializers.JSONField):
    """A JSON object given either as JSON or, in multipart forms, as a JSON string."""

    def to_internal_value(self, data):
        try:
            if isinstance(data, str):
                return parse_json_object(data)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from exc
        if not isinstance(data, dict):
            raise serializers.ValidationError("must be a JSON object")
        return data


class ModelVersionUploadSerializer(serializers.Serializer):
    """Input of ``POST /api/v1/models/<name>/versions/`` (multipart/form-data)."""

    artifact = serializers.FileField(
        help_text="A .tar.gz, .tar or .zip of one Triton model directory (config.pbtxt + one version dir)"
    )
    metadata = JSONObjectField(required=False, default=dict, help_text="A JSON object of free-form metadata")
    tags = JSONObjectField(required=False, default=dict, help_text="String key/value tags of the version")
    source_commit = serializers.CharField(required=False, allow_blank=True, default="", max_length=64)
    ci_run_url = serializers.CharField(required=False, allow_blank=True, default="", max_length=500)
    training_data_uri = serializers.CharField(required=False, allow_blank=True, default="", max_length=500)
    metrics = JSONObjectField(required=False, default=dict, help_text='Evaluation metrics, e.g. {"accuracy": 0.97}')


class AliasSerializer(serializers.ModelSerializer):
    """An alias and the version it points at."""

    alias = serializers.CharField(source="name", read_only=True)
    model = serializers.SlugRelatedField(slug_field="name", read_only=True)
    version = serializers.IntegerField(source="version.version", read_only=True)
    updated_by = serializers.SlugRelatedField(slug_field="username", read_only=True)

    class Meta:
        model = Alias
        fields = ["model", "alias", "version", "updated_by", "updated_at"]
        read_only_fields = fields


class AliasSetSerializer(serializers.Serializer):
    """Input of ``PUT /api/v1/models/<name>/aliases/<alias>/``."""

    version = serializers.IntegerField(min_value=1)


class AuditEventSerializer(serializers.ModelSerializer):
    """One audit event: who did what to which object, with its before/after details in ``data``."""

    actor = serializers.CharField(source="actor_label", read_only=True)
    model = serializers.SlugRelatedField(slug_field="name", read_only=True)

    class Meta:
        model = AuditEvent
        fields = ["id", "created_at", "action", "actor", "model", "object_type", "object_id", "data"]
        read_only_fields = fields
