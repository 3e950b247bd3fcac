"""API fuzzing, the long run: schemathesis against /api/schema/ with ~10,000 generated cases.

Runs tests/test_api_fuzzing.py (same world, checks and derandomized generation as in CI, where it
sends 25 cases per operation) with ``--cases-per-operation`` cases per operation, on PostgreSQL
(pytest-django creates and drops ``test_<database>``), the S3 stand-in and a real Prometheus.

    .venv/bin/python bench/api_fuzz.py --json bench/results/api_fuzz.json --markdown bench/results/api_fuzz.md

Verdict PASS when no operation answered an undocumented 5xx or a body that breaks the schema and
at least ``--min-cases`` cases were sent.
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_fuzzer(cases_per_operation: int, database_url: str) -> tuple[dict, int, float, str]:
    """Run the fuzz test once; returns (its report, pytest's exit status, wall seconds, output tail)."""
    with tempfile.TemporaryDirectory(prefix="api-fuzz-") as workdir:
        report_path = Path(workdir) / "report.json"
        env = {**os.environ, "DATABASE_URL": database_url, "MODELYARD_FUZZ_REPORT": str(report_path),
               "MODELYARD_FUZZ_CASES_PER_OPERATION": str(cases_per_operation)}
        started = time.monotonic()
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "tests/test_api_fuzzing.py", "-q", "-p", "no:cacheprovider",
             f"--basetemp={workdir}/pytest"],
            cwd=REPO, env=env, capture_output=True, text=True,
        )
        elapsed = time.monotonic() - started
        report = json.loads(report_path.read_text()) if report_path.exists() else {}
    return report, result.returncode, elapsed, (result.stdout + result.stderr)[-4000:]


def write_results(result: dict, json_path: Path, markdown_path: Path) -> None:
    json_path.write_text(json.dumps(result, indent=2) + "\n")
    operations = result["report"].get("operations", {})
    lines = [
        f"# API fuzzing: {result['total_cases']:,} schemathesis cases against /api/schema/", "",
        f"Run {result['started_at']} on Python {platform.python_version()}, {os.cpu_count()} CPUs. "
        "Command: `bench/run.sh api_fuzz`.", "",
        f"{result['cases_per_operation']} cases per operation (derandomized), {len(operations)} operations, "
        f"{result['seconds']:.0f} s in all. Checks: no 5xx except a status the operation documents, "
        "every body matching the schema of its status.", "",
        "| operation | cases | statuses |", "| --- | --- | --- |",
    ]
    for label, row in operations.items():
        statuses = ", ".join(f"{code}: {n}" for code, n in row["statuses"].items())
        lines.append(f"| `{label}` | {row['cases']} | {statuses} |")
    failures = result["report"].get("failures", {})
    if failures:
        lines += ["", "## Failures", ""]
        lines += [f"### `{label}`\n\n```\n{message[:2000]}\n```\n" for label, message in failures.items()]
    if result["pytest_exit"] and not failures:
        lines += ["", "## pytest output", "", "```", result["output_tail"], "```"]
    lines += ["", f"**Verdict: {result['verdict'].upper()}** — {result['verdict_reason']}", ""]
    markdown_path.write_text("\n".join(lines))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases-per-operation", type=int, default=300)
    parser.add_argument("--min-cases", type=int, default=10_000)
    parser.add_argument("--database-url", default=os.environ.get(
        "DATABASE_URL", "postgres://postgres@127.0.0.1:5432/modelyard_bench_fuzz"))
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--markdown", type=Path, required=True)
    args = parser.parse_args()

    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    report, exit_status, seconds, tail = run_fuzzer(args.cases_per_operation, args.database_url)
    total = report.get("total_cases", 0)
    failures = report.get("failures", {})
    if not report:
        verdict, reason = "fail", f"the fuzz test did not run to the end (pytest exit {exit_status})"
    elif failures:
        verdict, reason = "fail", f"{len(failures)} operation(s) answered a 5xx or broke the schema in {total:,} cases"
    elif total < args.min_cases:
        verdict, reason = "fail", f"only {total:,} cases were generated; target {args.min_cases:,}"
    else:
        verdict, reason = "pass", (f"{total:,} generated cases over {len(report['operations'])} operations, no "
                                   f"undocumented 5xx and no answer breaking the schema ({seconds:.0f} s)")
    result = {"started_at": started_at, "cases_per_operation": args.cases_per_operation, "total_cases": total,
              "seconds": round(seconds, 1), "pytest_exit": exit_status, "verdict": verdict,
              "verdict_reason": reason, "report": report, "output_tail": tail if exit_status else ""}
    write_results(result, args.json, args.markdown)
    print(f"{verdict.upper()}: {reason}")
    return 0 if report else 1


if __name__ == "__main__":
    sys.exit(main())
