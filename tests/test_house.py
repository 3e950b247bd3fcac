"""The house rules of docs/architecture.md that no import contract checks: few function-local project
imports, and no product module over 500 lines."""

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAX_LOCAL_IMPORTS = 15  # each one that stays has its reason in docs/architecture.md
MAX_MODULE_LINES = 500
OUTSIDE = {".venv", ".stack", "migrations", "tests", "bench", "node_modules"}


def _local_imports_script():
    spec = importlib.util.spec_from_file_location("local_imports", REPO / "scripts" / "local_imports.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_function_local_project_imports_stay_few():
    script = _local_imports_script()
    found = [f"{path.relative_to(REPO)}:{line}: {name}"
             for package in script.PACKAGES for path in sorted((REPO / package).rglob("*.py"))
             if not OUTSIDE.intersection(path.relative_to(REPO).parts)
             for line, name in script.local_imports(path)]
    assert len(found) <= MAX_LOCAL_IMPORTS, "\n".join(found)


def test_no_product_module_is_over_500_lines():
    long = [f"{path.relative_to(REPO)}: {lines}" for path in sorted(REPO.rglob("*.py"))
            if not OUTSIDE.intersection(path.relative_to(REPO).parts)
            and (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES]
    assert long == [], long
