"""Search folds case for non-ASCII text on SQLite too (its LIKE folds ASCII only), as on PostgreSQL; and a page of
models, whose JSON PostgreSQL writes itself, is built in Python there (``registry.api.reads.model_json``), and a
model's hand-written lookup (``registry.registered_models.get_model``) reads there too.

Runs the app against a fresh SQLite database in a subprocess, since the suite's own database is
PostgreSQL.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = """
from registry.filters import RegisteredModelFilter
from registry.models import RegisteredModel
RegisteredModel.objects.create(name="ecole", description="ÉCOLE Polytechnique classifier")
RegisteredModel.objects.create(name="iris", description="Blumen: Schwertlilie ÄRGER")
RegisteredModel.objects.create(name="other", description="nothing to see")
for term in ("école", "ärger", "IRIS", "polytechnique"):
    found = RegisteredModelFilter({"search": term}, queryset=RegisteredModel.objects.all()).qs
    print(term, sorted(found.values_list("name", flat=True)))
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient
client = APIClient()
client.force_authenticate(get_user_model().objects.create_superuser("admin", password="unused-here"))
page = client.get("/api/v1/models/?page_size=2").json()
print("page", [m["name"] for m in page["results"]], page["results"][0]["created_at"][-1], page["next"] is not None)
print("model", client.get("/api/v1/models/iris/").json()["team"], client.get("/api/v1/models/iris/versions/").json())
"""


@pytest.mark.integration
def test_search_folds_non_ascii_case_and_a_page_of_models_reads_on_sqlite(tmp_path):
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{tmp_path / 'search.sqlite3'}",
           "DJANGO_SETTINGS_MODULE": "modelyard.settings"}
    manage = [sys.executable, str(REPO / "manage.py")]
    subprocess.run([*manage, "migrate", "-v", "0"], env=env, cwd=REPO, check=True, timeout=300)
    result = subprocess.run([*manage, "shell", "-c", SCRIPT], env=env, cwd=REPO, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.strip().splitlines() if line and "imported automatically" not in line]
    assert lines == ["école ['ecole']", "ärger ['iris']", "IRIS ['iris']", "polytechnique ['ecole']",
                     "page ['ecole', 'iris'] Z True",
                     "model default {'next': None, 'previous': None, 'results': []}"]
