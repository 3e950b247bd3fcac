"""The registry API's hottest reads without building model instances or serializers, each the JSON its
serializer gives, from rows the database hands back as they are:

- ``GET /api/v1/models/<name>/versions/<n>/`` (what a CI pipeline polls) in one query: the version's row, its
  model's name and team, its creator's name, its aliases and ensemble members (array and ``jsonb_agg``
  subqueries) and the caller's role in the model's team (a scalar subquery), in SQL written here. PostgreSQL
  only; elsewhere ``version_json`` returns None and the view takes the serializer's path.
- a page of ``GET /api/v1/models/<name>/versions/`` (``version_rows``, ``json_page``): on PostgreSQL the page's
  query writes each version's JSON as ``version_json`` gives it; elsewhere the serializer's path.
- a page of ``GET /api/v1/models/`` (``model_rows``, ``json_page``): on PostgreSQL each model's JSON is built by
  the page's query itself (``json_build_object``, datetimes written as DRF writes them), so no datetime, tag or
  row is turned into Python and back per request; elsewhere from ``values()`` rows (``model_json``).

``tests/registry/test_fast_reads.py`` holds each equal to its serializer's output, field by field. Where the
time went before, and after: ``bench/results/registry_profile.md``.
"""

import json
from datetime import datetime
from functools import cache

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connections, router
from django.db.models import F, TextField
from django.db.models.expressions import RawSQL
from django.utils import timezone
from rest_framework.fields import DateTimeField

from accounts.access import Principal
from accounts.models import Membership, Team
from registry.choices import VersionStatus
from registry.models import Alias, EnsembleMember, ModelVersion, RegisteredModel

# DRF's own representation of a datetime (ISO 8601 in the current time zone), as the serializer's fields use.
_DATETIME = DateTimeField()


def _iso(value: datetime | None) -> str | None:
    """``value`` as DRF's ``DateTimeField`` writes it: ISO 8601 in the time zone of the settings, ``Z`` for UTC.
    Nothing here activates another time zone per request, so the current one is always the settings' own; asking
    for it per value (``timezone.get_current_timezone``, through asgiref's context-local) took a tenth of a page
    of models. Values of another kind (a database that hands back text) take DRF's own path."""
    if not isinstance(value, datetime) or timezone.is_naive(value):
        return None if value is None else _DATETIME.to_representation(value)
    text = value.astimezone(_settings_zone()).isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


@cache
def _settings_zone():
    return timezone.get_default_timezone()

# ModelVersionSerializer's fields, in its order.
FIELDS = ("model", "version", "status", "format", "artifact_sha256", "artifact_size", "artifact_filename",
          "sha256_verified_at", "integrity_error", "signature", "ensemble_members", "aliases", "metadata", "tags",
          "source_commit", "ci_run_url", "training_data_uri", "metrics", "created_by", "created_at")
_COLUMNS = ("version", "status", "format", "artifact_sha256", "artifact_size", "artifact_filename",
            "sha256_verified_at", "integrity_error", "signature", "metadata", "tags", "source_commit", "ci_run_url",
            "training_data_uri", "metrics", "created_at")


@cache
def _version_sql(where: str, role: bool) -> str:
    """The query of ``version_json`` and ``versions_json``, over the tables' real names, for the versions
    ``where`` (a condition on ``v``, the version, and ``m``, its model) selects; params those of ``where`` and,
    with ``role``, ``user`` (the caller's id, or None), whose role in the model's team it reads (else NULL)."""
    version, model, alias = ModelVersion._meta.db_table, RegisteredModel._meta.db_table, Alias._meta.db_table
    member, membership = EnsembleMember._meta.db_table, Membership._meta.db_table
    user = get_user_model()._meta.db_table
    columns = ", ".join(f"v.{column}" for column in _COLUMNS)
    role_column = (f"(SELECT r.role FROM {membership} r WHERE r.user_id = %(user)s AND r.team_id = m.team_id LIMIT 1)"
                   if role else "NULL")
    return f"""
        SELECT v.model_id, m.name, m.team_id, u.username,
               ARRAY(SELECT a.name FROM {alias} a WHERE a.version_id = v.id ORDER BY a.name),
               (SELECT jsonb_agg(jsonb_build_object('model', mm.name, 'version', mv.version,
                                                    'requested_version', e.requested_version)
                                 ORDER BY mm.name, mv.version)
                  FROM {member} e JOIN {version} mv ON mv.id = e.member_id JOIN {model} mm ON mm.id = mv.model_id
                 WHERE e.ensemble_id = v.id),
               {role_column},
               {columns}, v.id
          FROM {version} v JOIN {model} m ON m.id = v.model_id LEFT JOIN {user} u ON u.id = v.created_by_id
         WHERE {where}"""


# The largest version number a column holds (PositiveIntegerField: PostgreSQL's integer).
MAX_VERSION = 2**31 - 1
_ONE = "m.name = %(name)s AND v.version = %(number)s AND v.status <> %(deleted)s"
_BY_IDS = "v.id = ANY(%(ids)s::bigint[]) AND v.status <> %(deleted)s"


_JSON_COLUMNS = {"signature", "metadata", "tags", "metrics"}


def _json(value):
    """A jsonb column as Python: Django's PostgreSQL backend has psycopg hand jsonb over as text."""
    return json.loads(value) if isinstance(value, str) else value


def version_json(principal: Principal, model_name: str, number: int) -> tuple[RegisteredModel, dict] | None:
    """Version ``number`` of ``model_name`` as ``ModelVersionSerializer`` shows it, with its model (an unsaved
    ``RegisteredModel`` carrying ``pk``, ``name`` and ``team_id``, for the permission check), in one query
    (hand-written SQL: the ORM took longer to build this query than PostgreSQL to answer it); the caller's role
    in the model's team is recorded on ``principal`` (``Principal.note_role``), so the check that follows asks
    the database nothing more.

    Returns:
        ``(model, data)``, or None when there is no such live version or the database is not PostgreSQL (the
        caller then takes the serializer's path, which raises the usual NotFound).
    """
    database = connections[router.db_for_read(ModelVersion)]
    if database.vendor != "postgresql" or not 0 < number <= MAX_VERSION:
        return None  # the usual path answers what cannot name a version (no such version, or the 400 it gives)
    user = principal.user
    reads_membership = principal.is_authenticated and not user.is_staff
    with database.cursor() as cursor:
        cursor.execute(_version_sql(_ONE, role=reads_membership),
                       {"user": user.pk, "name": model_name, "number": number, "deleted": VersionStatus.DELETED})
        row = cursor.fetchone()
    if row is None:
        return None
    model, role, data = _version_row(row)
    if reads_membership:
        principal.note_role(model.team_id, role)
    return model, data


def versions_json(ids: list[int]) -> list[dict] | None:
    """The versions of primary keys ``ids`` as ``ModelVersionSerializer`` shows them, in the order of ``ids``, in
    one query (a page of ``GET /api/v1/models/<name>/versions/``, whose permission check came before); None
    when the database is not PostgreSQL (the caller serializes the page itself)."""
    database = connections[router.db_for_read(ModelVersion)]
    if database.vendor != "postgresql":
        return None
    if not ids:
        return []
    with database.cursor() as cursor:
        cursor.execute(_version_sql(_BY_IDS, role=False), {"ids": list(ids), "deleted": VersionStatus.DELETED})
        rows = {row[-1]: _version_row(row)[2] for row in cursor.fetchall()}
    return [rows[pk] for pk in ids if pk in rows]  # one deleted since the page's keys were read is left out


def _version_row(row: tuple) -> tuple[RegisteredModel, str | None, dict]:
    """A row of ``_version_sql`` as (its model, the caller's role in the model's team, the version's JSON)."""
    model_id, name, team_id, creator, aliases, members, role, *values = row
    data = dict(zip((*_COLUMNS, "id"), values, strict=True))
    for column in _JSON_COLUMNS:
        data[column] = _json(data[column])
    data.update(model=name, created_by=creator, aliases=list(aliases), ensemble_members=_json(members) or [],
                sha256_verified_at=None if data["sha256_verified_at"] is None
                else _iso(data["sha256_verified_at"]),
                created_at=_iso(data["created_at"]))
    return RegisteredModel(pk=model_id, name=name, team_id=team_id), role, {field: data[field] for field in FIELDS}


# RegisteredModelSerializer's fields, in its order.
MODEL_FIELDS = ("name", "team", "description", "tags", "inference_key_required", "latest_version", "created_by",
                "created_at", "updated_at")


def _utc_text_sql(column: str) -> str:
    """SQL for the ``timestamptz`` ``column`` as the text DRF's ``DateTimeField`` writes for it in UTC (``_iso``):
    ISO 8601 with a ``Z``, the microseconds only where they are not 0 (as ``datetime.isoformat``); NULL stays
    NULL."""
    return (f"(to_char({column} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS') || CASE WHEN "
            f"mod(date_part('microseconds', {column})::bigint, 1000000) = 0 THEN '' "
            f"ELSE to_char({column} AT TIME ZONE 'UTC', '.US') END || 'Z')")


def _builds_json_in_sql(queryset) -> bool:
    """True where the page's JSON can be written by the database: PostgreSQL, with the settings' time zone UTC
    (``_utc_text_sql`` writes UTC only)."""
    return connections[queryset.db].vendor == "postgresql" and settings.TIME_ZONE == "UTC"


@cache
def _model_json_sql() -> str:
    """SQL for the JSON of the registered model a query's row is (the table's own name, as the ORM names a query's
    base table), as ``RegisteredModelSerializer`` shows it, in ``MODEL_FIELDS``' order: its team's and creator's
    names and its newest live version number in subqueries by key. Written here, not as ORM expressions: resolving
    and compiling those (two joins, a correlated subquery, nine pairs of ``json_build_object``) took half as long
    as PostgreSQL took to answer the page, on every request."""
    model, version, team = RegisteredModel._meta.db_table, ModelVersion._meta.db_table, Team._meta.db_table
    user = get_user_model()._meta.db_table
    m = f'"{model}"'
    values = {
        "name": f"{m}.name",
        "team": f"(SELECT t.name FROM {team} t WHERE t.id = {m}.team_id)",
        "description": f"{m}.description",
        "tags": f"{m}.tags",
        "inference_key_required": f"{m}.inference_key_required",
        # with_version_summary's latest_version: the newest version that is not deleted
        "latest_version": f"""(SELECT v.version FROM {version} v
                                WHERE v.model_id = {m}.id AND v.status <> '{VersionStatus.DELETED.value}'
                                ORDER BY v.version DESC LIMIT 1)""",
        "created_by": f"(SELECT u.username FROM {user} u WHERE u.id = {m}.created_by_id)",
        "created_at": _utc_text_sql(f"{m}.created_at"),
        "updated_at": _utc_text_sql(f"{m}.updated_at"),
    }
    assert tuple(values) == MODEL_FIELDS
    return "json_build_object(" + ", ".join(f"'{field}', {values[field]}" for field in MODEL_FIELDS) + ")::text"


def model_rows(queryset):
    """``queryset`` (registered models; elsewhere than PostgreSQL annotated ``with_version_summary``, filtered and
    ordered) as ``values()`` rows holding ``name`` (a cursor's position; the order is kept) and what ``json_page``
    needs: on PostgreSQL ``_json``, each model's JSON as ``RegisteredModelSerializer`` shows it, written by the
    query (``_model_json_sql``); elsewhere the columns ``model_json`` reads."""
    if _builds_json_in_sql(queryset):
        return queryset.select_related(None).values(
            "name", _json=RawSQL(_model_json_sql(), (), output_field=TextField()))
    return queryset.values("name", "description", "tags", "inference_key_required", "latest_version", "created_at",
                           "updated_at",
                           _team=F("team__name"), _creator=F("created_by__username"))


def model_json(row: dict) -> dict:
    """One row of ``model_rows`` as ``RegisteredModelSerializer`` shows the model."""
    if "_json" in row:
        return json.loads(row["_json"])
    return {"name": row["name"], "team": row["_team"], "description": row["description"], "tags": row["tags"],
            "inference_key_required": row["inference_key_required"],
            "latest_version": row["latest_version"], "created_by": row["_creator"],
            "created_at": _iso(row["created_at"]),
            "updated_at": _iso(row["updated_at"])}


def json_page(rows: list[dict], next_link: str | None, previous_link: str | None) -> bytes | None:
    """The body of a cursor-paginated page (``{"next", "previous", "results"}``, as the pagination's response
    gives it) from rows (``model_rows``, ``version_rows``) whose JSON the database wrote (``_json``), joined as
    they came (UTF-8); None for rows that carry no such JSON (the caller renders each row in Python)."""
    if rows and "_json" not in rows[0]:
        return None
    results = ",".join(row["_json"] for row in rows)
    return f'{{"next":{json.dumps(next_link)},"previous":{json.dumps(previous_link)},"results":[{results}]}}'.encode()


@cache
def _version_json_sql() -> str:
    """SQL for the JSON of the version a query's row is (the table's own name, as the ORM names a query's base
    table), as ``ModelVersionSerializer`` shows it: its model's and creator's names, aliases and ensemble members in
    subqueries by key, in ``FIELDS``' order (``json_build_object`` keeps the order given)."""
    version, model, alias = ModelVersion._meta.db_table, RegisteredModel._meta.db_table, Alias._meta.db_table
    member, user = EnsembleMember._meta.db_table, get_user_model()._meta.db_table
    v = f'"{version}"'
    values = {
        "model": f"(SELECT m.name FROM {model} m WHERE m.id = {v}.model_id)",
        **{column: f"{v}.{column}" for column in _COLUMNS},
        "sha256_verified_at": _utc_text_sql(f"{v}.sha256_verified_at"),
        "created_at": _utc_text_sql(f"{v}.created_at"),
        "ensemble_members": f"""COALESCE((
            SELECT json_agg(json_build_object('model', mm.name, 'version', mv.version,
                                              'requested_version', e.requested_version) ORDER BY mm.name, mv.version)
              FROM {member} e JOIN {version} mv ON mv.id = e.member_id JOIN {model} mm ON mm.id = mv.model_id
             WHERE e.ensemble_id = {v}.id), '[]'::json)""",
        "aliases": f"to_json(ARRAY(SELECT a.name FROM {alias} a WHERE a.version_id = {v}.id ORDER BY a.name))",
        "created_by": f"(SELECT u.username FROM {user} u WHERE u.id = {v}.created_by_id)",
    }
    return "json_build_object(" + ", ".join(f"'{field}', {values[field]}" for field in FIELDS) + ")::text"


def version_rows(queryset):
    """``queryset`` (one model's live versions, filtered and ordered by version) as ``values()`` rows holding
    ``version`` (a cursor's position) and ``_json``, each version's JSON as ``ModelVersionSerializer`` shows it,
    written by the query (``_version_json_sql``); None where the database cannot write it (see
    ``_builds_json_in_sql``)."""
    if not _builds_json_in_sql(queryset):
        return None
    return queryset.select_related(None).prefetch_related(None).values(
        "version", _json=RawSQL(_version_json_sql(), (), output_field=TextField()))
