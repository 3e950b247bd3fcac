"""Search folds case for non-ASCII text on SQLite too (its LIKE folds ASCII only), as on PostgreSQL.

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
"""


@pytest.mark.integration
def test_search_folds_non_ascii_case_on_sqlite(tmp_path):
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{tmp_path / 'search.sqlite3'}",
           "DJANGO_SETTINGS_MODULE": "modelyard.settings"}
    manage = [sys.executable, str(REPO / "manage.py")]
    subprocess.run([*manage, "migrate", "-v", "0"], env=env, cwd=REPO, check=True, timeout=300)
    result = subprocess.run([*manage, "shell", "-c", SCRIPT], env=env, cwd=REPO, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.strip().splitlines() if line and "imported automatically" not in line]
    assert lines == ["école ['ecole']", "ärger ['iris']", "IRIS ['iris']", "polytechnique ['ecole']"]
