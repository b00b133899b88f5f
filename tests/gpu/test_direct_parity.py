"""Direct launches against Numba's launch path, bit for bit, on a GPU.

Every case runs once through Numba's path (``direct_launch`` off), then
twice with direct launches on: the first of those goes through the Python
direct path (or Numba's, where the direct path hands the call over), the
second through the compiled hot path where it is built and applies (the
arrays and stream are reused, so their launch fields are cached by then).
The outputs are compared as bytes (NaN, -0.0 and wrapped integers
included); a call Numba's path refuses must be refused the same way. The
test also counts that the direct and compiled paths were really taken for
the cases they cover, so it cannot compare Numba with Numba only.

Cases: every scalar type Numba passes by value, at its edges, as Python and
NumPy scalars, into unspecialized kernels and into kernels compiled for
another type (conversions); 1- to 3-D arrays in C and F order, strided,
reversed and transposed views; record arrays; zero-size arrays; dynamic
shared memory; ``forall``; several threads launching one kernel.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import numba_streamsafe as nss
from numba_streamsafe.hot import hot
from numba_streamsafe.numba.policy import launch_policy

pytestmark = pytest.mark.gpu

INTS = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64]
FLOATS = [np.float32, np.float64]


class Paths:
    """Runs a case three ways and counts the direct and compiled launches."""

    def __init__(self, gpu, rt, monkeypatch):
        self.gpu, self.rt = gpu, rt
        self.stream = gpu.stream()
        self.direct = 0
        inner = rt.driver.launch_kernel

        def counting(*args):
            self.direct += 1
            return inner(*args)

        monkeypatch.setattr(rt.driver, "launch_kernel", counting)
        self.compiled = 0
        self.last_error: Exception | None = None

    def run(self, launch, outputs):
        """``launch()`` three ways; each time ``outputs`` (device arrays) are
        cleared first and read back after. Returns the three results: a tuple
        of bytes per output, or the exception type raised."""
        results = []
        for direct in (False, True, True):
            launch_policy(self.rt).direct_launch = direct
            for out in outputs:
                nss.memset(out, 0xA5, stream=self.stream)
            before = hot.launches() if hot is not None else 0
            try:
                launch()
                self.gpu.synchronize()
                results.append(tuple(nss.copy_to_host(o, stream=self.stream).tobytes()
                                     for o in outputs))
            except Exception as exc:  # noqa: BLE001 - compared across the paths
                results.append(type(exc))
                self.last_error = exc
            finally:
                launch_policy(self.rt).direct_launch = True
            if hot is not None:
                self.compiled += hot.launches() - before
        return results

    def same(self, launch, outputs, what):
        numba, direct, compiled = self.run(launch, outputs)
        assert direct == numba, f"{what}: the direct path differs from Numba's"
        assert compiled == numba, f"{what}: the second direct launch differs from Numba's"
        return numba


@pytest.fixture
def paths(gpu, fresh_runtime, monkeypatch):
    return Paths(gpu, fresh_runtime, monkeypatch)


def _store_kernel(gpu, signature=None):
    def store(out: nss.Write, v):
        out[0] = v

    if signature is None:
        return nss.tracked_kernel(store)
    return nss.tracked_kernel(store, signature=signature)


def _edges(dtype):
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return [info.min, info.max, 0, 1] + ([-1] if info.min < 0 else [])
    info = np.finfo(dtype)
    return [0.0, -0.0, 1.5, float(info.max), float(-info.max), float(info.tiny),
            float(info.smallest_subnormal), np.inf, -np.inf, np.nan]


def test_scalars_unspecialized(gpu, paths):
    store = _store_kernel(gpu)
    s = paths.stream
    cases = []
    for dtype in INTS + FLOATS:
        for v in _edges(dtype):
            cases.append((dtype, dtype(v)))                          # NumPy scalars
    cases += [(np.int64, v) for v in (0, -1, 2**63 - 1, -(2**63))]   # Python int
    cases += [(np.float64, v) for v in (0.0, -0.0, 1e308, float("nan"), float("inf"), 5e-324)]
    cases += [(np.bool_, v) for v in (True, False, np.True_, np.False_)]
    cases += [(np.complex128, v) for v in (1.5 - 2j, complex("nan+infj"))]
    cases += [(np.complex64, np.complex64(0.25 + 4j))]
    for dtype, value in cases:
        out = nss.device_array(1, dtype, stream=s)
        paths.same(lambda out=out, value=value: store[1, 1, s](out, value), [out],
                   f"{type(value).__name__} {value!r} into {np.dtype(dtype)}")
    assert paths.direct >= len(cases)          # the direct path was taken
    if hot is not None:  # the compiled path takes the Python scalars (NumPy's: the Python path)
        python_scalars = sum(type(v) in (int, float, bool, complex) for _, v in cases)
        assert paths.compiled >= python_scalars


@pytest.mark.parametrize("dtype", INTS + FLOATS + [np.bool_], ids=lambda d: np.dtype(d).name)
def test_scalars_converted_to_a_compiled_signature(gpu, paths, dtype):
    name = {np.bool_: "boolean"}.get(dtype, np.dtype(dtype).name)
    store = _store_kernel(gpu, f"void({name}[:], {name})")
    s = paths.stream
    out = nss.device_array(1, dtype, stream=s)
    values = [0, 1, -1, 2, 255, 256, 2**31, -(2**31) - 1, 2**63, -(2**63), 2**64 - 1, 0.5, -0.5,
              2.7, 1e300, -1e300, float("nan"), True, False, np.int64(-5), np.uint8(200),
              np.float32(0.25), np.float64(1e40), np.int8(-128), np.bool_(True)]
    outcomes = []
    for v in values:
        outcomes.append(paths.same(lambda v=v: store[1, 1, s](out, v), [out],
                                   f"{type(v).__name__} {v!r} into a {name} parameter"))
    assert any(isinstance(o, tuple) for o in outcomes)
    assert paths.direct > 0


def _views():
    base1 = np.arange(24, dtype=np.float64)
    base2 = np.arange(48, dtype=np.int32).reshape(6, 8)
    base3 = np.arange(120, dtype=np.float32).reshape(4, 5, 6)
    return {
        "1d": (base1, lambda d: d), "1d-strided": (base1, lambda d: d[::3]),
        "1d-reversed": (base1, lambda d: d[::-1]), "2d-C": (base2, lambda d: d),
        "2d-F": (np.asfortranarray(base2), lambda d: d),
        "2d-cols-reversed": (base2, lambda d: d[:, ::-1]),
        "2d-block": (base2, lambda d: d[1:5, 2:7:2]),
        "3d-C": (base3, lambda d: d), "3d-F": (np.asfortranarray(base3), lambda d: d),
        "3d-strided": (base3, lambda d: d[::2, 1:, ::-3]),
        "1d-empty": (np.zeros(0, np.float64), lambda d: d),
        "2d-empty": (np.zeros((3, 0), np.int32), lambda d: d),
        "2d-empty-view": (base2, lambda d: d[2:2, :]),
    }


def _shape_kernel(ndim):
    if ndim == 1:
        def k1(a: nss.Read, meta: nss.Write, vals: nss.Write):
            meta[0] = a.shape[0]
            meta[1] = a.strides[0]
            for i in range(a.shape[0]):
                vals[i] = a[i]
        return nss.tracked_kernel(k1)
    if ndim == 2:
        def k2(a: nss.Read, meta: nss.Write, vals: nss.Write):
            for d in range(2):
                meta[d] = a.shape[d]
                meta[2 + d] = a.strides[d]
            for i in range(a.shape[0]):
                for j in range(a.shape[1]):
                    vals[i * a.shape[1] + j] = a[i, j]
        return nss.tracked_kernel(k2)

    def k3(a: nss.Read, meta: nss.Write, vals: nss.Write):
        for d in range(3):
            meta[d] = a.shape[d]
            meta[3 + d] = a.strides[d]
        for i in range(a.shape[0]):
            for j in range(a.shape[1]):
                for m in range(a.shape[2]):
                    vals[(i * a.shape[1] + j) * a.shape[2] + m] = a[i, j, m]
    return nss.tracked_kernel(k3)


def test_arrays_and_views(gpu, paths):
    s = paths.stream
    kernels = {n: _shape_kernel(n) for n in (1, 2, 3)}
    for name, (host, view) in _views().items():
        d = view(nss.to_device(host, stream=s))
        h = view(host)
        meta = nss.device_array(8, np.int64, stream=s)
        vals = nss.device_array(max(h.size, 1), np.float64, stream=s)
        k = kernels[h.ndim]
        result = paths.same(lambda k=k, d=d, meta=meta, vals=vals: k[1, 1, s](d, meta, vals),
                            [meta, vals], name)
        assert isinstance(result, tuple), (name, paths.last_error)
        got_meta = np.frombuffer(result[0], np.int64)
        assert list(got_meta[:h.ndim]) == list(d.shape), name
        assert list(got_meta[h.ndim:2 * h.ndim]) == list(d.strides), name
        np.testing.assert_array_equal(np.frombuffer(result[1], np.float64)[:h.size],
                                      h.ravel().astype(np.float64))
    assert paths.direct > 0


def test_record_arrays(gpu, paths):
    s = paths.stream
    rec = np.dtype([("x", np.int32), ("y", np.float64), ("z", np.int8)], align=True)
    host = np.zeros(10, rec)
    host["x"], host["y"], host["z"] = np.arange(10), np.linspace(0, 1, 10), -np.arange(10)

    @nss.tracked_kernel
    def fields(a: nss.Read, out: nss.Write):
        i = gpu.grid(1)
        if i < a.size:
            out[i] = a[i].x + a[i].y + a[i].z

    d = nss.to_device(host, stream=s)
    out = nss.device_array(10, np.float64, stream=s)
    result = paths.same(lambda: fields[1, 32, s](d, out), [out], "record array")
    assert isinstance(result, tuple), paths.last_error  # Numba's path ran it
    np.testing.assert_allclose(np.frombuffer(result[0], np.float64),
                               host["x"] + host["y"] + host["z"])
    assert paths.direct > 0


def test_dynamic_shared_memory_and_forall(gpu, paths):
    s = paths.stream

    @nss.tracked_kernel
    def reverse(a: nss.Read, out: nss.Write):
        buf = gpu.shared.array(0, np.float32)
        t = gpu.threadIdx.x
        buf[t] = a[t]
        gpu.syncthreads()
        out[t] = buf[gpu.blockDim.x - 1 - t]

    @nss.tracked_kernel
    def scale(a: nss.Read, out: nss.Write, k):
        i = gpu.grid(1)
        if i < out.size:
            out[i] = k * a[i]

    a = nss.to_device(np.arange(64, dtype=np.float32), stream=s)
    out = nss.device_array(64, np.float32, stream=s)
    result = paths.same(lambda: reverse[1, 64, s, 64 * 4](a, out), [out], "dynamic shared")
    np.testing.assert_array_equal(np.frombuffer(result[0], np.float32), np.arange(64)[::-1])
    paths.same(lambda: scale.forall(64, stream=s)(a, out, 3.0), [out], "forall")
    result = paths.same(lambda: scale.forall(64, tpb=16, stream=s)(a, out, 2.0), [out],
                        "forall with tpb")
    np.testing.assert_array_equal(np.frombuffer(result[0], np.float32), 2 * np.arange(64))


def test_threads_launch_one_kernel(gpu, fresh_runtime):
    @nss.tracked_kernel
    def affine(a: nss.Read, out: nss.Write, k, c):
        i = gpu.grid(1)
        if i < out.size:
            out[i] = k * a[i] + c

    n, nthreads, rounds = 4096, 8, 50
    errors: list[BaseException] = []
    results: list[np.ndarray | None] = [None] * nthreads

    def work(t):
        try:
            gpu.current_context()
            s = gpu.stream()
            a = nss.to_device(np.arange(n, dtype=np.int64), stream=s)
            out = nss.device_array(n, np.int64, stream=s)
            for r in range(rounds):
                affine[n // 256, 256, s](a, out, t + 1, r)
            results[t] = nss.copy_to_host(out, stream=s)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(nthreads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors[0]
    for t, got in enumerate(results):
        np.testing.assert_array_equal(got, (t + 1) * np.arange(n) + rounds - 1)
