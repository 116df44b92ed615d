#!/usr/bin/env bash
# On the GPU machine (through .gpu/on-device.sh): re-execute teaching notebooks in place, one at a time, each copied
# under $OUT/notebooks/ as soon as it is done (copy them back into notebooks/ here).
#   bash .gpu/on-device.sh bash bench/device/notebooks.sh 01 06 ...
set -uo pipefail
export JUPYTER_PATH=${JUPYTER_PATH:-/tmp/site/share/jupyter} TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/inductor}
mkdir -p "$OUT/notebooks"
for nb in "$@"; do
    start=$SECONDS
    python3 -m thunder_nb notebooks --in-place "$nb" > "$OUT/notebook-$nb.log" 2>&1
    echo "== $nb: exit $?, $((SECONDS - start)) s"
    cp notebooks/"$nb"_*.ipynb "$OUT/notebooks/"
done
