#!/usr/bin/env bash
# Before/after benchmark comparison in one GPU session.
#   scripts/bench_compare.sh BEFORE_DIR [SCRIPT ARGS...]
# BEFORE_DIR is a checkout of the earlier commit (e.g. `git worktree add .before REV`,
# carried to the GPU machine). SCRIPT defaults to run_all.py; with launch_overhead.py or
# alloc_free.py the two trees take turns ${ROUNDS:-2} times each, before first. Each run
# writes its JSON under $OUT/before-K or $OUT/after-K and its output to $OUT/compare.log.
# Prepares the GPU machine's Python as scripts/gpu_check.sh does (wheels from .whl/).
set -uo pipefail

BEFORE=${1:?usage: $0 BEFORE_DIR [SCRIPT ARGS...]}
# Absolute: each run goes into its tree, and its PYTHONPATH must still name it there.
BEFORE=$(cd "$BEFORE" && pwd) || { echo "no such checkout: $1" >&2; exit 2; }
shift
SCRIPT=${1:-run_all.py}
shift || true
OUT=${OUT:-./gpu-out}
ROUNDS=${ROUNDS:-2}
# A crash leaves a stack in the log (PYTHONFAULTHANDLER).
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 PYTHONWARNINGS=ignore NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0
mkdir -p "$OUT"

SITE=/tmp/site
if compgen -G ".whl/*.whl" > /dev/null && [[ ! -d "$SITE/numpy" ]]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" .whl/*.whl
fi

AFTER=$PWD
for k in $(seq 1 "$ROUNDS"); do
    for side in before after; do
        dir=$BEFORE
        [[ $side == after ]] && dir=$AFTER
        echo "=== $side round $k: $SCRIPT $*" | tee -a "$OUT/compare.log"
        (cd "$dir" && PYTHONPATH="$SITE:$dir" NSS_BENCH_DIR="$OUT/$side-$k" \
            python3 "benchmarks/$SCRIPT" "$@") 2>&1 | tee -a "$OUT/compare.log"
    done
done
