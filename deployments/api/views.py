"""Deployments API: serving hosts and deployments."""

from drf_spectacular.utils import extend_schema
from rest_framework import generics, mixins, permissions, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.access import Action, Principal, require, scope_team_filter
from accounts.choices import Scope
from accounts.permissions import AdminCanWrite, TokenScopePermission
from deployments import canaries, hosts, lifecycle, profiles, replays, rollouts, services
from deployments.api.filters import DeploymentFilter, ProfileFilter, ReplayFilter
from deployments.api.serializers import (
    CaptureSerializer,
    CaptureUpdateSerializer,
    DeploymentCreateSerializer,
    DeploymentSerializer,
    DeploymentUpdateSerializer,
    HostResidencySerializer,
    InferenceRequestSerializer,
    InferenceResultSerializer,
    ModelUnloadSerializer,
    ProfileCreateSerializer,
    ProfileSerializer,
    ReplayCreateSerializer,
    ReplaySerializer,
    ServingHostSerializer,
    ServingHostUpdateSerializer,
)
from deployments.capture import capture_panel
from deployments.heartbeats import residency_report
from deployments.inference import try_inference
from deployments.models import Deployment, Profile, Replay, ServingHost
from modelyard.api import error_responses
from modelyard.errors import NotFound
from registry.access import model_for, visible_models
from registry.capture import set_capture


class ServingHostViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin, mixins.UpdateModelMixin,
    mixins.DestroyModelMixin, viewsets.GenericViewSet,
):
    """Serving hosts, looked up by name. ``PATCH`` changes ``production`` and ``labels``; ``DELETE`` removes
    one (409 while a deployment runs there). Changes need an administrator."""

    serializer_class = ServingHostSerializer
    permission_classes = [AdminCanWrite, TokenScopePermission]
    required_scope = {"unload": Scope.DEPLOY, "reload": Scope.DEPLOY, "default": Scope.ADMIN}
    lookup_field = "name"
    lookup_value_regex = "[^/]+"
    ordering = "name"
    queryset = ServingHost.objects.order_by("name")

    def create(self, request, *args, **kwargs):
        data = self.get_serializer(data=request.data)
        data.is_valid(raise_exception=True)
        host = hosts.register_host(actor=request.user, **data.validated_data)
        return Response(self.get_serializer(host).data, status=status.HTTP_201_CREATED)

    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    @extend_schema(request=ServingHostUpdateSerializer, responses={200: ServingHostSerializer,
                                                                   **error_responses(403, 404)})
    def partial_update(self, request, *args, **kwargs):
        data = ServingHostUpdateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        host = hosts.update_host(name=self.kwargs["name"], actor=request.user, **data.validated_data)
        return Response(self.get_serializer(host).data)

    def destroy(self, request, *args, **kwargs):
        hosts.delete_host(name=self.kwargs["name"], actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=None, responses={202: ModelUnloadSerializer, **error_responses(403, 404, 409)})
    @action(detail=True, methods=["post"], url_path=r"models/(?P<model_name>[^/]+)/unload",
            permission_classes=[permissions.IsAuthenticated, TokenScopePermission])
    def unload(self, request, name=None, model_name=None):
        """Unload a model from this host (the reconciler will not load it back); 202 while the agent unloads.

        Needs the rights of a rollout to this host (maintainer; owner on a production host)."""
        _authorize_host_operation(request, name, model_name)
        version = lifecycle.unload_model(host_name=name, model_name=model_name, actor=request.user)
        return Response({"host": name, "model": model_name, "version": version}, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={201: DeploymentSerializer, **error_responses(403, 404, 409, 503)})
    @action(detail=True, methods=["post"], url_path=r"models/(?P<model_name>[^/]+)/reload",
            permission_classes=[permissions.IsAuthenticated, TokenScopePermission])
    def reload(self, request, name=None, model_name=None):
        """Load again the version last unloaded from this host, as a one-host rollout (rights as for unload)."""
        _authorize_host_operation(request, name, model_name)
        deployment = lifecycle.reload_model(host_name=name, model_name=model_name, actor=request.user)
        return Response(_deployment_data(deployment.pk), status=status.HTTP_201_CREATED)

    @extend_schema(responses={200: HostResidencySerializer, **error_responses(404)})
    @action(detail=True, methods=["get"], pagination_class=None,
            permission_classes=[permissions.IsAuthenticated, TokenScopePermission])
    def residency(self, request, name=None):
        """The host's models on demand as its gateway last reported them (state, held requests, requests, last
        use, last failed load), the models the caller may read only, and its memory budget with what the resident
        models hold and, when the budget cannot be held as measured, why."""
        principal = Principal.of(request)

        def visible(names: set[str]) -> set[str]:
            return set(visible_models(principal).filter(name__in=names).values_list("name", flat=True))

        return Response(HostResidencySerializer(residency_report(self.get_object(), visible)).data)


def _authorize_host_operation(request, host_name: str, model_name: str) -> None:
    """Check the principal may roll ``model_name`` out to host ``host_name``.

    Raises:
        NotFound: no such host, or no model the principal may read (HTTP 404).
        Forbidden: it may read the model but not deploy it there (HTTP 403).
    """
    host = ServingHost.objects.filter(name=host_name).first()
    if host is None:
        raise NotFound(f"no serving host named {host_name!r}")
    model_for(Principal.of(request), model_name, Action.DEPLOY, hosts=[host],
              doing=lifecycle.describe_host_operation(host))


def _deployment_data(pk: int) -> dict:
    return DeploymentSerializer(DeploymentViewSet.queryset.get(pk=pk)).data


class DeploymentViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin, viewsets.GenericViewSet
):
    """Deployments (rollouts): one model version onto a set of hosts in batches, with per-host state.

    ``POST .../<id>/pause/``, ``resume/``, ``cancel/`` and ``rollback/`` control a rollout;
    an illegal move (e.g. resuming a finished rollout) is a 409. A canary (``canary_percent``) changes
    its percent with ``PATCH``, goes to 100 % with ``promote/`` and back to its stable version with
    ``rollback/``.
    """

    http_method_names = ["get", "post", "patch", "head", "options"]

    serializer_class = DeploymentSerializer
    required_scope = Scope.DEPLOY
    lookup_value_regex = "[0-9]+"
    ordering = "-id"
    queryset = (
        Deployment.objects.select_related("model", "version", "created_by")
        .prefetch_related("targets__host", "targets__previous_version", "events")
        .order_by("-id")
    )
    filterset_class = DeploymentFilter

    def get_queryset(self):
        """Deployments of the models the principal may read."""
        return scope_team_filter(Principal.of(self.request), self.queryset, "model__team")

    def _controlled(self, pk) -> Deployment:
        """The deployment ``pk`` once the principal may deploy to every host it targets.

        Raises:
            Http404: no such deployment the principal may read.
            Forbidden: it may not deploy this model to those hosts (HTTP 403).
        """
        deployment = self.get_object()
        hosts = [target.host for target in deployment.targets.all()]
        require(Principal.of(self.request), Action.DEPLOY, model=deployment.model, hosts=hosts)
        return deployment

    @extend_schema(request=DeploymentCreateSerializer,
                   responses={201: DeploymentSerializer, **error_responses(403, 404, 409, 503)},
                   description="Deploying needs a maintainer of the model's team; to a production host, an owner.")
    def create(self, request, *args, **kwargs):
        data = DeploymentCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        fields = data.validated_data
        principal = Principal.of(request)
        model_for(principal, fields["model"])

        def authorize(model_version, hosts):
            require(principal, Action.DEPLOY, model=model_version.model, hosts=hosts)

        deployment = services.start_deployment(
            model_name=fields["model"], version=fields.get("version"), alias=fields["alias"],
            host_names=fields.get("hosts"), selector=fields.get("selector"), replicas=fields.get("replicas"),
            batch_size=fields["batch_size"], failure_policy=fields["failure_policy"],
            config_overrides=fields.get("config_overrides"), autoscale=fields.get("autoscale"), actor=request.user,
            authorize=authorize, config=fields.get("config", ""), confirm_breaking=fields["confirm_breaking"],
            canary_percent=fields.get("canary_percent"), shadow_percent=fields.get("shadow_percent"),
            max_request_bytes=fields.get("max_request_bytes"), residency=fields["residency"],
            pinned=fields["pinned"], cold_start_timeout=fields.get("cold_start_timeout"),
        )
        return Response(self._show(deployment.pk), status=status.HTTP_201_CREATED)

    @extend_schema(request=DeploymentUpdateSerializer,
                   responses={200: DeploymentSerializer, **error_responses(403, 404, 409)},
                   description="Change a canary's percent or shadow percent on every host it reached (no reload "
                               "there); audited.")
    def partial_update(self, request, pk=None):
        self._controlled(pk)
        data = DeploymentUpdateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        canaries.set_traffic(int(pk), **data.validated_data, actor=request.user)
        return Response(self._show(pk))

    @extend_schema(request=None, responses={201: DeploymentSerializer, **error_responses(403, 404, 409, 503)})
    @action(detail=True, methods=["post"])
    def promote(self, request, pk=None):
        """Make a canary's version the only one on the hosts it reached; returns the promotion rollout."""
        self._controlled(pk)
        promotion = canaries.promote_canary(int(pk), actor=request.user)
        return Response(self._show(promotion.pk), status=status.HTTP_201_CREATED)

    def _show(self, pk: int) -> dict:
        return _deployment_data(pk)

    @extend_schema(request=None, responses={200: DeploymentSerializer})
    @action(detail=True, methods=["post"])
    def pause(self, request, pk=None):
        """Stop dispatching further batches (hosts in flight finish)."""
        self._controlled(pk)
        rollouts.pause_rollout(int(pk), actor=request.user)
        return Response(self._show(pk))

    @extend_schema(request=None, responses={200: DeploymentSerializer})
    @action(detail=True, methods=["post"])
    def resume(self, request, pk=None):
        """Continue a paused rollout with its next batch."""
        self._controlled(pk)
        rollouts.resume_rollout(int(pk), actor=request.user)
        return Response(self._show(pk))

    @extend_schema(request=None, responses={200: DeploymentSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        """Stop the rollout for good; hosts not yet moved are left alone."""
        self._controlled(pk)
        rollouts.cancel_rollout(int(pk), actor=request.user)
        return Response(self._show(pk))

    @extend_schema(request=None, responses={200: DeploymentSerializer(many=True)})
    @action(detail=True, methods=["post"], pagination_class=None)
    def rollback(self, request, pk=None):
        """Send the hosts this rollout moved back to their previous version; returns the rollback rollouts."""
        self._controlled(pk)
        started = rollouts.rollback_rollout(int(pk), actor=request.user)
        return Response([self._show(d.pk) for d in started])


class ModelInferenceView(APIView):
    """Try it: send one inference request to the model on a chosen host and get the outputs and latency."""

    required_scope = Scope.DEPLOY

    @extend_schema(request=InferenceRequestSerializer,
                   responses={200: InferenceResultSerializer, **error_responses(403, 404, 409, 503)},
                   description="Needs a maintainer of the model's team (token scope deploy). 503 when the host's "
                   "Triton cannot be reached or times out; retrying may help.")
    def post(self, request, model_name: str):
        data = InferenceRequestSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        model_for(Principal.of(request), model_name, Action.DEPLOY, doing="trying a model")
        result = try_inference(model_name=model_name, host_name=data.validated_data["host"],
                               inputs=data.validated_data["inputs"], version=data.validated_data["version"])
        return Response(result)


class ModelCaptureView(APIView):
    """A model's request capture on the Triton hosts that serve it: ``GET`` its settings and what each host
    holds (counts and times only: captured bodies never leave the hosts), ``PATCH`` changes the settings
    (owners of the model's team; audited) and sends them to those hosts."""

    @extend_schema(responses={200: CaptureSerializer, **error_responses(404)})
    def get(self, request, model_name: str):
        model = model_for(Principal.of(request), model_name)
        return Response(self._body(model, []))

    @extend_schema(request=CaptureUpdateSerializer, responses={200: CaptureSerializer, **error_responses(403, 404)},
                   description="Captured requests hold users' data: owners of the model's team only. `fraction` 0 "
                   "turns capture off and deletes what the hosts captured. 400 for a value out of range "
                   "(max_bytes above MODELYARD_CAPTURE_MAX_BYTES_LIMIT, retention outside 1 hour to "
                   "MODELYARD_CAPTURE_MAX_RETENTION_SECONDS). `warnings` names serving hosts that cannot capture.")
    def patch(self, request, model_name: str):
        data = CaptureUpdateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        model_for(Principal.of(request), model_name, Action.MANAGE_CAPTURE)
        model, warnings = set_capture(model_name=model_name, actor=Principal.of(request), **data.validated_data)
        return Response(self._body(model, warnings))

    @staticmethod
    def _body(model, warnings: list[str]) -> dict:
        panel = capture_panel(model)
        return {**panel["settings"], "hosts": panel["hosts"], "warnings": warnings}


PROFILES = Profile.objects.select_related("version__model", "host", "created_by").order_by("-id")


class VersionProfilesView(generics.ListCreateAPIView):
    """Performance profiles of one model version: ``GET`` lists them (newest first), ``POST`` starts one.

    A profile loads a copy of the version on the host under a name of its own for each config of the
    sweep and measures it with Triton's perf_analyzer (wrk for BentoML); the host's served models are
    not touched. One profile runs on a host at a time.
    """

    serializer_class = ProfileSerializer
    required_scope = Scope.DEPLOY
    ordering = "-id"

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # the schema generator, with no URL arguments
            return Profile.objects.none()
        model = model_for(Principal.of(self.request), self.kwargs["model_name"])
        return PROFILES.filter(version__model=model, version__version=self.kwargs["version"])

    @extend_schema(request=ProfileCreateSerializer, responses={202: ProfileSerializer,
                                                               **error_responses(403, 404, 409)},
                   description="Needs the rights of a rollout to the host (a maintainer; an owner on a "
                   "production host). 409 while another profile runs on the host, or when its agent is too old.")
    def post(self, request, model_name: str, version: int):
        data = ProfileCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        principal = Principal.of(request)
        model_for(principal, model_name)

        def authorize(model_version, hosts):
            require(principal, Action.DEPLOY, model=model_version.model, hosts=hosts)

        profile = profiles.start_profile(
            model_name=model_name, version=version, host_name=data.validated_data["host"],
            sweep=data.validated_data.get("sweep"), slo_p99_ms=data.validated_data.get("slo_p99_ms"),
            actor=request.user, authorize=authorize)
        return Response(ProfileSerializer(PROFILES.get(pk=profile.pk)).data, status=status.HTTP_202_ACCEPTED)


class ProfileViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Performance profiles of the models the principal may read; ``POST .../<id>/cancel/`` stops one."""

    serializer_class = ProfileSerializer
    required_scope = Scope.DEPLOY
    lookup_value_regex = "[0-9]+"
    ordering = "-id"
    queryset = PROFILES
    filterset_class = ProfileFilter

    def get_queryset(self):
        return scope_team_filter(Principal.of(self.request), self.queryset, "version__model__team")

    @extend_schema(request=None, responses={200: ProfileSerializer, **error_responses(403, 404, 409, 503)})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        """Stop the profile: a queued one at once, a running one within about a second (its copy is
        unloaded and the rows measured so far are kept). Rights as for starting it."""
        profile = self.get_object()
        require(Principal.of(request), Action.DEPLOY, model=profile.version.model, hosts=[profile.host])
        profiles.cancel_profile(profile.pk, actor=request.user)
        return Response(self.get_serializer(PROFILES.get(pk=profile.pk)).data)


REPLAYS = Replay.objects.select_related("version__model__team", "against", "host", "created_by").order_by("-id")


class VersionReplaysView(generics.ListCreateAPIView):
    """Replays of one candidate model version: ``GET`` lists them (newest first), ``POST`` starts one.

    A replay sends a model's captured requests (newest first, paced, one at a time) to the version a host
    serves and to a copy of the candidate loaded beside it, and compares the answers output by output.
    """

    serializer_class = ReplaySerializer
    required_scope = Scope.DEPLOY
    ordering = "-id"

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # the schema generator, with no URL arguments
            return Replay.objects.none()
        model = model_for(Principal.of(self.request), self.kwargs["model_name"])
        return REPLAYS.filter(version__model=model, version__version=self.kwargs["version"])

    @extend_schema(request=ReplayCreateSerializer, responses={202: ReplaySerializer,
                                                              **error_responses(403, 404, 409)},
                   description="Needs the rights of a rollout to the host (a maintainer; an owner on a production "
                   "host). 409 when no host serves the `against` version through a gateway holding captured "
                   "requests of the model, when the host's agent is older than protocol 5, or while another "
                   "replay runs on the host.")
    def post(self, request, model_name: str, version: int):
        data = ReplayCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        principal = Principal.of(request)
        model_for(principal, model_name)

        def authorize(model_version, hosts):
            require(principal, Action.DEPLOY, model=model_version.model, hosts=hosts)

        fields = data.validated_data
        replay = replays.start_replay(
            model_name=model_name, version=version, against=fields["against"], host_name=fields.get("host"),
            tolerances=fields.get("tolerances"), max_requests=fields.get("max_requests"), pace=fields.get("pace"),
            actor=request.user, authorize=authorize)
        return Response(ReplaySerializer(REPLAYS.get(pk=replay.pk), context={"request": request}).data,
                        status=status.HTTP_202_ACCEPTED)


class ReplayViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Replays of the models the principal may read (``worst`` for owners of the model's team only);
    ``POST .../<id>/cancel/`` stops one."""

    serializer_class = ReplaySerializer
    required_scope = Scope.DEPLOY
    lookup_value_regex = "[0-9]+"
    ordering = "-id"
    queryset = REPLAYS
    filterset_class = ReplayFilter

    def get_queryset(self):
        return scope_team_filter(Principal.of(self.request), self.queryset, "version__model__team")

    @extend_schema(request=None, responses={200: ReplaySerializer, **error_responses(403, 404, 409, 503)})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        """Stop the replay: a queued one at once, a running one within about a second (its copy is unloaded
        and what was compared so far is kept). Rights as for starting it."""
        replay = self.get_object()
        require(Principal.of(request), Action.DEPLOY, model=replay.version.model, hosts=[replay.host])
        replays.cancel_replay(replay.pk, actor=request.user)
        return Response(self.get_serializer(REPLAYS.get(pk=replay.pk)).data)
