"""Fill an MLflow model registry database for bench/registry_vs_mlflow.py (run with MLflow's own venv).

MLflow's ``SqlAlchemyStore`` creates its schema (its own migrations); a sample of models and
versions is created through the store's public API and timed, then the rest is inserted in bulk
through MLflow's own SQLAlchemy tables (the rows the public API writes: a registered model, its
tags, its versions with status READY and their tag ``stage=bench``), since 50,000 API calls would take most of
an hour here. The bulk rows go in with PostgreSQL's ``COPY`` through the store's own connection (``copy_rows``):
SQLAlchemy's executemany took 1,448 s for 100k models × 10 versions here (2026-12-06), which put the whole
benchmark past its 40 minutes.
Prints one JSON object with the timings.

Usage: python bench/mlflow_populate.py DB_URI MODELS VERSIONS TEAMS
"""

import io
import json
import sys
import time

from mlflow.store.model_registry.dbmodels.models import (
    SqlModelVersion,
    SqlModelVersionTag,
    SqlRegisteredModel,
    SqlRegisteredModelTag,
)
from mlflow.store.model_registry.sqlalchemy_store import SqlAlchemyStore
from sqlalchemy import insert

API_SAMPLE = 100
CHUNK = 5000


def _csv_field(value) -> str:
    """``value`` as a field of PostgreSQL's CSV format: NULL unquoted and empty, anything else quoted (so an empty
    string stays one)."""
    if value is None:
        return ""
    return '"' + str(value).replace('"', '""') + '"'


def copy_rows(session, table, rows: list[dict]) -> None:
    """Write ``rows`` (column name -> value) into ``table`` with ``COPY ... FROM STDIN``, on the session's
    connection (psycopg2's ``copy_expert``), with the Python-side defaults the ORM's INSERT would have added for
    the columns a row leaves out (``insert(table).values(row)``'s compiled parameters; a default computed by a
    callable is left to the column's server default)."""
    compiled = insert(table).values(rows[0]).compile(dialect=session.get_bind().dialect)
    defaults = {key: value for key, value in compiled.params.items()
                if key not in rows[0] and key in table.c and value is not None}  # None: a callable's, left to the
    # column's server default (MLflow's "workspace" is 'default' either way)
    columns = [*rows[0], *defaults]
    text = "".join(",".join(_csv_field(row[c] if c in row else defaults[c]) for c in columns) + "\n" for row in rows)
    names = ", ".join(f'"{table.c[c].name}"' for c in columns)
    cursor = session.connection().connection.cursor()
    cursor.copy_expert(f'COPY "{table.name}" ({names}) FROM STDIN WITH (FORMAT csv)', io.StringIO(text))


def main(db_uri: str, models: int, versions: int, teams: int) -> dict:
    started = time.perf_counter()
    store = SqlAlchemyStore(db_uri)
    schema_s = time.perf_counter() - started

    def name(i: int) -> str:
        return f"model-{i:05d}"

    from mlflow.entities.model_registry import ModelVersionTag, RegisteredModelTag

    started = time.perf_counter()
    for i in range(API_SAMPLE):
        store.create_registered_model(name(i), tags=[RegisteredModelTag("team", f"team-{i % teams}")])
        for v in range(1, versions + 1):
            store.create_model_version(name(i), source=f"s3://bench/{name(i)}/{v}",
                                       tags=[ModelVersionTag("stage", "bench")])
    api_s = time.perf_counter() - started

    now = int(time.time() * 1000)
    started = time.perf_counter()
    with store.ManagedSessionMaker() as session:
        # The foreign keys' per-row checks off for this transaction, as pg_restore loads a dump: every row written
        # here names a model (and version) written before it.
        session.connection().exec_driver_sql("SET LOCAL session_replication_role = replica")
        for low in range(API_SAMPLE, models, CHUNK):
            chunk = range(low, min(low + CHUNK, models))
            copy_rows(session, SqlRegisteredModel.__table__, [
                {"name": name(i), "creation_time": now, "last_updated_time": now, "description": ""} for i in chunk
            ])
            copy_rows(session, SqlRegisteredModelTag.__table__, [
                {"name": name(i), "key": "team", "value": f"team-{i % teams}"} for i in chunk
            ])
            copy_rows(session, SqlModelVersion.__table__, [
                {"name": name(i), "version": v, "creation_time": now, "last_updated_time": now, "description": "",
                 "user_id": None, "current_stage": "None", "source": f"s3://bench/{name(i)}/{v}",
                 "storage_location": f"s3://bench/{name(i)}/{v}", "run_id": None, "run_link": None,
                 "status": "READY", "status_message": None}
                for i in chunk for v in range(1, versions + 1)
            ])
            copy_rows(session, SqlModelVersionTag.__table__, [
                {"name": name(i), "version": v, "key": "stage", "value": "bench"}
                for i in chunk for v in range(1, versions + 1)
            ])
    bulk_s = time.perf_counter() - started
    return {"schema_s": round(schema_s, 1), "api_sample_models": API_SAMPLE, "api_sample_s": round(api_s, 1),
            "api_per_model_ms": round(api_s / API_SAMPLE * 1000, 1), "bulk_s": round(bulk_s, 1)}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))))
