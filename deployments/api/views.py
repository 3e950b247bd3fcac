"""Deployments API: serving hosts and deployments."""

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.response import Response

from deployments import services
from deployments.api.serializers import DeploymentCreateSerializer, DeploymentSerializer, ServingHostSerializer
from deployments.models import Deployment, ServingHost
from modelyard.api import StaffCanWrite


class ServingHostViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin, mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    """Serving hosts, looked up by name. ``DELETE`` removes one (409 while a deployment runs there)."""

    serializer_class = ServingHostSerializer
    permission_classes = [StaffCanWrite]
    lookup_field = "name"
    lookup_value_regex = "[^/]+"
    ordering = "name"
    queryset = ServingHost.objects.order_by("name")

    def create(self, request, *args, **kwargs):
        data = self.get_serializer(data=request.data)
        data.is_valid(raise_exception=True)
        host = services.register_host(actor=request.user, **data.validated_data)
        return Response(self.get_serializer(host).data, status=status.HTTP_201_CREATED)

    def destroy(self, request, *args, **kwargs):
        services.delete_host(name=self.kwargs["name"], actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


class DeploymentViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin, viewsets.GenericViewSet
):
    """Deployments: one model version onto a set of hosts, with per-host state."""

    serializer_class = DeploymentSerializer
    ordering = "-id"
    queryset = (
        Deployment.objects.select_related("model", "version", "created_by")
        .prefetch_related("targets__host")
        .order_by("-id")
    )
    filterset_fields = {"model__name": ["exact"]}

    @extend_schema(request=DeploymentCreateSerializer, responses={201: DeploymentSerializer})
    def create(self, request, *args, **kwargs):
        data = DeploymentCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        deployment = services.start_deployment(
            model_name=data.validated_data["model"],
            version=data.validated_data["version"],
            host_names=data.validated_data["hosts"],
            actor=request.user,
        )
        deployment = services.get_deployment(deployment.pk)
        return Response(DeploymentSerializer(deployment).data, status=status.HTTP_201_CREATED)
