"""Bad input to the Numba layer gives a typed error that says what to do.

Every refused call must raise a :class:`~numba_streamsafe.StreamSafeError`
(usually :class:`~numba_streamsafe.InvalidArgument`) before anything changes:
no block allocated, no wait or event queued, no copy made. Refusals are
checked against the simulated driver's count of calls (``rt.driver.calls``).
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from numba import cuda

import numba_streamsafe as nss
from numba_streamsafe import InvalidArgument, Read, ReadWrite, StreamSafeError, Write
from numba_streamsafe._driver.sim import SimDriver
from numba_streamsafe.core.errors import InvalidArgumentType
from numba_streamsafe.numba.launch.policy import launch_policy
from numba_streamsafe.resources import AsyncResource
from numba_streamsafe.runtime import DeviceRuntime, get_runtime, set_runtime

ROOT = Path(__file__).resolve().parents[2]


def calls(rt) -> collections.Counter:
    return collections.Counter(rt.driver.calls)


def unchanged(rt, before: collections.Counter, live: int) -> None:
    """Nothing was allocated, queued or copied since ``before`` was taken."""
    assert calls(rt) == before, f"driver calls changed: {calls(rt) - before}"
    assert rt.bytes_outstanding() == live


@pytest.fixture
def written_on_a(rt, streams):
    """A (4, 6) int32 device array written on stream ``a``: a use on ``b`` must wait."""
    a, _ = streams
    return nss.to_device(np.arange(24, dtype=np.int32).reshape(4, 6), stream=a)


# -------------------------------------------- 1. dtypes that hold no numbers
OBJECT_DTYPES = {
    "object": np.dtype(object),
    "record-with-object": np.dtype([("a", np.int64), ("b", object)]),
    "nested-record-with-object": np.dtype([("a", np.int32),
                                           ("r", [("x", np.float64), ("o", object)])]),
    "subarray-of-object": np.dtype((object, 3)),
}
EMPTY_DTYPES = {"V0": np.dtype("V0"), "no-fields": np.dtype([]), "U": np.dtype("U"),
                "S": np.dtype("S")}


@pytest.mark.parametrize("dtype", list(OBJECT_DTYPES.values()), ids=list(OBJECT_DTYPES))
def test_device_array_refuses_object_dtypes(rt, dtype):
    before, live = calls(rt), rt.bytes_outstanding()
    with pytest.raises(InvalidArgument, match="Python objects") as info:
        nss.device_array(4, dtype)
    assert "numeric" in str(info.value)  # says what to use instead
    unchanged(rt, before, live)


@pytest.mark.parametrize("dtype", list(EMPTY_DTYPES.values()), ids=list(EMPTY_DTYPES))
def test_device_array_refuses_dtypes_of_zero_bytes(rt, dtype):
    before, live = calls(rt), rt.bytes_outstanding()
    with pytest.raises(InvalidArgument, match="0 bytes") as info:
        nss.device_array(4, dtype)
    assert "sized dtype" in str(info.value)
    unchanged(rt, before, live)


def test_device_array_refuses_what_is_not_a_dtype(rt):
    before, live = calls(rt), rt.bytes_outstanding()
    with pytest.raises(InvalidArgument, match="not a dtype"):
        nss.device_array(4, "no-such-dtype")
    unchanged(rt, before, live)


@pytest.mark.parametrize("host", [
    np.array([object()] * 4),
    np.zeros(4, OBJECT_DTYPES["record-with-object"]),
    [1, "a", None],
], ids=["object", "record-with-object", "mixed-list"])
def test_to_device_refuses_object_host_arrays(rt, host):
    before, live = calls(rt), rt.bytes_outstanding()
    with pytest.raises(InvalidArgument, match="Python objects"):
        nss.to_device(host)
    unchanged(rt, before, live)


def test_to_device_into_a_given_array_refuses_object_host_arrays(rt, written_on_a, streams):
    _, b = streams
    before, live = calls(rt), rt.bytes_outstanding()
    with pytest.raises(InvalidArgument, match="Python objects"):
        nss.to_device(np.array([object()] * 24).reshape(4, 6), to=written_on_a, stream=b)
    unchanged(rt, before, live)


def test_to_device_refuses_ragged_host_data(rt):
    with pytest.raises(InvalidArgument, match="host"):
        nss.to_device([[1, 2], [3]])


def test_copy_to_host_refuses_an_object_out(rt, written_on_a, streams):
    _, b = streams
    before, live = calls(rt), rt.bytes_outstanding()
    with pytest.raises(InvalidArgument, match="Python objects"):
        nss.copy_to_host(written_on_a, out=np.empty((4, 6), object), stream=b)
    unchanged(rt, before, live)


@pytest.mark.parametrize("dtype", [np.dtype([("a", np.int32), ("b", np.float64)]),
                                   np.dtype("datetime64[ns]"), np.dtype("S4"), np.dtype("V8")],
                         ids=["record", "datetime64", "S4", "V8"])
def test_dtypes_of_plain_bytes_still_round_trip(rt, dtype):
    host = np.frombuffer(np.arange(5 * dtype.itemsize, dtype=np.uint8).tobytes(), dtype=dtype)
    back = nss.copy_to_host(nss.to_device(host))
    assert back.dtype == dtype
    assert back.tobytes() == host.tobytes()


# ------------------------------------------------------------ 2. huge sizes
@pytest.mark.parametrize(("shape", "dtype"), [
    ((2**32, 2**32 + 1), np.uint8),   # 2**64 + 2**32 bytes: wrapped to 2**32 in int64
    ((2**62, 4), np.uint8),           # 2**64 bytes: wrapped to 0
    ((2**61,), np.float64),
    ((2**63,), np.uint8),             # one byte past int64
    ((0, 2**63), np.uint8),           # no bytes, but a dimension int64 cannot hold
    ((0, 2**62, 4), np.float64),      # no bytes, but strides int64 cannot hold
], ids=["2**32x2**32+1", "2**62x4", "2**61-float64", "2**63", "0x2**63", "0x2**62x4-float64"])
def test_sizes_past_int64_are_refused_before_allocating(rt, shape, dtype):
    before, live = calls(rt), rt.bytes_outstanding()
    with pytest.raises(InvalidArgument, match="too large") as info:
        nss.device_array(shape, dtype)
    assert "2**63 - 1" in str(info.value) and "smaller" in str(info.value)
    unchanged(rt, before, live)


def test_shapes_of_numpy_integers_are_accepted(rt):
    d = nss.device_array((np.int64(3), np.uint8(4)), np.int16)
    assert d.shape == (3, 4) and nss.block_of(d).nbytes == 24
    e = nss.device_array(np.int32(5), np.float32)
    assert e.shape == (5,)
    assert all(type(n) is int for n in d.shape + e.shape)


@pytest.mark.parametrize("shape", [4.0, True, (2, False), None, object()],
                         ids=["float", "bool", "bool-dim", "None", "object"])
def test_shapes_that_are_not_integers_are_refused(rt, shape):
    before, live = calls(rt), rt.bytes_outstanding()
    with pytest.raises(InvalidArgument, match="shape") as info:
        nss.device_array(shape)
    assert "tuple of non-negative ints" in str(info.value)
    unchanged(rt, before, live)


# -------------------------------------- 4. scalars for declared array params
@nss.tracked_kernel
def fill(out: Write, value):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = value


@nss.tracked_kernel
def scale(src: Read, dst: Write, k):
    i = cuda.grid(1)
    if i < src.size:
        dst[i] = src[i] * k


@nss.tracked_kernel
def bump(a: ReadWrite):
    i = cuda.grid(1)
    if i < a.size:
        a[i] += 1


@pytest.mark.parametrize(("kernel", "args", "param", "access"), [
    (fill, (3, 1.0), "out", "Write"),
    (scale, (7, "d", 2.0), "src", "Read"),
    (scale, ("d", None, 2.0), "dst", "Write"),
    (bump, (2.5,), "a", "ReadWrite"),
], ids=["int-for-write", "int-for-read", "None-for-write", "float-for-readwrite"])
def test_scalars_for_declared_array_parameters_are_refused(rt, streams, kernel, args, param,
                                                            access):
    a, b = streams
    d = nss.to_device(np.arange(8, dtype=np.float64), stream=a)
    args = tuple(d if isinstance(x, str) else x for x in args)
    before, live = calls(rt), rt.bytes_outstanding()
    with pytest.raises(InvalidArgumentType) as info:
        kernel[1, 8, b](*args)
    message = str(info.value)
    assert repr(kernel.__name__) in message and repr(param) in message, message
    assert f"declared {access}" in message, message
    assert "device array" in message  # what to pass
    unchanged(rt, before, live)


def test_scalars_for_undeclared_parameters_still_launch(rt):
    d = nss.device_array(8, np.float64)
    fill[1, 8](d, 3.0)
    np.testing.assert_array_equal(nss.copy_to_host(d), np.full(8, 3.0))


# ---------------------------------------------------- 6. copy_to_host's out
@pytest.mark.parametrize(("out", "match"), [
    (lambda: np.empty((6, 4), np.int32), "shape"),
    (lambda: np.empty(24, np.int32), "shape"),
    (lambda: np.empty((4, 6), np.int64), "dtype"),
    (lambda: np.empty((4, 6), np.int32, order="F"), "layout"),
    (lambda: np.empty((4, 12), np.int32)[:, ::2], "layout"),
    (lambda: np.broadcast_to(np.int32(0), (4, 6)), "writeable"),
], ids=["transposed-shape", "flat-shape", "dtype", "F-order", "strided", "read-only"])
def test_copy_to_host_checks_out_before_queueing(rt, written_on_a, streams, out, match):
    _, b = streams
    out = out()
    before, live = calls(rt), rt.bytes_outstanding()
    with pytest.raises(InvalidArgument, match=match) as info:
        nss.copy_to_host(written_on_a, out=out, stream=b)
    message = str(info.value)
    assert "np.empty((4, 6), dtype=np.int32)" in message, message  # what to pass
    unchanged(rt, before, live)


def test_copy_to_host_wrong_out_dtype_is_also_a_type_error(rt, written_on_a):
    with pytest.raises(TypeError, match="dtype"):
        nss.copy_to_host(written_on_a, out=np.empty((4, 6), np.float32))


def test_copy_to_host_into_a_good_out_still_works(rt, written_on_a, streams):
    _, b = streams
    out = np.empty((4, 6), np.int32)
    assert nss.copy_to_host(written_on_a, out=out, stream=b) is out
    b.synchronize()
    np.testing.assert_array_equal(out, np.arange(24).reshape(4, 6))
    assert rt.driver.hazards == []


def test_copy_to_host_of_a_reversed_view_is_ordered_and_copied(rt, written_on_a, streams):
    # Numba's device-to-host copy takes no negative stride: the library copies
    # the view turned round and turns it back on the host, ordered after a's write.
    _, b = streams
    expect = nss.copy_to_host(written_on_a, stream=b)[::-1]
    got = nss.copy_to_host(written_on_a[::-1], stream=b)
    b.synchronize()
    np.testing.assert_array_equal(got, expect)
    assert not rt.driver.hazards


# ------------------------------------------- 7. copy checks before fencing
@pytest.mark.parametrize(("dst", "src", "match"), [
    (lambda d: d[:, ::2], lambda s: s[:, ::2], "contiguous"),
    (lambda d: d[:, :3], lambda s: s[:, :3], "contiguous"),
    (lambda d: d[:, :3], lambda s: nss.device_array((4, 3), np.int32), "contiguous"),
], ids=["strided-views", "column-slices", "dst-only"])
def test_copy_validates_before_queueing_waits(rt, streams, written_on_a, dst, src, match):
    a, b = streams
    target = nss.device_array((4, 6), np.int32, stream=a)
    dst, src = dst(target), src(written_on_a)
    before, live = calls(rt), rt.bytes_outstanding()
    with pytest.raises(InvalidArgument, match=match) as info:
        nss.copy(dst, src, stream=b)
    assert "copy" in str(info.value)
    unchanged(rt, before, live)


def test_copy_between_layouts_is_refused_before_queueing(rt, streams, written_on_a):
    a, b = streams
    f_order = nss.device_array((4, 6), np.int32, stream=a, order="F")
    before, live = calls(rt), rt.bytes_outstanding()
    with pytest.raises(InvalidArgument, match="layout") as info:
        nss.copy(f_order, written_on_a, stream=b)
    assert "order=" in str(info.value)
    unchanged(rt, before, live)


def test_copy_of_a_contiguous_view_still_works(rt, streams, written_on_a):
    a, b = streams
    dst = nss.device_array((2, 6), np.int32, stream=a)
    nss.copy(dst, written_on_a[1:3], stream=b)
    np.testing.assert_array_equal(nss.copy_to_host(dst, stream=b),
                                  np.arange(24).reshape(4, 6)[1:3])
    assert rt.driver.hazards == []


def test_to_device_checks_to_before_queueing(rt, streams, written_on_a):
    _, b = streams
    before, live = calls(rt), rt.bytes_outstanding()
    with pytest.raises(InvalidArgument, match="shape"):
        nss.to_device(np.zeros((6, 4), np.int32), to=written_on_a, stream=b)
    with pytest.raises(InvalidArgument, match="dtype"):
        nss.to_device(np.zeros((4, 6), np.int64), to=written_on_a, stream=b)
    with pytest.raises(InvalidArgument, match="contiguous"):
        nss.to_device(np.zeros((4, 3), np.int32), to=written_on_a[:, ::2], stream=b)
    unchanged(rt, before, live)


# ------------------------------------------------- 8. tracking(False) scope
def test_tracking_applies_to_the_runtime_installed_on_entry(rt, streams):
    """The documented contract: ``tracking`` switches the runtime that
    ``get_runtime`` returns when the block is entered and restores that same
    runtime on exit; a runtime installed inside the block keeps its own setting."""
    a, b = streams
    other = DeviceRuntime(AsyncResource(SimDriver()))
    with nss.tracking(False):
        assert launch_policy(rt).tracking is False
        old = set_runtime(other, 0)
        assert old is rt
        try:
            assert get_runtime() is other and launch_policy(other).tracking is True
            x = nss.to_device(np.arange(8, dtype=np.int64), stream=a)
            waits = other.driver.calls["cuStreamWaitEvent"]
            nss.copy_to_host(x, stream=b)  # fenced: other tracks
            assert other.driver.calls["cuStreamWaitEvent"] > waits
            del x
        finally:
            set_runtime(rt, 0)
        set_runtime(other, 0)  # left installed when the block ends
    try:
        assert launch_policy(rt).tracking is True      # the entry runtime is restored
        assert launch_policy(other).tracking is True  # the one installed inside is unchanged
    finally:
        set_runtime(rt, 0)


def test_tracking_follows_a_runtime_installed_before_entry(rt, streams):
    a, b = streams
    x = nss.to_device(np.arange(8, dtype=np.int64), stream=a)
    waits = rt.driver.calls["cuStreamWaitEvent"]
    with nss.tracking(False):
        nss.copy_to_host(x, stream=b)  # unfenced
    assert rt.driver.calls["cuStreamWaitEvent"] == waits
    assert launch_policy(rt).tracking is True


# ------------------------------------------------------- 9. examples' --n
def _example(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, f"examples/{name}.py", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # one interpreter per case; CI runs it
@pytest.mark.parametrize(("example", "args"), [
    ("multistream_sort", ("--n", "-1")),
    ("hash_join", ("--n", "0")),
    ("hash_join", ("--n", "-5")),
    ("sort_join_pipeline", ("--n", "0")),
    ("sort_join_pipeline", ("--n", "-1")),
    ("multistream_sort", ("--repeat", "0")),
])
def test_examples_refuse_bad_sizes_with_a_usage_error(example, args):
    proc = _example(example, *args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    error = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(error) == 1 and args[0] in error[0], proc.stderr
    assert proc.stdout == ""


def test_multistream_sort_of_no_keys_is_correct():
    proc = _example("multistream_sort", "--n", "0")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "n=0" in proc.stdout and "result: correct" in proc.stdout


# -------------------------------------------------------------- all errors
def test_every_refusal_here_is_a_stream_safe_error():
    assert issubclass(InvalidArgumentType, InvalidArgument)
    assert issubclass(InvalidArgumentType, TypeError)
    assert issubclass(InvalidArgumentType, StreamSafeError)
