"""The direct-launch plans on the CPU: parameter layout, packing, argument
typing, overload choice and launch dimensions. The launches themselves need a
GPU (``tests/gpu/test_direct_launch.py``)."""

from __future__ import annotations

import ctypes
import json
import math
import struct
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from numba.cuda import types
from numba.cuda.np import numpy_support

from numba_streamsafe.numba.launch import launch_plan, packing

SCALARS = [types.int8, types.uint8, types.int16, types.uint16, types.int32, types.uint32,
           types.int64, types.uint64, types.float32, types.float64, types.boolean]


class FakeKernel:
    """The parts of Numba's ``_Kernel`` a plan reads."""

    def __init__(self, argtypes, debug=False, cooperative=False):
        self.argument_types = list(argtypes)
        self.debug = debug
        self.cooperative = cooperative
        cufunc = SimpleNamespace(handle=0xABC0)
        cache = {0: cufunc}
        self._codelibrary = SimpleNamespace(get_cufunc=lambda: cufunc, _cufunc_cache=cache)


class FakeDispatcher:
    def __init__(self, overloads, specialized=False, extensions=None):
        self.overloads = overloads
        self.specialized = specialized
        self.targetoptions = {"extensions": extensions} if extensions else {}
        self.specializations = {}


def fake_array(data, ptr):
    return SimpleNamespace(size=data.size, dtype=data.dtype, shape=data.shape,
                           strides=data.strides, gpu_data=SimpleNamespace(device_pointer=ptr))


def read_params(address, codes):
    """The kernel parameters behind a parameter pointer array, as the driver reads them."""
    pointers = (ctypes.c_void_p * len(codes)).from_address(address)
    out = []
    for p, code in zip(pointers, codes, strict=True):
        assert p % 8 == 0  # every parameter on its own 8-byte boundary
        size = struct.calcsize("=" + code)
        out.append(struct.unpack("=" + code, ctypes.string_at(p, size))[0])
    return out


def expected_params(argtypes, args):
    """Numba's marshalling (``_Kernel._prepare_args``), written out."""
    out = []
    for ty, arg in zip(argtypes, args, strict=True):
        if isinstance(ty, types.Array):
            out += [0, 0, arg.size, arg.dtype.itemsize, int(arg.gpu_data.device_pointer),
                    *arg.shape, *arg.strides]
        elif ty in (types.complex64, types.complex128):
            out += [arg.real, arg.imag]
        else:
            out.append(arg)
    return out


def test_param_slots_flatten_as_numba_does():
    codes, kinds = launch_plan.param_slots((types.Array(types.float32, 2, "C"), types.int32,
                                       types.complex128, types.boolean))
    assert codes == ["Q", "Q", "q", "q", "Q", "q", "q", "q", "q", "i", "d", "d", "?"]
    assert len(kinds) == 4
    assert launch_plan.param_slots((types.UniTuple(types.int64, 2),)) is None
    assert launch_plan.param_slots((types.NPDatetime("s"),)) is None


@st.composite
def programs(draw):
    """Random argument lists: arrays of 1 to 3 dimensions (C, F or strided
    views) and scalars of every covered type."""
    argtypes, args = [], []
    for i in range(draw(st.integers(0, 6))):
        if draw(st.booleans()):
            ndim = draw(st.integers(1, 3))
            shape = tuple(draw(st.integers(1, 5)) for _ in range(ndim))
            dtype = np.dtype(draw(st.sampled_from(["i1", "i4", "f4", "f8", "c16"])))
            data = np.zeros(shape, dtype, order=draw(st.sampled_from("CF")))
            if draw(st.booleans()):
                data = data[(slice(None, None, 2),) * ndim]
            argtypes.append(types.Array(numpy_support.from_dtype(dtype), ndim, "A"))
            args.append(fake_array(data, 0x7F00_0000_0000 + 256 * i))
        else:
            ty = draw(st.sampled_from(SCALARS + [types.complex64, types.complex128]))
            if ty == types.boolean:
                value = draw(st.booleans())
            elif ty in (types.float32, types.float64):
                value = float(np.dtype(str(ty)).type(draw(st.floats(-1e6, 1e6))))
            elif ty in (types.complex64, types.complex128):
                value = complex(np.complex64(complex(draw(st.integers(-99, 99)),
                                                     draw(st.integers(-99, 99)))))
            else:
                info = np.iinfo(str(ty))
                value = draw(st.integers(int(info.min), int(info.max)))
            argtypes.append(ty)
            args.append(value)
    return tuple(argtypes), tuple(args)


@given(programs())
def test_packed_parameters_are_numbas(program):
    argtypes, args = program
    codes, kinds = launch_plan.param_slots(argtypes)
    plan = launch_plan.LaunchPlan(FakeKernel(argtypes), argtypes)
    address = plan.pack(args)
    assert address is not None
    assert plan.nparams == len(codes)
    assert read_params(address, codes) == expected_params(argtypes, args)


def test_values_that_do_not_fit_are_left_to_numba():
    argtypes = (types.int32, types.uint8)
    codes, kinds = launch_plan.param_slots(argtypes)
    plan = launch_plan.LaunchPlan(FakeKernel(argtypes), argtypes)
    assert plan.pack((2**31, 1)) is None  # Numba's ctypes conversion wraps it
    assert plan.pack((1, -1)) is None
    assert plan.pack((1, "x")) is None
    assert plan.pack((-(2**31), 255)) is not None


def test_argument_types():
    assert launch_plan.argtypes_of((1, 2.0, True, 1j)) == (types.int64, types.float64,
                                                       types.boolean, types.complex128)
    assert launch_plan.argtypes_of((np.float32(1), np.int16(2))) == (types.float32, types.int16)
    arr = SimpleNamespace(gpu_data=object(), _numba_type_=types.Array(types.int32, 1, "C"))
    assert launch_plan.argtypes_of((arr,)) == (types.Array(types.int32, 1, "C"),)
    # Host arrays (Numba transfers them), tuples and other objects are Numba's.
    assert launch_plan.argtypes_of((np.zeros(3),)) is None
    assert launch_plan.argtypes_of(((1, 2),)) is None
    assert launch_plan.argtypes_of((None,)) is None


_ARRAY_TYPES = textwrap.dedent('''
    import itertools, json, types
    import numpy as np
    from numba.cuda.cudadrv.devicearray import DeviceNDArray
    from numba_streamsafe.numba.launch import launch_plan
    wrong, cases = [], 0
    for shape, order, dtype, step, broadcast in itertools.product(
            [(), (5,), (4, 3), (1, 4), (3, 1, 2)], "CF",  # (an empty one needs a GPU)
            [np.dtype(np.float32), np.dtype(np.int64), np.dtype(np.uint8),
             np.dtype([("a", "f4"), ("b", "f4")], align=True),  # equal to NumPy, not to Numba
             np.dtype([("a", "f4"), ("b", "f4")])], [1, 2], [False, True]):
        host = np.empty([n * step for n in shape], dtype=dtype, order=order)
        view = host[tuple(slice(None, None, step) for _ in shape)]
        strides = tuple(0 if broadcast and i == 0 else s for i, s in enumerate(view.strides))
        arr = DeviceNDArray(view.shape, strides, view.dtype,
                            gpu_data=types.SimpleNamespace(device_ctypes_pointer=None))
        for _ in range(2):  # made, then kept
            cases += 1
            got = launch_plan.argtypes_of((arr,))
            if got != (arr._numba_type_,):
                wrong.append(f"{shape} {order} {dtype} {step} {broadcast}: "
                             f"{got} != {arr._numba_type_}")
    print("RESULT " + json.dumps({"wrong": wrong, "cases": cases,
                                  "kinds": len(launch_plan._array_types)}))
''')


def test_device_array_types_are_numbas_own(child_env, repo_root):
    """The type a device array launches with (kept per kind of array) is the
    one Numba gives it, over contiguous, strided, broadcast and 0-d arrays
    of either order, of numbers and of aligned and packed records (Numba's
    own device arrays, in a child without the simulator)."""
    proc = subprocess.run([sys.executable, "-c", _ARRAY_TYPES], cwd=repo_root,
                          env=child_env(NUMBA_ENABLE_CUDASIM="0"), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    result = json.loads(line[len("RESULT "):])
    assert result["wrong"] == [], "\n".join(result["wrong"][:20])
    assert result["cases"] == 5 * 2 * 5 * 2 * 2 * 2 and result["kinds"] > 10, result


def test_plan_choice():
    c1 = types.Array(types.float32, 1, "C")
    a1 = types.Array(types.float32, 1, "A")
    key = (c1, types.int64)
    kernel = FakeKernel(key)
    plan = launch_plan.build_plan(FakeDispatcher({key: kernel}), key)
    assert isinstance(plan, launch_plan.LaunchPlan) and plan.function == 0xABC0
    assert plan.current(0) and not plan.current(1)
    # Not compiled yet: None (asked again later), not UNSUPPORTED.
    assert launch_plan.build_plan(FakeDispatcher({}), key) is None
    # A forall launch compiles into a specialized copy of the dispatcher.
    disp = FakeDispatcher({})
    disp.specializations[((9, 0), key)] = FakeDispatcher({key: kernel}, specialized=True)
    assert isinstance(launch_plan.build_plan(disp, key), launch_plan.LaunchPlan)
    # Kernels the direct path leaves to Numba.
    for k in (FakeKernel(key, debug=True), FakeKernel(key, cooperative=True)):
        assert launch_plan.build_plan(FakeDispatcher({key: k}), key) is launch_plan.UNSUPPORTED
    assert launch_plan.build_plan(FakeDispatcher({key: kernel}, extensions=[object()]),
                             key) is launch_plan.UNSUPPORTED
    # A signature: arrays of layout 'A' take any layout, scalars convert.
    spec = FakeDispatcher({(a1, types.int32): FakeKernel((a1, types.int32))}, specialized=True)
    assert isinstance(launch_plan.build_plan(spec, (c1, types.int64)), launch_plan.LaunchPlan)
    c2 = types.Array(types.float32, 2, "C")
    f64 = types.Array(types.float64, 1, "C")
    for wrong in ((c2, types.int64), (f64, types.int64), (c1,), (c1, c1)):
        assert launch_plan.build_plan(spec, wrong) is launch_plan.UNSUPPORTED
    spec_c = FakeDispatcher({(c1,): FakeKernel((c1,))}, specialized=True)
    f_order = (types.Array(types.float32, 1, "F"),)
    assert launch_plan.build_plan(spec_c, f_order) is launch_plan.UNSUPPORTED


@pytest.mark.parametrize("dim,expected", [
    (5, (5, 1, 1)), ((5,), (5, 1, 1)), ((2, 3), (2, 3, 1)), ((2, 3, 4), (2, 3, 4)),
    (0, None), ((2, 0), None), ((1, 2, 3, 4), None), (2.0, None), ((2, 3.0), None),
    (np.int64(4), None), ([2, 3], None), (True, None),
])
def test_dims(dim, expected):
    assert launch_plan.normalize_dims(dim) == expected


def test_runtime_switch(monkeypatch):
    from numba_streamsafe import AsyncResource, DeviceRuntime
    from numba_streamsafe._driver.sim import SimDriver
    from numba_streamsafe.core.settings import reload_settings
    from numba_streamsafe.numba.launch.policy import launch_policy

    class Launching(SimDriver):
        supports_direct_launch = True

        def launch_kernel(self, *args):
            raise AssertionError("not called here")

    def direct(driver):
        return launch_policy(DeviceRuntime(AsyncResource(driver))).direct_launch

    # The simulated driver cannot launch: tracked kernels use Numba's path.
    monkeypatch.delenv("NUMBA_STREAMSAFE_DIRECT_LAUNCH", raising=False)
    reload_settings()
    assert direct(SimDriver()) is False
    assert direct(Launching()) is True
    try:
        for off in ("0", "off", " false "):
            monkeypatch.setenv("NUMBA_STREAMSAFE_DIRECT_LAUNCH", off)
            reload_settings()
            assert direct(Launching()) is False
    finally:
        monkeypatch.delenv("NUMBA_STREAMSAFE_DIRECT_LAUNCH", raising=False)
        reload_settings()


def test_a_number_for_a_boolean_parameter_is_left_to_numba():
    from numba.cuda import types

    from numba_streamsafe.numba.launch.launch_plan import _accepts

    assert _accepts(types.boolean, types.boolean)
    for other in (types.float64, types.int64, types.float32):
        assert not _accepts(types.boolean, other)
    assert _accepts(types.float64, types.int64)  # other conversions still direct


def test_a_float_out_of_a_float32_range_is_left_to_numba():
    """struct raises OverflowError for 1e300 as float32 (Numba's ctypes
    conversion gives inf): the direct path must hand it to Numba's path, not
    raise. Likewise an int too large for a float64."""
    argtypes = (types.float32, types.float64)
    codes, kinds = launch_plan.param_slots(argtypes)
    plan = launch_plan.LaunchPlan(FakeKernel(argtypes), argtypes)
    assert plan.pack((1e300, 1.0)) is None
    assert plan.pack((1.0, 2**1100)) is None
    assert plan.pack((3.5e38, 1.0)) is None
    assert plan.pack((math.inf, -math.inf)) is not None
    assert plan.pack((1.5, 2**70)) is not None


def test_zero_dim_arrays_are_left_to_numba():
    """A 0-d array without ``gpu_data`` (a host one, or a CuPy or PyTorch one
    seen through the array interface) is Numba's to marshal: its path copies
    or views it. The direct path once took it for a NumPy scalar (it has a
    dtype and the shape ``()``), typed it as a 0-d array and, with such an
    overload compiled, packed it as a device array: ``AttributeError``
    (``gpu_data``) where Numba's path launches."""
    zero_d = types.Array(types.float64, 0, "C")
    foreign = SimpleNamespace(dtype=np.dtype(np.float64), shape=(), size=1,
                              __cuda_array_interface__={"shape": (), "typestr": "<f8",
                                                        "data": (0x7F00_0000_0000, False),
                                                        "version": 3, "strides": None})
    for arg in (np.array(2.0), np.zeros((), np.int32), foreign):
        assert launch_plan.argtypes_of((arg,)) is None, type(arg)
        assert launch_plan.argtypes_of((np.float32(1), arg)) is None
    # NumPy scalars of every kind are still typed as Numba types them.
    assert launch_plan.argtypes_of((np.float64(2.0), np.bool_(True), np.complex64(1j))) == (
        types.float64, types.boolean, types.complex64)
    assert launch_plan.argtypes_of((np.datetime64(1, "s"),)) == (types.NPDatetime("s"),)
    # A tracked 0-d device array is covered (it has gpu_data).
    dev = SimpleNamespace(gpu_data=object(), _numba_type_=zero_d)
    assert launch_plan.argtypes_of((dev,)) == (zero_d,)
    codes, kinds = launch_plan.param_slots((zero_d,))
    plan = launch_plan.LaunchPlan(FakeKernel((zero_d,)), (zero_d,))
    data = np.zeros((), np.float64)
    assert read_params(plan.pack((fake_array(data, 0x7F00_0000_0100),)), codes) == [
        0, 0, 1, 8, 0x7F00_0000_0100]


def _f32_bytes_numba(value) -> bytes:
    """A float32 parameter as Numba's marshalling gives it: ``ctypes.c_float``."""
    return bytes(ctypes.c_float(value))


def _nan(bits: int) -> float:
    return struct.unpack("=d", struct.pack("=Q", bits))[0]


#: float32 edge values, as doubles: signalling and quiet NaNs with payloads in
#: and below float32's mantissa, infinities, the float32 range's edges.
F32_EDGES = [0.0, -0.0, 1.5, -2.5, 3.4028234663852886e38, -3.4028234663852886e38,
             1.401298464324817e-45, 1.1754943508222875e-38, 1e-50, math.inf, -math.inf,
             math.nan, -math.nan, _nan(0x7FF0_0000_2000_0001), _nan(0xFFF0_0000_0000_0001),
             _nan(0x7FF4_0000_0000_0000), _nan(0x7FF8_0000_0000_0001), 7, -(2**70), True,
             np.float32(0.1), np.float64(_nan(0x7FF0_0000_2000_0001)), np.int64(-3)]


@pytest.mark.parametrize("by_ctypes", [False, True], ids=["struct", "ctypes"])
def test_float32_parameters_convert_as_numbas_c_float(monkeypatch, by_ctypes):
    """float32 and complex64 parameters take the bytes ``ctypes.c_float``
    (Numba's conversion: C's cast) gives, NaN payloads and signalling NaNs
    included. CPython 3.14's ``struct`` keeps a signalling NaN signalling where
    the cast quiets it; there (``_F32_BY_CTYPES``) the values go through
    ``ctypes.c_float`` first. Both ways are checked on this Python; the
    struct way only where this Python's ``struct`` casts as C does."""
    if packing.COMPILED and not by_ctypes:
        pytest.skip("the compiled packer casts as C does, whatever struct does")
    if not by_ctypes and packing._F32_BY_CTYPES:
        pytest.skip("this Python's struct packs signalling NaNs otherwise than C's cast")
    monkeypatch.setattr(packing, "_F32_BY_CTYPES", by_ctypes)
    argtypes = (types.float32, types.complex64)
    codes, kinds = launch_plan.param_slots(argtypes)
    plan = launch_plan.LaunchPlan(FakeKernel(argtypes), argtypes)
    for value in F32_EDGES:
        for imag in (0.0, _nan(0x7FF0_0000_2000_0001)):
            address = plan.pack((value, complex(float(value), imag)))
            assert address is not None, value
            pointers = (ctypes.c_void_p * 3).from_address(address)
            got = [ctypes.string_at(p, 4) for p in pointers]
            assert got == [_f32_bytes_numba(value), _f32_bytes_numba(float(value)),
                           _f32_bytes_numba(imag)], (value, imag)
    # Out of float32's range: Numba gives inf; the direct path hands it over
    # (struct refuses), or, by ctypes, packs the same inf.
    address = plan.pack((1e300, 0j))
    if address is not None:
        assert ctypes.string_at((ctypes.c_void_p * 1).from_address(address)[0], 4) == \
            _f32_bytes_numba(1e300)
    assert plan.pack((2**1100, 0j)) is None  # OverflowError on both paths
    assert plan.pack(("1.0", 0j)) is None


def test_the_struct_probe_matches_this_python():
    snan = _nan(0x7FF0_0000_2000_0001)
    assert packing._F32_BY_CTYPES == (struct.pack("=f", snan) != _f32_bytes_numba(snan))


# The oracle: numba-cuda's own marshalling (``_Kernel._prepare_args``) and
# cuda.core's ``ParamHolder`` (what Numba's launch hands cuLaunchKernel) run
# in a child interpreter without the simulator (which replaces both); the
# direct path's packing of the same value for the same parameter must give
# the bytes the kernel would read (the parameter's own size), or hand the
# call to Numba's path (in either build of the packer: the child runs the
# build this process runs).
ORACLE = textwrap.dedent(r'''
    import ctypes, json, math, struct, sys
    import numpy as np
    import numba
    assert not numba.config.ENABLE_CUDASIM
    from numba.cuda import types
    from numba.cuda.dispatcher import _Kernel
    try:
        from cuda.core._kernel_arg_handler import ParamHolder
    except ImportError as exc:
        print("SKIP cuda.core's ParamHolder cannot be imported: %s" % exc)
        sys.exit(0)
    from numba_streamsafe.numba.launch import launch_plan

    INTS = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"]
    DECLARED = [getattr(types, n) for n in INTS] + [
        types.float32, types.float64, types.complex64, types.complex128, types.boolean]
    # Bytes per kernel parameter (a boolean is a .u8 parameter); complex: two.
    SIZE = {types.boolean: [1], types.complex64: [4, 4], types.complex128: [8, 8],
            types.float32: [4], types.float64: [8]}
    SIZE.update({getattr(types, n): [np.dtype(n).itemsize] for n in INTS})

    def bits(dtype, raw):
        return np.array([raw], dtype="u%d" % np.dtype(dtype).itemsize).view(dtype)[0]

    def values():
        out = []
        for n in INTS:
            info = np.iinfo(n)
            edges = [int(info.min), int(info.max), 0, 1] + ([-1] if info.min < 0 else [])
            out += [np.dtype(n).type(v) for v in edges]
            out += [int(info.min) - 1, int(info.max) + 1, int(info.min), int(info.max)]
        for n in ("float32", "float64"):
            t, info = np.dtype(n).type, np.finfo(n)
            out += [t(v) for v in (0.0, -0.0, 1.5, info.max, -info.max, info.tiny,
                                   info.smallest_subnormal, np.inf, -np.inf, np.nan)]
            out += [bits(n, 0x7F800001 if n == "float32" else 0x7FF0000020000001)]
            out += [float(v) for v in (info.max, info.tiny, info.smallest_subnormal)]
        out += [np.complex64(0.25 - 4j), np.complex64(complex(np.inf, -0.0)),
                np.complex128(complex(np.nan, 1e300)), np.bool_(True), np.bool_(False),
                np.float16(1.5)]
        snan = struct.unpack("=d", struct.pack("=Q", 0x7FF0000020000001))[0]
        out += [0, 1, -1, 2, 255, 256, -129, 2**31, -(2**31) - 1, 2**63, -(2**63),
                2**64 - 1, 2**64, 2**1100, 0.0, -0.0, 0.25, 0.5, -0.5, 2.7, -2.7, 1e300,
                -1e300, 3.5e38, math.inf, -math.inf, math.nan, snan, 5e-324, True, False,
                1.5 - 2j, complex(math.nan, math.inf), complex(1e300, -0.0), 1j]
        return out

    class Fake:
        extensions = []

    def numba_bytes(ty, value):
        kernelargs = []
        try:
            _Kernel._prepare_args(Fake(), ty, value, 0, [], kernelargs)
            holder = ParamHolder(kernelargs)
        except Exception as exc:
            return "raises " + type(exc).__name__
        pointers = (ctypes.c_void_p * len(kernelargs)).from_address(holder.ptr)
        return [ctypes.string_at(p, n).hex() for p, n in zip(pointers, SIZE[ty])]

    def direct_bytes(ty, value):
        argtypes = launch_plan.argtypes_of((value,))
        if argtypes is None or not launch_plan._accepts(ty, argtypes[0]):
            return None
        codes, kinds = launch_plan.param_slots((ty,))
        kernel = type("K", (), {})()
        cufunc = type("F", (), {"handle": 1})()
        kernel._codelibrary = type("L", (), {"get_cufunc": lambda self: cufunc,
                                             "_cufunc_cache": {0: cufunc}})()
        plan = launch_plan.LaunchPlan(kernel, (ty,))  # owns the buffer read below
        address = plan.pack((value,))
        if address is None:
            return None
        pointers = (ctypes.c_void_p * len(codes)).from_address(address)
        return [ctypes.string_at(p, n).hex() for p, n in zip(pointers, SIZE[ty])]

    mismatches, counts = [], {"cases": 0, "direct": 0, "numba_raises": 0}
    for value in values():
        for ty in DECLARED:
            counts["cases"] += 1
            expected = numba_bytes(ty, value)
            counts["numba_raises"] += isinstance(expected, str)
            for path, got in (("direct", direct_bytes(ty, value)),):
                if got is None:
                    continue  # handed to Numba's path: the same by construction
                counts[path] += 1
                if got != expected:
                    mismatches.append("%s: %s %r into %s: %s, Numba: %s" % (
                        path, type(value).__name__, value, ty, got, expected))
    print("RESULT " + json.dumps({"mismatches": mismatches, "counts": counts}))
''')


def test_scalars_marshal_as_numba_cuda_marshals(child_env, repo_root):
    """Every scalar type Numba passes by value, at its edges, as Python and
    NumPy scalars, into a parameter of every scalar type (the unspecialized
    case is the diagonal): where the direct path
    packs the value, its bytes are the ones numba-cuda's ``_prepare_args``
    and cuda.core's ``ParamHolder`` give, read at the parameter's size;
    everywhere else it hands the call to Numba's path, which then converts
    it (or raises) itself."""
    proc = subprocess.run([sys.executable, "-c", ORACLE], cwd=repo_root,
                          env=child_env(NUMBA_ENABLE_CUDASIM="0"), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    if proc.stdout.startswith("SKIP "):
        pytest.skip(proc.stdout[5:].strip())
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    result = json.loads(line[len("RESULT "):])
    assert result["mismatches"] == [], "\n".join(result["mismatches"][:20])
    counts = result["counts"]
    # Not vacuous: most cases are packed directly, and Numba refuses some.
    assert counts["cases"] > 1500 and counts["direct"] > 600, counts
    assert counts["numba_raises"] > 100, counts


# ------------------------------------------------------------- the one packer
_EDGES = {
    "b": [-128, 127, -129, 128, 0, -1], "B": [0, 255, 256, -1], "h": [-(1 << 15), (1 << 15) - 1,
    1 << 15], "H": [0, (1 << 16) - 1, 1 << 16, -1], "i": [-(1 << 31), (1 << 31) - 1, 1 << 31],
    "I": [0, (1 << 32) - 1, 1 << 32, -1], "q": [-(1 << 63), (1 << 63) - 1, 1 << 63],
    "Q": [0, (1 << 64) - 1, 1 << 64, -1],
    "f": [0.0, -0.0, 1.5, 3.4028234663852886e38, 3.5e38, -3.5e38, math.inf, math.nan, 1e-45,
          7, 1 << 200],
    "d": [0.0, -0.0, 1e308, math.inf, -math.inf, math.nan, 5e-324, 3, -(1 << 60), 1 << 2000],
    "?": [True, False, 0, 1, 0.5],
}


def _pack(codes: bytes, args: tuple, fields: list) -> bytes | None:
    buffer = ctypes.create_string_buffer(packing.MAX_PARAM_BYTES)
    n = packing.pack_into(codes, args, fields, buffer, ctypes.addressof(buffer),
                           packing.MAX_PARAM_BYTES)
    return None if n < 0 else buffer.raw[:8 * n]


def _struct_bytes(code: str, value) -> bytes | None:
    try:
        raw = struct.pack("=" + code, value)
    except (struct.error, TypeError, OverflowError):
        return None
    return raw + b"\0" * (8 - len(raw))


@pytest.mark.parametrize("code", sorted(_EDGES))
def test_scalar_packing_matches_struct(code):
    """The packer (compiled or not) packs a scalar as ``struct`` does, and
    refuses exactly what ``struct`` refuses."""
    for value in _EDGES[code] + [True, False, "x", None, 2.5, 3, np.int16(-3), np.float32(2.5)]:
        want = _struct_bytes(code, value)
        if code == "f" and want is not None and not packing.COMPILED and packing._F32_BY_CTYPES:
            want = bytes(ctypes.c_float(value)) + bytes(4)
        assert _pack(code.encode(), (value,), [None]) == want, (code, value)


def test_complex_and_array_packing():
    fields = struct.pack("=QQqqQqq", 0, 0, 10, 4, 0xDEAD0000, 10, 4)
    got = _pack(b"AZC", (object(), 1.5 - 2j, 0.25 + 4j), [fields, None, None])
    assert got == fields + struct.pack("=dd", 1.5, -2.0) + struct.pack("=f4xf4x", 0.25, 4.0)
    assert _pack(b"Z", ("1j",), [None]) is None
    # Codes and arguments that do not match, fields that are not whole slots,
    # parameters over the buffer: refused, nothing packed.
    assert _pack(b"q", (1, 2), [None, None]) is None
    assert _pack(b"A", (object(),), [b"123"]) is None
    assert _pack(b"A", (object(),), [bytes(packing.MAX_PARAM_BYTES + 8)]) is None
