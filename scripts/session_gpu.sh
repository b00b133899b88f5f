#!/usr/bin/env bash
# This round's GPU checks in one call, from the repository root on the GPU machine
# (issues "Check mode everywhere" and "The first hour"), with .whl/ (NumPy below 2.5) and,
# for numba-cuda-mlir, .whl-mlir/ (scripts/mlir_gpu_check.py) carried:
#   the driver observer's mixed programs, check mode's GPU tests, the reports, the pytest
#   plugin, the first start and the destroyed-stream refusals (scripts/gpu_round.sh observe
#   with OBSERVE_TESTS); check mode's cost; one report printed in full (check mode on
#   examples/plain_numba_pipeline.py); numba-cuda-mlir. Logs under /tmp/session-logs, the
#   ones to keep copied to $OUT (eight files at most come back). On a machine of several
#   GPUs it also runs the multi-GPU tests, the Dask tests (one worker per GPU) and the
#   docs' Dask blocks (dask-cuda's LocalCUDACluster), with .whl-dask/ carried.
set -uo pipefail
OUT=${OUT:-./gpu-out}
LOGS=/tmp/session-logs
mkdir -p "$OUT" "$LOGS"
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
OBSERVE_TESTS="tests/gpu/test_race_reports_gpu.py tests/gpu/test_pytest_plugin_gpu.py \
tests/gpu/test_first_start_gpu.py tests/gpu/test_faults.py" OUT=$LOGS \
    bash scripts/gpu_round.sh observe > "$LOGS/observe.txt" 2>&1
grep -E "passed|failed|error" "$LOGS/observe_tests.log" | tail -3
sed -n '/^check mode against/,$p' "$LOGS/check_mode.log"
(export NUMBA_STREAMSAFE_MODE=check NUMBA_STREAMSAFE_CHECK_REPORT=exit \
    NUMBA_CUDA_MEMORY_MANAGER=numba_streamsafe PYTHONPATH=/tmp/site:$PWD
 timeout 180 python3 -X faulthandler examples/plain_numba_pipeline.py --repeat 1 \
     > "$LOGS/report_out.txt" 2> "$LOGS/report_err.txt"; echo "report example exit $?")
head -c 6000 "$LOGS/report_err.txt"
if compgen -G ".whl-mlir/*" > /dev/null; then
    timeout 330 python3 scripts/mlir_gpu_check.py --out "$LOGS/mlir" > "$LOGS/mlir.txt" 2>&1
    echo "mlir check exit $?"
    tail -n 25 "$LOGS/mlir.txt"
fi
ngpus=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
if (( ngpus > 1 )); then
    # gpu_round.sh installed .whl-dask/ into /tmp/site with the other wheels.
    (export PYTHONPATH=/tmp/site:$PWD PYTEST_ADDOPTS="-n 0" NSS_RACE_REPORT=$LOGS/race.txt
     timeout 240 python3 -X faulthandler -m pytest -m gpu -q -p no:cacheprovider -rs \
         tests/gpu/test_multi_gpu.py tests/gpu/test_dask_gpu.py \
         "tests/gpu/test_doc_blocks_gpu.py" -k "multi_gpu or dask or Dask or LocalCUDA or multi" \
         > "$LOGS/multi_gpu.log" 2>&1; echo "multi-GPU and Dask tests on $ngpus GPUs: exit $?")
    grep -E "passed|failed|error|SKIP" "$LOGS/multi_gpu.log" | tail -6
fi
for f in observe_tests.log race.txt check_mode.log report_err.txt report_out.txt mlir.txt \
         observe.txt multi_gpu.log; do
    [[ -f $LOGS/$f ]] && cp "$LOGS/$f" "$OUT/"
done
[[ -f $LOGS/mlir/mlir_gpu_check.json ]] && cp "$LOGS/mlir/mlir_gpu_check.json" "$OUT/"
