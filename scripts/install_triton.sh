#!/usr/bin/env bash
# Install a CPU-capable Triton Inference Server for local runs and tests.
#
# Lays out, under $MODELYARD_STACK_DIR (default: <repo>/.stack):
#   triton/          tritonserver 2.51 unpacked from the nvidia-pytriton wheel
#                    (bin/, lib/, backends/python with the Python 3.11 stub, caches/)
#   bin/tritonserver wrapper that sets LD_LIBRARY_PATH and execs the real binary
#   triton-env/      venv of the system Python 3.11 with numpy<2 and onnxruntime,
#                    given to python-backend models as EXECUTION_ENV_PATH
#
# Idempotent: a marker file records a finished install, and a second run only
# checks that marker and the key files, then exits.
#
# Environment:
#   MODELYARD_STACK_DIR   where to install (default <repo>/.stack)
#   MODELYARD_WHEEL_DIR   extra folder to look in for the pytriton wheel
#   SYSTEM_PYTHON         Python 3.11 the stub links against (default /usr/bin/python3.11)
set -euo pipefail

PYTRITON_VERSION="0.7.0"
WHEEL_NAME="nvidia_pytriton-${PYTRITON_VERSION}-py3-none-manylinux_2_35_x86_64.whl"
STUB_PYTHON="3.11"
ENV_REQUIREMENTS=("numpy<2" "onnxruntime")
# Bump when the layout below changes so existing installs are redone.
MARKER_CONTENT="pytriton=${PYTRITON_VERSION} stub=${STUB_PYTHON} env=${ENV_REQUIREMENTS[*]} layout=2"

REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STACK_DIR="${MODELYARD_STACK_DIR:-$REPO_DIR/.stack}"
SYSTEM_PYTHON="${SYSTEM_PYTHON:-/usr/bin/python3.11}"
TRITON_DIR="$STACK_DIR/triton"
ENV_DIR="$STACK_DIR/triton-env"
WRAPPER="$STACK_DIR/bin/tritonserver"
MARKER="$STACK_DIR/.triton-installed"

log() { printf 'install_triton: %s\n' "$*"; }

installed() {
    [[ -f "$MARKER" && "$(cat "$MARKER")" == "$MARKER_CONTENT" \
       && -x "$WRAPPER" && -x "$TRITON_DIR/bin/tritonserver" \
       && -x "$TRITON_DIR/backends/python/triton_python_backend_stub" \
       && -x "$ENV_DIR/bin/python" ]]
}

if installed; then
    log "already installed in $STACK_DIR"
    exit 0
fi

# Parallel runs (e.g. several test workers) wait for the first one to finish.
mkdir -p "$STACK_DIR"
exec 9>"$STACK_DIR/.install.lock"
flock 9
if installed; then
    log "already installed in $STACK_DIR"
    exit 0
fi

if [[ ! -x "$SYSTEM_PYTHON" ]]; then
    log "error: $SYSTEM_PYTHON not found; the Triton python backend stub links the system libpython3.11" >&2
    exit 1
fi
if ! "$SYSTEM_PYTHON" -c "import ensurepip" 2>/dev/null; then
    log "error: $SYSTEM_PYTHON cannot create venvs; install Debian's python3.11-venv package" >&2
    exit 1
fi

# A Python with pip, used only to download the wheel and unpack it.
if [[ -x "$REPO_DIR/.venv/bin/python" ]]; then
    TOOL_PYTHON="$REPO_DIR/.venv/bin/python"
else
    TOOL_PYTHON="$SYSTEM_PYTHON"
fi

rm -f "$MARKER"
mkdir -p "$STACK_DIR/downloads" "$STACK_DIR/bin"

# 1. Find or download the wheel.
wheel=""
for dir in "${MODELYARD_WHEEL_DIR:-}" "$STACK_DIR/downloads" /tmp/setup/wheels; do
    if [[ -n "$dir" && -f "$dir/$WHEEL_NAME" ]]; then
        wheel="$dir/$WHEEL_NAME"
        break
    fi
done
if [[ -z "$wheel" ]]; then
    log "downloading nvidia-pytriton==$PYTRITON_VERSION (about 55 MB)"
    "$TOOL_PYTHON" -m pip download --quiet --no-deps --only-binary=:all: \
        --platform manylinux_2_35_x86_64 --python-version 3.11 \
        --dest "$STACK_DIR/downloads" "nvidia-pytriton==$PYTRITON_VERSION"
    wheel="$STACK_DIR/downloads/$WHEEL_NAME"
fi
log "using wheel $wheel"

# 2. Unpack only the server tree and its bundled shared libraries.
log "unpacking tritonserver into $TRITON_DIR"
rm -rf "$TRITON_DIR" "$TRITON_DIR.tmp"
mkdir -p "$TRITON_DIR.tmp"
"$TOOL_PYTHON" - "$wheel" "$TRITON_DIR.tmp" <<'PY'
import sys
import zipfile
from pathlib import Path

wheel, dest = sys.argv[1], Path(sys.argv[2])
with zipfile.ZipFile(wheel) as zf:
    for info in zf.infolist():
        name = info.filename
        if info.is_dir():
            continue
        if name.startswith("pytriton/tritonserver/"):
            target = dest / name[len("pytriton/tritonserver/"):]
        elif name.startswith("nvidia_pytriton.libs/"):
            # The binary's RPATH includes ${ORIGIN}/../lib.
            target = dest / "lib" / name[len("nvidia_pytriton.libs/"):]
        else:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        with zf.open(info) as src, open(target, "wb") as out:
            while chunk := src.read(1 << 20):
                out.write(chunk)
        mode = (info.external_attr >> 16) & 0o777
        target.chmod(0o755 if mode & 0o111 else 0o644)
PY
cp "$TRITON_DIR.tmp/python_backend_stubs/$STUB_PYTHON/triton_python_backend_stub" \
   "$TRITON_DIR.tmp/backends/python/triton_python_backend_stub"
chmod 755 "$TRITON_DIR.tmp/backends/python/triton_python_backend_stub"
rm -rf "$TRITON_DIR.tmp/python_backend_stubs"
mv "$TRITON_DIR.tmp" "$TRITON_DIR"

# 3. Wrapper: the python backend and its stub are separate loads/processes whose
# RPATH points into the wheel's layout, so they find the bundled libraries through
# LD_LIBRARY_PATH, which the stub process inherits.
log "writing wrapper $WRAPPER"
cat > "$WRAPPER.tmp" <<'EOF'
#!/usr/bin/env bash
# Runs the tritonserver installed by scripts/install_triton.sh (found relative to this
# file). Unless given, --backend-directory and --cache-directory point into that install.
triton_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/../triton" && pwd)"
export LD_LIBRARY_PATH="$triton_dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
defaults=()
[[ " $* " == *" --backend-directory"* ]] || defaults+=("--backend-directory=$triton_dir/backends")
[[ " $* " == *" --cache-directory"* ]] || defaults+=("--cache-directory=$triton_dir/caches")
exec "$triton_dir/bin/tritonserver" "${defaults[@]}" "$@"
EOF
chmod 755 "$WRAPPER.tmp"
mv "$WRAPPER.tmp" "$WRAPPER"

# `tritonserver --help` prints its usage and exits 1; a missing shared library
# shows up as a loader error instead of the usage line.
help_output="$("$WRAPPER" --help 2>&1 || true)"
if [[ "$help_output" != *"Usage: tritonserver"* ]]; then
    log "error: $WRAPPER does not run:" >&2
    printf '%s\n' "$help_output" | tail -n 20 >&2
    exit 1
fi
log "tritonserver runs"

# 4. Execution environment for python-backend models.
if [[ ! -x "$ENV_DIR/bin/python" ]]; then
    log "creating execution environment $ENV_DIR with $SYSTEM_PYTHON"
    rm -rf "$ENV_DIR"
    "$SYSTEM_PYTHON" -m venv "$ENV_DIR"
fi
log "installing ${ENV_REQUIREMENTS[*]} into $ENV_DIR"
"$ENV_DIR/bin/python" -m pip install --quiet --disable-pip-version-check "${ENV_REQUIREMENTS[@]}"
"$ENV_DIR/bin/python" -c "import numpy, onnxruntime; print('install_triton: env numpy', numpy.__version__, 'onnxruntime', onnxruntime.__version__)"

printf '%s' "$MARKER_CONTENT" > "$MARKER"
log "done: run $WRAPPER, EXECUTION_ENV_PATH=$ENV_DIR"
