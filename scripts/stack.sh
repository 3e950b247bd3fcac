#!/usr/bin/env bash
# Run the whole Modelyard stack on this machine, without containers.
#
#   scripts/stack.sh start    start every service that is not already running, then seed
#   scripts/stack.sh stop     stop what this script started (process groups), wait for exit
#   scripts/stack.sh status   one line per service: up or down
#
# Each service runs as its own session (setsid), so its process group holds the
# service and all its children; stop signals that group. The BentoML host agent
# starts its nginx and one `bentoml serve` per served model in sessions of their
# own; stop ends them after the agent (manage.py stop_bentoml_host). PID files live in
# var/run/, logs in var/log/. A service whose PID file names a live process that
# answers on its port is left alone, so `start` is safe to run twice.
#
# PostgreSQL and Redis are usually running already (system services); they are
# only started here when nothing answers, and only stopped when started here.
#
# Environment (defaults in brackets):
#   MODELYARD_WEB_PORT [8080]            Django (gunicorn)
#   MODELYARD_S3_PORT [9000]             S3 stand-in (moto_server)
#   MODELYARD_S3_ENDPOINT_URL            a non-local endpoint skips the stand-in
#   MODELYARD_GATEWAY_PORT [8010]        the local Triton host's gateway (its agent's nginx): clients' address
#   MODELYARD_GATEWAY_GRPC_PORT [8011]   the same gateway's gRPC address (passed to Triton gRPC)
#   MODELYARD_TRITON_HTTP_PORT [8000]    Triton HTTP/REST (the agent's; clients go through the gateway)
#   MODELYARD_TRITON_GRPC_PORT [8001]    Triton gRPC
#   MODELYARD_TRITON_METRICS_PORT [8002] Triton /metrics
#   MODELYARD_PROMETHEUS_PORT [9090]     Prometheus
#   MODELYARD_BENTOML_PORT [3000]        the local BentoML host's nginx (started by its agent)
#   CELERY_BROKER_URL [redis://127.0.0.1:6379/0]
#   DATABASE_URL [unset: SQLite at var/modelyard.sqlite3]
#   MODELYARD_SEED [1]                   0 skips `python -m demo.seed`
#   MODELYARD_WEB_REPLICAS [1]           web processes (gunicorn masters): web on MODELYARD_WEB_PORT, web-2 on
#                                        the port after it, and so on; more than one needs PostgreSQL
#   MODELYARD_WORKERS [1]                orchestrator workers (orchestrator, orchestrator-2, ...), each its own
#                                        Celery worker process; more than one needs PostgreSQL
#   MODELYARD_STACK_DIR [.stack]         where scripts/install_triton.sh installed Triton
set -euo pipefail

REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_DIR"

VAR_DIR="$REPO_DIR/var"
RUN_DIR="$VAR_DIR/run"
LOG_DIR="$VAR_DIR/log"
MODEL_REPOSITORY="$VAR_DIR/model-repository"
STACK_DIR="${MODELYARD_STACK_DIR:-$REPO_DIR/.stack}"
VENV_BIN="$REPO_DIR/.venv/bin"
PY="$VENV_BIN/python"
export PATH="$VENV_BIN:$PATH"

# The ports, broker and database a running stack was started with (var/stack.ports, written by start), so that
# `make stop` and `make status` from another shell reach that stack; the environment still wins.
PORTS_FILE="$VAR_DIR/stack.ports"
PORT_VARIABLES=(MODELYARD_WEB_PORT MODELYARD_S3_PORT MODELYARD_GATEWAY_PORT MODELYARD_GATEWAY_GRPC_PORT MODELYARD_TRITON_HTTP_PORT MODELYARD_TRITON_GRPC_PORT
    MODELYARD_TRITON_METRICS_PORT MODELYARD_PROMETHEUS_PORT MODELYARD_BENTOML_PORT CELERY_BROKER_URL DATABASE_URL
    MODELYARD_WEB_REPLICAS MODELYARD_WORKERS)
if [[ "${1:-}" != start && -f "$PORTS_FILE" ]]; then
    while IFS='=' read -r key value; do
        [[ " ${PORT_VARIABLES[*]} " == *" $key "* && -z "${!key:-}" ]] && export "$key=$value"
    done <"$PORTS_FILE"
fi

WEB_PORT="${MODELYARD_WEB_PORT:-8080}"
S3_PORT="${MODELYARD_S3_PORT:-9000}"
TRITON_HTTP_PORT="${MODELYARD_TRITON_HTTP_PORT:-8000}"
GATEWAY_PORT="${MODELYARD_GATEWAY_PORT:-8010}"
GATEWAY_GRPC_PORT="${MODELYARD_GATEWAY_GRPC_PORT:-8011}"
TRITON_GRPC_PORT="${MODELYARD_TRITON_GRPC_PORT:-8001}"
TRITON_METRICS_PORT="${MODELYARD_TRITON_METRICS_PORT:-8002}"
PROMETHEUS_PORT="${MODELYARD_PROMETHEUS_PORT:-9090}"
BENTO_PORT="${MODELYARD_BENTOML_PORT:-3000}"
BENTO_ROOT="$VAR_DIR/bentoml-agent"
BENTO_HOST=local-bento
export CELERY_BROKER_URL="${CELERY_BROKER_URL:-redis://127.0.0.1:6379/0}"

PROMETHEUS_TEMPLATE="$REPO_DIR/deploy/prometheus/prometheus.local.yml.tmpl"
PROMETHEUS_CONFIG="$REPO_DIR/deploy/prometheus/prometheus.local.yml"
LOGIN_FILE="$VAR_DIR/local-login.txt"
TOKEN_FILE="$VAR_DIR/admin.token"
STACK_ENV_FILE="$VAR_DIR/stack.env"

WEB_REPLICAS="${MODELYARD_WEB_REPLICAS:-1}"
WORKERS="${MODELYARD_WORKERS:-1}"
for count in WEB_REPLICAS WORKERS; do
    [[ "${!count}" =~ ^[1-8]$ ]] || {
        printf '[stack] error: MODELYARD_%s must be a number from 1 to 8, not %q\n' "$count" "${!count}" >&2
        exit 2
    }
done

# replicas NAME COUNT: NAME, NAME-2, ... NAME-COUNT (the first keeps the plain name).
replicas() {
    local i
    printf '%s\n' "$1"
    for ((i = 2; i <= $2; i++)); do printf '%s-%d\n' "$1" "$i"; done
}

# Services this script may start, in start order (stop runs the reverse).
mapfile -t WEB_SERVICES < <(replicas web "$WEB_REPLICAS")
mapfile -t ORCHESTRATOR_SERVICES < <(replicas orchestrator "$WORKERS")
SERVICES=(redis s3 "${WEB_SERVICES[@]}" triton agent bento-agent "${ORCHESTRATOR_SERVICES[@]}" beat prometheus)

# web_port NAME: the port of web replica NAME (web, web-2, ...).
web_port() {
    local index=1
    [[ "$1" == web-* ]] && index="${1#web-}"
    printf '%d' $((WEB_PORT + index - 1))
}

log() { printf '[stack] %s\n' "$*"; }
warn() { printf '[stack] warning: %s\n' "$*" >&2; }
die() { printf '[stack] error: %s\n' "$*" >&2; exit 1; }

is_local_host() {
    case "$1" in
        127.0.0.1 | localhost | ::1 | "[::1]" | "") return 0 ;;
        *) return 1 ;;
    esac
}

# Host and port of the Redis broker, from CELERY_BROKER_URL.
if [[ "$CELERY_BROKER_URL" =~ ^rediss?://([^@/]*@)?(\[[^]]*\]|[^:/]*)(:([0-9]+))?(/.*)?$ ]]; then
    REDIS_HOST="${BASH_REMATCH[2]:-127.0.0.1}"
    REDIS_PORT="${BASH_REMATCH[4]:-6379}"
else
    die "CELERY_BROKER_URL=$CELERY_BROKER_URL is not a redis:// URL"
fi

# ---------------------------------------------------------------- processes

pid_file() { printf '%s/%s.pid' "$RUN_DIR" "$1"; }

# Start time of a process (clock ticks since boot), so a PID file whose number
# was reused by an unrelated process after a reboot or crash is not trusted.
proc_start_time() {
    local stat
    stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
    # Field 22, counted after the parenthesised command name (which may hold spaces).
    stat="${stat##*) }"
    awk '{ print $20 }' <<<"$stat"
}

# Prints the PID of service $1 when its PID file names a live process that we started.
service_pid() {
    local file pid recorded now
    file="$(pid_file "$1")"
    [[ -f "$file" ]] || return 1
    pid="$(sed -n 1p "$file")"
    recorded="$(sed -n 2p "$file")"
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    now="$(proc_start_time "$pid")" || return 1
    [[ -z "$recorded" || "$recorded" == "$now" ]] || return 1
    printf '%s' "$pid"
}

# Removes the PID file of service $1 when it no longer names a live process.
clear_stale() {
    local file
    file="$(pid_file "$1")"
    if [[ -f "$file" ]] && ! service_pid "$1" >/dev/null; then
        rm -f "$file"
    fi
}

# start_bg NAME COMMAND...: runs COMMAND in a new session with its output appended
# to var/log/NAME.log and records its PID (= process group id) in var/run/NAME.pid.
start_bg() {
    local name="$1"
    shift
    local logfile="$LOG_DIR/$name.log"
    printf '\n===== %s start %s =====\n' "$(date -u +%FT%TZ)" "$name" >>"$logfile"
    # Job control is off in scripts, so the forked child is not a group leader and
    # setsid makes it a session leader in place: $! is the service's PID and PGID.
    # fd 9 (the stack lock) is closed so services do not hold the lock.
    setsid "$@" </dev/null >>"$logfile" 2>&1 9>&- &
    local pid=$!
    sleep 0.2
    local start_time
    start_time="$(proc_start_time "$pid")" || {
        tail -n 30 "$logfile" >&2 || true
        die "$name exited at once; see $logfile"
    }
    printf '%s\n%s\n' "$pid" "$start_time" >"$(pid_file "$name")"
    log "$name started (pid $pid, log var/log/$name.log)"
}

# stop_service NAME [TIMEOUT]: SIGTERM to the service's process group, wait for
# every process in it to exit, SIGKILL after TIMEOUT seconds.
stop_service() {
    local name="$1" timeout="${2:-30}" pid waited=0
    if ! pid="$(service_pid "$name")"; then
        clear_stale "$name"
        return 0
    fi
    log "stopping $name (process group $pid)"
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    while kill -0 -- "-$pid" 2>/dev/null; do
        if ((waited >= timeout * 10)); then
            warn "$name did not exit within ${timeout}s; sending SIGKILL"
            kill -KILL -- "-$pid" 2>/dev/null || true
            sleep 0.5
            break
        fi
        sleep 0.1
        waited=$((waited + 1))
    done
    rm -f "$(pid_file "$name")"
}

service_died() {
    local name="$1"
    tail -n 40 "$LOG_DIR/$name.log" >&2 || true
    rm -f "$(pid_file "$name")"
    die "$name exited during startup; last lines above, full log in var/log/$name.log"
}

# ---------------------------------------------------------------- probes

# True when something accepts TCP connections on 127.0.0.1:$1.
port_answers() {
    timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null
}

# True when a server could bind port $1 (on all interfaces, as a server would with SO_REUSEADDR).
port_free() {
    "$PY" - "$1" <<'PY' 2>/dev/null
import socket
import sys

for family, host in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
    try:
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError:
        continue  # no IPv6 on this machine
    with sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        try:
            sock.bind((host, int(sys.argv[1])))
        except OSError:
            sys.exit(1)
PY
}

# require_port PORT ENV_VAR SERVICE: fails with a clear message when PORT is taken.
require_port() {
    local port="$1" var="$2" service="$3"
    if ! port_free "$port"; then
        local holder
        holder="$(ss -Hltnp "sport = :$port" 2>/dev/null | grep -o 'users:(("[^"]*",pid=[0-9]*' | head -n 1 | sed 's/users:(("//; s/",pid=/ pid /')"
        die "port $port, needed by $service, is already in use${holder:+ by $holder} (not started by this script). Stop that process or choose another port: export $var=<free port>"
    fi
}

http_ok() {
    curl -fsS -o /dev/null --max-time 3 "$1" 2>/dev/null
}

# Any HTTP answer at all (moto's root answers 200, others may 4xx).
http_answers() {
    local code
    code="$(curl -s -o /dev/null --max-time 3 -w '%{http_code}' "$1" 2>/dev/null || true)"
    [[ -n "$code" && "$code" != "000" ]]
}

redis_answers() {
    if command -v redis-cli >/dev/null 2>&1; then
        [[ "$(redis-cli -h "$REDIS_HOST" -p "$REDIS_PORT" ping 2>/dev/null)" == PONG ]]
    else
        local reply
        reply="$(timeout 3 bash -c "exec 3<>/dev/tcp/$REDIS_HOST/$REDIS_PORT; printf 'PING\r\n' >&3; head -c 5 <&3" 2>/dev/null || true)"
        [[ "$reply" == +PONG ]]
    fi
}

# wait_until NAME TIMEOUT DESCRIPTION PROBE...: polls PROBE until it succeeds, failing
# early when service NAME (if we started it) has died.
wait_until() {
    local name="$1" timeout="$2" what="$3"
    shift 3
    local deadline=$((SECONDS + timeout)) watched=0
    [[ -f "$(pid_file "$name")" ]] && watched=1
    until "$@"; do
        if ((watched)) && ! service_pid "$name" >/dev/null; then
            service_died "$name"
        fi
        if ((SECONDS >= deadline)); then
            tail -n 40 "$LOG_DIR/$name.log" >&2 2>/dev/null || true
            die "$name: $what not reached within ${timeout}s; see var/log/$name.log"
        fi
        sleep 0.5
    done
}

# True once service $1's log shows a Celery worker "ready." line after byte offset $2.
celery_ready() {
    tail -c "+$(($2 + 1))" "$LOG_DIR/$1.log" 2>/dev/null | grep -q ' ready\.$'
}

log_size() {
    stat -c %s "$LOG_DIR/$1.log" 2>/dev/null || echo 0
}

# ---------------------------------------------------------------- services

report_database() {
    # The issue's contract: PostgreSQL when DATABASE_URL is set, SQLite in this
    # checkout's var/ otherwise (so two checkouts never share a database).
    if [[ -n "${DATABASE_URL:-}" ]]; then
        log "database: DATABASE_URL is set; using it as is"
    else
        log "database: SQLite at var/modelyard.sqlite3 (set DATABASE_URL for PostgreSQL)"
    fi
}

start_redis() {
    clear_stale redis
    if redis_answers; then
        if service_pid redis >/dev/null; then
            log "redis: already running (pid $(service_pid redis))"
        else
            log "redis: answering on $REDIS_HOST:$REDIS_PORT (not managed here; left alone)"
        fi
        return 0
    fi
    if ! is_local_host "$REDIS_HOST"; then
        die "Redis at $REDIS_HOST:$REDIS_PORT (CELERY_BROKER_URL) does not answer; start it or point CELERY_BROKER_URL elsewhere"
    fi
    if service_pid redis >/dev/null; then
        wait_until redis 30 "PING" redis_answers
        return 0
    fi
    if ! command -v redis-server >/dev/null 2>&1; then
        log "redis: installing Debian's redis-server"
        apt-get update -qq && apt-get install -y -qq --no-install-recommends redis-server >/dev/null
    fi
    require_port "$REDIS_PORT" CELERY_BROKER_URL redis
    mkdir -p "$VAR_DIR/redis"
    # Same flags as the machine's own Redis, kept in the foreground so the PID file holds it.
    start_bg redis redis-server --bind 127.0.0.1 -::1 --port "$REDIS_PORT" \
        --save "" --appendonly no --dir "$VAR_DIR/redis" --logfile ""
    wait_until redis 30 "PING" redis_answers
    log "redis: ready on 127.0.0.1:$REDIS_PORT"
}

start_s3() {
    clear_stale s3
    local endpoint="${MODELYARD_S3_ENDPOINT_URL:-}"
    if [[ -n "$endpoint" ]]; then
        local host="${endpoint#*://}"
        host="${host%%/*}"
        host="${host%:*}"
        if ! is_local_host "$host"; then
            log "s3: using $endpoint (MODELYARD_S3_ENDPOINT_URL); no local stand-in"
            return 0
        fi
    fi
    export MODELYARD_S3_ENDPOINT_URL="http://127.0.0.1:$S3_PORT"
    if service_pid s3 >/dev/null; then
        wait_until s3 30 "an HTTP answer" http_answers "$MODELYARD_S3_ENDPOINT_URL/"
        log "s3: already running (pid $(service_pid s3)) at $MODELYARD_S3_ENDPOINT_URL"
        return 0
    fi
    require_port "$S3_PORT" MODELYARD_S3_PORT "the S3 stand-in (moto_server)"
    start_bg s3 moto_server -H 127.0.0.1 -p "$S3_PORT"
    wait_until s3 60 "an HTTP answer" http_answers "$MODELYARD_S3_ENDPOINT_URL/"
    "$PY" scripts/s3_snapshot.py restore "$VAR_DIR/s3-snapshot" || die "could not restore var/s3-snapshot"
    # The upload page sends parts straight to S3 from the browser: allow this stack's web origin.
    "$PY" manage.py configure_s3_cors "http://127.0.0.1:$WEB_PORT" "http://localhost:$WEB_PORT" \
        || warn "could not set the bucket's CORS rules; uploads from the browser will fail"
    log "s3: ready at $MODELYARD_S3_ENDPOINT_URL (objects are saved to var/s3-snapshot at stop)"
}

prepare_django() {
    log "django: migrate"
    "$PY" manage.py migrate --noinput
    log "django: collectstatic"
    "$PY" manage.py collectstatic --noinput -v 0
    log "django: bootstrap_local"
    "$PY" manage.py bootstrap_local --username admin \
        --password-file "$LOGIN_FILE" --token-file "$TOKEN_FILE"
}

start_web() {
    local name
    for name in "${WEB_SERVICES[@]}"; do
        start_web_replica "$name" "$(web_port "$name")"
    done
}

# start_web_replica NAME PORT: one gunicorn master (two workers) on 127.0.0.1:PORT.
start_web_replica() {
    local name="$1" port="$2"
    clear_stale "$name"
    local url="http://127.0.0.1:$port/healthz"
    if service_pid "$name" >/dev/null; then
        wait_until "$name" 60 "GET /healthz = 200" http_ok "$url"
        log "$name: already running (pid $(service_pid "$name")) at http://127.0.0.1:$port/"
        return 0
    fi
    require_port "$port" MODELYARD_WEB_PORT "the web app (gunicorn)"
    start_bg "$name" gunicorn -c python:modelyard.gunicorn_config modelyard.wsgi -b "127.0.0.1:$port" \
        --workers 2 --timeout 300 \
        --access-logfile - --error-logfile -
    wait_until "$name" 90 "GET /healthz = 200" http_ok "$url"
    log "$name: ready at http://127.0.0.1:$port/"
}

start_triton() {
    clear_stale triton
    local url="http://127.0.0.1:$TRITON_HTTP_PORT/v2/health/live"
    if service_pid triton >/dev/null; then
        wait_until triton 120 "GET /v2/health/live = 200" http_ok "$url"
        log "triton: already running (pid $(service_pid triton))"
        return 0
    fi
    local binary="$STACK_DIR/bin/tritonserver"
    [[ -x "$binary" ]] || die "$binary is missing; run \`make install\` (scripts/install_triton.sh) first"
    require_port "$TRITON_HTTP_PORT" MODELYARD_TRITON_HTTP_PORT "Triton HTTP"
    require_port "$TRITON_GRPC_PORT" MODELYARD_TRITON_GRPC_PORT "Triton gRPC"
    require_port "$TRITON_METRICS_PORT" MODELYARD_TRITON_METRICS_PORT "Triton metrics"
    mkdir -p "$MODEL_REPOSITORY"
    local args=(
        --model-repository="$MODEL_REPOSITORY"
        --model-control-mode=explicit
        --http-address=127.0.0.1 --http-port "$TRITON_HTTP_PORT"
        --grpc-address=127.0.0.1 --grpc-port "$TRITON_GRPC_PORT"
        --metrics-address=127.0.0.1 --metrics-port "$TRITON_METRICS_PORT"
        --metrics-config summary_latencies=true
        --log-verbose=0
    )
    # The wrapper only sets the library path; the unpacked server has no
    # /opt/tritonserver, so backends and caches are named explicitly.
    [[ -d "$STACK_DIR/triton/backends" ]] && args+=(--backend-directory="$STACK_DIR/triton/backends")
    [[ -d "$STACK_DIR/triton/caches" ]] && args+=(--cache-directory="$STACK_DIR/triton/caches")
    start_bg triton "$binary" "${args[@]}"
    wait_until triton 120 "GET /v2/health/live = 200" http_ok "$url"
    log "triton: ready at http://127.0.0.1:$TRITON_HTTP_PORT (model repository var/model-repository)"
}

# start_celery NAME CELERY_ARGS...: a Celery process of the orchestrator's app with no port;
# ready once its log says so.
start_celery() {
    local name="$1"
    shift
    start_process "$name" "$1" celery -A modelyard "$@"
}

# start_host_agent NAME AGENT_ARGS...: a host agent, started as on a serving host with the
# modelyard-agent command and an environment without database or S3 settings.
start_host_agent() {
    local name="$1"
    shift
    start_process "$name" worker env -u DATABASE_URL -u DJANGO_SETTINGS_MODULE -u MODELYARD_S3_ENDPOINT_URL \
        -u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY modelyard-agent "$@"
}

# start_process NAME KIND COMMAND...: KIND worker waits for Celery's "ready." line in the log.
start_process() {
    local name="$1" kind="$2"
    shift 2
    clear_stale "$name"
    if service_pid "$name" >/dev/null; then
        log "$name: already running (pid $(service_pid "$name"))"
        return 0
    fi
    local offset
    offset="$(log_size "$name")"
    start_bg "$name" "$@"
    if [[ "$kind" == worker ]]; then
        wait_until "$name" 90 "worker ready" celery_ready "$name" "$offset"
    else
        sleep 2
        service_pid "$name" >/dev/null || service_died "$name"
    fi
    log "$name: ready"
}

# The gateway the local Triton host's agent runs (its state dir is .model-repository.modelyard beside the repository).
GATEWAY_DIR="$(dirname "$MODEL_REPOSITORY")/.$(basename "$MODEL_REPOSITORY").modelyard/gateway"

gateway_pid() {
    local pid
    pid="$(cat "$GATEWAY_DIR/nginx.pid" 2>/dev/null)" || return 1
    [[ "$pid" =~ ^[0-9]+$ ]] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q '^nginx: master' || return 1
    printf '%s' "$pid"
}

start_agent() {
    # The agent starts its gateway on this port at its first heartbeat or deployment: refuse a taken port now.
    if ! service_pid agent >/dev/null && ! gateway_pid >/dev/null; then
        require_port "$GATEWAY_PORT" MODELYARD_GATEWAY_PORT "the Triton host's gateway"
        require_port "$GATEWAY_GRPC_PORT" MODELYARD_GATEWAY_GRPC_PORT "the Triton host's gateway (gRPC)"
    fi
    start_host_agent agent --host local --runtime triton --model-repository "$MODEL_REPOSITORY" \
        --triton-url "http://127.0.0.1:$TRITON_HTTP_PORT" --triton-grpc-url "127.0.0.1:$TRITON_GRPC_PORT" \
        --gateway-grpc-listen "127.0.0.1:$GATEWAY_GRPC_PORT" \
        --concurrency 4 --perf-analyzer "$STACK_DIR/bin/perf_analyzer"
}

# After the agent stopped (and before Triton): its gateway, a daemon of its own, stops too, letting the
# requests in flight finish.
stop_gateway() {
    local pid
    pid="$(gateway_pid)" || return 0
    log "stopping the Triton host's gateway"
    /usr/sbin/nginx -p "$GATEWAY_DIR" -e "$GATEWAY_DIR/error.log" -c "$GATEWAY_DIR/nginx.conf" -s quit \
        || warn "could not stop the gateway (pid $pid); see \`make status\`"
    for _ in $(seq 1 100); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.1
    done
    warn "the gateway (pid $pid) still runs after 10 s"
}

# The nginx master of the local BentoML host, from the PID file its agent's nginx writes.
bento_nginx_pid() {
    local pid
    pid="$(cat "$BENTO_ROOT/nginx/nginx.pid" 2>/dev/null)" || return 1
    [[ "$pid" =~ ^[0-9]+$ ]] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q '^nginx: master' || return 1
    printf '%s' "$pid"
}

# PIDs of the `bentoml serve` processes (arbiters and workers) the local BentoML agent started:
# each runs with BENTOML_HOME set to an instance home under var/bentoml-agent/instances/.
bento_pids() {
    grep -lzs "^BENTOML_HOME=$BENTO_ROOT/instances/" /proc/[0-9]*/environ 2>/dev/null \
        | sed 's|^/proc/\([0-9]*\)/environ$|\1|' | sort -n || true
}

start_bento_agent() {
    # The agent starts nginx on this port at its first heartbeat or deployment: refuse a taken port now.
    if ! service_pid bento-agent >/dev/null && ! bento_nginx_pid >/dev/null; then
        require_port "$BENTO_PORT" MODELYARD_BENTOML_PORT "the BentoML host's nginx"
    fi
    start_host_agent bento-agent --host "$BENTO_HOST" --runtime bentoml --bentoml-root "$BENTO_ROOT" --concurrency 4
}

# After the agent stopped: its bento processes and nginx (in sessions of their own) stop too.
stop_bento_host() {
    if [[ -z "$(bento_pids)" ]] && ! bento_nginx_pid >/dev/null; then
        return 0
    fi
    log "stopping the BentoML host's bentoml serve processes and nginx"
    "$PY" manage.py stop_bentoml_host --root "$BENTO_ROOT" --inference-url "http://127.0.0.1:$BENTO_PORT" \
        || warn "could not stop every bentoml serve process; see \`make status\`"
}

start_orchestrator() {
    local name
    for name in "${ORCHESTRATOR_SERVICES[@]}"; do
        start_celery "$name" worker -Q default -n "$name@%h" --concurrency 2 --loglevel INFO
    done
}

start_beat() {
    # The scheduler class (django-celery-beat's database scheduler) comes from settings.
    start_celery beat beat --loglevel INFO -s "$RUN_DIR/celerybeat-schedule" \
        --pidfile "$RUN_DIR/celerybeat.pid"
}

render_prometheus_config() {
    [[ -f "$PROMETHEUS_TEMPLATE" ]] || die "$PROMETHEUS_TEMPLATE is missing"
    # Only these names are substituted; anything else in the file stays as written.
    # Serving hosts (Triton included) are discovered from the web app with the
    # API token that prepare_django wrote, so their ports are not needed here.
    # shellcheck disable=SC2016
    local names='${MODELYARD_WEB_PORT} ${MODELYARD_PROMETHEUS_PORT} ${MODELYARD_API_TOKEN_FILE}'
    MODELYARD_WEB_PORT="$WEB_PORT" MODELYARD_PROMETHEUS_PORT="$PROMETHEUS_PORT" \
        MODELYARD_API_TOKEN_FILE="$TOKEN_FILE" \
        envsubst "$names" <"$PROMETHEUS_TEMPLATE" >"$PROMETHEUS_CONFIG.tmp"
    mv "$PROMETHEUS_CONFIG.tmp" "$PROMETHEUS_CONFIG"
}

start_prometheus() {
    clear_stale prometheus
    local url="http://127.0.0.1:$PROMETHEUS_PORT/-/ready"
    render_prometheus_config
    if service_pid prometheus >/dev/null; then
        # Pick up a changed config (ports) without a restart.
        kill -HUP "$(service_pid prometheus)" 2>/dev/null || true
        wait_until prometheus 60 "GET /-/ready = 200" http_ok "$url"
        log "prometheus: already running (pid $(service_pid prometheus))"
        return 0
    fi
    command -v prometheus >/dev/null 2>&1 || die "prometheus is not installed; run \`make install\`"
    require_port "$PROMETHEUS_PORT" MODELYARD_PROMETHEUS_PORT Prometheus
    mkdir -p "$VAR_DIR/prometheus"
    start_bg prometheus prometheus --config.file="$PROMETHEUS_CONFIG" \
        --storage.tsdb.path="$VAR_DIR/prometheus" \
        --storage.tsdb.retention.time=7d \
        --web.listen-address="127.0.0.1:$PROMETHEUS_PORT"
    wait_until prometheus 60 "GET /-/ready = 200" http_ok "$url"
    log "prometheus: ready at http://127.0.0.1:$PROMETHEUS_PORT/"
}

write_stack_env() {
    {
        echo "MODELYARD_WEB_PORT=$WEB_PORT"
        echo "MODELYARD_S3_PORT=$S3_PORT"
        echo "MODELYARD_GATEWAY_PORT=$GATEWAY_PORT"
        echo "MODELYARD_GATEWAY_GRPC_PORT=$GATEWAY_GRPC_PORT"
        echo "MODELYARD_TRITON_HTTP_PORT=$TRITON_HTTP_PORT"
        echo "MODELYARD_TRITON_GRPC_PORT=$TRITON_GRPC_PORT"
        echo "MODELYARD_TRITON_METRICS_PORT=$TRITON_METRICS_PORT"
        echo "MODELYARD_PROMETHEUS_PORT=$PROMETHEUS_PORT"
        echo "MODELYARD_BENTOML_PORT=$BENTO_PORT"
        echo "CELERY_BROKER_URL=$CELERY_BROKER_URL"
        [[ -z "${DATABASE_URL:-}" ]] || echo "DATABASE_URL=$DATABASE_URL"
        echo "MODELYARD_WEB_REPLICAS=$WEB_REPLICAS"
        echo "MODELYARD_WORKERS=$WORKERS"
    } >"$PORTS_FILE"
    {
        echo "# Written by scripts/stack.sh start: \`source var/stack.env\` to reach this stack from a shell."
        [[ -n "${DATABASE_URL:-}" ]] && printf 'export DATABASE_URL=%q\n' "$DATABASE_URL"
        printf 'export CELERY_BROKER_URL=%q\n' "$CELERY_BROKER_URL"
        printf 'export MODELYARD_S3_ENDPOINT_URL=%q\n' "$MODELYARD_S3_ENDPOINT_URL"
        printf 'export MODELYARD_PROMETHEUS_URL=%q\n' "$MODELYARD_PROMETHEUS_URL"
        # The CLI's and the README's curl examples' settings; the token is read when the file is sourced.
        printf 'export MODELYARD_URL=%q\n' "http://127.0.0.1:$WEB_PORT"
        printf 'export MODELYARD_TOKEN="$(cat %q 2>/dev/null)"\n' "$TOKEN_FILE"
        printf 'export TOKEN="$MODELYARD_TOKEN" API=%q\n' "http://127.0.0.1:$WEB_PORT/api/v1"
    } >"$STACK_ENV_FILE"
}

run_seed() {
    if [[ "${MODELYARD_SEED:-1}" == 0 ]]; then
        log "seed: skipped (MODELYARD_SEED=0)"
        return 0
    fi
    log "seed: python -m demo.seed"
    "$PY" -m demo.seed \
        --api "http://127.0.0.1:$WEB_PORT" \
        --token-file "$TOKEN_FILE" \
        --inference-url "http://127.0.0.1:$GATEWAY_PORT" \
        --metrics-url "http://127.0.0.1:$TRITON_METRICS_PORT/metrics" \
        --bento-inference-url "http://127.0.0.1:$BENTO_PORT" \
        --prometheus-url "http://127.0.0.1:$PROMETHEUS_PORT" \
        --execution-env "$STACK_DIR/triton-env"
}

print_summary() {
    local password="(see var/local-login.txt)" token="(see var/admin.token)"
    [[ -s "$LOGIN_FILE" ]] && password="$(head -n 1 "$LOGIN_FILE")"
    [[ -s "$TOKEN_FILE" ]] && token="$(head -n 1 "$TOKEN_FILE")"
    local replicas=""
    ((WEB_REPLICAS > 1)) && replicas="  (and $((WEB_REPLICAS - 1)) more web replica(s) on the ports after it)"
    cat <<EOF

Modelyard is running.
  Web          http://127.0.0.1:$WEB_PORT/$replicas
  Workers      $WORKERS orchestrator worker(s), one beat
  API schema   http://127.0.0.1:$WEB_PORT/api/schema/
  Prometheus   http://127.0.0.1:$PROMETHEUS_PORT/
  Inference    http://127.0.0.1:$GATEWAY_PORT/v2  (host local: its agent's gateway, canaries; Triton itself at http://127.0.0.1:$TRITON_HTTP_PORT, gRPC 127.0.0.1:$TRITON_GRPC_PORT, metrics http://127.0.0.1:$TRITON_METRICS_PORT/metrics)
  BentoML      http://127.0.0.1:$BENTO_PORT/<model>/  (host $BENTO_HOST: its agent's nginx, e.g. POST /iris-bento/classify)
  S3           $MODELYARD_S3_ENDPOINT_URL
  Login        admin / $password
  API token    $token   (header: Authorization: Bearer <token>)
  Logs         var/log/   Shell env: source var/stack.env   Stop: make stop
EOF
}

# ---------------------------------------------------------------- commands

acquire_lock() {
    mkdir -p "$RUN_DIR" "$LOG_DIR"
    exec 9>"$RUN_DIR/stack.lock"
    if ! flock -n 9; then
        log "another scripts/stack.sh is running; waiting for it"
        flock 9
    fi
}

cmd_start() {
    acquire_lock
    if ((WEB_REPLICAS > 1 || WORKERS > 1)) && [[ "${DATABASE_URL:-}" != postgres* ]]; then
        die "MODELYARD_WEB_REPLICAS=$WEB_REPLICAS and MODELYARD_WORKERS=$WORKERS need PostgreSQL (DATABASE_URL=postgres://...): SQLite takes one writer at a time and has no row locks"
    fi
    [[ -x "$PY" ]] || die ".venv is missing; run \`make install\` first"
    report_database
    start_redis
    start_s3
    export MODELYARD_PROMETHEUS_URL="${MODELYARD_PROMETHEUS_URL:-http://127.0.0.1:$PROMETHEUS_PORT}"
    export DJANGO_SETTINGS_MODULE=modelyard.settings
    write_stack_env
    prepare_django
    start_web
    start_triton
    start_agent
    start_bento_agent
    start_orchestrator
    start_beat
    start_prometheus
    local seed_rc=0
    run_seed || seed_rc=$?
    print_summary
    if ((seed_rc != 0)); then
        warn "the demo seed failed (exit $seed_rc); the services above are up. Rerun it with:"
        warn "  .venv/bin/python -m demo.seed --api http://127.0.0.1:$WEB_PORT --inference-url http://127.0.0.1:$GATEWAY_PORT --bento-inference-url http://127.0.0.1:$BENTO_PORT"
        exit "$seed_rc"
    fi
}

cmd_stop() {
    acquire_lock
    local i
    if service_pid s3 >/dev/null; then
        MODELYARD_S3_ENDPOINT_URL="http://127.0.0.1:$S3_PORT" "$PY" scripts/s3_snapshot.py save "$VAR_DIR/s3-snapshot" \
            || warn "could not save the S3 stand-in's objects; they are lost with it"
    fi
    for ((i = ${#SERVICES[@]} - 1; i >= 0; i--)); do
        stop_service "${SERVICES[$i]}" 30
        # The gateway holds kept-alive connections to Triton, which waits for them before it exits.
        [[ "${SERVICES[$i]}" == agent ]] && stop_gateway
    done
    stop_bento_host
    rm -f "$RUN_DIR/celerybeat.pid" "$PORTS_FILE"
    log "stopped"
}

status_line() {
    printf '  %-15s %-5s %s\n' "$1" "$2" "$3"
}

cmd_status() {
    mkdir -p "$RUN_DIR"
    local s3_url="http://127.0.0.1:$S3_PORT"
    local name pid state detail up
    for name in database "${SERVICES[@]}"; do
        pid="$(service_pid "$name" 2>/dev/null || true)"
        case "$name" in
            database)
                up=1
                if [[ -n "${DATABASE_URL:-}" ]]; then
                    detail="DATABASE_URL (external)"
                else
                    detail="SQLite var/modelyard.sqlite3"
                fi
                ;;
            redis)
                up=0
                redis_answers && up=1
                detail="$REDIS_HOST:$REDIS_PORT${pid:+ pid $pid}"
                [[ -z "$pid" ]] && ((up)) && detail+=" (not managed here)"
                ;;
            s3)
                up=0
                http_answers "$s3_url/" && up=1
                detail="$s3_url${pid:+ pid $pid}"
                ;;
            web | web-*)
                up=0
                http_ok "http://127.0.0.1:$(web_port "$name")/healthz" && up=1
                detail="http://127.0.0.1:$(web_port "$name")/${pid:+ pid $pid}"
                ;;
            triton)
                up=0
                http_ok "http://127.0.0.1:$TRITON_HTTP_PORT/v2/health/live" && up=1
                detail="http://127.0.0.1:$TRITON_HTTP_PORT${pid:+ pid $pid}"
                ;;
            prometheus)
                up=0
                http_ok "http://127.0.0.1:$PROMETHEUS_PORT/-/ready" && up=1
                detail="http://127.0.0.1:$PROMETHEUS_PORT/${pid:+ pid $pid}"
                ;;
            *)
                up=0
                [[ -n "$pid" ]] && up=1
                detail="${pid:+pid $pid}"
                ;;
        esac
        state=down
        ((up)) && state=up
        status_line "$name" "$state" "$detail"
    done
    pid="$(gateway_pid || true)"
    state=down
    http_ok "http://127.0.0.1:$GATEWAY_PORT/healthz" && state=up
    status_line gateway "$state" "http://127.0.0.1:$GATEWAY_PORT${pid:+ pid $pid}"
    pid="$(bento_nginx_pid || true)"
    state=down
    http_ok "http://127.0.0.1:$BENTO_PORT/healthz" && state=up
    status_line bento-nginx "$state" "http://127.0.0.1:$BENTO_PORT${pid:+ pid $pid}"
    pid="$(bento_pids | tr '\n' ' ')"
    state=down
    [[ -n "$pid" ]] && state=up
    status_line bento-serve "$state" "${pid:+pids ${pid% }}"
}

case "${1:-}" in
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    *)
        echo "usage: $0 start|stop|status" >&2
        exit 2
        ;;
esac
