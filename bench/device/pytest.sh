#!/usr/bin/env bash
# On the GPU machine (through .gpu/on-device.sh): one pytest run of the GPU tests, bounded, its whole log under $OUT.
#   bash .gpu/on-device.sh bash bench/device/pytest.sh NAME SECONDS [pytest arguments...]
# A device call that runs past its limit returns only what is under $OUT: a bounded run with a log of its own says
# which tests passed and why the others failed, where one long unbounded run says nothing.
set -uo pipefail
name=$1 limit=$2
shift 2
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/inductor}
mkdir -p "$OUT"
export THUNDER_NB_FAILURE_LOG="$OUT/$name.failures"  # each failure as it happens (tests/conftest.py)
# NOTE: -v: a line per test as it ends, with its name (-q's dots name nothing when the limit cuts the run short);
# SIGINT at the limit, SIGKILL 30 s later: pytest stops as on Ctrl-C and still prints which tests failed and why
timeout -s INT -k 30 "$limit" python3 -m pytest -m gpu -v --no-header -p no:cacheprovider -p no:logging --tb=short \
    -rfE "$@" > "$OUT/$name.log" 2>&1
echo "== $name: exit $? ($(tail -1 "$OUT/$name.log"))"
