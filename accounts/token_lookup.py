"""The API token a request presents, with its user and its team, in one query whose SQL is built once per process.

Every API request looks its token up (``accounts.authentication``). Through the ORM
(``ApiToken.objects.select_related("user", "team").filter(prefix=...).first()``) building that query took
longer than the database took to answer it: py-spy of a gunicorn worker answering ``GET /api/v1/whoami/``
found 60 % of the request in authentication, two thirds of that in compiling the query
(``bench/results/registry_profile.md``). This module builds the same SQL once, from the models' own
metadata, and turns the row into the same three model instances through each field's database converters,
so JSON columns and datetimes read exactly as the ORM reads them, on PostgreSQL as on SQLite.
"""

from functools import cache

from django.contrib.auth import get_user_model
from django.db import connections, router

from accounts.models import ApiToken, Team


@cache
def _query(alias: str) -> tuple[str, tuple[tuple, ...]]:
    """The SQL for database ``alias`` (one parameter: the prefix) and, per model (token, user, team), its
    concrete fields with each one's column expression and converters, in the SQL's column order."""
    connection = connections[alias]
    quote = connection.ops.quote_name
    user_model = get_user_model()
    parts = []
    columns = []
    for table, model in (("t", ApiToken), ("u", user_model), ("g", Team)):
        fields = []
        for field in model._meta.concrete_fields:
            columns.append(f"{table}.{quote(field.column)}")
            column = field.get_col(model._meta.db_table)
            fields.append((field.attname, column,
                           tuple(connection.ops.get_db_converters(column) + column.get_db_converters(connection))))
        parts.append(tuple(fields))
    token = ApiToken._meta
    sql = (f"SELECT {', '.join(columns)} FROM {quote(token.db_table)} t"
           f" JOIN {quote(user_model._meta.db_table)} u"
           f" ON u.{quote(user_model._meta.pk.column)} = t.{quote(token.get_field('user').column)}"
           f" LEFT JOIN {quote(Team._meta.db_table)} g"
           f" ON g.{quote(Team._meta.pk.column)} = t.{quote(token.get_field('team').column)}"
           f" WHERE t.{quote(token.get_field('prefix').column)} = %s")
    return sql, tuple(parts)


def _instance(model, alias: str, fields: tuple, values: tuple, connection):
    """``model`` as the ORM would load it from ``values`` (one per concrete field, in order)."""
    converted = []
    for (_, column, converters), value in zip(fields, values, strict=True):
        for convert in converters:
            value = convert(value, column, connection)
        converted.append(value)
    return model.from_db(alias, [attname for attname, _, _ in fields], converted)


def token_by_prefix(prefix: str) -> ApiToken | None:
    """The token whose prefix is ``prefix``, its ``user`` and ``team`` loaded (no query when read), or None.
    One query; the same instances as ``ApiToken.objects.select_related("user", "team").filter(prefix=prefix)``.
    """
    alias = router.db_for_read(ApiToken)
    connection = connections[alias]
    sql, (token_fields, user_fields, team_fields) = _query(alias)
    with connection.cursor() as cursor:
        cursor.execute(sql, [prefix])
        row = cursor.fetchone()
    if row is None:
        return None
    first_user, first_team = len(token_fields), len(token_fields) + len(user_fields)
    token = _instance(ApiToken, alias, token_fields, row[:first_user], connection)
    user = _instance(get_user_model(), alias, user_fields, row[first_user:first_team], connection)
    ApiToken.user.field.set_cached_value(token, user)
    team = None
    if token.team_id is not None:
        team = _instance(Team, alias, team_fields, row[first_team:], connection)
    ApiToken.team.field.set_cached_value(token, team)
    return token
