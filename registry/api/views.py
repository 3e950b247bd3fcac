"""Registry API: models and their versions."""

from django.db.models import Max, Q
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.parsers import FormParser, JSONParser, MultiPartParser
from rest_framework.response import Response

from modelyard.api import uploaded_file_path
from registry import services
from registry.api.serializers import (
    ModelVersionSerializer,
    ModelVersionUploadSerializer,
    RegisteredModelCreateSerializer,
    RegisteredModelSerializer,
)
from registry.choices import VersionStatus
from registry.models import ModelVersion, RegisteredModel


class RegisteredModelViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin, viewsets.GenericViewSet
):
    """Registered models, looked up by name."""

    serializer_class = RegisteredModelSerializer
    lookup_field = "name"
    lookup_value_regex = "[^/]+"
    ordering = "name"

    def get_queryset(self):
        return (
            RegisteredModel.objects.select_related("created_by")
            .annotate(latest_version=Max("versions__version", filter=~Q(versions__status=VersionStatus.DELETED)))
            .order_by("name")
        )

    @extend_schema(request=RegisteredModelCreateSerializer, responses={201: RegisteredModelSerializer})
    def create(self, request, *args, **kwargs):
        data = RegisteredModelCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        model = services.create_model(actor=request.user, **data.validated_data)
        model = self.get_queryset().get(pk=model.pk)
        return Response(RegisteredModelSerializer(model).data, status=status.HTTP_201_CREATED)


class ModelVersionViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin, viewsets.GenericViewSet
):
    """Versions of one registered model, looked up by number."""

    serializer_class = ModelVersionSerializer
    lookup_field = "version"
    lookup_value_regex = "[0-9]+"
    parser_classes = [MultiPartParser, FormParser, JSONParser]
    ordering = "-version"

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation has no URL kwargs
            return ModelVersion.objects.none()
        model = services.get_model(self.kwargs["model_name"])
        return (
            ModelVersion.objects.filter(model=model)
            .exclude(status=VersionStatus.DELETED)
            .select_related("model", "created_by")
            .order_by("-version")
        )

    @extend_schema(request=ModelVersionUploadSerializer, responses={201: ModelVersionSerializer})
    def create(self, request, *args, **kwargs):
        model = services.get_model(self.kwargs["model_name"])
        data = ModelVersionUploadSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        upload = data.validated_data["artifact"]
        with uploaded_file_path(upload) as path:
            version = services.register_version(
                model=model, artifact_path=path, filename=upload.name,
                metadata=data.validated_data["metadata"], actor=request.user,
            )
        return Response(ModelVersionSerializer(version).data, status=status.HTTP_201_CREATED)
