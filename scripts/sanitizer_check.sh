#!/usr/bin/env bash
# compute-sanitizer memcheck over the GPU suite, with a negative control.
#
# Run from the repository root on a CUDA machine:
#   scripts/sanitizer_check.sh [STEP ...]
# Steps (default: all, in this order):
#   oob           negative control: tests/gpu/sanitizer_oob.py writes one element past
#                 the end of an nss.device_array (NUMBA_STREAMSAFE_RESOURCE=direct);
#                 memcheck must report it ("Invalid __global__ write")
#   oob-pool      the same write in a pooled block (default AsyncResource): informational,
#                 shows whether memcheck sees an overrun inside the pool (compute-sanitizer
#                 2025.3.1 on the H100 did: it knows each cuMemAllocAsync block's size)
#   direct-basic  tests/gpu/test_gpu_basic.py with NUMBA_STREAMSAFE_RESOURCE=direct (plain
#                 cuMemAlloc, so bounds are exact; tracking is off there, so only this
#                 file, whose tests do not rely on cross-stream ordering, is run)
#   basic direct guard races lifecycle faults stress
#                 each file of tests/gpu with the default AsyncResource
# Every step runs under
#   compute-sanitizer --tool memcheck --error-exitcode 1 --target-processes all
#                     --report-api-errors no --show-backtrace device
# (child processes included; API errors are left out because the suite provokes
# them on purpose: out of memory, destroyed streams). Host backtraces are off:
# to show one, compute-sanitizer 2025.3.1 keeps the Python frames of every kernel
# launch alive, and with them the launch's arguments, so dropped device arrays are
# never freed and every test asserting that memory comes back fails
# (tests/gpu/sanitizer_lifetime.py shows it, for plain Numba kernels too). Device
# backtraces of precise errors are still shown. The table at the end gives, per
# step: memcheck's error count (summed over the ERROR SUMMARY lines), what was
# expected, pytest's summary and the verdict. The verdict is about memcheck only;
# a test that fails under the sanitizer shows in the pytest column.
#
# Environment: OUT (log folder, default ./gpu-out; one log: sanitizer.log),
# SANITIZER_STEP_TIMEOUT (seconds per step, default 0 = none), SANITIZER_DEADLINE
# (a time in seconds since the epoch: steps are cut to end by then, and a step with
# less than 15 s left is skipped), NSS_SKIP_WHEELS=1
# (the wheels from .whl/ are already installed in /tmp/site). The race and stress
# tests are shortened (NSS_RACE_TRIALS=10, 4 threads x 4 streams x 100 steps of
# at most 4 MiB) unless those variables are set.
set -uo pipefail

OUT=${OUT:-./gpu-out}
STEP_TIMEOUT=${SANITIZER_STEP_TIMEOUT:-0}
DEADLINE=${SANITIZER_DEADLINE:-0}
mkdir -p "$OUT"
LOG="$OUT/sanitizer.log"
: > "$LOG"
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1  # a crash leaves a stack in the log

SAN=$(command -v compute-sanitizer || true)
if [[ -z "$SAN" && -x /usr/local/cuda/bin/compute-sanitizer ]]; then
    SAN=/usr/local/cuda/bin/compute-sanitizer
fi
if [[ -z "$SAN" ]]; then
    echo "compute-sanitizer not found (PATH, /usr/local/cuda/bin)" >&2
    exit 2
fi

SITE=/tmp/site
if [[ "${NSS_SKIP_WHEELS:-0}" != 1 ]] && compgen -G ".whl/*.whl" > /dev/null; then
    wheels=()
    for w in numpy hypothesis sortedcontainers attrs; do
        for f in .whl/"$w"-*.whl; do [[ -e "$f" ]] && wheels+=("$f"); done
    done
    if (( ${#wheels[@]} )); then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$SITE" "${wheels[@]}"
    fi
fi
export PYTHONPATH="$SITE:$PWD"
# GPU runs are in-process and in order (the repository default spreads tests over
# pytest-xdist workers, carried in .whl).
export PYTEST_ADDOPTS="-n 0 ${PYTEST_ADDOPTS:-}"
export NUMBA_DISABLE_PERFORMANCE_WARNINGS=1
export NSS_RACE_TRIALS=${NSS_RACE_TRIALS:-10}
export NSS_STRESS_THREADS=${NSS_STRESS_THREADS:-4}
export NSS_STRESS_STREAMS=${NSS_STRESS_STREAMS:-4}
export NSS_STRESS_STEPS=${NSS_STRESS_STEPS:-100}
export NSS_STRESS_MAX_BYTES=${NSS_STRESS_MAX_BYTES:-4194304}

"$SAN" --version 2>&1 | tail -n 1 | tee -a "$LOG"

MEMCHECK=("$SAN" --tool memcheck --error-exitcode 1 --target-processes all
          --report-api-errors no --show-backtrace device)
PYTEST=(python3 -m pytest -m gpu -q -p no:cacheprovider)

NAMES=()
EXITS=()
ERRS=()
EXPECTS=()
PYT=()
VERDICTS=()
SECS=()

# step NAME EXPECT CMD...: run CMD under memcheck. EXPECT is 0 (no error may be
# reported), >0 (an error must be reported, with "Invalid __global__ write") or
# - (informational).
step() {
    local name=$1 expect=$2
    shift 2
    local tmp t0 t1 rc errs pyt verdict limit=$STEP_TIMEOUT left
    if [[ "$DEADLINE" != 0 ]]; then
        left=$(( DEADLINE - $(date +%s) - 10 ))
        if (( left < 15 )); then
            echo "=== $name: skipped, no time left" | tee -a "$LOG"
            NAMES+=("$name"); EXITS+=(-); ERRS+=(-); EXPECTS+=("$expect"); PYT+=(-)
            VERDICTS+=("SKIPPED (time)"); SECS+=(0)
            return
        fi
        if [[ "$limit" == 0 ]] || (( left < limit )); then
            limit=$left
        fi
    fi
    tmp=$(mktemp)
    echo "=== $name: $*" | tee -a "$LOG"
    t0=$(date +%s.%N)
    if [[ "$limit" != 0 ]]; then
        timeout --kill-after=10 "$limit" "${MEMCHECK[@]}" "$@" > "$tmp" 2>&1
    else
        "${MEMCHECK[@]}" "$@" > "$tmp" 2>&1
    fi
    rc=$?
    t1=$(date +%s.%N)
    cat "$tmp" >> "$LOG"
    tail -n 4 "$tmp"
    if grep -q "ERROR SUMMARY" "$tmp"; then
        errs=$(grep -oE "ERROR SUMMARY: [0-9]+" "$tmp" | awk '{ s += $3 } END { print s + 0 }')
    else
        errs=n/a
    fi
    pyt=$(grep -E "^[=]* ?[0-9]+ (passed|failed|error|skipped|deselected)" "$tmp" | tail -n 1 \
          | sed -E 's/=//g; s/^ +//; s/ +$//; s/ in [0-9.]+s.*//')
    [[ -n "$pyt" ]] || pyt=-
    if [[ $rc == 124 || $rc == 137 ]]; then
        verdict="TIMEOUT"
    elif [[ "$errs" == n/a ]]; then
        verdict="FAIL (no summary)"
    elif [[ "$expect" == 0 ]]; then
        [[ "$errs" == 0 ]] && verdict=PASS || verdict=FAIL
    elif [[ "$expect" == ">0" ]]; then
        if (( errs > 0 )) && [[ $rc != 0 ]] && grep -q "Invalid __global__ write" "$tmp"; then
            verdict=PASS
        else
            verdict=FAIL
        fi
    else
        verdict=info
    fi
    NAMES+=("$name"); EXITS+=("$rc"); ERRS+=("$errs"); EXPECTS+=("$expect")
    PYT+=("$pyt"); VERDICTS+=("$verdict")
    SECS+=("$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.0f", b - a }')")
    echo "=== $name: exit $rc, memcheck errors $errs, expected $expect: $verdict" | tee -a "$LOG"
    rm -f "$tmp"
}

ALL=(oob oob-pool direct-basic basic direct guard races lifecycle faults stress)
STEPS=("$@")
(( ${#STEPS[@]} )) || STEPS=("${ALL[@]}")

for s in "${STEPS[@]}"; do
    case "$s" in
        oob) NUMBA_STREAMSAFE_RESOURCE=direct step oob ">0" python3 tests/gpu/sanitizer_oob.py ;;
        oob-pool) NUMBA_STREAMSAFE_RESOURCE=async step oob-pool - \
                      python3 tests/gpu/sanitizer_oob.py ;;
        direct-basic) NUMBA_STREAMSAFE_RESOURCE=direct step direct-basic 0 \
                          "${PYTEST[@]}" tests/gpu/test_gpu_basic.py ;;
        basic) step basic 0 "${PYTEST[@]}" tests/gpu/test_gpu_basic.py ;;
        direct) step direct 0 "${PYTEST[@]}" tests/gpu/test_direct_launch.py ;;
        guard) step guard 0 "${PYTEST[@]}" tests/gpu/test_guard_gpu.py ;;
        races) step races 0 "${PYTEST[@]}" tests/gpu/test_races.py ;;
        lifecycle) step lifecycle 0 "${PYTEST[@]}" tests/gpu/test_lifecycle.py ;;
        faults) step faults 0 "${PYTEST[@]}" tests/gpu/test_faults.py ;;
        stress) step stress 0 "${PYTEST[@]}" tests/gpu/test_stress.py ;;
        *) echo "unknown step $s (known: ${ALL[*]})" >&2; exit 2 ;;
    esac
done

echo
printf '%-13s %5s %7s %8s %-34s %6s  %s\n' run exit errors expected pytest secs verdict \
    | tee -a "$LOG"
status=0
for i in "${!NAMES[@]}"; do
    printf '%-13s %5s %7s %8s %-34s %6s  %s\n' "${NAMES[$i]}" "${EXITS[$i]}" "${ERRS[$i]}" \
        "${EXPECTS[$i]}" "${PYT[$i]}" "${SECS[$i]}" "${VERDICTS[$i]}" | tee -a "$LOG"
    case "${VERDICTS[$i]}" in PASS|info|"SKIPPED (time)") ;; *) status=1 ;; esac
done
exit "$status"
