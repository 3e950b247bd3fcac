"""Registry API: models and their versions."""

from functools import cache

import django_filters
from django.db import transaction
from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import exceptions, mixins, status, viewsets
from rest_framework.parsers import FormParser, JSONParser, MultiPartParser
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.access import Action, Principal, can_see, require, scope_team_filter, team_for_new_model
from audit.models import AuditEvent
from modelyard.api import error_responses, uploaded_file_path
from modelyard.conditional import entity_tag, precondition_from
from modelyard.errors import NotFound
from modelyard_agent.formats.names import RESERVED_ALIASES
from registry import cards
from registry.access import model_for
from registry.aliases import current_alias, delete_alias, protect_alias, resolve_alias, set_alias
from registry.api.reads import (
    MAX_VERSION,
    json_page,
    model_json,
    model_rows,
    version_json,
    version_rows,
    versions_json,
)
from registry.api.serializers import (
    AliasProtectSerializer,
    AliasSerializer,
    AliasSetSerializer,
    AuditEventSerializer,
    ModelCardSerializer,
    ModelCardUpdateSerializer,
    ModelVersionSerializer,
    ModelVersionUploadSerializer,
    RegisteredModelCreateSerializer,
    RegisteredModelSerializer,
    RegisteredModelUpdateSerializer,
)
from registry.choices import VersionStatus
from registry.deletion import delete_version
from registry.filters import ModelVersionFilter, RegisteredModelFilter, UtcIsoDateTimeFilter
from registry.inference_keys import require_inference_key
from registry.models import Alias, ModelVersion, RegisteredModel
from registry.registered_models import create_model, update_model
from registry.versions import get_version, register_version


@cache
def _models_with_summary():
    """Registered models with their creator and team joined and ``with_version_summary``'s annotations: built once
    per process (resolving the two correlated subqueries took a tenth of a page of models), cloned per request."""
    return RegisteredModel.objects.select_related("created_by", "team").with_version_summary()


def _compact_json(request) -> bool:
    """Whether the answer is plain JSON, which a page the database wrote can be: not another renderer (the
    browsable API), nor JSON with an ``indent`` the client asked for (``Accept: application/json; indent=4``),
    which DRF's renderer honours."""
    return request.accepted_renderer.format == "json" and "indent" not in (request.accepted_media_type or "")


@cache
def _model_rows():
    """``model_rows`` of every registered model, built once per process (on PostgreSQL from the bare table: the
    page's JSON names the team, the creator and the newest version itself; elsewhere from
    ``_models_with_summary``); cloned, filtered and ordered per request (filters and ordering apply to ``values()``
    rows as to models)."""
    return model_rows(_models_with_summary())


@cache
def _live_version_rows():
    """``version_rows`` of every model's live versions, newest first, built once per process (the exclusion of
    deleted versions and the page's JSON expression resolved once); cloned, filtered (the model, the caller's
    teams, the query string's filters, which apply to ``values()`` rows as to versions) and paginated per
    request. None where the database cannot write the page."""
    return version_rows(ModelVersion.objects.exclude(status=VersionStatus.DELETED).order_by("-version"))


class RegisteredModelViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin, viewsets.GenericViewSet
):
    """Registered models, looked up by name."""

    serializer_class = RegisteredModelSerializer
    filterset_class = RegisteredModelFilter
    lookup_field = "name"
    lookup_value_regex = "[^/]+"
    ordering = "name"

    def get_queryset(self):
        models = _models_with_summary().all()  # a clone of the query built once, its subqueries resolved
        return scope_team_filter(Principal.of(self.request), models).order_by("name")

    def list(self, request, *args, **kwargs):
        """A page of models, built from ``values()`` rows rather than model instances and a serializer: as JSON,
        the body the database wrote (``registry.api.reads.json_page``); for another renderer (the browsable
        API), or where the database cannot write it, from ``model_json`` of each row, which gives what
        ``RegisteredModelSerializer`` would."""
        models = scope_team_filter(Principal.of(request), _model_rows().all()).order_by("name")
        page = self.paginate_queryset(self.filter_queryset(models))
        if _compact_json(request):
            body = json_page(page, self.paginator.get_next_link(), self.paginator.get_previous_link())
            if body is not None:
                return HttpResponse(body, content_type="application/json")
        return self.get_paginated_response([model_json(row) for row in page])

    def get_object(self):
        model = model_for(Principal.of(self.request), self.kwargs["name"])  # a NotFound that names the model
        return self.get_queryset().get(pk=model.pk)

    @extend_schema(request=RegisteredModelUpdateSerializer,
                   responses={200: RegisteredModelSerializer, **error_responses(403, 404)})
    def partial_update(self, request, *args, **kwargs):
        data = RegisteredModelUpdateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        fields = dict(data.validated_data)
        required = fields.pop("inference_key_required", None)
        principal = Principal.of(request)
        model_for(principal, self.kwargs["name"], Action.CHANGE)
        if required is not None:
            model_for(principal, self.kwargs["name"], Action.MANAGE_INFERENCE_KEYS)
        with transaction.atomic():
            model = update_model(name=self.kwargs["name"], actor=request.user, **fields)
            if required is not None:
                model = require_inference_key(name=model.name, required=required, actor=request.user)
        return Response(RegisteredModelSerializer(self.get_queryset().get(pk=model.pk)).data)

    @extend_schema(request=RegisteredModelCreateSerializer,
                   responses={201: RegisteredModelSerializer, **error_responses(403, 409)})
    def create(self, request, *args, **kwargs):
        data = RegisteredModelCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        fields = dict(data.validated_data)
        team = team_for_new_model(Principal.of(request), fields.pop("team"))
        model = create_model(actor=request.user, team=team, **fields)
        model = self.get_queryset().get(pk=model.pk)
        return Response(RegisteredModelSerializer(model).data, status=status.HTTP_201_CREATED)


class ModelVersionViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin, viewsets.GenericViewSet
):
    """Versions of one registered model, looked up by number."""

    serializer_class = ModelVersionSerializer
    filterset_class = ModelVersionFilter
    lookup_field = "version"
    lookup_value_regex = "[0-9]+"
    parser_classes = [MultiPartParser, FormParser, JSONParser]
    ordering = "-version"

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation has no URL kwargs
            return ModelVersion.objects.none()
        model = model_for(Principal.of(self.request), self.kwargs["model_name"])
        return (
            ModelVersion.objects.filter(model=model)
            .exclude(status=VersionStatus.DELETED)
            .select_related("model", "created_by")
            .prefetch_related("members__member__model", "aliases")
            .order_by("-version")
        )

    def _readable_version_rows(self):
        """``version_rows`` of the named model's live versions that the caller may read, newest first, in one query
        with the page (the model's own lookup, ``get_queryset``, is left for a page that comes back empty); None
        where the database cannot write the page."""
        rows = _live_version_rows()
        if rows is None:
            return None
        rows = rows.filter(model__name=self.kwargs["model_name"])
        return scope_team_filter(Principal.of(self.request), rows, "model__team")

    def list(self, request, *args, **kwargs):
        """A page of the model's versions. As JSON on PostgreSQL, the body the page's query wrote
        (``registry.api.reads.version_rows``); for another renderer (the browsable API), the page's keys first,
        then its rows with their aliases and ensemble members in one query without the serializer
        (``registry.api.reads.versions_json``); elsewhere through the serializer."""
        try:
            rows = self._readable_version_rows() if _compact_json(request) else None
            page = self.paginate_queryset(self.filter_queryset(rows)) if rows is not None else None
        except (exceptions.NotFound, exceptions.ValidationError):  # an invalid cursor, filter or page size
            # An unknown or hidden model is named as such, whatever the query string: as it is on the path that
            # looks the model up first (another renderer, a database that does not write the page).
            self.get_queryset()
            raise
        if rows is not None:
            if not page:  # no version the caller may read: the model's check tells why, or it has none
                self.get_queryset()
            return HttpResponse(json_page(page, self.paginator.get_next_link(), self.paginator.get_previous_link()),
                                content_type="application/json")
        queryset = self.filter_queryset(self.get_queryset())
        page = self.paginate_queryset(queryset.select_related(None).prefetch_related(None).values("pk", "version"))
        rows = versions_json([row["pk"] for row in page])
        if rows is None:
            rows = self.get_serializer(queryset.filter(pk__in=[row["pk"] for row in page]), many=True).data
        return self.get_paginated_response(rows)

    def retrieve(self, request, *args, **kwargs):
        """One version; its ``ETag`` (``version_etag`` of the body) goes back in ``If-None-Match`` (304) or
        ``If-Match``.

        On PostgreSQL the version, its model, aliases, ensemble members and the caller's role come in one query,
        without the serializer (``registry.api.reads``); elsewhere the version, its model and the model's team
        come in one query (``get_object`` would look the model up first). A version that is not found, or a
        model the principal may not read, goes the usual way for the same 404 as every other path.
        """
        principal = Principal.of(request)
        fast = version_json(principal, self.kwargs["model_name"], int(self.kwargs["version"]))
        if fast is not None and can_see(principal, fast[0]):
            require(principal, Action.VIEW, model=fast[0])
            return _with_etag(Response(fast[1]), version_etag(fast[1]))
        if int(self.kwargs["version"]) > MAX_VERSION:  # (a NUL in a path is refused by NulPathMiddleware)
            self.get_object()  # raises the NotFound naming the model or the version, without a query that fails
        found = (
            ModelVersion.objects.filter(model__name=self.kwargs["model_name"], version=int(self.kwargs["version"]))
            .exclude(status=VersionStatus.DELETED)
            .select_related("model__team", "created_by")
            .prefetch_related("members__member__model", "aliases")
            .first()
        )
        if found is None or not can_see(principal, found.model):
            found = self.get_object()  # raises the NotFound naming the model or the version
        require(principal, Action.VIEW, model=found.model)
        data = self.get_serializer(found).data
        return _with_etag(Response(data), version_etag(data))

    def get_object(self):
        number = int(self.kwargs["version"])
        found = self.get_queryset().filter(version=number).first()  # the model's check is in get_queryset
        if found is None:  # the same NotFound as the service's, also for a deleted version
            raise NotFound(f"model {self.kwargs['model_name']!r} has no version {number}")
        return found

    @extend_schema(request=ModelVersionUploadSerializer,
                   responses={201: ModelVersionSerializer, **error_responses(403, 404, 409, 503)},
                   description="503 when S3 cannot store the artifact (nothing is registered; retry).")
    def create(self, request, *args, **kwargs):
        model = model_for(Principal.of(request), self.kwargs["model_name"], Action.CHANGE)
        data = ModelVersionUploadSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        upload = data.validated_data["artifact"]
        with uploaded_file_path(upload) as path:
            fields = data.validated_data
            version = register_version(
                model=model, artifact_path=path, filename=upload.name, metadata=fields["metadata"],
                tags=fields["tags"], actor=request.user, signature=fields.get("signature"),
                max_batch_size=fields.get("max_batch_size"),
                lineage={key: fields[key] for key in ("source_commit", "ci_run_url", "training_data_uri", "metrics")},
            )
        return Response(ModelVersionSerializer(version).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        responses={204: None, **error_responses(403, 404, 409, 412)},
        description="Soft-delete a version (owners of the model's team, and the maintainer who registered it): "
        "its aliases go with it "
        "in the same transaction, its number is never reused, and its artifact is removed from S3 by the next "
        "garbage collection once no live version shares it. 409 while an ensemble composes it or a host "
        "serves it; deleting it again is a 404. With `If-Match` (the `ETag` of its GET), only if it has not "
        "changed since (412 otherwise).",
    )
    def destroy(self, request, *args, **kwargs):
        principal = Principal.of(request)
        version = get_version(self.kwargs["model_name"], int(self.kwargs["version"]), visible_to=principal)
        require(principal, Action.DELETE_VERSION, model=version.model, version=version)
        check = precondition_from(request, f"{self.kwargs['model_name']} v{self.kwargs['version']}")
        delete_version(model_name=self.kwargs["model_name"], version=int(self.kwargs["version"]),
                       actor=request.user, precondition=None if check is None else (
                           lambda current: check(version_etag(ModelVersionSerializer(current).data))))
        return Response(status=status.HTTP_204_NO_CONTENT)


class AliasListView(APIView):
    """``GET /api/v1/models/<name>/aliases/``: every alias of a model (``latest`` is not stored)."""

    @extend_schema(responses={200: AliasSerializer(many=True), **error_responses(404)})
    def get(self, request, model_name: str):
        model = model_for(Principal.of(request), model_name)
        aliases = Alias.objects.filter(model=model).select_related("model", "version", "updated_by")
        return Response(AliasSerializer(aliases, many=True).data)


def version_etag(data: dict) -> str:
    """The entity tag of ``GET .../versions/<n>/`` (``modelyard.conditional``): of ``data``, the version's
    JSON (``ModelVersionSerializer``'s output)."""
    return entity_tag("version", data)


def alias_etag(alias: Alias | None) -> str | None:
    """The entity tag of ``GET .../aliases/<alias>/`` (``modelyard.conditional``): the alias's state (the
    version it names, whether it is locked, when it last changed) and the JSON of that version, so it
    changes whenever that answer would; None for an alias that does not exist."""
    if alias is None:
        return None
    return entity_tag("alias", alias.pk, alias.version_id, alias.protected, alias.updated_at.isoformat(),
                      ModelVersionSerializer(alias.version).data)


def _alias_precondition(request, model_name: str, alias: str):
    """The service's ``precondition`` for ``request``'s ``If-Match`` on an alias, or None without one."""
    check = precondition_from(request, f"alias {alias!r} of {model_name!r}")
    return None if check is None else (lambda current: check(alias_etag(current)))


def _with_etag(response: Response, etag: str | None) -> Response:
    if etag is not None:
        response["ETag"] = etag
    return response


IF_MATCH = ("Send the `ETag` of the alias's last GET, PUT or PATCH in `If-Match` to change it only if nobody did "
            "since (412 `precondition_failed` otherwise, and nothing changes).")


class AliasDetailView(APIView):
    """One alias: ``GET`` resolves it (``latest`` too), ``PUT {"version": n}`` sets or moves it,
    ``PATCH {"protected": true}`` locks or unlocks it, ``DELETE`` removes it. Every change is an audit
    event. Every answer about a stored alias carries its ``ETag`` (the alias's state: the version it
    names, whether it is locked), which ``If-Match`` sends back to make a change a compare-and-set."""

    @extend_schema(responses={200: ModelVersionSerializer, **error_responses(404)},
                   description="The version the alias names; `ETag` is the alias's state, for `If-Match` on a "
                   "later PUT, PATCH or DELETE. For `latest`, which is not stored and cannot be moved, the `ETag` is "
                   "the digest of the answer, as on every GET, for `If-None-Match` only.")
    def get(self, request, model_name: str, alias: str):
        model = model_for(Principal.of(request), model_name)
        if alias in RESERVED_ALIASES:  # latest: resolved, not stored (its ETag is the body's digest)
            return Response(ModelVersionSerializer(resolve_alias(model_name, alias)).data)
        # The body and its ETag from one read of the alias: read apart, a move between the two reads gave the old
        # version with the new state's ETag, so an If-Match move "away" from the version shown could be no move.
        row = current_alias(model, alias)
        if row is None or row.version.status == VersionStatus.DELETED:
            raise NotFound(f"model {model_name!r} has no alias {alias!r}")
        return _with_etag(Response(ModelVersionSerializer(row.version).data), alias_etag(row))

    @extend_schema(request=AliasSetSerializer, responses={200: AliasSerializer, **error_responses(403, 404, 412)},
                   description="Moving a production alias (MODELYARD_PRODUCTION_ALIASES) needs a team owner; moving "
                   "a protected alias needs a team owner and a `reason` (400 without one). Both are in the audit "
                   "log. " + IF_MATCH + " `If-Match: *` moves it only if it exists.")
    def put(self, request, model_name: str, alias: str):
        data = AliasSetSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        model_for(Principal.of(request), model_name, Action.MOVE_ALIAS, alias=alias)
        row = set_alias(
            model_name=model_name, alias=alias, version=data.validated_data["version"], actor=request.user,
            reason=data.validated_data["reason"], precondition=_alias_precondition(request, model_name, alias),
        )
        return self._answer(row)

    @extend_schema(request=AliasProtectSerializer, responses={200: AliasSerializer, **error_responses(403, 404, 412)},
                   description="Lock (`protected: true`) or unlock an alias: team owners only; audited. " + IF_MATCH)
    def patch(self, request, model_name: str, alias: str):
        data = AliasProtectSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        model_for(Principal.of(request), model_name, Action.PROTECT_ALIAS, alias=alias)
        row = protect_alias(model_name=model_name, alias=alias, actor=Principal.of(request),
                            precondition=_alias_precondition(request, model_name, alias), **data.validated_data)
        return self._answer(row)

    @staticmethod
    def _answer(row: Alias) -> Response:
        row = Alias.objects.select_related("model", "version", "updated_by").get(pk=row.pk)
        return _with_etag(Response(AliasSerializer(row).data), alias_etag(row))

    @extend_schema(responses={204: None, **error_responses(403, 404, 409, 412)},
                   description="409 while the alias is protected: an owner unlocks it first. " + IF_MATCH)
    def delete(self, request, model_name: str, alias: str):
        model_for(Principal.of(request), model_name, Action.MOVE_ALIAS, alias=alias)
        delete_alias(model_name=model_name, alias=alias, actor=request.user,
                     precondition=_alias_precondition(request, model_name, alias))
        return Response(status=status.HTTP_204_NO_CONTENT)


class AuditEventFilter(django_filters.FilterSet):
    """Filters of the audit log: action, model name, actor, object type and a time range."""

    action = django_filters.CharFilter(field_name="action")
    model = django_filters.CharFilter(field_name="model__name")
    actor = django_filters.CharFilter(field_name="actor_label")
    object_type = django_filters.CharFilter(field_name="object_type")
    since = UtcIsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    until = UtcIsoDateTimeFilter(field_name="created_at", lookup_expr="lt")

    class Meta:
        model = AuditEvent
        fields = ["action", "model", "actor", "object_type", "since", "until"]


class AuditEventViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """``GET /api/v1/audit/``: every change, newest first, cursor-paginated and filterable."""

    serializer_class = AuditEventSerializer
    filterset_class = AuditEventFilter
    ordering = "-id"

    def get_queryset(self):
        """Events of the models the principal may read; events of no model (hosts, webhooks, teams) only
        for administrators."""
        events = AuditEvent.objects.select_related("model").order_by("-id")
        principal = Principal.of(self.request)
        if principal.is_admin:
            return events
        return scope_team_filter(principal, events.filter(model__isnull=False), "model__team")


class ModelCardView(APIView):
    """``GET`` a version's model card, ``PATCH`` some of its fields (maintainers; audited)."""

    @extend_schema(responses={200: ModelCardSerializer, **error_responses(404)})
    def get(self, request, model_name: str, version: int):
        found = get_version(model_name, version, visible_to=Principal.of(request))
        return Response(ModelCardSerializer(cards.card_of(found)).data)

    @extend_schema(request=ModelCardUpdateSerializer,
                   responses={200: ModelCardSerializer, **error_responses(403, 404)},
                   description="Set the given fields (the others stay); 400 naming a field that breaks its rule. "
                   "Every change is an audit event (version.card_updated) with the fields before and after.")
    def patch(self, request, model_name: str, version: int):
        data = ModelCardUpdateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        model_for(Principal.of(request), model_name, Action.CHANGE)
        found = get_version(model_name, version)
        # The raw values, so a value the serializer would coerce (a "0.9" string) is refused by the service.
        fields = {key: request.data[key] for key in data.validated_data}
        return Response(ModelCardSerializer(cards.update_card(found, actor=request.user, **fields)).data)


class ModelCardReadmeView(APIView):
    """``GET`` a version's model card as a README.md with YAML front matter (``text/markdown``)."""

    @extend_schema(responses={(200, "text/markdown"): OpenApiResponse(OpenApiTypes.STR, description="README.md"),
                              **error_responses(404)})
    def get(self, request, model_name: str, version: int):
        found = get_version(model_name, version, visible_to=Principal.of(request))
        return HttpResponse(cards.readme(cards.card_of(found)), content_type="text/markdown; charset=utf-8")
