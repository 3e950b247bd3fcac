"""Fill an MLflow model registry database for bench/registry_vs_mlflow.py (run with MLflow's own venv).

MLflow's ``SqlAlchemyStore`` creates its schema (its own migrations); a sample of models and
versions is created through the store's public API and timed, then the rest is inserted in bulk
through MLflow's own SQLAlchemy tables (the rows the public API writes: a registered model, its
tags, its versions with status READY and their tag ``stage=bench``), since 50,000 API calls would take most of
an hour here.
Prints one JSON object with the timings.

Usage: python bench/mlflow_populate.py DB_URI MODELS VERSIONS TEAMS
"""

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
        for low in range(API_SAMPLE, models, CHUNK):
            chunk = range(low, min(low + CHUNK, models))
            session.execute(insert(SqlRegisteredModel.__table__), [
                {"name": name(i), "creation_time": now, "last_updated_time": now, "description": ""} for i in chunk
            ])
            session.execute(insert(SqlRegisteredModelTag.__table__), [
                {"name": name(i), "key": "team", "value": f"team-{i % teams}"} for i in chunk
            ])
            session.execute(insert(SqlModelVersion.__table__), [
                {"name": name(i), "version": v, "creation_time": now, "last_updated_time": now, "description": "",
                 "user_id": None, "current_stage": "None", "source": f"s3://bench/{name(i)}/{v}",
                 "storage_location": f"s3://bench/{name(i)}/{v}", "run_id": None, "run_link": None,
                 "status": "READY", "status_message": None}
                for i in chunk for v in range(1, versions + 1)
            ])
            session.execute(insert(SqlModelVersionTag.__table__), [
                {"name": name(i), "version": v, "key": "stage", "value": "bench"}
                for i in chunk for v in range(1, versions + 1)
            ])
    bulk_s = time.perf_counter() - started
    return {"schema_s": round(schema_s, 1), "api_sample_models": API_SAMPLE, "api_sample_s": round(api_s, 1),
            "api_per_model_ms": round(api_s / API_SAMPLE * 1000, 1), "bulk_s": round(bulk_s, 1)}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))))
