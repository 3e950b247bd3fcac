"""Model instances from hand-written SQL that is built once per process, for the reads every request makes.

Through the ORM, building and compiling a query that joins two or three tables takes longer than the database
takes to answer it: py-spy of a gunicorn worker found two thirds of an API token's lookup in compiling its
query, and a model's lookup with the caller's role cost as much again (``bench/results/registry_profile.md``).
The hottest lookups (``accounts.token_lookup``, ``registry.registered_models.get_model``) write their SQL once
from the models' own metadata (``Columns``) and turn a row into the same instances the ORM would load, through
each field's database converters, so JSON columns and datetimes read exactly as the ORM reads them, on
PostgreSQL as on SQLite.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Columns:
    """The concrete fields of ``model`` read from the table aliased ``table`` in a query on one database:
    ``sql`` their column expressions (comma separated, in the fields' order) and, per field, its attribute
    name, its column and its converters."""

    model: type
    sql: str
    fields: tuple

    @classmethod
    def of(cls, model, table: str, connection) -> "Columns":
        """``model``'s columns in a query that names its table ``table``, on ``connection``."""
        quote = connection.ops.quote_name
        fields, columns = [], []
        for field in model._meta.concrete_fields:
            columns.append(f"{table}.{quote(field.column)}")
            column = field.get_col(model._meta.db_table)
            fields.append((field.attname, column,
                           tuple(connection.ops.get_db_converters(column) + column.get_db_converters(connection))))
        return cls(model, ", ".join(columns), tuple(fields))

    def __len__(self) -> int:
        return len(self.fields)

    def instance(self, alias: str, values, connection):
        """The instance the ORM would load from ``values`` (one per field, in order) read from database
        ``alias``."""
        converted = []
        for (_, column, converters), value in zip(self.fields, values, strict=True):
            for convert in converters:
                value = convert(value, column, connection)
            converted.append(value)
        return self.model.from_db(alias, [attname for attname, _, _ in self.fields], converted)
