#!/usr/bin/env bash
# Run every benchmark and write its results to bench/results/<name>.json and <name>.md.
#
#   bench/run.sh [NAME...]      (default: every benchmark listed below)
#
# Needs the virtualenv (make install-python), prometheus and promtool (make install-prometheus)
# and PostgreSQL on 127.0.0.1:5432 (each benchmark creates and drops its own database); the
# rollout benchmarks (deploy_overhead, rolling_update) also need Triton (make install-triton) and
# Redis on 127.0.0.1:6379 (database 11 as their broker, or MODELYARD_BENCH_BROKER_URL); bentoml_swap
# and bentoml_split need nginx (make install-nginx; bentoml_split with its Lua module).
# A benchmark that misses its target still exits 0: the verdict is in its results file.
# The exit status is non-zero when a benchmark could not run to the end.
set -euo pipefail

REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_DIR"
PY="$REPO_DIR/.venv/bin/python"
RESULTS="$REPO_DIR/bench/results"
BENCHMARKS=(overview rollout_planning upload s3_snapshot registry_vs_mlflow registry_writes deploy_overhead rolling_update rolling_update_gateway bentoml_swap bentoml_split profile_card gateway api_fuzz triton_restart on_demand concurrent_loads residency_poll on_demand_scale)

log() { printf '[bench] %s\n' "$*"; }
die() { printf '[bench] error: %s\n' "$*" >&2; exit 1; }

[[ -x "$PY" ]] || die ".venv is missing; run \`make install\`"
command -v prometheus >/dev/null || die "prometheus is not installed; run \`make install-prometheus\`"
command -v promtool >/dev/null || die "promtool is not installed; run \`make install-prometheus\`"
pg_isready -q -h 127.0.0.1 -p 5432 || die "PostgreSQL does not answer on 127.0.0.1:5432"

selected=("$@")
((${#selected[@]})) || selected=("${BENCHMARKS[@]}")
# The upload benchmark's S3 server (LocalStack's, in its own virtualenv).
if [[ " ${selected[*]} " == *" upload "* ]]; then
    "$REPO_DIR/scripts/install_localstack.sh"
fi
mkdir -p "$RESULTS"
failed=()
for name in "${selected[@]}"; do
    [[ -f "bench/$name.py" ]] || die "no benchmark bench/$name.py"
    log "$name"
    if "$PY" "bench/$name.py" --json "$RESULTS/$name.json" --markdown "$RESULTS/$name.md"; then
        log "$name: results in bench/results/$name.md"
        sed -n 's/^\*\*Verdict: \(.*\)\*\* — \(.*\)$/[bench] \1: \2/p' "$RESULTS/$name.md"
    else
        failed+=("$name")
    fi
    # The registry at its large scale too: 100k models × 10 versions (about 25 minutes here).
    if [[ "$name" == registry_vs_mlflow ]]; then
        large="${name}_100k"
        if "$PY" "bench/$name.py" --models 100000 --versions 10 --requests 100 \
                --json "$RESULTS/$large.json" --markdown "$RESULTS/$large.md"; then
            sed -n 's/^\*\*Verdict: \(.*\)\*\* — \(.*\)$/[bench] \1: \2/p' "$RESULTS/$large.md"
        else
            failed+=("$large")
        fi
    fi
done
((${#failed[@]} == 0)) || die "did not finish: ${failed[*]}"
