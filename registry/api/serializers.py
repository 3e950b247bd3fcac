"""Serializers of the registry API."""

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from accounts.api.serializers import TOKEN_STATES
from accounts.tokens import token_state
from audit.models import AuditEvent
from modelyard.api import RefuseUnknownFields
from modelyard.jsonobject import parse_json_object
from registry.inference_keys import KEY_RE
from registry.inference_keys import NAME_MAX_LENGTH as INFERENCE_KEY_NAME_MAX_LENGTH
from registry.models import Alias, EnsembleMember, InferenceKey, ModelCard, ModelVersion, RegisteredModel

MODEL_NAME_MAX_LENGTH = RegisteredModel._meta.get_field("name").max_length


class RegisteredModelSerializer(serializers.ModelSerializer):
    """A registered model as the API shows it."""

    team = serializers.SlugRelatedField(slug_field="name", read_only=True)
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)
    latest_version = serializers.IntegerField(read_only=True, allow_null=True)

    class Meta:
        model = RegisteredModel
        fields = ["name", "team", "description", "tags", "inference_key_required", "latest_version", "created_by",
                  "created_at", "updated_at"]
        read_only_fields = fields


class RegisteredModelCreateSerializer(RefuseUnknownFields, serializers.Serializer):
    """Input of ``POST /api/v1/models/``."""

    name = serializers.CharField(max_length=200, trim_whitespace=False)
    team = serializers.CharField(
        max_length=63, required=False, allow_blank=True, default="",
        help_text="The owning team; may be left out when you maintain exactly one team",
    )
    description = serializers.CharField(required=False, allow_blank=True, default="", max_length=10_000)
    tags = serializers.DictField(child=serializers.CharField(allow_blank=True), required=False, default=dict)


class RegisteredModelUpdateSerializer(RefuseUnknownFields, serializers.Serializer):
    """Input of ``PATCH /api/v1/models/<name>/``: any field may be left out."""

    description = serializers.CharField(required=False, allow_blank=True, max_length=10_000)
    tags = serializers.DictField(child=serializers.CharField(allow_blank=True), required=False)
    inference_key_required = serializers.BooleanField(
        required=False, help_text="clients must present an inference key of the team scoped to the model "
                                  "(changing it needs the team's owner role)")


class EnsembleMemberSerializer(serializers.ModelSerializer):
    """One model version an ensemble composes: the version the config asked for (-1: newest) and
    the registered version it resolved to when the ensemble was registered."""

    model = serializers.CharField(source="member.model.name", read_only=True)
    version = serializers.IntegerField(source="member.version", read_only=True)

    class Meta:
        model = EnsembleMember
        fields = ["model", "version", "requested_version"]
        read_only_fields = fields


class ModelVersionSerializer(serializers.ModelSerializer):
    """A model version as the API shows it; sizes in bytes. ``signature`` holds the inputs and
    outputs (name, data_type, dims) for every format; ``ensemble_members`` is empty unless the
    version is a Triton ensemble."""

    model = serializers.SlugRelatedField(slug_field="name", read_only=True)
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)
    ensemble_members = EnsembleMemberSerializer(source="members", many=True, read_only=True)
    aliases = serializers.SlugRelatedField(slug_field="name", many=True, read_only=True,
                                           help_text="the aliases that name this version now, e.g. production")
    # A URLField would be documented as format "uri", which the empty string (no CI run given) is not.
    ci_run_url = serializers.CharField(read_only=True, help_text="the CI run's http(s) URL, or empty")

    class Meta:
        model = ModelVersion
        fields = [
            "model", "version", "status", "format", "artifact_sha256", "artifact_size", "artifact_filename",
            "sha256_verified_at", "integrity_error", "signature", "ensemble_members", "aliases", "metadata", "tags",
            "source_commit", "ci_run_url",
            "training_data_uri", "metrics", "created_by", "created_at",
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


class ModelVersionUploadSerializer(RefuseUnknownFields, serializers.Serializer):
    """Input of ``POST /api/v1/models/<name>/versions/`` (multipart/form-data)."""

    artifact = serializers.FileField(
        help_text=(
            "A Triton model directory or ensemble (.tar.gz, .tgz, .tar.xz, .tar or .zip: config.pbtxt + one "
            "version dir), a single ONNX (.onnx), TorchScript (.pt) or TensorRT plan (.plan) file, or a "
            "BentoML export (.bentomodel, .bento); the file name's suffix tells which"
        )
    )
    signature = JSONObjectField(
        required=False,
        help_text=(
            'Inputs and outputs of a single-file model: {"inputs": [{"name": "input", "data_type": "TYPE_FP32", '
            '"dims": [-1, 4]}], "outputs": [...]}; required for .pt and .plan, optional for .onnx (read from '
            "the file, and checked against it when given)"
        ),
    )
    max_batch_size = serializers.IntegerField(
        required=False, min_value=0, max_value=2**31 - 1,
        help_text="Single-file models: 0 (default) takes dims as they are; above 0 the first dim is the batch",
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
    updated_by = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)

    class Meta:
        model = Alias
        fields = ["model", "alias", "version", "protected", "updated_by", "updated_at"]
        read_only_fields = fields


class AliasSetSerializer(RefuseUnknownFields, serializers.Serializer):
    """Input of ``PUT /api/v1/models/<name>/aliases/<alias>/``."""

    version = serializers.IntegerField(min_value=1)
    reason = serializers.CharField(required=False, allow_blank=True, default="", max_length=1000,
                                   help_text="why it moves; required to move a protected alias (kept in the audit log)")


class AliasProtectSerializer(RefuseUnknownFields, serializers.Serializer):
    """Input of ``PATCH /api/v1/models/<name>/aliases/<alias>/``: lock or unlock the alias."""

    protected = serializers.BooleanField(help_text="locked: moving it needs a team owner and a reason")
    reason = serializers.CharField(required=False, allow_blank=True, default="", max_length=1000,
                                   help_text="why (kept in the audit log)")


class AuditEventSerializer(serializers.ModelSerializer):
    """One audit event: who did what to which object, with its before/after details in ``data``."""

    actor = serializers.CharField(source="actor_label", read_only=True)
    model = serializers.SlugRelatedField(slug_field="name", read_only=True, allow_null=True)
    object = serializers.CharField(source="object_label", read_only=True,
                                   help_text='the object as people name it, e.g. "model iris", "alias production"')

    class Meta:
        model = AuditEvent
        fields = ["id", "created_at", "action", "actor", "model", "object_type", "object_id", "object", "data"]
        read_only_fields = fields


class EvaluationResultSerializer(serializers.Serializer):
    """One evaluation result of a model card."""

    task = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    dataset = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    metric = serializers.CharField(max_length=200)
    value = serializers.FloatField()


class ModelCardSerializer(serializers.ModelSerializer):
    """A version's model card (empty fields when it has none yet)."""

    model = serializers.CharField(source="version.model.name", read_only=True)
    version = serializers.IntegerField(source="version.version", read_only=True)
    license = serializers.CharField(read_only=True, help_text="an SPDX license expression, 'other', or empty")
    datasets = serializers.ListField(child=serializers.CharField(), read_only=True)
    evaluation_results = EvaluationResultSerializer(many=True, read_only=True)
    updated_by = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)
    updated_at = serializers.DateTimeField(read_only=True, allow_null=True)

    class Meta:
        model = ModelCard
        fields = ["model", "version", "license", "datasets", "base_model", "intended_use", "limitations",
                  "evaluation_results", "updated_by", "updated_at"]
        read_only_fields = fields


class ModelCardUpdateSerializer(RefuseUnknownFields, serializers.Serializer):
    """Input of ``PATCH /api/v1/models/<name>/versions/<n>/card/``: any of the fields; the service checks
    them further (an SPDX license, at most 100 datasets and results, finite values)."""

    license = serializers.CharField(max_length=200, required=False, allow_blank=True,
                                    help_text="an SPDX license expression (e.g. Apache-2.0), 'other', or empty")
    datasets = serializers.ListField(child=serializers.CharField(max_length=200), required=False, max_length=100)
    base_model = serializers.CharField(max_length=200, required=False, allow_blank=True)
    intended_use = serializers.CharField(max_length=10_000, required=False, allow_blank=True)
    limitations = serializers.CharField(max_length=10_000, required=False, allow_blank=True)
    evaluation_results = serializers.ListField(child=serializers.DictField(), required=False, max_length=100,
                                               help_text='[{"task", "dataset", "metric", "value"}], value a number')


class InferenceKeySerializer(serializers.ModelSerializer):
    """An inference key as the API shows it: never its secret, which is not stored, nor its digest."""

    team = serializers.SlugRelatedField(slug_field="name", read_only=True)
    models = serializers.SlugRelatedField(source="scoped_models", slug_field="name", many=True, read_only=True,
                                          help_text="the models the key opens")
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)
    state = serializers.SerializerMethodField(help_text="active, expired or revoked")

    class Meta:
        model = InferenceKey
        fields = ["id", "name", "prefix", "team", "models", "state", "created_by", "created_at", "expires_at",
                  "revoked_at", "last_used_at"]
        read_only_fields = fields

    @extend_schema_field(serializers.ChoiceField(choices=TOKEN_STATES))
    def get_state(self, key: InferenceKey) -> str:
        return token_state(key)


class InferenceKeyCreatedSerializer(InferenceKeySerializer):
    """The answer to creating an inference key: the key with its plaintext, shown this once."""

    key = serializers.CharField(read_only=True, help_text="what clients send to call the models; shown only in "
                                                          "this answer")

    class Meta(InferenceKeySerializer.Meta):
        fields = [*InferenceKeySerializer.Meta.fields, "key"]
        read_only_fields = fields


class InferenceKeyCreateSerializer(RefuseUnknownFields, serializers.Serializer):
    """Input of ``POST /api/v1/inference-keys/``: a key of the models' team."""

    name = serializers.CharField(max_length=INFERENCE_KEY_NAME_MAX_LENGTH)
    models = serializers.ListField(child=serializers.CharField(max_length=MODEL_NAME_MAX_LENGTH), min_length=1,
                                   max_length=1000,
                                   help_text="names of the models the key opens, all of one team")
    expires_at = serializers.DateTimeField(required=False, allow_null=True, default=None,
                                           help_text="ISO 8601, in the future; null or left out: no expiry")

    def validate_models(self, names: list[str]) -> list[str]:
        # A key pasted for a model is refused here, before a "no model named ..." could repeat it.
        if any(KEY_RE.search(name) for name in names):
            raise serializers.ValidationError("that is an inference key, not a model name")
        return names
