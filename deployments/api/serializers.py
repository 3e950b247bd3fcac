"""Serializers of the deployments API."""

from rest_framework import serializers

from deployments.choices import DeploymentStatus, Runtime
from deployments.models import Deployment, DeploymentTarget, ServingHost


class ServingHostSerializer(serializers.ModelSerializer):
    """A serving host as the API shows it and accepts it."""

    name = serializers.CharField(max_length=200, trim_whitespace=False)
    runtime = serializers.ChoiceField(choices=Runtime.choices, default=Runtime.TRITON)
    inference_url = serializers.CharField(max_length=200)
    metrics_url = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    config_overrides = serializers.JSONField(required=False, default=dict)
    labels = serializers.DictField(child=serializers.CharField(allow_blank=True), required=False, default=dict)
    online = serializers.SerializerMethodField(help_text="agent reported recently and the runtime was live")

    class Meta:
        model = ServingHost
        fields = ["name", "runtime", "inference_url", "metrics_url", "config_overrides", "labels", "online",
                  "last_heartbeat_at", "heartbeat", "created_at"]
        read_only_fields = ["online", "last_heartbeat_at", "heartbeat", "created_at"]
        validators = []  # uniqueness is the service's job, answered with 409

    def get_online(self, host: ServingHost) -> bool:
        return host.is_online()


class DeploymentTargetSerializer(serializers.ModelSerializer):
    """One host's state within a deployment."""

    host = serializers.SlugRelatedField(slug_field="name", read_only=True)

    class Meta:
        model = DeploymentTarget
        fields = ["host", "state", "error", "details", "updated_at"]
        read_only_fields = fields


class DeploymentSerializer(serializers.ModelSerializer):
    """A deployment with its overall status and per-host states."""

    model = serializers.SlugRelatedField(slug_field="name", read_only=True)
    version = serializers.IntegerField(source="version.version", read_only=True)
    status = serializers.ChoiceField(choices=DeploymentStatus.choices, read_only=True)
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    targets = DeploymentTargetSerializer(many=True, read_only=True)

    class Meta:
        model = Deployment
        fields = ["id", "model", "version", "status", "targets", "created_by", "created_at"]
        read_only_fields = fields


class DeploymentCreateSerializer(serializers.Serializer):
    """Input of ``POST /api/v1/deployments/``."""

    model = serializers.CharField(max_length=200)
    version = serializers.IntegerField(min_value=1)
    hosts = serializers.ListField(child=serializers.CharField(max_length=200), allow_empty=False, max_length=1000)
