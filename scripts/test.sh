#!/usr/bin/env bash
# The CI suite: guard rails (ruff, import layers, migrations check) and the whole pytest suite.
#
#   scripts/test.sh [--fast] [PYTEST_ARGS...]
#
# Makes sure PostgreSQL and Redis answer (starting them the way the machine's own
# services are started when they do not), that Prometheus, nginx, Triton, perf_analyzer and
# LocalStack are installed, then runs the checks against PostgreSQL. pytest runs in
# MODELYARD_TEST_WORKERS pytest-xdist workers (2; 0 runs in this process), one test module to
# a worker at a time, each with its own test database, broker database and ports (docs/testing.md),
# the longest modules handed out first (tests/plugins/order.py; pytest-xdist's own reorder, by test
# count, is turned off).
# --fast runs the fast tier only (-m "not integration": unit and database tests) and installs no
# server. pytest's exit status is this script's; "no tests collected" (5) counts as a failure.
set -euo pipefail

FAST=0
if [[ "${1:-}" == --fast ]]; then
    FAST=1
    shift
fi
WORKERS="${MODELYARD_TEST_WORKERS:-2}"
[[ "$WORKERS" =~ ^[0-9]+$ ]] || { printf '[test] error: MODELYARD_TEST_WORKERS must be a number, not %q\n' "$WORKERS" >&2; exit 2; }

REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_DIR"
PY="$REPO_DIR/.venv/bin/python"
export PATH="$REPO_DIR/.venv/bin:$PATH"

log() { printf '[test] %s\n' "$*"; }
die() { printf '[test] error: %s\n' "$*" >&2; exit 1; }

[[ -x "$PY" ]] || die ".venv is missing; run \`make install\`"

wait_for() {
    local what="$1" timeout="$2"
    shift 2
    local deadline=$((SECONDS + timeout))
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || die "$what did not come up within ${timeout}s"
        sleep 0.5
    done
}

if ! pg_isready -q -h 127.0.0.1 -p 5432; then
    # shellcheck disable=SC2012  # cluster names are version numbers
    cluster="$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n 1)"
    [[ -n "$cluster" ]] || die "PostgreSQL is not installed (no cluster under /etc/postgresql)"
    log "starting PostgreSQL $cluster/main"
    pg_ctlcluster --skip-systemctl-redirect "$cluster" main start
    wait_for PostgreSQL 30 pg_isready -q -h 127.0.0.1 -p 5432
fi

if [[ "$(redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null)" != PONG ]]; then
    log "starting Redis on 127.0.0.1:6379"
    mkdir -p /var/lib/redis /var/log/redis
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
        --dir /var/lib/redis --logfile /var/log/redis/ci.log
    wait_for Redis 15 redis-cli -h 127.0.0.1 -p 6379 ping
fi

if ((FAST)); then
    :  # the fast tier starts no server
else
if ! command -v prometheus >/dev/null 2>&1; then
    log "installing Prometheus (Debian package)"
    apt-get update && apt-get install -y --no-install-recommends prometheus
fi
if [[ ! -x /usr/sbin/nginx || ! -e /usr/lib/nginx/modules/ngx_http_lua_module.so ]] \
        || [[ -z "$(find /usr/lib -path '*lua/5.1/cjson.so' -print -quit)" ]]; then
    log "installing nginx with its Lua module (Debian packages; host agents run their own masters)"
    apt-get install -y --no-install-recommends nginx libnginx-mod-http-lua lua-cjson \
        || { apt-get update && apt-get install -y --no-install-recommends nginx libnginx-mod-http-lua lua-cjson; }
fi
# Exits at once when its marker says Triton is installed.
scripts/install_triton.sh
scripts/install_perf_analyzer.sh
# LocalStack's S3, which checks part checksums on arrival (moto does not); marker in .stack/.
scripts/install_localstack.sh
fi

export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/modelyard}"

log "ruff check ."
"$PY" -m ruff check .
log "lint-imports (layers and forbidden imports: pyproject.toml [tool.importlinter])"
"$(dirname "$PY")/lint-imports"
log "manage.py makemigrations --check --dry-run"
"$PY" manage.py makemigrations --check --dry-run

args=()
((WORKERS > 0)) && args+=(-n "$WORKERS" --dist loadfile --no-loadscope-reorder)
((FAST)) && args+=(-m "not integration")
# A base temporary directory of this run's own rather than pytest's shared /tmp/pytest-of-<user>:
# every pytest session that starts closes that one to mode 700 again, and the nginx workers of this
# run (an unprivileged user) must traverse it (tests/fixtures/services.py, traversable). Kept when
# the run fails, for its logs; removed when it passes.
BASETEMP="$(mktemp -d "${TMPDIR:-/tmp}/modelyard-tests.XXXXXX")"
args+=(--basetemp "$BASETEMP/run")
# A full run (no test path given) makes the install tests' virtualenvs (the agent's wheel, requirements.txt)
# in the background while the other tests run: pip's downloads take most of their ~200 s, and
# tests/test_install.py runs last (tests/plugins/order.py), so it finds them made. It waits on the same locks
# if they are not.
PREFETCH=""
if ((!FAST)) && [[ ! " $* " =~ \ tests/ ]]; then
    nice -n 10 "$PY" -m tests.fixtures.wheels >"$BASETEMP/requirements-venv.log" 2>&1 &
    PREFETCH=$!
fi
# The 20 longest modules are printed after pytest's summary, so a CI log's tail names where the time went;
# a --module-times=FILE given on the command line writes there instead.
MODULE_TIMES=""
if [[ ! " $* " =~ \ --module-times ]]; then
    MODULE_TIMES="$BASETEMP/module-times.md"
    args+=(--module-times "$MODULE_TIMES")
fi
log "pytest ${args[*]} $*"
rc=0
"$PY" -m pytest "${args[@]}" "$@" || rc=$?
if [[ -n "$MODULE_TIMES" && -s "$MODULE_TIMES" ]]; then
    log "the longest modules (seconds summed over the workers):"
    cat "$MODULE_TIMES"
fi
if [[ -n "$PREFETCH" ]] && ! wait "$PREFETCH"; then  # the install test made it itself then, or said why not
    log "making the install test's virtualenv in the background failed: $BASETEMP/requirements-venv.log"
fi
if ((rc == 0)); then
    rm -rf "$BASETEMP"
else
    log "temporary files of this run kept in $BASETEMP"
fi
if ((rc == 5)); then
    die "pytest collected no tests (exit 5)"
fi
exit "$rc"
