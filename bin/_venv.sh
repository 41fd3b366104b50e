# Sourced by bin/demo, bin/test and bin/serve: make .venv with the project installed from
# the lock files (requirements/base.txt, requirements/dev.txt), so that every machine runs
# the versions the suite was run with. Reinstalls only when the lock changed since the last
# install. PYTHON=python3.13 uses that interpreter, in a venv of its own (.venv-py3.13), so
# that CI's second run on the newest Python never reinstalls or overwrites .venv. Refresh
# the locks after changing pyproject.toml with:
#   .venv/bin/pip install uv && .venv/bin/uv pip compile pyproject.toml --universal \
#       --python-version 3.11 -o requirements/base.txt
#   (and the same with --extra dev -o requirements/dev.txt)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# A runnable path for interpreter $1 (a name on PATH or a path), or nothing and failure.
# Run, not just found: pyenv puts a shim on PATH for every version it has installed, which
# fails for a version not selected, so such a name is looked up among pyenv's versions.
python_path() {
    if "$1" -c '' >/dev/null 2>&1; then
        echo "$1"
        return 0
    fi
    command -v pyenv >/dev/null 2>&1 || return 1
    local version
    version="$(pyenv whence "$1" 2>/dev/null | sort -V | tail -n 1)"
    [ -n "$version" ] || return 1
    local path
    path="$(pyenv root)/versions/$version/bin/$1"
    "$path" -c '' >/dev/null 2>&1 || return 1
    echo "$path"
}

if [ -n "${PYTHON:-}" ]; then
    if ! PY="$(python_path "$PYTHON")"; then
        echo "error: PYTHON=$PYTHON does not run here; name an interpreter (or its path) that does" >&2
        exit 2
    fi
    VENV="$ROOT/.venv-py$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
else
    PY="$(python_path python3.11 || echo python3)"
    VENV="$ROOT/.venv"
fi

# PyICU (Unicode TR39 confusables, from ICU itself) builds against the system's ICU.
ensure_icu() {
    if command -v pkg-config >/dev/null 2>&1 && pkg-config --exists icu-uc 2>/dev/null \
        && command -v g++ >/dev/null 2>&1; then
        return 0
    fi
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "==> installing Debian packages for PyICU: libicu-dev pkg-config g++"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
            apt-get install -y -qq libicu-dev pkg-config g++ >/dev/null
    else
        echo "note: PyICU needs ICU's headers to build: apt-get install libicu-dev pkg-config g++" >&2
    fi
}

# Run a command with its output kept back: shown (on stderr) only if it fails. pip's
# warnings and banners would otherwise bury what the scripts print after them.
quietly() {
    local log status=0
    log="$(mktemp)"
    "$@" >"$log" 2>&1 || status=$?
    if [ "$status" != 0 ]; then
        cat "$log" >&2
    fi
    rm -f "$log"
    return "$status"
}

ensure_venv() {
    local extras="$1"
    local lock="$ROOT/requirements/base.txt"
    [ "$extras" = "dev" ] && lock="$ROOT/requirements/dev.txt"
    local stamp="$VENV/.installed-$extras"
    if [ ! -x "$VENV/bin/python" ]; then
        echo "==> creating $VENV"
        quietly "$PY" -m venv "$VENV"
    fi
    if [ ! -f "$stamp" ] || [ "$lock" -nt "$stamp" ] || [ "$ROOT/pyproject.toml" -nt "$stamp" ]; then
        echo "==> installing dependencies from ${lock#"$ROOT"/}"
        "$VENV/bin/python" -c 'import icu' 2>/dev/null || ensure_icu
        quietly "$VENV/bin/python" -m pip install --quiet --upgrade pip
        quietly "$VENV/bin/python" -m pip install --quiet -r "$lock"
        quietly "$VENV/bin/python" -m pip install --quiet --no-deps -e "$ROOT"
        touch "$stamp"
    fi
}
