"""The examples queue the GPU work of the benchmarks' tracked variant, call for call.

The examples carry the pipeline as straight-line code; the benchmarks run the
same pipeline written against an ordering (``benchmarks/ordered_pipeline.py``)
so they can also time it device-synchronized and with hand-placed events. On
the simulated driver, each side runs in a fresh child process that records
every driver call (streams, events and blocks named in order of first sight)
and every tracked launch (kernel, grid, block, stream, arguments: arrays as
block, offset, shape and dtype). The two records must be equal.

Run as a script, this file is that child: ``python <this file> <side> <example> <n>``
prints the record as JSON.
"""

from __future__ import annotations

import bisect
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

#: The examples run end to end on the simulator: in CI (pytest -m slow), out of the
#: default run, which stays under a minute.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

#: Driver calls recorded, with the kind of each positional argument:
#: "stream", "event", "ptr" (a block, by name and offset) or "value".
CALLS: dict[str, tuple[str, ...]] = {
    "create_stream": (),
    "destroy_stream": ("stream",),
    "stream_synchronize": ("stream",),
    "stream_query": ("stream",),
    "synchronize": (),
    "event_create": (),
    "event_destroy": ("event",),
    "event_record": ("event", "stream"),
    "event_query": ("event",),
    "event_synchronize": ("event",),
    "stream_wait_event": ("stream", "event"),
    "alloc_async": ("value", "stream"),
    "alloc": ("value",),
    "free_async": ("ptr", "stream"),
    "free": ("ptr",),
    "pool_trim": ("value",),
    "set_pool_attribute": ("value", "value"),
    "memset_async": ("ptr", "value", "value", "stream"),
    "copy_to_host": ("ptr", "value", "stream"),
    "trace_access": ("stream", "accesses", "label"),
    "launch_kernel": ("value", "value", "value", "value", "stream"),
}


class Recorder:
    """Records calls of every SimDriver and every tracked launch, with names for handles."""

    def __init__(self) -> None:
        self.log: list[list[Any]] = []
        self.names: dict[tuple[str, int], str] = {}
        self.bases: list[int] = []  # sorted base addresses of the blocks seen
        self.blocks: dict[int, tuple[str, int]] = {}  # base -> (name, bytes)
        self.nblocks = 0

    def name(self, kind: str, handle: int) -> str:
        key = (kind, handle)
        if key not in self.names:
            self.names[key] = f"{kind}{sum(k == kind for k, _ in self.names)}"
        return self.names[key]

    def block(self, ptr: int) -> str:
        i = bisect.bisect_right(self.bases, ptr) - 1
        if i >= 0:
            base = self.bases[i]
            name, nbytes = self.blocks[base]
            if ptr < base + max(nbytes, 1):
                return name if ptr == base else f"{name}+{ptr - base}"
        return "unknown"

    def new_block(self, ptr: int, nbytes: int) -> str:
        name = f"block{self.nblocks}"
        self.nblocks += 1
        if ptr not in self.blocks:
            bisect.insort(self.bases, ptr)
        self.blocks[ptr] = (name, nbytes)
        return name

    def arg(self, kind: str, value: Any) -> Any:
        if kind == "stream":
            return self.name("stream", value)
        if kind == "event":
            return self.name("event", value)
        if kind == "ptr":
            return self.block(value)
        if kind == "accesses":
            # (ptr, nbytes, access[, argument name]): the names differ between callers
            return [[self.block(e[0]), e[1], int(e[2])] for e in value]
        if kind == "label":
            return str(value).split(" (")[0]  # "copy to device (tag)": the tag is no GPU work
        return value if isinstance(value, (int, float, str, type(None))) else repr(value)

    def install(self) -> None:
        from numba_streamsafe._driver.sim import SimDriver

        for call, kinds in CALLS.items():
            method = getattr(SimDriver, call, None)
            if method is not None:
                setattr(SimDriver, call, self._wrap(call, kinds, method))
        import numba_streamsafe as nss

        tracked = nss.TrackedKernel
        getitem = tracked.__getitem__
        recorder = self

        def configure(kernel: Any, config: Any) -> Any:
            launch = getitem(kernel, config)

            def call(*args: Any) -> Any:
                grid, block, *rest = config
                stream = nss.get_runtime().stream_handle(rest[0]) if rest else 0
                recorder.log.append(["kernel", kernel.__name__, repr(grid), repr(block),
                                     recorder.name("stream", stream), *rest[1:],
                                     [recorder.launch_arg(a) for a in args]])
                return launch(*args)

            return call

        tracked.__getitem__ = configure

    def launch_arg(self, value: Any) -> Any:
        host = getattr(value, "_ary", None)  # a simulator device array: its bytes are the block's
        if host is None:
            return self.arg("value", value)
        import numba_streamsafe as nss

        try:
            block = nss.block_of(value)
        except Exception:  # not memory of the library (Numba's own allocator)
            block = None
        if block is None:
            return ["foreign", list(host.shape), str(host.dtype)]
        return [self.block(block.ptr), host.ctypes.data - block.ptr, list(host.shape),
                str(host.dtype)]

    def _wrap(self, call: str, kinds: tuple[str, ...], method: Any) -> Any:
        recorder = self

        def wrapped(driver: Any, *args: Any, **kwargs: Any) -> Any:
            entry: list[Any] = [call]
            if call in ("free_async", "free"):
                entry.append(recorder.block(args[0]))  # named before the address is reused
                entry += [recorder.arg(k, a) for k, a in zip(kinds[1:], args[1:], strict=False)]
            else:
                entry += [recorder.arg(k, a) for k, a in zip(kinds, args, strict=False)]
            # ``site`` and ``stack`` (the caller's frames, for race reports) differ
            # between callers (and hold code objects, whose text names their address).
            entry += [f"{k}={v!r}" for k, v in sorted(kwargs.items())
                      if k not in ("site", "stack")]
            recorder.log.append(entry)
            result = method(driver, *args, **kwargs)
            if call == "create_stream":
                entry.append(recorder.name("stream", result))
            elif call == "event_create":
                entry.append(recorder.name("event", result))
            elif call in ("alloc_async", "alloc"):
                entry.append(recorder.new_block(result, args[0]))
            return result

        return wrapped


def _example(name: str, n: int) -> None:
    """The example's own tracked run, as ``python examples/<name>.py --n <n>`` runs it."""
    sys.path.insert(0, str(ROOT / "examples"))
    module = __import__(name)
    report = module.run(n, 4, True, 1)
    assert report.correct and report.hazards == 0, report


def _benchmark(name: str, n: int) -> None:
    """The benchmarks' tracked variant of the same work."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import numpy as np
    import ordered_pipeline as op
    from numba import cuda
    from orderings import Ordering
    from target import hazards_now, host_sync

    import numba_streamsafe as nss

    if name == "sort_join_pipeline":  # what benchmarks/pipeline.py times as "tracked"
        import pipeline

        args = pipeline.parse_args(["--n", str(n)])
        work, build, batches, expected, streams = pipeline.prepare(args)
        _, count, results, _, _ = pipeline.one_run("tracked", build, batches, streams,
                                                   pipeline=work)
        assert np.array_equal(results, expected) and count[0] == (expected >= 0).sum()
    elif name == "multistream_sort":  # the sort of pipeline.py --sort bucket
        keys = np.random.default_rng(1).integers(0, np.int64(1) << 32, size=n, dtype=np.int64)
        collect = cuda.stream()
        workers = [cuda.stream() for _ in range(4)]

        def run() -> np.ndarray:
            with nss.tracking(True):
                d_keys = nss.to_device(keys, stream=collect, tag="keys")
                d_sorted = op.multistream_sort(d_keys, n, workers, collect, Ordering())
                got = nss.copy_to_host(d_sorted, stream=collect)
                collect.synchronize()
            return got

        assert np.array_equal(run(), np.sort(keys))
    elif name == "hash_join":  # the table build and probe of pipeline.py --uploads per-stream
        from data import HostBatches, expected_probe, make_relations

        build, probe = make_relations(n, 1)
        batches = HostBatches.of(probe, 16)
        build_stream = cuda.stream()
        probe_streams = [cuda.stream() for _ in range(4)]

        def join() -> None:
            d_build = nss.to_device(build, stream=build_stream, tag="build keys")
            table = op.build_table(d_build, build_stream, Ordering())
            op.probe_batches(batches, table, probe_streams, Ordering())
            for s in probe_streams:
                host_sync(s)

        with nss.tracking(True):
            join()
        assert np.array_equal(np.concatenate(batches.results), expected_probe(build, probe))
    else:
        raise SystemExit(f"unknown example {name!r}")
    assert hazards_now() == 0


def _record(side: str, name: str, n: int) -> list[list[Any]]:
    recorder = Recorder()
    recorder.install()
    (_example if side == "example" else _benchmark)(name, n)
    import gc

    import numba_streamsafe as nss

    gc.collect()
    nss.get_runtime().flush()  # the frees still queued when the run ended
    return recorder.log


def _child(side: str, name: str, n: int, **extra_env: str) -> list[list[Any]]:
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", **extra_env}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, __file__, side, name, str(n)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("RECORD ")]
    return json.loads(line[len("RECORD "):])


def _first_difference(a: list[Any], b: list[Any]) -> str:
    same = (x == y for x, y in zip(a, b, strict=False))
    i = next((i for i, ok in enumerate(same) if not ok), min(len(a), len(b)))
    show = "\n".join(f"  {j}: {a[j] if j < len(a) else '-'}\n      {b[j] if j < len(b) else '-'}"
                     for j in range(max(0, i - 3), min(max(len(a), len(b)), i + 4)))
    return f"{len(a)} and {len(b)} entries; first difference at {i} (example, then benchmark):\n" \
           + show


def _check_same_work(name: str, n: int) -> None:
    example = _child("example", name, n)
    benchmark = _child("benchmark", name, n)
    assert sum(e[0] == "kernel" for e in example) > 10, example[:20]
    assert example == benchmark, _first_difference(example, benchmark)


def test_pipeline_example_queues_the_tracked_benchmark_work():
    """examples/sort_join_pipeline.py and benchmarks/pipeline.py's "tracked" kind,
    both at their defaults (4 streams, 8 probe batches, 4 chunks, one upload stream)."""
    _check_same_work("sort_join_pipeline", 300)  # chunks of 75 keys: padded sorts


def test_sort_example_queues_the_benchmark_sort():
    _check_same_work("multistream_sort", 200)


def test_hash_join_example_queues_the_benchmark_build_and_probes():
    _check_same_work("hash_join", 200)


if __name__ == "__main__":
    side, example, size = sys.argv[1:4]
    print("RECORD " + json.dumps(_record(side, example, int(size))))
