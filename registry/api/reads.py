"""The registry API's hottest read, ``GET /api/v1/models/<name>/versions/<n>/`` (what a CI pipeline polls), in
one query and without building model instances or a ``ModelVersionSerializer``: the version's row, its model's
name and team, its creator's name, its aliases and ensemble members (array and ``jsonb_agg`` subqueries) and
the caller's role in the model's team (a scalar subquery), turned into the JSON the serializer gives by a plain
function. ``tests/registry/test_fast_reads.py`` holds the two equal, field by field, for every kind of version.

PostgreSQL only (array subqueries); elsewhere ``version_json`` returns None and the view takes the serializer's
path. Where the time went before, and after: ``bench/results/registry_profile.md``.
"""

from django.contrib.postgres.aggregates import JSONBAgg
from django.contrib.postgres.expressions import ArraySubquery
from django.db import connections
from django.db.models import CharField, F, JSONField, OuterRef, Subquery, Value
from django.db.models.functions import JSONObject
from rest_framework.fields import DateTimeField

from accounts.access import Principal
from accounts.models import Membership
from registry.choices import VersionStatus
from registry.models import Alias, EnsembleMember, ModelVersion, RegisteredModel

# DRF's own representation of a datetime (ISO 8601 in the settings' time zone), as the serializer's fields use.
_DATETIME = DateTimeField()

# ModelVersionSerializer's fields, in its order.
FIELDS = ("model", "version", "status", "format", "artifact_sha256", "artifact_size", "artifact_filename",
          "sha256_verified_at", "integrity_error", "signature", "ensemble_members", "aliases", "metadata", "tags",
          "source_commit", "ci_run_url", "training_data_uri", "metrics", "created_by", "created_at")
_COLUMNS = ("version", "status", "format", "artifact_sha256", "artifact_size", "artifact_filename",
            "sha256_verified_at", "integrity_error", "signature", "metadata", "tags", "source_commit", "ci_run_url",
            "training_data_uri", "metrics", "created_at")


def version_json(principal: Principal, model_name: str, number: int) -> tuple[RegisteredModel, dict] | None:
    """Version ``number`` of ``model_name`` as ``ModelVersionSerializer`` shows it, with its model (an unsaved
    ``RegisteredModel`` carrying ``pk``, ``name`` and ``team_id``, for the permission check), in one query; the
    caller's role in the model's team is recorded on ``principal`` (``Principal.note_role``), so the check
    that follows asks the database nothing more.

    Returns:
        ``(model, data)``, or None when there is no such live version or the database is not PostgreSQL (the
        caller then takes the serializer's path, which raises the usual NotFound).
    """
    query = ModelVersion.objects.filter(model__name=model_name, version=number).exclude(status=VersionStatus.DELETED)
    if connections[query.db].vendor != "postgresql":
        return None
    user = principal.user
    reads_membership = principal.is_authenticated and not user.is_staff
    role = (Subquery(Membership.objects.filter(user_id=user.pk, team_id=OuterRef("model__team_id"))
                     .values("role")[:1]) if reads_membership else Value(None, output_field=CharField()))
    members = (EnsembleMember.objects.filter(ensemble=OuterRef("pk")).values("ensemble")
               .annotate(rows=JSONBAgg(JSONObject(model="member__model__name", version="member__version",
                                                  requested_version="requested_version"),
                                       order_by="member__model__name"))
               .values("rows"))
    row = (query
           .annotate(_model_name=F("model__name"), _team_id=F("model__team_id"), _creator=F("created_by__username"),
                     _aliases=ArraySubquery(Alias.objects.filter(version=OuterRef("pk")).order_by("name")
                                            .values("name")),
                     _members=Subquery(members, output_field=JSONField()), _role=role)
           .values("model_id", "_model_name", "_team_id", "_creator", "_aliases", "_members", "_role", *_COLUMNS)
           .first())
    if row is None:
        return None
    if reads_membership:
        principal.note_role(row["_team_id"], row["_role"])
    data = {column: row[column] for column in _COLUMNS}
    data.update(model=row["_model_name"], created_by=row["_creator"], aliases=row["_aliases"],
                ensemble_members=row["_members"] or [],
                sha256_verified_at=_DATETIME.to_representation(row["sha256_verified_at"])
                if row["sha256_verified_at"] is not None else None,
                created_at=_DATETIME.to_representation(row["created_at"]))
    model = RegisteredModel(pk=row["model_id"], name=row["_model_name"], team_id=row["_team_id"])
    return model, {field: data[field] for field in FIELDS}
