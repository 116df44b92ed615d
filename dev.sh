#!/usr/bin/env bash
# thunder-nb's commands. Each one sets up what it needs first (idempotent), one progress line a step:
#   bash dev.sh example   run the main job on the built-in example
#   bash dev.sh test      run the tests (what CI runs); --fast: the inner loop's tier (not slow, browser or gpu)
#   bash dev.sh lab       open JupyterLab on a working copy of notebooks/ with the extension ready (as root too)
# Set-up: uv (on PATH, or else from PyPI into the private virtualenv .cache/uv-venv/: never into the
# system Python, which Debian's python3 refuses (PEP 668, "externally-managed-environment"); Debian's
# python3-venv first, when root and it is missing) -> .venv with the locked versions (uv.lock) ->
# Graphviz's dot (Debian's graphviz, when root) -> the widget JavaScript that exported HTML pages
# inline, so their widgets work offline (npm pack into .cache/widget-js/; Debian's npm when root and
# npm is missing) -> for the tests, Debian's chromium for the browser tests (when root).
# What apt-get, dpkg, pip and npm print is shown only when they fail.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

say() { printf 'dev.sh: %s\n' "$*" >&2; }

quietly() {  # quietly COMMAND...: run it, and show what it printed only if it fails
    local log rc=0
    log=$(mktemp)
    "$@" >"$log" 2>&1 || rc=$?
    if [ "$rc" != 0 ]; then
        cat "$log" >&2
        say "this failed (exit status $rc): $*"
    fi
    rm -f "$log"
    return "$rc"
}

can_apt() { [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; }

apt_get_update() {  # the package lists, quietly; waits up to APT_LOCK_WAIT seconds (600) for another apt-get
    # NOTE: DPkg::Lock::Timeout waits for dpkg's lock only: an apt-get update that holds the package lists' lock (the
    # daily timer's) makes a second one fail at once (exit 100, "Could not get lock /var/lib/apt/lists/lock")
    local log rc waited=0 wait=${APT_LOCK_WAIT:-600}
    log=$(mktemp)
    while :; do
        rc=0
        apt-get -o DPkg::Lock::Timeout="$wait" update >"$log" 2>&1 || rc=$?
        if [ "$rc" = 0 ] || ! grep -q "Could not get lock" "$log" || [ "$waited" -ge "$wait" ]; then
            break
        fi
        [ "$waited" = 0 ] && say "apt-get: another apt-get holds the package lists; waiting for it (up to $wait s)"
        sleep 5
        waited=$((waited + 5))
    done
    if [ "$rc" != 0 ]; then
        cat "$log" >&2
        say "this failed (exit status $rc): apt-get update"
    fi
    rm -f "$log"
    return "$rc"
}

apt_get_install() {  # apt_get_install PACKAGE...: Debian packages, quietly (root only)
    if [ -z "${_APT_UPDATED:-}" ]; then
        apt_get_update
        _APT_UPDATED=1
    fi
    # NOTE: another apt-get (an unattended upgrade) may hold dpkg's lock: wait for it rather than fail at once
    quietly env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends "$@"
}

apt_install() {  # apt_install STEP PROGRAM PACKAGE...: Debian packages when PROGRAM is missing
    local step=$1 prog=$2
    shift 2
    if command -v "$prog" >/dev/null 2>&1; then
        say "$step: $(command -v "$prog")"
    elif can_apt; then
        say "$step: installing Debian's $* (apt-get)"
        apt_get_install "$@"
    else
        say "$step: $prog is missing; install it with: sudo apt-get install $* (tests that need it are skipped)"
    fi
}

UV_VENV=.cache/uv-venv

need_python() {
    command -v python3 >/dev/null 2>&1 && return 0
    if can_apt; then
        say "python: installing Debian's python3 and python3-venv (apt-get)"
        apt_get_install python3 python3-venv
    else
        say "python3 is missing: install Python >= 3.10 (sudo apt-get install python3 python3-venv), then run this again"
        exit 1
    fi
}

need_uv() {  # sets UV
    if command -v uv >/dev/null 2>&1; then
        UV=uv
        say "uv: $(command -v uv)"
        return 0
    fi
    UV=$UV_VENV/bin/uv
    if [ -x "$UV" ]; then
        say "uv: $UV (private)"
        return 0
    fi
    need_python
    say "uv: installing it from PyPI into $UV_VENV (a private virtualenv; the system Python is left alone)"
    rm -rf "$UV_VENV"
    if ! python3 -m venv "$UV_VENV" >/dev/null 2>&1; then
        rm -rf "$UV_VENV"
        # NOTE: Debian's python3 has no venv module (ensurepip) until python3-venv is installed
        if can_apt; then
            say "uv: installing Debian's python3-venv first (apt-get)"
            apt_get_install python3-venv
            quietly python3 -m venv "$UV_VENV"
        else
            say "python3 -m venv fails: install Debian's python3-venv (sudo apt-get install python3-venv)" \
                "or uv itself (https://docs.astral.sh/uv/), then run this again"
            exit 1
        fi
    fi
    quietly "$UV_VENV/bin/python" -m pip install --disable-pip-version-check uv
}

# The exact versions inlined into exported pages: the html-manager for ipywidgets 8, and require.js.
WIDGET_JS_PACKAGES=("@jupyter-widgets/html-manager@1.0.15" "requirejs@2.3.8")
WIDGET_JS_DIR=.cache/widget-js

widget_js() {  # require.js and embed-amd.js from the npm registry into $WIDGET_JS_DIR (once)
    if [ -f "$WIDGET_JS_DIR/require.js" ] && [ -f "$WIDGET_JS_DIR/embed-amd.js" ]; then
        say "widget JavaScript: $WIDGET_JS_DIR"
        return 0
    fi
    command -v npm >/dev/null 2>&1 || apt_install "widget JavaScript" npm npm
    if ! command -v npm >/dev/null 2>&1; then
        say "widget JavaScript: npm is missing: exported HTML pages will load it from a CDN (their widgets need network)"
        return 0
    fi
    say "widget JavaScript: fetching ${WIDGET_JS_PACKAGES[*]} (npm)"
    local tmp
    tmp=$(mktemp -d)
    if (cd "$tmp" && quietly npm pack "${WIDGET_JS_PACKAGES[@]}" &&
        tar -xzf jupyter-widgets-html-manager-*.tgz package/dist/embed-amd.js &&
        tar -xzf requirejs-*.tgz package/require.js); then
        mkdir -p "$WIDGET_JS_DIR"
        mv "$tmp/package/dist/embed-amd.js" "$tmp/package/require.js" "$WIDGET_JS_DIR/"
        printf '%s\n' "${WIDGET_JS_PACKAGES[@]}" >"$WIDGET_JS_DIR/VERSIONS"
    else
        say "widget JavaScript: npm pack failed: exported HTML pages will load it from a CDN (their widgets need network)"
    fi
    rm -rf "$tmp"
}

setup() {
    need_uv
    if [ -x .venv/bin/python ]; then
        say ".venv: the locked versions of uv.lock (uv sync)"
    else
        say ".venv: creating it with the locked versions of uv.lock (uv sync; the first time downloads torch, minutes)"
    fi
    "$UV" sync --frozen --extra test --extra zoo --extra browser --quiet
    # NOTE: every Python this script starts (and the kernels, ranks and commands they start) writes the .pyc of what it
    # imports. Where PYTHONDONTWRITEBYTECODE is set (as on these machines) no process wrote them, and each one that
    # imported thunder compiled its sources again, about 5 s of CPU (the suite starts dozens). uv's --compile-bytecode
    # wrote them for the whole environment instead, at every fresh .venv: 26 s of CPU and 13 s before anything ran
    # (a clean clone's set-up, and the clone test_setup makes), for modules most of which nothing imports (2026-12-05)
    unset PYTHONDONTWRITEBYTECODE
    apt_install "Graphviz" dot graphviz
    widget_js
}

case "${1:-}" in
    example)
        setup
        shift
        say "running the example: .venv/bin/python -m thunder_nb example${*:+ $*}"
        exec .venv/bin/python -m thunder_nb example "$@"
        ;;
    test)
        setup
        shift
        # NOTE: pytest-xdist workers (THUNDER_NB_TEST_JOBS overrides, 1 runs in this process): the full suite one more
        # than the cores, since a worker waits while a kernel, a browser or a clone's set-up works (on 2 cores two
        # workers kept them 79% busy, three 100%: 12m43 -> 10m54); the fast tier, which waits on nothing, one per core
        # (a third worker's collection cost more than it gained). A test file stays on one worker, so its module
        # fixtures are made once
        cores=$(nproc 2>/dev/null || echo 1)
        [ "${1:-}" = "--fast" ] || cores=$(( cores + 1 ))
        jobs=${THUNDER_NB_TEST_JOBS:-$cores}
        [ "$jobs" -gt 5 ] && jobs=5
        workers=()
        [ "$jobs" -gt 1 ] && workers=(-n "$jobs" --dist loadfile --no-loadscope-reorder)  # LONGEST_FILES first (tests/conftest.py)
        if [ "${1:-}" = "--fast" ]; then
            # NOTE: the inner loop's tier: what runs in seconds (no kernel, notebook, browser, GPU or long training)
            shift
            say "running the fast tier: .venv/bin/python -m pytest -m 'not slow and not browser and not gpu'${workers[*]:+ ${workers[*]}}${*:+ $*}"
            exec .venv/bin/python -m pytest -m "not slow and not browser and not gpu" "${workers[@]}" "$@"
        fi
        apt_install "browser" chromium chromium fonts-liberation2
        say "running the tests: .venv/bin/python -m pytest${workers[*]:+ ${workers[*]}}${*:+ $*}"
        exec .venv/bin/python -m pytest "${workers[@]}" "$@"
        ;;
    lab)
        setup
        shift
        # NOTE: Jupyter refuses to run as root without --allow-root; the server listens on this machine only
        root=()
        [ "$(id -u)" = 0 ] && root=(--allow-root)
        # NOTE: a working copy, so that Lab's autosave and the user's new notebooks never touch the repository; a
        # notebook already there is the user's (their edits, their saved widget state) and is never overwritten
        lab_dir=${THUNDER_NB_LAB_DIR:-.cache/lab}
        mkdir -p "$lab_dir"
        copied=0
        for nb in notebooks/*.ipynb; do
            if [ ! -e "$lab_dir/$(basename "$nb")" ]; then
                cp "$nb" "$lab_dir/"
                copied=$((copied + 1))
            fi
        done
        say "notebooks: a working copy in $lab_dir ($copied copied from notebooks/; yours kept as you saved them;" \
            "delete one to get the repository's version back)"
        # NOTE: Lab's default for this .venv only (its overrides.json): a notebook saved in Lab keeps its widgets'
        # state, so its toggles show again when it is reopened (ipywidgets' own default is not to save it)
        mkdir -p .venv/share/jupyter/lab/settings
        printf '%s\n' '{"@jupyter-widgets/jupyterlab-manager:plugin": {"saveState": true}}' \
            >.venv/share/jupyter/lab/settings/overrides.json
        say "opening JupyterLab on $lab_dir (stop it with Ctrl-C); in a notebook: %load_ext thunder_nb"
        exec .venv/bin/python -m jupyterlab --ServerApp.ip=127.0.0.1 --ServerApp.root_dir="$lab_dir" "${root[@]}" "$@"
        ;;
    *)
        echo "usage: bash dev.sh example | test [--fast] [pytest args] | lab [jupyterlab args]" >&2
        exit 2
        ;;
esac
