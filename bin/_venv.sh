# Sourced by bin/demo and bin/test: make .venv with the project installed.
# Reinstalls only when pyproject.toml changed since the last install.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3

ensure_venv() {
    local extras="$1"
    local stamp="$VENV/.installed-$extras"
    if [ ! -x "$VENV/bin/python" ]; then
        echo "==> creating $VENV"
        "$PY" -m venv "$VENV"
    fi
    if [ ! -f "$stamp" ] || [ "$ROOT/pyproject.toml" -nt "$stamp" ]; then
        echo "==> installing dependencies ($extras)"
        "$VENV/bin/python" -m pip install --quiet --upgrade pip
        if [ "$extras" = "dev" ]; then
            "$VENV/bin/python" -m pip install --quiet -e "$ROOT[dev]"
        else
            "$VENV/bin/python" -m pip install --quiet -e "$ROOT"
        fi
        touch "$stamp"
    fi
}
