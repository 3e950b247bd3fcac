"""Where a registry read spends its time: each operation of ``bench/registry_vs_mlflow.py`` (and the floor,
``GET /api/v1/whoami/``) run in-process through Django's whole handler (every middleware, authentication,
permissions, the view, serialisation and rendering; no HTTP server) under cProfile, on a database the
benchmark filled (``--keep``) or on one this script fills.

For each operation, milliseconds per request, each phase's cumulative time (a phase's SQL counts in it
too, and in "SQL"):

- total: ``BaseHandler.get_response``, the whole request as the WSGI handler sees it;
- middleware and routing: total less the DRF view's ``dispatch``;
- authentication: ``ApiTokenAuthentication.authenticate`` (the token's lookup);
- permissions: ``APIView.check_permissions`` and ``accounts.access`` checks;
- serialisation: ``Serializer.data`` / ``ListSerializer.data``;
- rendering: ``JSONRenderer.render``;
- SQL: every query's round trip (``CursorWrapper._execute``), with the number of queries.

Usage (after ``python bench/registry_vs_mlflow.py --keep``, or with ``--fill N``)::

    python bench/registry_profile.py --requests 200 --json bench/results/registry_profile.json
"""

import argparse
import cProfile
import json
import os
import pstats
import random
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

PHASES = {
    "authentication": [("accounts/authentication.py", "authenticate")],
    "permissions": [("rest_framework/views.py", "check_permissions"), ("accounts/access.py", "model_for"),
                    ("registry/access.py", "model_for"), ("accounts/access.py", "scope_team_filter")],
    "serialisation": [("rest_framework/serializers.py", "data")],
    # get a version on PostgreSQL: its one query and the JSON built from the row (registry.api.reads)
    "one-query read": [("registry/api/reads.py", "version_json")],
    "rendering": [("rest_framework/renderers.py", "render")],
    "SQL": [("django/db/backends/utils.py", "_execute")],
}


def cumulative(stats: pstats.Stats, where: str, name: str) -> tuple[float, int]:
    """Seconds and calls of the functions named ``name`` in files ending with ``where`` (outermost calls)."""
    seconds, calls = 0.0, 0
    for (filename, _line, function), (primitive, _total, _tt, cumtime, _callers) in stats.stats.items():
        if function == name and filename.endswith(where):
            seconds += cumtime
            calls += primitive
    return seconds, calls


def profile(client, url: str, requests: int) -> dict:
    """Per-request milliseconds of each phase of ``GET url`` over ``requests`` requests."""
    for _ in range(10):
        assert client.get(url, HTTP_HOST="127.0.0.1").status_code == 200, url
    profiler = cProfile.Profile()
    started = time.perf_counter()
    profiler.enable()
    for _ in range(requests):
        client.get(url, HTTP_HOST="127.0.0.1")
    profiler.disable()
    wall = time.perf_counter() - started
    stats = pstats.Stats(profiler)
    total, _ = cumulative(stats, "django/core/handlers/base.py", "get_response")
    dispatch, _ = cumulative(stats, "rest_framework/views.py", "dispatch")
    row = {"wall_ms_unprofiled_estimate": None, "total_ms": total, "middleware and routing_ms": total - dispatch}
    for phase, names in PHASES.items():
        seconds = sum(cumulative(stats, where, name)[0] for where, name in names)
        row[f"{phase}_ms"] = seconds
        if phase == "SQL":
            row["queries"] = sum(cumulative(stats, where, name)[1] for where, name in names) / requests
    result = {key: round(value * 1000 / requests, 3) if key.endswith("_ms") and value is not None else value
              for key, value in row.items()}
    result["profiled_wall_ms"] = round(wall * 1000 / requests, 3)
    return result


def timed(client, url: str, requests: int) -> float:
    """p50 milliseconds of ``GET url`` in-process without the profiler."""
    values = []
    for _ in range(requests):
        started = time.perf_counter()
        client.get(url, HTTP_HOST="127.0.0.1")
        values.append(time.perf_counter() - started)
    values.sort()
    return round(values[len(values) // 2] * 1000, 3)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--database", default="bench_registry")
    parser.add_argument("--fill", type=int, default=0, help="fill a new database with N models × 5 versions")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    os.environ.update({"DATABASE_URL": f"postgres://postgres@127.0.0.1:5432/{args.database}",
                       "MODELYARD_DEBUG": "false", "MODELYARD_SECRET_KEY": uuid.uuid4().hex * 2,
                       "MODELYARD_SSL_REDIRECT": "false", "MODELYARD_LOG_LEVEL": "WARNING",
                       "DJANGO_SETTINGS_MODULE": "modelyard.settings"})
    import registry_vs_mlflow as bench

    if args.fill:
        bench.admin_sql(f"DROP DATABASE IF EXISTS {args.database} WITH (FORCE)", f"CREATE DATABASE {args.database}")
    import django

    django.setup()
    from django.core.management import call_command
    from django.test import Client

    if args.fill:
        call_command("migrate", verbosity=0)
        token = bench.populate_ours(args.fill, 5)["token"]
        models, versions = args.fill, 5
        with bench.psycopg_connect(args.database) as conn:  # as autovacuum would after the bulk fill
            conn.execute("VACUUM ANALYZE")
    else:
        from django.contrib.auth import get_user_model

        from accounts.tokens import issue_token
        from registry.models import RegisteredModel

        user = get_user_model().objects.get(username="bench")
        token = issue_token(user=user, name=f"profile-{uuid.uuid4().hex[:6]}", scopes=["read"])[1]
        models, versions = RegisteredModel.objects.count(), RegisteredModel.objects.first().next_version - 1
    client = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
    rng = random.Random(7)
    operations = {"floor (whoami)": "/api/v1/whoami/"}
    operations.update({label: url.removeprefix("OURS") for label, url, _ in bench.operations(
        "OURS", "", models, versions, rng)})
    result = {"models": models, "versions": versions, "requests": args.requests, "operations": {}}
    for label, url in operations.items():
        row = profile(client, url, args.requests)
        row["wall_ms_unprofiled_estimate"] = timed(client, url, args.requests)
        result["operations"][label] = {"url": url, **row}
        print(label, json.dumps(row), file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
