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
another type (conversions); one kernel taking every scalar type at once,
interleaved with arrays; 1- to 3-D arrays in C and F order, strided,
reversed and transposed views; 0-d arrays (tracked, CuPy's and PyTorch's);
record arrays; zero-size arrays; dynamic shared memory; ``forall``; launch
configurations the driver refuses; several threads launching one kernel.

Each ``Paths.same`` call can also say whether the direct path covers the
case (``covered``): then both launches with direct launches on must have
been taken by the direct or the compiled path, else by neither.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import numba_streamsafe as nss
from numba_streamsafe.numba.launch import launcher
from numba_streamsafe.numba.launch.policy import launch_policy

pytestmark = pytest.mark.gpu

INTS = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64]
FLOATS = [np.float32, np.float64]


class Paths:
    """Runs a case three ways and counts the direct and compiled launches."""

    def __init__(self, gpu, rt, monkeypatch):
        self.gpu, self.rt = gpu, rt
        self.stream = gpu.stream()
        self.direct = 0
        self._lock = threading.Lock()
        inner = rt.driver.launch_kernel

        def counting(*args):
            with self._lock:  # threads launch too
                self.direct += 1
            return inner(*args)

        monkeypatch.setattr(rt.driver, "launch_kernel", counting)
        self.compiled = 0
        self.last_error: Exception | None = None
        #: Per run of the last ``run``: launches the direct or compiled path took.
        self.taken: list[int] = []

    def launches(self) -> int:
        """Launches the Python direct path and the direct launch
        (:func:`launcher.launch`, either build) took so far; the latter's
        count is process-wide, and those it handed to the driver layer are
        counted there once."""
        return self.direct + launcher.launches() - launcher.by_driver()

    def run(self, launch, outputs):
        """``launch()`` three ways; each time ``outputs`` (device arrays) are
        cleared first and read back after. Returns the three results: a tuple
        of bytes per output, or the exception type raised."""
        results = []
        self.taken = []
        for direct in (False, True, True):
            taken = self.launches()
            launch_policy(self.rt).direct_launch = direct
            for out in outputs:
                nss.memset(out, 0xA5, stream=self.stream)
            before = launcher.launches()
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
            self.compiled += launcher.launches() - before
            self.taken.append(self.launches() - taken)
        return results

    def same(self, launch, outputs, what, covered=None):
        """Run ``launch`` three ways and assert the results are equal; with
        ``covered`` given, assert the launches with direct launches on were
        (True) or were not (False) taken by the direct or compiled path."""
        numba, direct, compiled = self.run(launch, outputs)
        assert direct == numba, f"{what}: the direct path differs from Numba's"
        assert compiled == numba, f"{what}: the second direct launch differs from Numba's"
        assert self.taken[0] == 0, f"{what}: a launch with direct launches off was direct"
        if covered is not None:
            want = [0, 1, 1] if covered else [0, 0, 0]
            assert self.taken == want, (
                f"{what}: launches taken by the direct/compiled paths {self.taken}, "
                f"expected {want}")
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


def _bits(dtype, raw):
    """A NumPy scalar of ``dtype`` with the given bit pattern (NaN payloads)."""
    return np.array([raw], dtype=f"u{np.dtype(dtype).itemsize}").view(dtype)[0]


#: Signalling NaNs with a payload (Numba's conversion to float32 quiets them).
SNAN64 = _bits(np.float64, 0x7FF0_0000_2000_0001)
SNAN32 = _bits(np.float32, 0x7F80_0001)


def test_scalars_unspecialized(gpu, paths):
    store = _store_kernel(gpu)
    s = paths.stream
    cases = []
    for dtype in INTS + FLOATS:
        for v in _edges(dtype):
            cases.append((dtype, dtype(v)))                          # NumPy scalars
    cases += [(np.float64, SNAN64), (np.float32, SNAN32),
              (np.float64, _bits(np.float64, 0xFFF0_0000_0000_0001))]
    cases += [(np.int64, v) for v in (0, -1, 2**63 - 1, -(2**63))]   # Python int
    cases += [(np.float64, v) for v in (0.0, -0.0, 1e308, float("nan"), float("inf"), 5e-324,
                                        float(SNAN64))]
    cases += [(np.bool_, v) for v in (True, False, np.True_, np.False_)]
    cases += [(np.complex128, v) for v in (1.5 - 2j, complex("nan+infj"), complex(-0.0, 5e-324),
                                           np.complex128(complex(SNAN64, -0.0)))]
    cases += [(np.complex64, v) for v in (np.complex64(0.25 + 4j),
                                          np.complex64(complex(np.inf, -0.0)),
                                          np.complex64(complex(np.float32(1e-45), np.nan)))]
    for dtype, value in cases:
        out = nss.device_array(1, dtype, stream=s)
        paths.same(lambda out=out, value=value: store[1, 1, s](out, value), [out],
                   f"{type(value).__name__} {value!r} into {np.dtype(dtype)}", covered=True)
    assert paths.direct >= len(cases)          # the direct path was taken
    # The direct launch (either build) takes the Python scalars (NumPy's: the Python path).
    python_scalars = sum(type(v) in (int, float, bool, complex) for _, v in cases)
    assert paths.compiled >= python_scalars


COMPLEX = [np.complex64, np.complex128]


def _covered(dtype, value) -> bool | None:
    """Whether the direct path must take ``value`` for a parameter of
    ``dtype`` (True), must hand it to Numba's path (False), or either
    (None, not asserted)."""
    if dtype is np.bool_:
        return type(value) in (bool, np.bool_)  # a number for a boolean: Numba's path
    if dtype in COMPLEX:
        return type(value) is dtype or None     # only the parameter's own complex type
    if isinstance(value, (complex, np.complexfloating)) or type(value) is np.float16:
        return False                            # Numba's path refuses or converts it
    if dtype in INTS and isinstance(value, (float, np.floating)):
        return False                            # not an integer: Numba's path raises
    if dtype in INTS and type(value) in (int, bool) or dtype in INTS and \
            isinstance(value, np.integer):
        info = np.iinfo(dtype)
        return bool(info.min <= int(value) <= info.max)  # else Numba's path wraps it
    return None


@pytest.mark.parametrize("dtype", INTS + FLOATS + COMPLEX + [np.bool_],
                         ids=lambda d: np.dtype(d).name)
def test_scalars_converted_to_a_compiled_signature(gpu, paths, dtype):
    name = {np.bool_: "boolean"}.get(dtype, np.dtype(dtype).name)
    store = _store_kernel(gpu, f"void({name}[:], {name})")
    s = paths.stream
    out = nss.device_array(1, dtype, stream=s)
    values = [0, 1, -1, 2, 255, 256, 2**31, -(2**31) - 1, 2**63, -(2**63), 2**64 - 1, 2**64, 0.5,
              -0.5, 2.7, 1e300, -1e300, 3.5e38, float("nan"), float(SNAN64), -0.0, 5e-324, True,
              False, np.int64(-5), np.uint8(200), np.uint64(2**64 - 1), np.float32(0.25),
              np.float64(1e40), np.int8(-128), np.bool_(True), np.bool_(False), SNAN64, SNAN32,
              np.float16(1.5), 1.5 - 2j, complex(float("nan"), -0.0), np.complex64(0.5 - 1j),
              np.complex128(complex(1e300, SNAN64))]
    outcomes = []
    for v in values:
        outcomes.append(paths.same(lambda v=v: store[1, 1, s](out, v), [out],
                                   f"{type(v).__name__} {v!r} into a {name} parameter",
                                   covered=_covered(dtype, v)))
    assert any(isinstance(o, tuple) for o in outcomes)
    assert paths.direct > 0


#: One parameter of every scalar type, in an order that mixes their sizes.
MIXED = [("boolean", np.bool_), ("float64", np.float64), ("int8", np.int8),
         ("complex64", np.complex64), ("uint16", np.uint16), ("complex128", np.complex128),
         ("int32", np.int32), ("float32", np.float32), ("uint64", np.uint64),
         ("uint8", np.uint8), ("int16", np.int16), ("uint32", np.uint32), ("int64", np.int64)]


def _mixed_kernel(signature=None):
    """A kernel taking each MIXED type, each scalar after its output array."""
    def mixed(o0: nss.Write, v0, o1: nss.Write, v1, o2: nss.Write, v2, o3: nss.Write, v3,
              o4: nss.Write, v4, o5: nss.Write, v5, o6: nss.Write, v6, o7: nss.Write, v7,
              o8: nss.Write, v8, o9: nss.Write, v9, o10: nss.Write, v10, o11: nss.Write, v11,
              o12: nss.Write, v12):
        o0[0] = v0
        o1[0] = v1
        o2[0] = v2
        o3[0] = v3
        o4[0] = v4
        o5[0] = v5
        o6[0] = v6
        o7[0] = v7
        o8[0] = v8
        o9[0] = v9
        o10[0] = v10
        o11[0] = v11
        o12[0] = v12

    if signature is None:
        return nss.tracked_kernel(mixed)
    return nss.tracked_kernel(mixed, signature=signature)


def test_every_scalar_type_in_one_launch(gpu, paths):
    """Thirteen scalars of every size between arrays: each lands in its own
    parameter, unspecialized (NumPy scalars of each type at their edges, and
    Python scalars) and through a signature (conversions that fit, one that
    does not fit, one Numba refuses)."""
    s = paths.stream
    outs = [nss.device_array(1, dtype, stream=s) for _, dtype in MIXED]

    def launch(kernel, values):
        args = [x for pair in zip(outs, values, strict=True) for x in pair]
        return lambda: kernel[1, 1, s](*args)

    def edges(pick):
        out = []
        for _, dtype in MIXED:
            if dtype is np.bool_:
                out.append(np.bool_(pick % 2 == 0))
            elif dtype in INTS:
                out.append(dtype(_edges(dtype)[pick % len(_edges(dtype))]))
            elif dtype in FLOATS:
                out.append(dtype(_edges(dtype)[pick % len(_edges(dtype))]))
            else:
                part = np.dtype(dtype).type(0).real.dtype.type
                e = _edges(part)
                out.append(dtype(complex(e[pick % len(e)], e[(pick + 3) % len(e)])))
        return out

    free = _mixed_kernel()
    for pick in range(10):
        paths.same(launch(free, edges(pick)), outs, f"NumPy scalars, edge set {pick}",
                   covered=True)
    python = [True, -0.0, -1, 1.5 - 2j, 7, 1j, 2**40, 1e-45, 2**63 - 1, 255, -(2**15),
              False, -(2**63)]
    paths.same(launch(free, python), outs, "Python scalars", covered=True)

    signature = "void(" + ", ".join(f"{n}[:], {n}" for n, _ in MIXED) + ")"
    typed = _mixed_kernel(signature)
    fits = [np.bool_(True), 7, np.int64(-5), np.complex64(0.5j), True, np.complex128(1 + 1j),
            np.uint8(200), 3, np.int8(5), np.int16(255), -(2**15), 2**32 - 1, np.uint32(7)]
    paths.same(launch(typed, fits), outs, "conversions that fit", covered=True)
    wraps = list(fits)
    wraps[4] = 70000  # a uint16 parameter: Numba's path wraps it, the direct path hands it over
    result = paths.same(launch(typed, wraps), outs, "a value that wraps", covered=False)
    assert isinstance(result, tuple), paths.last_error
    assert np.frombuffer(result[4], np.uint16)[0] == 70000 % 65536
    refused = list(fits)
    refused[2] = 0.5  # a float for an int8 parameter: Numba's path raises
    result = paths.same(launch(typed, refused), outs, "a value Numba refuses", covered=False)
    assert not isinstance(result, tuple)


def test_zero_dim_device_arrays(gpu, paths):
    """A tracked 0-d array: shape and strides ``()``; the direct path marshals it."""
    s = paths.stream

    @nss.tracked_kernel
    def take(x: nss.Read, meta: nss.Write, out: nss.Write):
        out[0] = x[()]
        meta[0] = len(x.shape)
        meta[1] = x.size

    meta = nss.device_array(2, np.int64, stream=s)
    out = nss.device_array(1, np.float64, stream=s)
    for value in (2.5, -0.0, SNAN64):
        x = nss.to_device(np.array(value), stream=s)
        assert x.shape == () and x.strides == ()
        result = paths.same(lambda x=x: take[1, 1, s](x, meta, out), [meta, out],
                            f"0-d array {value!r}", covered=True)
        assert list(np.frombuffer(result[0], np.int64)) == [0, 1]
        if value == value:  # the NaN's bits are compared across the paths above
            assert result[1] == np.array([value]).tobytes()


@pytest.mark.parametrize("library", ["cupy", "torch"])
def test_zero_dim_foreign_arrays_are_numbas(gpu, paths, library):
    """A 0-d CuPy array or PyTorch tensor (a reduction's result, say) has a
    dtype and the shape ``()`` but no ``gpu_data``: Numba's path marshals it.
    The direct path once took it for a NumPy scalar and, once Numba had
    compiled the 0-d overload, failed with AttributeError."""
    lib = pytest.importorskip(library)
    s = paths.stream

    @nss.tracked_kernel(allow_foreign=True)
    def take(x: nss.Read, out: nss.Write):
        out[0] = x[()]

    if library == "cupy":
        x = lib.asarray(2.5, dtype=lib.float64)
        lib.cuda.runtime.deviceSynchronize()
    else:
        x = lib.tensor(2.5, dtype=lib.float64, device="cuda")
        lib.cuda.synchronize()
    out = nss.device_array(1, np.float64, stream=s)
    result = paths.same(lambda: take[1, 1, s](x, out), [out], f"0-d {library} array",
                        covered=False)
    if not isinstance(result, tuple):  # every path raised alike: parity holds
        pytest.skip(f"Numba's own path cannot launch with a 0-d {library} array here: "
                    f"{paths.last_error!r}")
    assert result == (np.array([2.5]).tobytes(),)


def test_launch_configurations_the_driver_refuses(gpu, paths):
    """Too many threads per block, a grid too tall, too much dynamic shared
    memory: every path raises (the types differ: Numba's path raises its
    own error, the direct path the library's DriverError), and the context
    is usable after."""
    store = _store_kernel(gpu)
    s = paths.stream
    out = nss.device_array(1, np.float64, stream=s)
    store[1, 1, s](out, 1.0)  # compiled
    for what, launch in [
        ("2048 threads per block", lambda: store[1, 2048, s](out, 1.0)),
        ("block (32, 32, 2)", lambda: store[1, (32, 32, 2), s](out, 1.0)),
        ("grid (1, 70000)", lambda: store[(1, 70000), 1, s](out, 1.0)),
        ("1 MiB of dynamic shared memory", lambda: store[1, 1, s, 1 << 20](out, 1.0)),
    ]:
        results = paths.run(launch, [out])
        assert all(isinstance(r, type) and issubclass(r, Exception) for r in results), \
            (what, results)
    # The context is still usable.
    paths.same(lambda: store[1, 1, s](out, 2.0), [out], "after the refused launches",
               covered=True)


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


def test_threads_launch_one_kernel(gpu, paths):
    """Eight threads launch one kernel at once, each on its own stream with
    its own arrays, first through Numba's path, then with direct launches:
    the same bytes, the expected values, and every direct-phase launch taken
    by the direct or the compiled path."""
    @nss.tracked_kernel
    def affine(a: nss.Read, out: nss.Write, k, c):
        i = gpu.grid(1)
        if i < out.size:
            out[i] = k * a[i] + c

    n, nthreads, rounds = 4096, 8, 50
    rt = paths.rt

    def phase(direct):
        launch_policy(rt).direct_launch = direct
        errors: list[BaseException] = []
        results: list[bytes | None] = [None] * nthreads
        start = threading.Barrier(nthreads)

        def work(t):
            try:
                gpu.current_context()
                s = gpu.stream()
                a = nss.to_device(np.arange(n, dtype=np.int64), stream=s)
                out = nss.device_array(n, np.int64, stream=s)
                start.wait(timeout=120)
                for r in range(rounds):
                    affine[n // 256, 256, s](a, out, t + 1, r)
                results[t] = nss.copy_to_host(out, stream=s).tobytes()
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
                start.abort()  # the others stop waiting

        threads = [threading.Thread(target=work, args=(t,)) for t in range(nthreads)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        launch_policy(rt).direct_launch = True
        assert not errors, errors[0]
        return results

    before = paths.launches()
    numba = phase(False)
    assert paths.launches() == before  # Numba's path only
    direct = phase(True)
    taken = paths.launches() - before
    assert taken == nthreads * rounds, taken  # every launch direct (or compiled)
    assert direct == numba
    for t, got in enumerate(direct):
        np.testing.assert_array_equal(np.frombuffer(got, np.int64),
                                      (t + 1) * np.arange(n) + rounds - 1)
