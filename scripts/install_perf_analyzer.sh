#!/usr/bin/env bash
# Install the load generators that performance cards are measured with.
#
#   perf_analyzer   Triton's own load tool (Triton versions). PyPI's perf-analyzer package holds
#                   no binary for this platform; the binary ships inside the tritonclient 2.41.0
#                   wheel (tritonclient-2.41.0.data/data/bin/perf_analyzer), so only that member
#                   is unpacked. The project's own tritonclient is not touched.
#   wrk             Debian's HTTP load generator (BentoML versions), driven by
#                   modelyard_agent/profiling/wrk_report.lua.
#
# Lays out, under $MODELYARD_STACK_DIR (default: <repo>/.stack):
#   perf_analyzer/bin/perf_analyzer   the binary
#   perf_analyzer/lib/                libcudart.so.12 from PyPI's nvidia-cuda-runtime-cu12 (the
#                                     binary links it; without a GPU it is loaded but not used)
#   bin/perf_analyzer                 wrapper that sets LD_LIBRARY_PATH and execs the binary
#
# Debian packages: libb64-0d (the binary links libb64.so.0d) and wrk.
# Idempotent: a marker records a finished install; a second run checks it and exits.
set -euo pipefail

TRITONCLIENT_VERSION="2.41.0"
CUDART_REQUIREMENT="nvidia-cuda-runtime-cu12>=12,<13"
MARKER_CONTENT="tritonclient=${TRITONCLIENT_VERSION} cudart=${CUDART_REQUIREMENT} layout=1"

REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STACK_DIR="${MODELYARD_STACK_DIR:-$REPO_DIR/.stack}"
PA_DIR="$STACK_DIR/perf_analyzer"
WRAPPER="$STACK_DIR/bin/perf_analyzer"
MARKER="$STACK_DIR/.perf-analyzer-installed"

log() { printf 'install_perf_analyzer: %s\n' "$*"; }

installed() {
    [[ -f "$MARKER" && "$(cat "$MARKER")" == "$MARKER_CONTENT" && -x "$WRAPPER" \
       && -x "$PA_DIR/bin/perf_analyzer" ]] && command -v wrk >/dev/null 2>&1 \
       && "$WRAPPER" --version >/dev/null 2>&1
}

if installed; then
    log "already installed in $STACK_DIR"
    exit 0
fi

mkdir -p "$STACK_DIR"
exec 9>"$STACK_DIR/.install.lock"
flock 9
if installed; then
    log "already installed in $STACK_DIR"
    exit 0
fi

missing=()
dpkg -s libb64-0d >/dev/null 2>&1 || missing+=(libb64-0d)
command -v wrk >/dev/null 2>&1 || missing+=(wrk)
if ((${#missing[@]})); then
    log "installing Debian packages: ${missing[*]}"
    apt-get install -y --no-install-recommends "${missing[@]}" \
        || { apt-get update && apt-get install -y --no-install-recommends "${missing[@]}"; }
fi

if [[ -x "$REPO_DIR/.venv/bin/python" ]]; then
    TOOL_PYTHON="$REPO_DIR/.venv/bin/python"
else
    TOOL_PYTHON="python3"
fi

rm -f "$MARKER"
downloads="$STACK_DIR/downloads"
mkdir -p "$downloads" "$PA_DIR/bin" "$PA_DIR/lib" "$STACK_DIR/bin"
log "downloading tritonclient $TRITONCLIENT_VERSION and the CUDA runtime (wheels, no install)"
"$TOOL_PYTHON" -m pip download --disable-pip-version-check --no-deps -q -d "$downloads" \
    "tritonclient==$TRITONCLIENT_VERSION" "$CUDART_REQUIREMENT"

"$TOOL_PYTHON" - "$downloads" "$PA_DIR" "$TRITONCLIENT_VERSION" <<'PY'
"""Unpack perf_analyzer from the tritonclient wheel and libcudart from the CUDA runtime wheel."""
import pathlib
import stat
import sys
import zipfile

downloads, target, version = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3]
member = f"tritonclient-{version}.data/data/bin/perf_analyzer"
with zipfile.ZipFile(next(downloads.glob(f"tritonclient-{version}-*.whl"))) as wheel:
    (target / "bin" / "perf_analyzer").write_bytes(wheel.read(member))
(target / "bin" / "perf_analyzer").chmod(0o755)
cudart = sorted(downloads.glob("nvidia_cuda_runtime_cu12-*.whl"))[-1]
with zipfile.ZipFile(cudart) as wheel:
    for name in wheel.namelist():
        if "/cuda_runtime/lib/libcudart.so" in name:
            out = target / "lib" / pathlib.PurePosixPath(name).name
            out.write_bytes(wheel.read(name))
            out.chmod(out.stat().st_mode | stat.S_IXUSR)
PY

cat >"$WRAPPER" <<EOF
#!/usr/bin/env bash
# Triton's perf_analyzer (from the tritonclient $TRITONCLIENT_VERSION wheel); see scripts/install_perf_analyzer.sh.
export LD_LIBRARY_PATH="$PA_DIR/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
exec "$PA_DIR/bin/perf_analyzer" "\$@"
EOF
chmod +x "$WRAPPER"

if ! "$WRAPPER" --version >/dev/null 2>&1; then
    log "error: $WRAPPER does not start:" >&2
    "$WRAPPER" --version 2>&1 | tail -n 3 >&2
    exit 1
fi
echo "$MARKER_CONTENT" >"$MARKER"
log "installed $WRAPPER and $(command -v wrk)"
