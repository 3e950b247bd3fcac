"""The API token a request presents, with its user and its team, in one query whose SQL is built once per process.

Every API request looks its token up (``accounts.authentication``). Through the ORM
(``ApiToken.objects.select_related("user", "team").filter(prefix=...).first()``) building that query took
longer than the database took to answer it: py-spy of a gunicorn worker answering ``GET /api/v1/whoami/``
found 60 % of the request in authentication, two thirds of that in compiling the query
(``bench/results/registry_profile.md``). This module builds the same SQL once, from the models' own
metadata, and turns the row into the same three model instances (``modelyard.prebuilt``).
"""

from functools import cache

from django.contrib.auth import get_user_model
from django.db import connections, router

from accounts.models import ApiToken, Team
from modelyard.prebuilt import Columns


@cache
def _query(alias: str) -> tuple[str, tuple[Columns, Columns, Columns]]:
    """The SQL for database ``alias`` (one parameter: the prefix) and the columns of the token, its user and its
    team, in the SQL's column order."""
    connection = connections[alias]
    quote = connection.ops.quote_name
    user_model = get_user_model()
    parts = (Columns.of(ApiToken, "t", connection), Columns.of(user_model, "u", connection),
             Columns.of(Team, "g", connection))
    token = ApiToken._meta
    sql = (f"SELECT {', '.join(part.sql for part in parts)} FROM {quote(token.db_table)} t"
           f" JOIN {quote(user_model._meta.db_table)} u"
           f" ON u.{quote(user_model._meta.pk.column)} = t.{quote(token.get_field('user').column)}"
           f" LEFT JOIN {quote(Team._meta.db_table)} g"
           f" ON g.{quote(Team._meta.pk.column)} = t.{quote(token.get_field('team').column)}"
           f" WHERE t.{quote(token.get_field('prefix').column)} = %s")
    return sql, parts


def token_by_prefix(prefix: str) -> ApiToken | None:
    """The token whose prefix is ``prefix``, its ``user`` and ``team`` loaded (no query when read), or None.
    One query; the same instances as ``ApiToken.objects.select_related("user", "team").filter(prefix=prefix)``.
    """
    alias = router.db_for_read(ApiToken)
    connection = connections[alias]
    sql, (token_columns, user_columns, team_columns) = _query(alias)
    with connection.cursor() as cursor:
        cursor.execute(sql, [prefix])
        row = cursor.fetchone()
    if row is None:
        return None
    first_user, first_team = len(token_columns), len(token_columns) + len(user_columns)
    token = token_columns.instance(alias, row[:first_user], connection)
    user = user_columns.instance(alias, row[first_user:first_team], connection)
    ApiToken.user.field.set_cached_value(token, user)
    team = None
    if token.team_id is not None:
        team = team_columns.instance(alias, row[first_team:], connection)
    ApiToken.team.field.set_cached_value(token, team)
    return token
