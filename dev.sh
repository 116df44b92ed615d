#!/usr/bin/env bash
# thunder-nb's two commands. Each one sets up what it needs first (idempotent):
#   bash dev.sh example   run the main job on the built-in example
#   bash dev.sh test      run the tests (what CI runs)
# Set-up: uv (from PyPI) -> .venv with the locked versions (uv.lock) -> Graphviz's dot (Debian's
# graphviz, when root) -> the widget JavaScript that exported HTML pages inline, so their widgets work
# offline (npm pack into .cache/widget-js/; Debian's npm when root and npm is missing) -> for the tests,
# Debian's chromium for the browser tests (when root).
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

# The exact versions inlined into exported pages: the html-manager for ipywidgets 8, and require.js.
WIDGET_JS_PACKAGES=("@jupyter-widgets/html-manager@1.0.15" "requirejs@2.3.8")
WIDGET_JS_DIR=.cache/widget-js

widget_js() {  # require.js and embed-amd.js from the npm registry into $WIDGET_JS_DIR (once)
    [ -f "$WIDGET_JS_DIR/require.js" ] && [ -f "$WIDGET_JS_DIR/embed-amd.js" ] && return 0
    apt_install npm npm
    if ! command -v npm >/dev/null 2>&1; then
        say "npm is missing: exported HTML pages will load the widget JavaScript from a CDN (their widgets need network)"
        return 0
    fi
    say "fetching ${WIDGET_JS_PACKAGES[*]} (npm)"
    local tmp
    tmp=$(mktemp -d)
    if (cd "$tmp" && npm pack --silent "${WIDGET_JS_PACKAGES[@]}" >/dev/null &&
        tar -xzf jupyter-widgets-html-manager-*.tgz package/dist/embed-amd.js &&
        tar -xzf requirejs-*.tgz package/require.js); then
        mkdir -p "$WIDGET_JS_DIR"
        mv "$tmp/package/dist/embed-amd.js" "$tmp/package/require.js" "$WIDGET_JS_DIR/"
        printf '%s\n' "${WIDGET_JS_PACKAGES[@]}" >"$WIDGET_JS_DIR/VERSIONS"
    else
        say "npm pack failed: exported HTML pages will load the widget JavaScript from a CDN (their widgets need network)"
    fi
    rm -rf "$tmp"
}

setup() {
    need_uv
    uv sync --frozen --extra test --extra browser --quiet
    apt_install dot graphviz
    widget_js
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
