#!/usr/bin/env bash
# One GPU call's worth of checks for this round's issues, run from the repository root on
# the GPU machine:  scripts/gpu_round.sh stacks|rmm|ordered|two-gpu|ranges|engine|engine-bench|launch|docs|tests|bench|runall|new|graphs|numba-suite|suite|hot|alloc|check|observe|ab|host|hooks|steps|long|yardstick|house|profile
#   stacks: the GPU suite on the CUDA 12 stack and on the oldest supported numba-cuda;
#   two-gpu: the two-GPU tests (races, per-device switches, exit) and the rest of the suite;
#   ranges: the engine compiled, benchmarks/chunked_streams.py (K chunks of one array
#          against K separate arrays), the range race cases (tracked and plain), then the
#          whole GPU suite;
#   tests: the GPU suite (with the Dask and plain-Numba tests), the examples with inferred
#          accesses, the traced sort -> join pipeline (JSON + PNG under $OUT), the access
#          inference's cost against compiling;
#   bench: launch and allocation benchmarks, this tree against the checkout in .before/
#          (scripts/bench_compare.sh), rounds interleaved.
# Everything written under $OUT comes back as $OUT/out.tgz where it is more than 7 files.
# Wheels: .whl/ (numpy < 2.5), .whl-rmm/ (rmm-cu13, librmm-cu13, rapids-logger: the `rmm`
# step), .whl-build/ (Cython, to compile the engine),
# .whl-dask/ (distributed), .whl-plot/ (matplotlib).
set -uo pipefail
OUT=${OUT:-./gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1  # a crash leaves a stack in the log
SITE=/tmp/site
wheels=()
for d in .whl-dask .whl-plot .whl-suite .whl-build .whl-rmm .whl; do
    compgen -G "$d/*.whl" > /dev/null && wheels+=("$d"/*.whl)
done
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "${wheels[@]}" 2>&1 | tail -2
export PYTHONPATH="$SITE:$PWD"
# GPU runs are in-process and in order (the repository default spreads tests over
# pytest-xdist workers, carried in .whl).
export PYTEST_ADDOPTS="-n 0 ${PYTEST_ADDOPTS:-}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader

pack_out() {  # at exit: at most 8 files come back from $OUT, so all of it goes into one archive
    local n
    n=$(find "$OUT" -type f | wc -l)
    if (( n > 7 )); then
        tar -czf /tmp/gpu-round-out.tgz -C "$OUT" . && find "$OUT" -mindepth 1 -delete \
            && mv /tmp/gpu-round-out.tgz "$OUT/out.tgz"
    fi
}
trap pack_out EXIT

run() {  # run NAME CMD...: output to $OUT/NAME.log, one summary line
    local name=$1; shift
    local t0=$SECONDS
    "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    printf '%-28s exit %3s  %4ss\n' "$name" "$rc" "$((SECONDS - t0))" | tee -a "$OUT/steps.txt"
}

ordered_pair() {  # ordered_pair BASE [ROUND]: self_ordered.py, stream_events.py, both trees
    local base=$1 side dir script
    for side in base this; do
        dir=$PWD; [[ $side == base ]] && dir=$base
        for script in self_ordered.py stream_events.py; do
            printf '%s %s ' "$side${2:+ $2}" "$script" >> "$OUT/ordered.log"
            PYTHONPATH="$SITE:$dir" NUMBA_CUDA_MEMORY_MANAGER=numba_streamsafe \
                PYTHONWARNINGS=ignore python3 -X faulthandler "benchmarks/$script" \
                >> "$OUT/ordered.log" 2>&1
        done
    done
}

two_trees() {  # two_trees BASE: this tree and BASE/ compiled here; the race tests' trials
    command -v gcc > /dev/null && run build_ext python3 setup.py build_ext --inplace -j 8
    (cd "$1" && PYTHONPATH="$SITE:$PWD" python3 setup.py build_ext --inplace -j 8) \
        > "$OUT/build_base.log" 2>&1
    export NSS_RACE_REPORT=$OUT/race.txt NSS_RACE_TRIALS=${NSS_RACE_TRIALS:-10} \
        NSS_PLAIN_TRIALS=${NSS_PLAIN_TRIALS:-10}
}

gpu_tests() {  # gpu_tests NAME FILE...: the GPU tests of FILE... (and EXTRA_TESTS) as NAME
    local name=$1; shift
    # shellcheck disable=SC2086  # EXTRA_TESTS is a list of files
    run "$name" timeout "${TESTS_TIMEOUT:-200}" python3 -X faulthandler -m pytest -m gpu -q \
        -p no:cacheprovider -rs -o faulthandler_timeout=100 "$@" ${EXTRA_TESTS:-}
    tail -n 3 "$OUT/$name.log"
}

case "${1:-tests}" in
stacks)
    # The GPU suite on other stacks (issue "Reach"), each in a virtual environment of its
    # own over the machine's packages (--system-site-packages), so that cuda.pathfinder
    # finds its libraries in site-packages as it does after a pip install:
    #   .whl-cu12/   cuda-python and cuda-bindings 12.9 (cuda-core picks its cu12 build);
    #   .whl-cu12-libs/*.tar.xz  numba-cuda[cu12]'s NVRTC 12 and NVVM 12 (the files of
    #                the nvidia-cuda-nvrtc-cu12 and nvidia-cuda-nvcc-cu12 wheels, nvvm/ only),
    #                unpacked into site-packages; too large to travel with the wheels, it
    #                comes in a call of its own with PREPARE_ONLY=1 (the machine keeps the
    #                environment while warm);
    #   .whl-oldest/ numba-cuda 0.24.0 and a cuda-core it accepts (< 1.0), with the
    #                machine's numba when it is one that release works with (<= 0.65).
    # Fetch wheels here with pip download --no-deps --only-binary=:all: --python-version 3.12
    # --platform manylinux_2_28_x86_64 (and _2_27, _2_24, _2_17) -d DIR.
    export NSS_RACE_REPORT=$OUT/race.txt
    [[ ${PREPARE_ONLY:-0} == 1 ]] || python3 setup.py build_ext --inplace -j 8 > "$OUT/build_ext.log" 2>&1
    for stack in ${STACKS:-cu12 oldest}; do
        venv=/tmp/venv-$stack
        [[ -x $venv/bin/python ]] || python3 -m venv --system-site-packages "$venv"
        purelib=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
        # The machine's python3 may itself run in an environment: its packages come
        # after the stack's own
        # (site.addsitedir, so that their own .pth hooks, numba-cuda's among them, run).
        python3 -c 'import site; print("import site; " + "; ".join(
            f"site.addsitedir({d!r})" for d in site.getsitepackages()))' > "$purelib/_machine.pth"
        for tarball in .whl-$stack-libs/*.tar.xz; do
            [[ -f $tarball && ! -f $purelib/.$(basename "$tarball").done ]] || continue
            tar -xJf "$tarball" -C "$purelib" && touch "$purelib/.$(basename "$tarball").done"
            echo "$stack: unpacked $(basename "$tarball")" | tee -a "$OUT/steps.txt"
        done
        wheels=()
        for w in .whl-$stack/*.whl .whl/numpy-*.whl; do [[ -f $w ]] && wheels+=("$w"); done
        if (( ${#wheels[@]} )); then
            "$venv/bin/python" -m pip install -q --no-index --no-deps --no-compile \
                --ignore-installed "${wheels[@]}" 2>&1 | tail -3
        fi
        [[ ${PREPARE_ONLY:-0} == 1 ]] && continue
        if ! compgen -G "$purelib/.*.done" > /dev/null && ! compgen -G ".whl-$stack/*.whl" > /dev/null; then
            echo "$stack: nothing installed in $venv, not run" | tee -a "$OUT/steps.txt"
            continue
        fi
        # The repository itself (built in place) and pytest-xdist from /tmp/site come first.
        env PYTHONPATH="$PWD" "$venv/bin/python" -c "from importlib.metadata import version as v; \
import numba.cuda, cuda.bindings, cuda.pathfinder as pf; \
print('$stack:', *(f'{d} {v(d)}' for d in ('numba-cuda', 'numba', 'cuda-bindings', 'cuda-core', 'numpy'))); \
print('$stack: nvrtc', pf.load_nvidia_dynamic_lib('nvrtc').abs_path, 'nvvm', pf.load_nvidia_dynamic_lib('nvvm').abs_path)" \
            2>&1 | tee -a "$OUT/steps.txt"
        run "suite_$stack" env PYTHONPATH="$PWD" timeout "${SUITE_TIMEOUT:-400}" \
            "$venv/bin/python" -X faulthandler -m pytest -m gpu -q -p no:cacheprovider \
            tests/gpu -rs --deselect tests/gpu/test_multi_gpu.py
        tail -n 3 "$OUT/suite_$stack.log"
    done
    cat "$OUT/race.txt" 2>/dev/null
    ;;
rmm)
    # RMM as the upstream (issue "One pool with RAPIDS"): the race hazards over RMM's pool
    # and async resources with their negative controls, one pool with CuPy, then the
    # allocation benchmark (ours over RMM against RMM's Numba plugin).
    python3 setup.py build_ext --inplace -j 8 > "$OUT/build_ext.log" 2>&1
    export NSS_RACE_REPORT=$OUT/race.txt NSS_RACE_TRIALS=${NSS_RACE_TRIALS:-100}
    run rmm_tests timeout 400 python3 -X faulthandler -m pytest -m gpu -q -p no:cacheprovider \
        tests/gpu/test_rmm_gpu.py -rs
    tail -n 3 "$OUT/rmm_tests.log"
    run alloc_free timeout 150 python3 -X faulthandler benchmarks/alloc_free.py --rounds 11
    grep -E "us$|ours" "$OUT/alloc_free.log"
    cat "$OUT/race.txt" 2>/dev/null
    ;;
two-gpu)
    # Two GPUs (nvidia-h100-x2): the multi-GPU races, the per-device switches and the
    # interpreter exit (five child processes with the library, one with Numba alone), then
    # the rest of the GPU suite on the same machine.
    python3 setup.py build_ext --inplace -j 8 > "$OUT/build_ext.log" 2>&1
    export NSS_RACE_REPORT=$OUT/race.txt
    run multi_gpu timeout 150 python3 -X faulthandler -m pytest -m gpu -q -p no:cacheprovider \
        tests/gpu/test_multi_gpu.py -rs
    tail -n 3 "$OUT/multi_gpu.log"
    for i in 1 2 3; do  # the crash without the library, shown directly
        run "numba_only_exit_$i" python3 -X faulthandler tests/gpu/two_gpu_exit.py numba-only 30 5
    done
    if [[ ${WHOLE:-1} == 1 ]]; then
        run gpu_suite timeout "${SUITE_TIMEOUT:-390}" python3 -X faulthandler -m pytest -m gpu \
            -q -p no:cacheprovider tests/gpu -rs --deselect tests/gpu/test_multi_gpu.py
        tail -n 3 "$OUT/gpu_suite.log"
    fi
    cat "$OUT/race.txt"
    ;;
ranges)
    run build_ext python3 setup.py build_ext --inplace
    python3 -c "import numba_streamsafe.numba.launch.launcher as l, numba_streamsafe.compiled as c; \
print(set(c.engine_builds(load=True).values()), 'libcuda entry:', l.available())" 2>&1 | tail -1
    run chunked python3 -X faulthandler benchmarks/chunked_streams.py
    export NSS_RACE_REPORT=$OUT/race.txt NSS_RACE_TRIALS=${NSS_RACE_TRIALS:-100}
    run range_races timeout 580 python3 -X faulthandler -m pytest -m gpu -q -p no:cacheprovider \
        tests/gpu/test_range_races.py tests/gpu/test_transparent_gpu.py -rs
    if [[ ${WHOLE:-1} == 1 ]]; then
        run gpu_suite timeout "${SUITE_TIMEOUT:-400}" python3 -X faulthandler -m pytest -m gpu \
            -q -p no:cacheprovider tests/gpu -rs --deselect tests/gpu/test_range_races.py \
            --deselect tests/gpu/test_transparent_gpu.py
        tail -n 6 "$OUT/gpu_suite.log"
    fi
    tail -n 8 "$OUT/range_races.log"
    grep -E "K=|chunks" "$OUT/chunked.log"
    cat "$OUT/race.txt" 2>/dev/null
    cat "$OUT/steps.txt"
    ;;
engine)
    # The engine: compiled here (and the tree before it in .before/, for the benchmarks),
    # then the GPU suite on the compiled build and, with SUITES=both, on the Python source.
    # PART=1 or PART=2: the first or the second half of the test files (the whole suite
    # took more than 540 s at NSS_RACE_TRIALS=100). Each test's outcome is logged as it
    # ends (-v), so a run cut by its time limit still names its failures.
    run build_ext python3 setup.py build_ext --inplace -j 8
    if [[ -d .before ]]; then (cd .before && python3 setup.py build_ext --inplace -j 8) \
        > "$OUT/build_before.log" 2>&1; fi
    python3 -c "import numba_streamsafe.numba.launch.launcher as l, numba_streamsafe.compiled as c; \
print(c.engine_builds(load=True), 'libcuda entry:', l.available())"
    export NSS_RACE_REPORT=$OUT/race.txt NSS_RACE_TRIALS=${NSS_RACE_TRIALS:-100}
    suite=(tests/gpu)
    if [[ -n ${PART:-} ]]; then
        mapfile -t all < <(printf '%s\n' tests/gpu/test_*.py | sort)
        half=$(( (${#all[@]} + 1) / 2 ))
        if [[ $PART == 1 ]]; then suite=("${all[@]:0:half}"); else suite=("${all[@]:half}"); fi
    fi
    # shellcheck disable=SC2086  # SUITE_ARGS: several arguments
    run gpu_compiled timeout "${SUITE_TIMEOUT:-400}" python3 -X faulthandler -m pytest -m gpu \
        -v -p no:cacheprovider "${suite[@]}" -rs ${SUITE_ARGS:-}
    grep -E "FAILED|ERROR" "$OUT/gpu_compiled.log" | head -20
    tail -n 4 "$OUT/gpu_compiled.log"
    if [[ ${SUITES:-compiled} == both ]]; then
        # shellcheck disable=SC2086
        NUMBA_STREAMSAFE_PURE_PYTHON=1 run gpu_pure timeout "${SUITE_TIMEOUT:-400}" python3 \
            -X faulthandler -m pytest -m gpu -v -p no:cacheprovider "${suite[@]}" -rs \
            ${SUITE_ARGS:-}
        grep -E "FAILED|ERROR" "$OUT/gpu_pure.log" | head -20
        tail -n 4 "$OUT/gpu_pure.log"
    fi
    cat "$OUT/race.txt" 2>/dev/null | tail -20
    ;;
docs)
    # The docs' library blocks on the GPU (CuPy, PyTorch, cuda.core, Dask, dask-cuda's
    # LocalCUDACluster; wheels for Dask and dask-cuda in .whl-dask) and the Dask GPU tests.
    run build_ext python3 setup.py build_ext --inplace
    python3 -c "import dask_cuda, distributed; print('dask-cuda', dask_cuda.__version__, \
'distributed', distributed.__version__)" 2>&1 | tail -1
    run doc_blocks_gpu python3 -X faulthandler -m pytest -m gpu -q -p no:cacheprovider -rs \
        tests/gpu/test_doc_blocks_gpu.py tests/gpu/test_dask_gpu.py
    tail -n 15 "$OUT/doc_blocks_gpu.log"
    ;;
launch)
    # A hot-path change, before and after in one call: launch_overhead.py (and with
    # ALLOC=1 alloc_free.py) on this tree and on ${BEFORE:-.before} (another checkout,
    # compiled here too), rounds interleaved.
    before=${BEFORE:-.before}
    run build_ext python3 setup.py build_ext --inplace
    (cd "$before" && python3 setup.py build_ext --inplace) > "$OUT/build_before.log" 2>&1
    ROUNDS=${ROUNDS:-2} bash scripts/bench_compare.sh "$PWD/$before" launch_overhead.py \
        --rounds "${BENCH_ROUNDS:-9}" > "$OUT/launch.log" 2>&1
    if [[ ${ALLOC:-0} == 1 ]]; then
        ROUNDS=${ROUNDS:-2} bash scripts/bench_compare.sh "$PWD/$before" alloc_free.py \
            > "$OUT/alloc.log" 2>&1
    fi
    grep -h -E "^=== |same stream|cross stream|raw cuLaunch|floor|entry alone|threads at once|us/|DIED" \
        "$OUT/launch.log" "$OUT/alloc.log" 2>/dev/null | head -80
    ;;
engine-bench)
    # benchmarks/run_all.py on the tree before the engine (.before/, built by `engine`)
    # and on this one, in one call: the table of issue 28.
    run build_ext python3 setup.py build_ext --inplace
    (cd .before && python3 setup.py build_ext --inplace) > "$OUT/build_before.log" 2>&1
    # The harness is this tree's on both sides (its --rounds makes the pair fit one call);
    # the benchmarks and the library are each tree's own.
    cp benchmarks/run_all.py .before/benchmarks/run_all.py
    ROUNDS=${ROUNDS:-1} timeout "${BENCH_TIMEOUT:-560}" bash scripts/bench_compare.sh \
        "$PWD/.before" run_all.py --rounds "${BENCH_ROUNDS:-5}" > "$OUT/run_all_compare.log" 2>&1
    grep -E "^=== |^figure|pass|MISS|peer|not run|DIED|launch, |hand-placed|compiled entry" \
        "$OUT/run_all_compare.log" | head -90
    ;;
tests)
    export NSS_RACE_REPORT=$OUT/race.txt
    run gpu_tests python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu -rs
    for ex in multistream_sort hash_join sort_join_pipeline; do
        NUMBA_STREAMSAFE_ACCESS=infer run "infer_$ex" python3 "examples/$ex.py" --repeat 3
    done
    run inference_cost python3 benchmarks/inference_cost.py
    tail -n 3 "$OUT/gpu_tests.log"
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
runall)
    # Every benchmark and the table of figures, targets and verdicts (benchmarks/run_all.py).
    command -v gcc > /dev/null && run build_ext python3 setup.py build_ext --inplace
    (cd benchmarks && NSS_BENCH_DIR="$OUT" NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 \
        python3 run_all.py > "$OUT/run_all.log" 2>&1; echo "run_all exit $?")
    grep -E "^launch overhead|same stream|cross stream|threads|compiled entry|^allocate|ours /" \
        "$OUT/run_all.log" | head -30
    sed -n '/^figure/,$p' "$OUT/run_all.log"
    ;;
new)
    # This round's new GPU tests (DLPack, direct-launch parity, graphs, hot path, foreign
    # streams), numba-cuda's IPC tests under pytest without and with the plugin, the
    # graph replay benchmark.
    command -v gcc > /dev/null && run build_ext python3 setup.py build_ext --inplace
    export NSS_RACE_REPORT=$OUT/race.txt
    run gpu_new python3 -m pytest -m gpu -q -p no:cacheprovider -rs ${NEW_TESTS:-\
        tests/gpu/test_dlpack_gpu.py tests/gpu/test_direct_parity.py \
        tests/gpu/test_graphs_gpu.py tests/gpu/test_hot_path.py}
    tail -15 "$OUT/gpu_new.log"
    for mm in default numba_streamsafe numba_streamsafe-ipc; do
        ipc=0; [[ $mm == *-ipc ]] && ipc=1
        NUMBA_CUDA_MEMORY_MANAGER=${mm%-ipc} NUMBA_STREAMSAFE_IPC=$ipc run "ipc_$mm" \
            python3 -m unittest -v numba.cuda.tests.cudapy.test_ipc
        tail -n 3 "$OUT/ipc_$mm.log"
    done
    (cd benchmarks && NSS_BENCH_DIR="$OUT" run graph_replay python3 graph_replay.py)
    cat "$OUT/graph_replay.log" "$OUT/race.txt"
    ;;
graphs)
    # CUDA graphs: their GPU tests on the compiled and the pure-Python path, the sort ->
    # join pipeline with its probe stage as a graph (tracked, then the race without
    # tracking), the replay benchmark and its negative control.
    command -v gcc > /dev/null && run build_ext python3 setup.py build_ext --inplace
    export NSS_RACE_REPORT=$OUT/race.txt NSS_RACE_TRIALS=${NSS_RACE_TRIALS:-100}
    run gpu_graphs python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_graphs_gpu.py -rs
    NUMBA_STREAMSAFE_PURE_PYTHON=1 run gpu_graphs_pure python3 -m pytest -m gpu -q \
        -p no:cacheprovider tests/gpu/test_graphs_gpu.py -rs
    run example_graph python3 examples/sort_join_pipeline.py --graph --repeat 3
    run example_graph_race python3 examples/sort_join_pipeline.py --graph --no-tracking --repeat 3
    (cd benchmarks && NSS_BENCH_DIR="$OUT" NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 \
        run graph_replay python3 graph_replay.py)
    (cd benchmarks && NSS_BENCH_DIR="$OUT" run graph_replay_race python3 graph_replay.py --race)
    tail -n 3 "$OUT/gpu_graphs.log" "$OUT/gpu_graphs_pure.log"
    grep -h -E "result|runs:" "$OUT"/example_graph*.log
    cat "$OUT/graph_replay.log" "$OUT/graph_replay_race.log" "$OUT/race.txt"
    ;;
transparent)
    # Transparent mode: its GPU races (plain Numba, 0 wrong on, >= 70 % off), the plain-Numba
    # example without and with the plugin, the plain-launch cost side by side.
    command -v gcc > /dev/null && run build_ext python3 setup.py build_ext --inplace
    export NSS_RACE_REPORT=$OUT/race.txt NSS_RACE_TRIALS=${NSS_RACE_TRIALS:-100}
    run gpu_transparent python3 -X faulthandler -m pytest -m gpu -q -p no:cacheprovider -rs \
        tests/gpu/test_transparent_gpu.py tests/gpu/test_plain_numba_gpu.py ${EXTRA_TESTS:-}
    (cd benchmarks && NSS_BENCH_DIR="$OUT" run plain_launch python3 -X faulthandler \
        plain_launch.py)
    tail -n 15 "$OUT/gpu_transparent.log"
    cat "$OUT/plain_launch.log" "$OUT/race.txt"
    ;;
check)
    # Check mode (issue "races on a GPU"): its GPU tests and transparent mode's
    # (NSS_RACE_TRIALS trials, default 30), the cost against ordering mode, and, with
    # SELF_BEFORE set to an earlier tree carried beside this one, the self-ordered
    # program on both trees, taking turns. numba-cuda's suite in check mode is
    # `NSS_SUITE_ENV="NUMBA_STREAMSAFE_MODE=check" scripts/gpu_round.sh numba-suite`.
    command -v gcc > /dev/null && run build_ext python3 setup.py build_ext --inplace
    NSS_RACE_TRIALS=${NSS_RACE_TRIALS:-30} run check_tests python3 -m pytest -m gpu -q \
        -p no:cacheprovider tests/gpu/test_check_mode_gpu.py tests/gpu/test_transparent_gpu.py \
        tests/gpu/test_pytest_plugin_gpu.py tests/gpu/test_race_reports_gpu.py -rs
    tail -n 3 "$OUT/check_tests.log"
    run check_mode python3 benchmarks/check_mode.py --rounds "${ROUNDS:-5}"
    tail -n 8 "$OUT/check_mode.log"
    # The stack capture check mode makes at every launch, on this host's CPU.
    run stack_capture python3 benchmarks/stack_capture.py
    cat "$OUT/stack_capture.log"
    if [[ -n ${SELF_BEFORE:-} ]]; then
        (cd "$SELF_BEFORE" && PYTHONPATH="$SITE:$PWD" python3 setup.py build_ext --inplace) \
            > "$OUT/build_before.log" 2>&1
        root=$PWD
        before=$(cd "$SELF_BEFORE" && pwd)
        for _ in 1 2; do
            for tree in "$before" "$root"; do
                (cd "$tree" && NUMBA_CUDA_MEMORY_MANAGER=numba_streamsafe PYTHONPATH="$SITE:$tree" \
                    python3 "$root/benchmarks/self_ordered.py") 2>&1 | tail -n 1 \
                    | tee -a "$OUT/self_ordered.log"
            done
        done
    fi
    ;;
observe)
    # The driver observer (issue "check mode everywhere"): the mixed programs (Numba
    # kernels on CuPy, PyTorch and cuda.core streams, ordered by those libraries, and
    # CuPy's copies and fills) in check mode, with their negative controls and in ordering
    # mode; check mode's own GPU tests; check mode with the observer against ordering
    # mode (the launch, the self-ordered pipeline, the pipeline ordered with CuPy's events,
    # the example as written).
    command -v gcc > /dev/null && run build_ext python3 setup.py build_ext --inplace -j 8
    export NSS_RACE_REPORT=$OUT/race.txt
    run observe_tests python3 -X faulthandler -m pytest -m gpu -q -p no:cacheprovider -rs \
        tests/gpu/test_mixed_gpu.py tests/gpu/test_check_mode_gpu.py ${OBSERVE_TESTS:-}
    tail -n 3 "$OUT/observe_tests.log"; cat "$OUT/race.txt" 2>/dev/null
    run check_mode python3 -X faulthandler benchmarks/check_mode.py --rounds "${ROUNDS:-5}"
    tail -n 12 "$OUT/check_mode.log"
    ;;
ab)
    # Ordering mode's launch, allocation and free, this tree against the earlier one in
    # .before/ (built here), taking turns: scripts/bench_compare.sh.
    command -v gcc > /dev/null && run build_ext python3 setup.py build_ext --inplace -j 8
    (cd .before && PYTHONPATH="$SITE:$PWD" python3 setup.py build_ext --inplace -j 8) \
        > "$OUT/build_before.log" 2>&1
    ROUNDS=${ROUNDS:-2} bash scripts/bench_compare.sh "$PWD/.before" launch_overhead.py \
        > "$OUT/launch.log" 2>&1
    ROUNDS=${ROUNDS:-2} bash scripts/bench_compare.sh "$PWD/.before" alloc_free.py \
        > "$OUT/alloc.log" 2>&1
    grep -E "^=== |same stream|cross stream|ratio|us/|us$" "$OUT/launch.log" "$OUT/alloc.log" \
        | head -80
    ;;
hooks)
    # Issue "host cost", the hooks on the program's own ordering, this tree against
    # ${BASE:-.before53}/ (built here): the GPU tests of transparent mode and plain Numba
    # (TESTS=0: none), then PAIRS (default 3) rounds of benchmarks/self_ordered.py and
    # stream_events.py over each tree's package, the trees taking turns, then
    # benchmarks/hooks_host.py of each tree (the hooks' own work, the driver taken out).
    base=$PWD/${BASE:-.before53}
    two_trees "$base"
    if [[ ${TESTS:-1} == 1 ]]; then
        gpu_tests hook_tests tests/gpu/test_transparent_gpu.py tests/gpu/test_plain_numba_gpu.py \
            tests/gpu/test_hot_path.py
    fi
    for k in $(seq 1 "${PAIRS:-3}"); do ordered_pair "$base" "$k"; done
    cat "$OUT/ordered.log"
    for side in base this; do
        dir=$PWD; [[ $side == base ]] && dir=$base
        echo "== $side" >> "$OUT/hooks_host.log"
        PYTHONPATH="$SITE:$dir:$PWD/benchmarks" python3 -X faulthandler benchmarks/hooks_host.py \
            >> "$OUT/hooks_host.log" 2>&1
    done
    cat "$OUT/hooks_host.log"
    ;;
host)
    # Issue "host cost", this tree against ${BASE:-.before53}/ (built here), in one call:
    # this round's GPU tests (and EXTRA_TESTS), a stream per step with and without the
    # plugin for both trees (this tree's benchmarks/stream_per_step.py over each tree's
    # package, taking turns), the first launch of plain kernels, the self-ordered rounds
    # and the 200-stream events
    # of both trees, then the launch and allocation benchmarks of both trees taking turns.
    # Nothing else runs on the GPU meanwhile: a process beside them (the long run, in an
    # earlier version of this step) halved a stream per step and moved the launch figures.
    base=$PWD/${BASE:-.before53}
    two_trees "$base"
    if [[ ${TESTS:-1} == 1 ]]; then  # TESTS=0: the benchmarks only (the tests in a call of their own)
        gpu_tests host_tests tests/gpu/test_host_cost_gpu.py tests/gpu/test_hot_path.py \
            tests/gpu/test_plain_numba_gpu.py tests/gpu/test_stream_reuse.py \
            tests/gpu/test_transparent_gpu.py
    fi
    export PYTHONWARNINGS=ignore
    for k in $(seq 1 "${ROUNDS:-2}"); do
        for side in base this; do
            dir=$PWD; [[ $side == base ]] && dir=$base
            echo "== $side $k" >> "$OUT/per_step.log"
            PYTHONPATH="$SITE:$dir" NSS_BENCH_DIR="$OUT/$side-$k" python3 -X faulthandler \
                benchmarks/stream_per_step.py --rounds "${STEP_ROUNDS:-3}" >> "$OUT/per_step.log" 2>&1
        done
    done
    grep -E "^==|ratio" "$OUT/per_step.log"
    run first_launch python3 -X faulthandler benchmarks/first_launch.py --rounds 3
    tail -n 9 "$OUT/first_launch.log"
    ordered_pair "$base"
    cat "$OUT/ordered.log"
    ROUNDS=${LAUNCH_ROUNDS:-2} bash scripts/bench_compare.sh "$base" launch_overhead.py \
        --rounds 9 > "$OUT/launch.log" 2>&1
    grep -E "^=== |raw cuLaunch|floor|threads" "$OUT/launch.log"
    if [[ ${ALLOC:-1} == 1 ]]; then  # ALLOC=0: no allocation benchmark
        ROUNDS=1 bash scripts/bench_compare.sh "$base" alloc_free.py --rounds 5 \
            > "$OUT/alloc.log" 2>&1
        grep -E "^=== |ours / bare" "$OUT/alloc.log"
    fi
    grep -A 11 "^phase" "$OUT/per_step.log" | tail -n 24  # the last round's phases, both trees
    if [[ ${PROFILE:-0} == 1 ]]; then  # where a stream per step spends its time, this tree
        NUMBA_CUDA_MEMORY_MANAGER=numba_streamsafe python3 benchmarks/stream_per_step.py --child \
            --profile "$OUT/per_step_plugin.prof" > "$OUT/per_step_plugin.json" 2>&1
        python3 benchmarks/stream_per_step.py --child --profile "$OUT/per_step_plain.prof" \
            > "$OUT/per_step_plain.json" 2>&1
    fi
    ;;
steps)
    # A stream per step alone (issue "host cost"), this tree: benchmarks/stream_per_step.py
    # with its plugin and plain processes taking turns for STEP_ROUNDS rounds (default 7;
    # the host's speed moves from process to process, so one round says little).
    # STEP_ARGS: more options, e.g. --bare (a third process under bare_async_emm).
    command -v gcc > /dev/null && run build_ext python3 setup.py build_ext --inplace -j 8
    # shellcheck disable=SC2086  # STEP_ARGS is a list of options
    PYTHONWARNINGS=ignore NSS_BENCH_DIR="$OUT/steps" run per_step python3 -X faulthandler \
        benchmarks/stream_per_step.py --rounds "${STEP_ROUNDS:-7}" ${STEP_ARGS:-}
    grep -E "rounds|ratio" "$OUT/per_step.log"
    grep -A 11 "^phase" "$OUT/per_step.log"
    ;;
long)
    # The long run alone (issue "host cost"): a stream per step for LONG_MINUTES (default
    # 8) under the plugin, per minute; the last minute against the first.
    command -v gcc > /dev/null && run build_ext python3 setup.py build_ext --inplace -j 8
    PYTHONWARNINGS=ignore run long_run python3 -X faulthandler benchmarks/stream_per_step.py \
        --minutes "${LONG_MINUTES:-8}"
    tail -n 9 "$OUT/long_run.log"
    ;;
yardstick)
    # Issue "host cost": the real-programs benchmark (benchmarks/real_programs.py, .whl-suite
    # carried), then run_all.py of this tree and of ${BASE:-.before53}/ taking turns.
    # BUDGET: seconds after which no new round starts. A round of the ten programs took
    # about 85 s on an H200, so the default 400 lets five rounds run (290 allowed four)
    # and ends within a call's 600 s; give RUN_ALL=0 with it.
    base=$PWD/${BASE:-.before53}
    command -v gcc > /dev/null && run build_ext python3 setup.py build_ext --inplace -j 8
    export PYTHONWARNINGS=ignore
    run real_programs python3 -X faulthandler benchmarks/real_programs.py \
        --rounds "${ROUNDS:-5}" --budget "${BUDGET:-400}"
    tail -n 20 "$OUT/real_programs.log"
    if [[ ${RUN_ALL:-1} == 1 ]]; then
        (cd "$base" && PYTHONPATH="$SITE:$PWD" python3 setup.py build_ext --inplace -j 8) \
            > "$OUT/build_base.log" 2>&1
        ROUNDS=1 bash scripts/bench_compare.sh "$base" run_all.py --rounds "${RUN_ALL_ROUNDS:-3}" \
            > "$OUT/run_all.log" 2>&1
        grep -E "^=== |ratio|x |  " "$OUT/run_all.log" | tail -n 60
    fi
    ;;
house)
    # Issue "host cost": run_all.py of ${BASE:-.before52}/ (the tree before the issue's
    # work) and of this tree, both compiled here, ${HOUSE_ROUNDS:-1} time(s) each, the before
    # tree first in each round (each run_all with --rounds ${RUN_ALL_ROUNDS:-3}), then every
    # figure side by side with after / before and the ones that moved the wrong way by more
    # than 3 % (scripts/runall_compare.py over the runs' compare.log).
    base=$PWD/${BASE:-.before52}
    command -v gcc > /dev/null && run build_ext python3 setup.py build_ext --inplace -j 8
    command -v gcc > /dev/null && run build_base bash -c \
        "cd '$base' && PYTHONPATH='$SITE:$base' python3 setup.py build_ext --inplace -j 8"
    rm -f "$OUT/compare.log"  # bench_compare.sh appends to it: this call's runs alone
    ROUNDS=${HOUSE_ROUNDS:-1} bash scripts/bench_compare.sh "$base" run_all.py \
        --rounds "${RUN_ALL_ROUNDS:-3}" > /dev/null 2>&1
    python3 scripts/runall_compare.py "$OUT/compare.log" | tee "$OUT/house.txt"
    ;;
profile)
    # Where the host time goes (issue "host cost"), this tree compiled: a stream per
    # step with and without the plugin (benchmarks/stream_per_step.py) and cProfile of
    # each; the first launch of plain kernels (benchmarks/first_launch.py); the launch
    # benchmark with the GIL kept and released through the launch; a real program profiled. (py-spy record --gil
    # --native on the threads benchmark never returned on the H200: not used.)
    command -v gcc > /dev/null && run build_ext python3 setup.py build_ext --inplace -j 8
    run per_step python3 -X faulthandler benchmarks/stream_per_step.py --rounds "${ROUNDS:-3}"
    tail -n 2 "$OUT/per_step.log"
    NUMBA_CUDA_MEMORY_MANAGER=numba_streamsafe python3 benchmarks/stream_per_step.py --child \
        --profile "$OUT/per_step_plugin.prof" > "$OUT/per_step_plugin.json" 2>&1
    python3 benchmarks/stream_per_step.py --child --profile "$OUT/per_step_plain.prof" \
        > "$OUT/per_step_plain.json" 2>&1
    run first_launch python3 -X faulthandler benchmarks/first_launch.py --rounds "${ROUNDS:-3}"
    tail -n 9 "$OUT/first_launch.log"
    run launch python3 -X faulthandler benchmarks/launch_overhead.py --rounds "${LAUNCH_ROUNDS:-5}" \
        --gil-variants
    grep -E "raw cuLaunch|floor|threads|entry" "$OUT/launch.log"
    # A real program that ran slower with the plugin (REAL, default test_montecarlo; .whl-suite
    # carried), profiled with and without it.
    PYTHONWARNINGS=ignore run real_profile python3 -X faulthandler benchmarks/real_programs.py \
        --rounds 1 --only ${REAL:-test_montecarlo} --profile "$OUT/real_profile"
    tail -n 4 "$OUT/real_profile.log"
    ;;
ordered)
    # Programs that order themselves (issue "host cost"): this tree against the one
    # in ${BASE:-.before}/ (built here), taking turns in one call: benchmarks/self_ordered.py
    # (the self-ordered round against the library-ordered one, the hooked Event.record
    # and wait against Numba's own) and benchmarks/stream_events.py (the library's events
    # on a 200-stream program), then the launch benchmark of both trees; before it, the
    # GPU tests of transparent mode, graphs, streams and check mode on this tree.
    base=$PWD/${BASE:-.before}
    command -v gcc > /dev/null && run build_ext python3 setup.py build_ext --inplace -j 8
    (cd "$base" && PYTHONPATH="$SITE:$PWD" python3 setup.py build_ext --inplace -j 8) \
        > "$OUT/build_base.log" 2>&1
    export NSS_RACE_REPORT=$OUT/race.txt
    [[ ${SKIP_TESTS:-0} == 1 ]] || run ordered_tests timeout "${TESTS_TIMEOUT:-240}" python3 -X faulthandler -m pytest -m gpu \
        -o faulthandler_timeout=120 \
        -q -p no:cacheprovider -rs tests/gpu/test_transparent_gpu.py \
        tests/gpu/test_plain_numba_gpu.py tests/gpu/test_graphs_gpu.py \
        tests/gpu/test_stream_reuse.py tests/gpu/test_foreign_streams.py \
        tests/gpu/test_mixed_gpu.py tests/gpu/test_check_mode_gpu.py
    [[ ${SKIP_TESTS:-0} == 1 ]] || tail -n 2 "$OUT/ordered_tests.log"
    for k in $(seq 1 "${ROUNDS:-3}"); do
        ordered_pair "$base" "$k"
    done
    cat "$OUT/ordered.log"
    ROUNDS=${LAUNCH_ROUNDS:-1} bash scripts/bench_compare.sh "$base" launch_overhead.py \
        > "$OUT/launch.log" 2>&1
    grep -E "^=== |raw cuLaunch|floor|threads" "$OUT/launch.log"
    if [[ ${ALLOC:-0} == 1 ]]; then
        ROUNDS=${LAUNCH_ROUNDS:-1} bash scripts/bench_compare.sh "$base" alloc_free.py \
            > "$OUT/alloc.log" 2>&1
        grep -E "^=== |ours / bare" "$OUT/alloc.log"
    fi
    ;;
numba-suite)
    # numba-cuda's own test suite without and with the plugin, side by side; the
    # difference (scripts/suite_diff.py). NSS_SUITE_ENV adds variables to the plugin's run.
    command -v gcc > /dev/null && run build_ext python3 setup.py build_ext --inplace
    python3 scripts/suite_diff.py run --out "$OUT" --jobs "${JOBS:-8}" ${SUITE_TESTS:-} \
        | tee "$OUT/suite_diff.txt"
    ;;
suite)
    # The whole GPU suite on the compiled path (the multi-GPU file in its own process),
    # then on the pure-Python path, then the graph replay benchmark.
    command -v gcc > /dev/null && run build_ext python3 setup.py build_ext --inplace
    export NSS_RACE_REPORT=$OUT/race.txt
    run gpu_suite python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu -rs \
        --deselect tests/gpu/test_multi_gpu.py ${SUITE_ARGS:-}
    tail -n 3 "$OUT/gpu_suite.log"
    if [[ -n ${PURE:-} ]]; then
        NUMBA_STREAMSAFE_PURE_PYTHON=1 run gpu_suite_pure python3 -m pytest -m gpu -q \
            -p no:cacheprovider tests/gpu -rs --deselect tests/gpu/test_multi_gpu.py ${SUITE_ARGS:-}
        tail -n 3 "$OUT/gpu_suite_pure.log"
    fi
    (cd benchmarks && NSS_BENCH_DIR="$OUT" run graph_replay python3 graph_replay.py)
    cat "$OUT/graph_replay.log"
    cat "$OUT/race.txt"
    ;;
hot)
    # The compiled engine: build it in place, its GPU tests, the direct-launch and race
    # suites through it, then the launch benchmark: .base (an earlier tree) against this
    # tree, and this tree on the engine's Python source, taking turns.
    command -v gcc > /dev/null && run build_ext python3 setup.py build_ext --inplace
    python3 -c "import numba_streamsafe.numba.launch.launcher, numba_streamsafe.compiled as c; \
print(c.engine_builds(load=True))"
    export NSS_RACE_REPORT=$OUT/race.txt NSS_RACE_TRIALS=${NSS_RACE_TRIALS:-100}
    run gpu_hot python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_hot_path.py \
        tests/gpu/test_direct_launch.py tests/gpu/test_races.py ${HOT_TESTS:-} -rs
    tail -n 3 "$OUT/gpu_hot.log"; cat "$OUT/race.txt" 2>/dev/null
    BENCH=${BENCH:-launch_overhead.py}
    for k in $(seq 1 "${ROUNDS:-2}"); do
        for side in base hot pure; do
            dir=$PWD; extra=()
            [[ $side == base ]] && dir=$PWD/.base
            [[ $side == pure ]] && extra=(env NUMBA_STREAMSAFE_PURE_PYTHON=1)
            echo "=== $side round $k" >> "$OUT/bench.log"
            (cd "$dir" && PYTHONPATH="$SITE:$dir" NSS_BENCH_DIR="$OUT/$side-$k" \
                NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 "${extra[@]}" \
                python3 "benchmarks/$BENCH" ${BENCH_ARGS:-}) >> "$OUT/bench.log" 2>&1
        done
    done
    grep -E "^=== |same stream|cross stream|ratio|raw|threads|us/" "$OUT/bench.log" | head -80
    ;;
alloc)
    # The allocation path before (.base) and after (this tree), taking turns, ROUNDS
    # times: alloc_free.py (every manager side by side, ratios per round), then
    # alloc_parts.py (where one cycle's microseconds go) once per tree.
    command -v gcc > /dev/null && run build_ext python3 setup.py build_ext --inplace
    for k in $(seq 1 "${ROUNDS:-2}"); do
        for side in base this; do
            dir=$PWD; [[ $side == base ]] && dir=$PWD/.base
            echo "=== $side round $k" >> "$OUT/alloc.log"
            (cd "$dir" && PYTHONPATH="$SITE:$dir" NSS_BENCH_DIR="$OUT/$side-$k" \
                python3 benchmarks/alloc_free.py) >> "$OUT/alloc.log" 2>&1
        done
    done
    for side in base this; do
        dir=$PWD; [[ $side == base ]] && dir=$PWD/.base
        echo "=== $side parts" >> "$OUT/alloc.log"
        (cd "$dir" && PYTHONPATH="$SITE:$dir" python3 benchmarks/alloc_parts.py) \
            >> "$OUT/alloc.log" 2>&1
    done
    grep -v -E '^ *$|^\{' "$OUT/alloc.log" | head -80
    ;;
esac
cat "$OUT/steps.txt" 2>/dev/null
