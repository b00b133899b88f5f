#!/usr/bin/env bash
# One GPU call's worth of checks for this round's issues, run from the repository root on
# the GPU machine:  scripts/gpu_round.sh tests|bench
#   tests: the GPU suite (with the Dask and plain-Numba tests), the examples with inferred
#          accesses, the traced sort -> join pipeline (JSON + PNG under $OUT), the access
#          inference's cost against compiling;
#   bench: launch and allocation benchmarks, this tree against the checkout in .before/
#          (scripts/bench_compare.sh), rounds interleaved.
# Wheels: .whl/ (numpy < 2.5, rmm), .whl-dask/ (distributed), .whl-plot/ (matplotlib).
set -uo pipefail
OUT=${OUT:-./gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
SITE=/tmp/site
wheels=()
for d in .whl-dask .whl-plot .whl; do
    compgen -G "$d/*.whl" > /dev/null && wheels+=("$d"/*.whl)
done
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "${wheels[@]}" 2>&1 | tail -2
export PYTHONPATH="$SITE:$PWD"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader

run() {  # run NAME CMD...: output to $OUT/NAME.log, one summary line
    local name=$1; shift
    local t0=$SECONDS
    "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    printf '%-28s exit %3s  %4ss\n' "$name" "$rc" "$((SECONDS - t0))" | tee -a "$OUT/steps.txt"
}

case "${1:-tests}" in
tests)
    export NSS_RACE_REPORT=$OUT/race.txt
    run gpu_tests python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu -rs
    for ex in multistream_sort hash_join sort_join_pipeline; do
        NUMBA_STREAMSAFE_ACCESS=infer run "infer_$ex" python3 "examples/$ex.py" --repeat 3
    done
    run inference_cost python3 benchmarks/inference_cost.py
    tail -3 "$OUT/gpu_tests.log"
    grep -h -E "result|runs:" "$OUT"/infer_*.log
    tail -16 "$OUT/inference_cost.log"
    cat "$OUT/race.txt"
    ;;
bench)
    export NSS_RACE_REPORT=$OUT/race.txt
    run gpu_tests_quick python3 -m pytest -m gpu -q -p no:cacheprovider \
        tests/gpu/test_plain_numba_gpu.py tests/gpu/test_dask_gpu.py tests/gpu/test_races.py
    tail -2 "$OUT/gpu_tests_quick.log"; cat "$OUT/race.txt"
    # The pipeline traced on its second run (the first compiles the kernels).
    run traced_pipeline python3 examples/sort_join_pipeline.py --repeat 2 \
        --trace "$OUT/sort_join_trace.json" --plot "$OUT/sort_join_trace.png"
    grep -h -E "result|trace:" "$OUT/traced_pipeline.log"
    ROUNDS=${ROUNDS:-2} bash scripts/bench_compare.sh "$PWD/.before" launch_overhead.py \
        > "$OUT/launch.log" 2>&1
    ROUNDS=${ROUNDS:-2} bash scripts/bench_compare.sh "$PWD/.before" alloc_free.py \
        > "$OUT/alloc.log" 2>&1
    grep -E "^=== |same stream|cross stream|ratio|us/" "$OUT/launch.log" "$OUT/alloc.log" | head -60
    ;;
esac
cat "$OUT/steps.txt" 2>/dev/null
