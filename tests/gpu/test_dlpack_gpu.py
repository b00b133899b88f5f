"""DLPack on a GPU, ``NSS_INTEROP_TRIALS`` times (default 100) ordered and,
interleaved, with tracking off (the negative control), with
``NUMBA_CUDA_ARRAY_INTERFACE_SYNC`` off so only the library orders:

- ``torch-dlpack`` / ``cupy-dlpack``: a tracked array written by a slow
  tracked kernel on stream b (allocated on a) is taken by
  ``torch.from_dlpack`` / ``cupy.from_dlpack`` on a consumer stream of that
  library, which passes its stream to ``__dlpack__``; PyTorch both with the
  DLPack 1.0 capsule it asks for and through a legacy ``dltensor`` capsule;
- ``torch-import`` / ``cupy-import``: a tensor or array written on a stream
  of that library after a long sleep comes in through ``nss.import_array``
  (a copy) on a Numba stream and is read there by a tracked kernel. The
  import runs with the producer's stream current in its library, as DLPack
  producers order their current stream before the consumer's;
- ``torch-borrow`` / ``cupy-borrow`` / ``cupy-cai-borrow``: the same through
  ``nss.from_dlpack`` / ``nss.from_cuda_array_interface``, without a copy;
- ``torch-release``: a borrowed tensor read late by a slow tracked kernel is
  dropped while the kernel runs, and PyTorch's caching allocator is asked
  for the same size on the tensor's stream, which it then fills. The library
  keeps the tensor alive until the kernel is done, so the new tensor gets
  other memory; the negative control reads the tensor through Numba's own
  ``cuda.as_cuda_array`` view, which keeps it alive no longer than the view.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import numba_streamsafe as nss

pytestmark = pytest.mark.gpu

TRIALS = int(os.environ.get("NSS_INTEROP_TRIALS", "100"))
N = 1 << 16
GRID, BLOCK = 256, 256
SPINS = 1000


@pytest.fixture(autouse=True)
def _no_interface_sync(monkeypatch):
    from numba.cuda.core import config

    monkeypatch.setattr(config, "CUDA_ARRAY_INTERFACE_SYNC", False, raising=False)


def _export_trials(gpu, kernels, read) -> tuple[int, int]:
    """A slow tracked writer of a fresh array on b (allocated on a), then
    ``read(x, value)`` by the consumer; wrong counts (tracked, untracked)."""
    a, b = gpu.stream(), gpu.stream()
    wrong = {True: 0, False: 0}
    for i in range(TRIALS):
        for tracked in (True, False):
            value = (0 if tracked else 1 << 20) + i + 2
            with nss.tracking(tracked):
                x = nss.device_array(N, np.int32, stream=a)
                kernels.slow_fill[GRID, BLOCK, b](x, value, SPINS)
                ok = read(x, value)
            gpu.synchronize()
            wrong[tracked] += not ok
    return wrong[True], wrong[False]


def _torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch has no CUDA here")
    return torch


class _Capsules:
    """Passes a consumer's ``__dlpack__`` call on to a tracked array, and notes
    which capsule the array gave (``legacy``: asks for a ``dltensor`` one)."""

    def __init__(self, array, legacy):
        self.array, self.legacy, self.versioned = array, legacy, []

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        from numba_streamsafe.numba.interop import dlpack

        capsule = self.array.__dlpack__(stream=stream,
                                        max_version=None if self.legacy else max_version)
        self.versioned.append(bool(dlpack._pyapi.PyCapsule_IsValid(capsule,
                                                                   b"dltensor_versioned")))
        return capsule


@pytest.mark.parametrize("capsule", ["versioned", "legacy"])
def test_torch_from_dlpack_is_ordered(gpu, kernels, race_report, capsule):
    torch = _torch()
    ts = torch.cuda.Stream()
    seen = []

    def read(x, value):
        with torch.cuda.stream(ts):
            producer = _Capsules(x, legacy=capsule == "legacy")
            t = torch.from_dlpack(producer)   # passes ts to __dlpack__
            seen.extend(producer.versioned)
            return bool((t == value).all().item())

    read(nss.device_array(N, np.int32), 0)
    assert seen == [capsule == "versioned"], f"PyTorch took {seen}"
    tracked, untracked = _export_trials(gpu, kernels, read)
    race_report(f"torch-dlpack-{capsule} tracked_wrong={tracked}/{TRIALS} "
                f"untracked_wrong={untracked}/{TRIALS}")
    assert tracked == 0
    assert untracked >= 0.7 * TRIALS, "the race did not show without the ordering"


def test_cupy_from_dlpack_is_ordered(gpu, kernels, race_report, cupy):
    consumer = cupy.cuda.Stream(non_blocking=True)

    def read(x, value):
        with consumer:
            xc = cupy.from_dlpack(x)          # passes the consumer stream to __dlpack__
            return bool((xc == value).all())

    read(nss.device_array(N, np.int32), 0)
    tracked, untracked = _export_trials(gpu, kernels, read)
    race_report(f"cupy-dlpack tracked_wrong={tracked}/{TRIALS} "
                f"untracked_wrong={untracked}/{TRIALS}")
    assert tracked == 0
    assert untracked >= 0.7 * TRIALS, "the race did not show without the ordering"


def _import_trials(gpu, kernels, produce, current, take=None) -> tuple[int, int]:
    """``produce(value)`` returns a foreign array written late on a foreign
    stream; ``current()`` makes that stream current in its library;
    ``take(foreign, stream=s)`` brings it in (default ``nss.import_array``)."""
    take = take or nss.import_array
    s = gpu.stream()
    out = nss.device_array(N, np.int32, stream=s)
    wrong = {True: 0, False: 0}
    for i in range(TRIALS):
        for tracked in (True, False):
            value = (0 if tracked else 1 << 20) + i + 2
            foreign = produce(value)
            with nss.tracking(tracked), current():
                x = take(foreign, stream=s)
                kernels.copy[GRID, BLOCK, s](x, out)
            gpu.synchronize()
            wrong[tracked] += not bool((nss.copy_to_host(out, stream=s) == value).all())
            del x, foreign
    nss.get_runtime().reap()
    return wrong[True], wrong[False]


def _torch_producer(torch, ts):
    def produce(value):
        with torch.cuda.stream(ts):
            t = torch.empty(N, dtype=torch.int32, device="cuda")
            torch.cuda._sleep(2_000_000)      # about 1 ms before the write
            t.fill_(value)
        return t

    return produce


_SPIN = r"""
extern "C" __global__ void spin(int *x, int n, int value, long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {}
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = value;
}"""


def _cupy_producer(cupy, cs):
    spin = cupy.RawKernel(_SPIN, "spin")

    def produce(value):
        with cs:
            x = cupy.empty(N, dtype=cupy.int32)
            spin((N // 256,), (256,), (x, np.int32(N), np.int32(value), np.int64(2_000_000)))
        return x

    return produce


def test_a_torch_tensor_comes_in_ordered(gpu, kernels, race_report):
    torch = _torch()
    ts = torch.cuda.Stream()
    produce = _torch_producer(torch, ts)
    produce(0)
    tracked, untracked = _import_trials(gpu, kernels, produce, lambda: torch.cuda.stream(ts))
    race_report(f"torch-import tracked_wrong={tracked}/{TRIALS} "
                f"untracked_wrong={untracked}/{TRIALS}")
    assert tracked == 0
    assert untracked >= 0.7 * TRIALS, "the race did not show without the ordering"


def test_a_cupy_array_comes_in_ordered(gpu, kernels, race_report, cupy):
    cs = cupy.cuda.Stream(non_blocking=True)
    produce = _cupy_producer(cupy, cs)
    produce(0)
    tracked, untracked = _import_trials(gpu, kernels, produce, lambda: cs)
    race_report(f"cupy-import tracked_wrong={tracked}/{TRIALS} "
                f"untracked_wrong={untracked}/{TRIALS}")
    assert tracked == 0
    assert untracked >= 0.7 * TRIALS, "the race did not show without the ordering"


def test_a_torch_tensor_is_borrowed_ordered(gpu, kernels, race_report):
    torch = _torch()
    ts = torch.cuda.Stream()
    produce = _torch_producer(torch, ts)
    t = produce(0)
    with torch.cuda.stream(ts):
        x = nss.from_dlpack(t, stream=gpu.stream())
    assert nss.block_of(x).borrowed and nss.block_of(x).ptr == t.data_ptr()  # no copy
    del x, t
    tracked, untracked = _import_trials(gpu, kernels, produce, lambda: torch.cuda.stream(ts),
                                        nss.from_dlpack)
    race_report(f"torch-borrow tracked_wrong={tracked}/{TRIALS} "
                f"untracked_wrong={untracked}/{TRIALS}")
    assert tracked == 0
    assert untracked >= 0.7 * TRIALS, "the race did not show without the ordering"


def test_a_cupy_array_is_borrowed_ordered(gpu, kernels, race_report, cupy):
    cs = cupy.cuda.Stream(non_blocking=True)
    produce = _cupy_producer(cupy, cs)
    produce(0)
    tracked, untracked = _import_trials(gpu, kernels, produce, lambda: cs, nss.from_dlpack)
    race_report(f"cupy-borrow tracked_wrong={tracked}/{TRIALS} "
                f"untracked_wrong={untracked}/{TRIALS}")
    assert tracked == 0
    assert untracked >= 0.7 * TRIALS, "the race did not show without the ordering"


def test_a_cupy_array_is_borrowed_through_its_interface_ordered(gpu, kernels, race_report, cupy):
    cs = cupy.cuda.Stream(non_blocking=True)
    produce = _cupy_producer(cupy, cs)
    with cs:
        named = produce(0).__cuda_array_interface__.get("stream")
    assert named == cs.ptr, f"CuPy's interface names stream {named!r}, not its current one"
    tracked, untracked = _import_trials(gpu, kernels, produce, lambda: cs,
                                        nss.from_cuda_array_interface)
    race_report(f"cupy-cai-borrow tracked_wrong={tracked}/{TRIALS} "
                f"untracked_wrong={untracked}/{TRIALS}")
    assert tracked == 0
    assert untracked >= 0.7 * TRIALS, "the race did not show without the ordering"


def test_a_released_torch_tensor_is_not_reused_under_a_tracked_read(gpu, kernels, race_report):
    """The borrowed tensor is dropped while a slow tracked kernel still reads
    it, then PyTorch allocates the same size on the tensor's stream and fills
    it. After ``empty_cache`` the caching allocator hands that allocation the
    dropped tensor's memory as soon as it is free: the library must keep the
    tensor until the kernel is done. Negative control: Numba's own view."""
    torch = _torch()
    ts = torch.cuda.Stream()
    a, b = gpu.stream(), gpu.stream()
    out = nss.device_array(N, np.int32, stream=b)
    rt = nss.get_runtime()
    # Launch once on a borrowed array first: a launch that makes Numba compile
    # for new argument types can leave the launching frames, and so the
    # arguments, alive inside Numba for a while (seen on the H100 after other
    # test files), which would keep a tensor here that the library released.
    with torch.cuda.stream(ts):
        warm = nss.from_dlpack(torch.zeros((N,), dtype=torch.int32, device="cuda"), stream=a)
        kernels.slow_copy[GRID, BLOCK, b](warm, out, 1)
        del warm
    baseline = None
    wrong = {True: 0, False: 0}
    reused = 0
    for i in range(TRIALS):
        for borrowed in (True, False):
            value = (0 if borrowed else 1 << 20) + i + 2
            gpu.synchronize()
            torch.cuda.synchronize()
            rt.reap()                                  # earlier releases let go
            torch.cuda.empty_cache()
            if baseline is None:
                baseline = torch.cuda.memory_allocated()
            with torch.cuda.stream(ts):
                t = torch.full((N,), value, dtype=torch.int32, device="cuda")
                address = t.data_ptr()
                if borrowed:
                    x = nss.from_dlpack(t, stream=a)
                    kernels.slow_copy[GRID, BLOCK, b](x, out, SPINS)
                    del x
                else:
                    view = gpu.as_cuda_array(t, sync=False)
                    with nss.tracking(False):
                        kernels.slow_copy[GRID, BLOCK, b](view, out, SPINS)
                    del view
                del t
                t2 = torch.empty((N,), dtype=torch.int32, device="cuda")
                t2.fill_(-1)                           # on ts, not ordered after b
            if t2.data_ptr() == address:
                reused += 1
                assert not borrowed, "the borrowed tensor's memory was handed out under a use"
            gpu.synchronize()
            torch.cuda.synchronize()
            wrong[borrowed] += not bool((nss.copy_to_host(out, stream=b) == value).all())
            del t2
    gpu.synchronize()
    rt.reap()
    race_report(f"torch-release borrowed_wrong={wrong[True]}/{TRIALS} "
                f"numba_view_wrong={wrong[False]}/{TRIALS} reused={reused}/{TRIALS}")
    assert torch.cuda.memory_allocated() <= baseline, \
        f"a released tensor was kept: {_holders_of_cuda_tensors(torch)}"
    assert wrong[True] == 0
    assert reused >= 0.7 * TRIALS, "PyTorch did not hand the freed memory out again"
    assert wrong[False] >= 0.7 * TRIALS, "the race did not show without the keep-alive"


def _holders_of_cuda_tensors(torch) -> list[str]:
    """For a failure message: the chain of objects (frames named) that keeps
    each live CUDA tensor and each borrowed block's lease alive, up to twelve
    levels, and the tracker's pending releases."""
    import gc

    mine: set[int] = set()

    def referrers(obj):
        refs = gc.get_referrers(obj)
        mine.add(id(refs))
        found = [r for r in refs if id(r) not in mine]
        mine.add(id(found))
        return found

    from numba_streamsafe.numba.interop import imports

    objects = gc.get_objects()
    mine.add(id(objects))
    tensors = [o for o in objects if isinstance(o, torch.Tensor) and o.is_cuda]
    leases = [o for o in objects if isinstance(o, imports._Lease)]
    mine.add(id(tensors))
    mine.add(id(leases))
    del objects
    out = []
    both = tensors + leases
    mine.add(id(both))
    for tensor in both:
        path, obj = [], tensor
        path_prev = tensor
        for _ in range(12):
            refs = referrers(obj)
            if not refs:
                break
            obj = refs[0]
            desc = type(obj).__qualname__
            if hasattr(obj, "f_code"):
                desc += f" {obj.f_code.co_name} ({obj.f_code.co_filename}:{obj.f_lineno})"
            elif isinstance(obj, dict):
                desc += f" keys={list(obj)[:6]}"
            elif isinstance(obj, (list, tuple)):
                desc += f" len={len(obj)} of {[type(v).__qualname__ for v in obj[:4]]}"
            elif hasattr(obj, "describe"):
                desc += f" {obj.describe()}"
            elif hasattr(obj, "__dict__"):
                desc += f" attrs={[k for k, v in vars(obj).items() if v is path_prev][:3]}"
            path_prev = obj
            path.append(f"{desc} (+{len(refs) - 1} more)")
        name = f"tensor at {tensor.data_ptr():#x}" if isinstance(tensor, torch.Tensor) else \
            f"lease of {tensor.block.describe()}"
        out.append(f"{name} <- " + " <- ".join(path))
    tracker = nss.get_runtime().resource.tracker
    pending = [(s, n, len(k or ())) for s, (n, _o, k) in tracker._reaper.pending.slots.items()]
    out.append(f"pending {pending} queued {len(tracker._deferred)} "
               f"borrowed {tracker.table.borrowed}")
    return out
