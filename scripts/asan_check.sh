#!/usr/bin/env bash
# The compiled engine under AddressSanitizer and UndefinedBehaviorSanitizer.
#
# Run from the repository root on a CUDA machine (gcc with libasan and libubsan):
#   scripts/asan_check.sh [pytest arguments]      (default: -m gpu tests/gpu)
#
# 1. Builds the engine's extensions in place with -fsanitize=address,undefined.
# 2. Negative control: a small C library built with the same flags writes one
#    byte past a heap block and shifts by a negative amount; with the runtimes
#    preloaded, ASan and UBSan must report both (else the set-up sees nothing and
#    the run is void).
# 3. The GPU suite (or the given pytest arguments), then scripts/stress_threads.py
#    for ASAN_STRESS_SECONDS (default 60), with the sanitizer runtimes preloaded
#    (Python itself is not instrumented; PYTHONMALLOC=malloc sends its objects
#    through the allocator ASan watches). ASAN_OPTIONS: protect_shadow_gap=0 (the
#    CUDA driver maps memory where ASan would protect), detect_leaks=0 (the
#    interpreter leaks at exit by design), halt_on_error=0 so every report shows.
# 4. Counts the reports ("ERROR: AddressSanitizer", "runtime error:") in the logs
#    and prints a table; exit status 1 when the control saw nothing or a run
#    reported anything.
# 5. Rebuilds the extensions without the sanitizers.
#
# Logs: $OUT (default ./gpu-out): asan_build.log, asan_control.log, asan_suite.log,
# asan_stress.log.
set -uo pipefail
OUT=${OUT:-./gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1  # a crash leaves a stack in the log
SITE=/tmp/site
if [[ "${NSS_SKIP_WHEELS:-0}" != 1 ]] && compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" .whl/*.whl .whl-build/*.whl 2>&1 | tail -2
fi
export PYTHONPATH="$SITE:$PWD"
export PYTEST_ADDOPTS="-n 0 ${PYTEST_ADDOPTS:-}"

ASAN_LIB=$(gcc -print-file-name=libasan.so)
UBSAN_LIB=$(gcc -print-file-name=libubsan.so)
if [[ ! -e "$ASAN_LIB" || ! -e "$UBSAN_LIB" ]]; then
    echo "libasan or libubsan not found (gcc -print-file-name): $ASAN_LIB $UBSAN_LIB" >&2
    exit 2
fi
FLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer -g -O1"
SAN_ENV=(env LD_PRELOAD="$ASAN_LIB:$UBSAN_LIB" PYTHONMALLOC=malloc
         ASAN_OPTIONS="protect_shadow_gap=0:detect_leaks=0:halt_on_error=0:allocator_may_return_null=1"
         UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=0")

reports() {  # reports LOG: the sanitizer reports in LOG
    grep -c -E "ERROR: AddressSanitizer|runtime error:" "$1" 2>/dev/null || true
}

# 1. The instrumented build.
find numba_streamsafe -name "*.so" -path "*numba_streamsafe/*" -delete
CFLAGS="$FLAGS" LDFLAGS="-fsanitize=address,undefined" \
    python3 setup.py build_ext --inplace --force > "$OUT/asan_build.log" 2>&1
instrumented=0
for so in $(find numba_streamsafe -name "*.so"); do
    # (grep reads everything: with pipefail, grep -q would fail nm with SIGPIPE)
    if nm -D "$so" 2>/dev/null | grep __asan_ > /dev/null; then
        instrumented=$((instrumented + 1))
    fi
done
echo "instrumented engine modules: $instrumented" | tee -a "$OUT/asan_build.log"

# 2. The negative control.
ctl=$(mktemp -d)
cat > "$ctl/bad.c" <<'EOF'
#include <stdlib.h>
int overflow(int n) { char *p = malloc(n); p[n] = 1; int r = p[0]; free(p); return r; }
int shift(int by) { return 1 << by; }
EOF
gcc $FLAGS -shared -fPIC -o "$ctl/libbad.so" "$ctl/bad.c"
"${SAN_ENV[@]}" python3 -c "import ctypes; l = ctypes.CDLL('$ctl/libbad.so'); \
l.shift(-1); l.overflow(16)" > "$OUT/asan_control.log" 2>&1
control=$(reports "$OUT/asan_control.log")

# 3. The suite and the stress, instrumented.
export NSS_RACE_TRIALS=${NSS_RACE_TRIALS:-10} NUMBA_DISABLE_PERFORMANCE_WARNINGS=1
export NSS_STRESS_STEPS=${NSS_STRESS_STEPS:-200}
t0=$SECONDS
args=("$@")
(( ${#args[@]} )) || args=(-m gpu tests/gpu)
"${SAN_ENV[@]}" timeout "${ASAN_SUITE_TIMEOUT:-420}" python3 -X faulthandler -m pytest -v \
    -p no:cacheprovider -rs "${args[@]}" > "$OUT/asan_suite.log" 2>&1
suite_rc=$?
suite_s=$((SECONDS - t0)); t0=$SECONDS
(( ${ASAN_STRESS_SECONDS:-60} > 0 )) && "${SAN_ENV[@]}" timeout $(( ${ASAN_STRESS_SECONDS:-60} + 120 )) python3 -X faulthandler \
    scripts/stress_threads.py --seconds "${ASAN_STRESS_SECONDS:-60}" ${ASAN_STRESS_ARGS:-} \
    > "$OUT/asan_stress.log" 2>&1
stress_rc=$?
stress_s=$((SECONDS - t0))

# 4. The table.
printf '%-10s %5s %8s %6s  %s\n' run exit reports secs summary
printf '%-10s %5s %8s %6s  %s\n' control - "$control" - "must be >= 2 (heap overflow, shift)"
printf '%-10s %5s %8s %6s  %s\n' suite "$suite_rc" "$(reports "$OUT/asan_suite.log")" "$suite_s" \
    "$(tail -n 1 "$OUT/asan_suite.log" | cut -c1-100)"
printf '%-10s %5s %8s %6s  %s\n' stress "$stress_rc" "$(reports "$OUT/asan_stress.log")" \
    "$stress_s" "$(grep -m1 '^stress ' "$OUT/asan_stress.log" | cut -c1-120)"
status=0
(( control >= 2 )) || { echo "VOID: the control saw no report"; status=1; }
for log in asan_suite asan_stress; do
    n=$(reports "$OUT/$log.log")
    (( n == 0 )) || { echo "REPORTS in $log.log: $n"; grep -m5 -A12 -E \
        "ERROR: AddressSanitizer|runtime error:" "$OUT/$log.log"; status=1; }
done

# 5. Back to the plain build.
find numba_streamsafe -name "*.so" -path "*numba_streamsafe/*" -delete
python3 setup.py build_ext --inplace --force > "$OUT/asan_rebuild.log" 2>&1
exit $status
