"""The direct-launch plans on the CPU: parameter layout, packing, argument
typing, overload choice and launch dimensions. The launches themselves need a
GPU (``tests/gpu/test_direct_launch.py``)."""

from __future__ import annotations

import ctypes
import math
import struct
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from numba.cuda import types
from numba.cuda.np import numpy_support

from numba_streamsafe.numba import direct

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
    codes, kinds = direct.param_slots((types.Array(types.float32, 2, "C"), types.int32,
                                       types.complex128, types.boolean))
    assert codes == ["Q", "Q", "q", "q", "Q", "q", "q", "q", "q", "i", "d", "d", "?"]
    assert len(kinds) == 4
    assert direct.param_slots((types.UniTuple(types.int64, 2),)) is None
    assert direct.param_slots((types.NPDatetime("s"),)) is None


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
    codes, kinds = direct.param_slots(argtypes)
    plan = direct.LaunchPlan(FakeKernel(argtypes), kinds, codes)
    address = plan.pack(args)
    assert address is not None
    assert plan.nparams == len(codes)
    assert read_params(address, codes) == expected_params(argtypes, args)


def test_values_that_do_not_fit_are_left_to_numba():
    argtypes = (types.int32, types.uint8)
    codes, kinds = direct.param_slots(argtypes)
    plan = direct.LaunchPlan(FakeKernel(argtypes), kinds, codes)
    assert plan.pack((2**31, 1)) is None  # Numba's ctypes conversion wraps it
    assert plan.pack((1, -1)) is None
    assert plan.pack((1, "x")) is None
    assert plan.pack((-(2**31), 255)) is not None


def test_argument_types():
    assert direct.argtypes_of((1, 2.0, True, 1j)) == (types.int64, types.float64,
                                                       types.boolean, types.complex128)
    assert direct.argtypes_of((np.float32(1), np.int16(2))) == (types.float32, types.int16)
    arr = SimpleNamespace(gpu_data=object(), _numba_type_=types.Array(types.int32, 1, "C"))
    assert direct.argtypes_of((arr,)) == (types.Array(types.int32, 1, "C"),)
    # Host arrays (Numba transfers them), tuples and other objects are Numba's.
    assert direct.argtypes_of((np.zeros(3),)) is None
    assert direct.argtypes_of(((1, 2),)) is None
    assert direct.argtypes_of((None,)) is None


def test_plan_choice():
    c1 = types.Array(types.float32, 1, "C")
    a1 = types.Array(types.float32, 1, "A")
    key = (c1, types.int64)
    kernel = FakeKernel(key)
    plan = direct.build_plan(FakeDispatcher({key: kernel}), key)
    assert isinstance(plan, direct.LaunchPlan) and plan.function == 0xABC0
    assert plan.current(0) and not plan.current(1)
    # Not compiled yet: None (asked again later), not UNSUPPORTED.
    assert direct.build_plan(FakeDispatcher({}), key) is None
    # A forall launch compiles into a specialized copy of the dispatcher.
    disp = FakeDispatcher({})
    disp.specializations[((9, 0), key)] = FakeDispatcher({key: kernel}, specialized=True)
    assert isinstance(direct.build_plan(disp, key), direct.LaunchPlan)
    # Kernels the direct path leaves to Numba.
    for k in (FakeKernel(key, debug=True), FakeKernel(key, cooperative=True)):
        assert direct.build_plan(FakeDispatcher({key: k}), key) is direct.UNSUPPORTED
    assert direct.build_plan(FakeDispatcher({key: kernel}, extensions=[object()]),
                             key) is direct.UNSUPPORTED
    # A signature: arrays of layout 'A' take any layout, scalars convert.
    spec = FakeDispatcher({(a1, types.int32): FakeKernel((a1, types.int32))}, specialized=True)
    assert isinstance(direct.build_plan(spec, (c1, types.int64)), direct.LaunchPlan)
    c2 = types.Array(types.float32, 2, "C")
    f64 = types.Array(types.float64, 1, "C")
    for wrong in ((c2, types.int64), (f64, types.int64), (c1,), (c1, c1)):
        assert direct.build_plan(spec, wrong) is direct.UNSUPPORTED
    spec_c = FakeDispatcher({(c1,): FakeKernel((c1,))}, specialized=True)
    assert direct.build_plan(spec_c, (types.Array(types.float32, 1, "F"),)) is direct.UNSUPPORTED


@pytest.mark.parametrize("dim,expected", [
    (5, (5, 1, 1)), ((5,), (5, 1, 1)), ((2, 3), (2, 3, 1)), ((2, 3, 4), (2, 3, 4)),
    (0, None), ((2, 0), None), ((1, 2, 3, 4), None), (2.0, None), ((2, 3.0), None),
    (np.int64(4), None), ([2, 3], None), (True, None),
])
def test_dims(dim, expected):
    assert direct.normalize_dims(dim) == expected


def test_runtime_switch(monkeypatch):
    from numba_streamsafe import AsyncResource, DeviceRuntime
    from numba_streamsafe._driver.sim import SimDriver
    from numba_streamsafe.numba.policy import launch_policy
    from numba_streamsafe.settings import reload_settings

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

    from numba_streamsafe.numba.direct import _accepts

    assert _accepts(types.boolean, types.boolean)
    for other in (types.float64, types.int64, types.float32):
        assert not _accepts(types.boolean, other)
    assert _accepts(types.float64, types.int64)  # other conversions still direct


def test_a_float_out_of_a_float32_range_is_left_to_numba():
    """struct raises OverflowError for 1e300 as float32 (Numba's ctypes
    conversion gives inf): the direct path must hand it to Numba's path, not
    raise. Likewise an int too large for a float64."""
    argtypes = (types.float32, types.float64)
    codes, kinds = direct.param_slots(argtypes)
    plan = direct.LaunchPlan(FakeKernel(argtypes), kinds, codes)
    assert plan.pack((1e300, 1.0)) is None
    assert plan.pack((1.0, 2**1100)) is None
    assert plan.pack((3.5e38, 1.0)) is None
    assert plan.pack((math.inf, -math.inf)) is not None
    assert plan.pack((1.5, 2**70)) is not None
