#!/usr/bin/env bash
# thunder-nb's two commands. Each one sets up what it needs first (idempotent):
#   bash dev.sh example   run the main job on the built-in example
#   bash dev.sh test      run the tests (what CI runs)
# Set-up: uv (from PyPI) -> .venv with the locked versions (uv.lock) -> Graphviz's dot (Debian's
# graphviz, when root) -> for the tests, Debian's chromium for the browser tests (when root).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

say() { printf 'dev.sh: %s\n' "$*" >&2; }

need_uv() {
    if ! command -v uv >/dev/null 2>&1; then
        say "installing uv (PyPI)"
        python3 -m pip install -q --disable-pip-version-check uv >&2 || python3 -m pip install -q --user uv >&2
        export PATH="$HOME/.local/bin:$PATH"
    fi
}

apt_install() {  # apt_install PROGRAM PACKAGE...: install Debian packages when PROGRAM is missing
    local prog=$1; shift
    command -v "$prog" >/dev/null 2>&1 && return 0
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        say "installing $* (Debian)"
        if [ -z "${_APT_UPDATED:-}" ]; then apt-get update -qq >&2; _APT_UPDATED=1; fi
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >&2
    else
        say "$prog is missing; install it with: sudo apt-get install $* (tests that need it are skipped)"
    fi
}

setup() {
    need_uv
    uv sync --frozen --extra test --extra browser --quiet
    apt_install dot graphviz
}

case "${1:-}" in
    example)
        setup
        shift
        exec .venv/bin/python -m thunder_nb example "$@"
        ;;
    test)
        setup
        apt_install chromium chromium fonts-liberation2
        shift
        exec .venv/bin/python -m pytest "$@"
        ;;
    *)
        echo "usage: bash dev.sh example | test [pytest args]" >&2
        exit 2
        ;;
esac
