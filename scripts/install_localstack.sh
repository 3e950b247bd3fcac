#!/usr/bin/env bash
# Install LocalStack's S3 into its own virtualenv (it needs Python 3.13; the project runs on 3.11).
#
# Lays out, under $MODELYARD_STACK_DIR (default: <repo>/.stack):
#   localstack/        the virtualenv, from scripts/localstack-requirements.txt
#   bin/localstack-s3  starts LocalStack with S3 only: localstack-s3 HOST:PORT DATA_DIR
#
# Python 3.13 is taken from $MODELYARD_PYTHON313, else `python3.13` on PATH, else pyenv's newest 3.13.
# Idempotent: a marker holding the requirements' checksum records a finished install.
set -euo pipefail

REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STACK_DIR="${MODELYARD_STACK_DIR:-$REPO_DIR/.stack}"
VENV="$STACK_DIR/localstack"
REQUIREMENTS="$REPO_DIR/scripts/localstack-requirements.txt"
MARKER="$STACK_DIR/.localstack-installed"
WANT="$(sha256sum "$REQUIREMENTS" | cut -d' ' -f1)"

if [[ -f "$MARKER" && "$(cat "$MARKER")" == "$WANT" && -x "$STACK_DIR/bin/localstack-s3" ]]; then
    exit 0
fi

python313="${MODELYARD_PYTHON313:-}"
if [[ -z "$python313" ]]; then
    python313="$(command -v python3.13 || true)"
fi
if [[ -z "$python313" || "$python313" == *"/shims/"* ]]; then
    candidate="$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.13*/bin/python3.13 2>/dev/null | sort -V | tail -1 || true)"
    [[ -n "$candidate" ]] && python313="$candidate"
fi
if [[ -z "$python313" ]] || ! "$python313" -c 'import sys; assert sys.version_info[:2] == (3, 13)' 2>/dev/null; then
    echo "install_localstack: LocalStack's S3 needs Python 3.13; set MODELYARD_PYTHON313 to one" >&2
    exit 1
fi

echo "install_localstack: LocalStack S3 into $VENV (with $python313)"
rm -rf "$VENV"
"$python313" -m venv "$VENV"
"$VENV/bin/pip" install --quiet --disable-pip-version-check -r "$REQUIREMENTS"
"$VENV/bin/python" -c 'import localstack.aws.components, localstack.services.s3.provider'

mkdir -p "$STACK_DIR/bin"
cat >"$STACK_DIR/bin/localstack-s3" <<WRAPPER
#!/usr/bin/env bash
# localstack-s3 HOST:PORT DATA_DIR: LocalStack with S3 only, in the foreground, objects under DATA_DIR.
set -euo pipefail
mkdir -p "\$2"
cd "\$2"
export SERVICES=s3 GATEWAY_LISTEN="\$1" LOCALSTACK_HOST="\$1" DISABLE_EVENTS=1 SKIP_SSL_CERT_DOWNLOAD=1
export EAGER_SERVICE_LOADING=1 FILESYSTEM_ROOT="\$2" TMPDIR="\$2"
exec "$VENV/bin/python" -m localstack.runtime.main
WRAPPER
chmod +x "$STACK_DIR/bin/localstack-s3"
echo "$WANT" >"$MARKER"
echo "install_localstack: done"
