#!/usr/bin/env bash
# GPU check: GPU tests, full-size examples and (with GPU_BENCH=1) benchmarks.
# Run from the repository root on a CUDA machine:
#   scripts/gpu_check.sh [tests|examples|bench]
# Logs go under $OUT (default ./gpu-out). Pinned wheels (numpy < 2.5 and the test
# dependencies) are taken from .whl/ and installed into a private target directory.
set -uo pipefail

OUT=${OUT:-./gpu-out}
GPU_BENCH=${GPU_BENCH:-0}
ONLY=${1:-}
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1  # a crash leaves a stack in the log

case "$ONLY" in
    ""|tests|examples|bench) ;;
    *) echo "usage: $0 [tests|examples|bench]" >&2; exit 2 ;;
esac

mkdir -p "$OUT"

SITE=/tmp/site
# .whl/: numpy < 2.5 and the test dependencies; .whl-dask/ (optional): distributed and
# its dependencies, for the Dask GPU test (pip download "distributed==X" --python-version 3.12
# --only-binary=:all: -d .whl-dask).
if compgen -G ".whl/*.whl" > /dev/null; then
    wheels=(.whl/*.whl)
    if compgen -G ".whl-dask/*.whl" > /dev/null; then
        wheels+=(.whl-dask/*.whl)
    fi
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" "${wheels[@]}"
else
    echo "warning: no wheels in .whl/; using the installed packages" >&2
fi
export PYTHONPATH="$SITE:$PWD"
# GPU runs are in-process and in order (the repository default spreads tests over
# pytest-xdist workers, carried in .whl).
export PYTEST_ADDOPTS="-n 0 ${PYTEST_ADDOPTS:-}"

python3 - <<'PY'
import sys
print("python    ", sys.version.split()[0])
for name in ("numpy", "numba"):
    try:
        mod = __import__(name)
        print(f"{name:<10}", mod.__version__)
    except Exception as exc:  # noqa: BLE001
        print(f"{name:<10} import failed: {exc}")
try:
    from importlib.metadata import version
    print("numba-cuda", version("numba-cuda"))
except Exception as exc:  # noqa: BLE001
    print("numba-cuda not found:", exc)
PY
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || echo "nvidia-smi failed"

NAMES=()
CODES=()
SECS=()

# step NAME LOG CMD...: run CMD, append its output to $OUT/LOG, record status and time.
step() {
    local name=$1 log=$2
    shift 2
    echo "=== $name: $*" | tee -a "$OUT/$log"
    local t0 t1 rc
    t0=$(date +%s.%N)
    "$@" 2>&1 | tee -a "$OUT/$log"
    rc=${PIPESTATUS[0]}
    t1=$(date +%s.%N)
    NAMES+=("$name")
    CODES+=("$rc")
    SECS+=("$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')")
    echo "=== $name: exit $rc" | tee -a "$OUT/$log"
}

want() { [[ -z "$ONLY" || "$ONLY" == "$1" ]]; }

N=$((1 << 24))

if want tests; then
    : > "$OUT/gpu_tests.log"
    # tests/gpu on its own: the CPU suite's conftest switches Numba's simulator on.
    step gpu_tests gpu_tests.log python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu
fi

if want examples; then
    : > "$OUT/examples.log"
    for ex in multistream_sort hash_join sort_join_pipeline; do
        step "$ex" examples.log python3 "examples/$ex.py" --n "$N" --repeat 3
        # Tracking off: the same work unfenced; the summary says how many runs were wrong.
        step "$ex-untracked" examples.log python3 "examples/$ex.py" --n "$N" --no-tracking \
            --repeat "${UNTRACKED_RUNS:-20}"
    done
fi

if want bench; then
    if [[ -f benchmarks/run_all.py && "$GPU_BENCH" == 1 ]]; then
        : > "$OUT/bench.log"
        step bench bench.log python3 benchmarks/run_all.py
    else
        echo "bench skipped (needs benchmarks/run_all.py and GPU_BENCH=1)"
    fi
fi

echo
printf '%-22s %6s %10s\n' step exit seconds
status=0
for i in "${!NAMES[@]}"; do
    printf '%-22s %6s %10s\n' "${NAMES[$i]}" "${CODES[$i]}" "${SECS[$i]}"
    [[ "${CODES[$i]}" == 0 ]] || status=1
done
exit "$status"
