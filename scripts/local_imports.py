#!/usr/bin/env python3
"""Count the function-local imports of the project's own modules (docs/architecture.md, "Imports").

    scripts/local_imports.py [--list]

An import inside a function body of a product module (migrations, tests and bench left out) that names
one of the project's packages. Prints the total, one line per module with its count, and with
``--list`` every import with its line. Exit status 0.
"""

import ast
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("modelyard", "modelyard_agent", "modelyard_cli", "audit", "accounts", "registry", "deployments",
            "monitoring", "promotions", "demo")


def local_imports(path: Path) -> list[tuple[int, str]]:
    """``[(line, module)]``: the project imports inside function bodies of the file at ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for inner in ast.walk(node):
            names = ([alias.name for alias in inner.names] if isinstance(inner, ast.Import)
                     else [inner.module or ""] if isinstance(inner, ast.ImportFrom) and not inner.level else [])
            found += [(inner.lineno, name) for name in names if name.partition(".")[0] in PACKAGES]
    return sorted(set(found))


def main(argv: list[str]) -> int:
    per_module: Counter[str] = Counter()
    listing = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            if "migrations" in path.parts or ".venv" in path.parts:
                continue
            for line, module in local_imports(path):
                relative = path.relative_to(REPO)
                per_module[str(relative)] += 1
                listing.append(f"{relative}:{line}: {module}")
    print(f"function-local project imports: {sum(per_module.values())}")
    for module, count in per_module.most_common():
        print(f"{count:4d}  {module}")
    if "--list" in argv:
        print("\n".join(listing))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
