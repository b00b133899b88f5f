"""Tracked arrays and copies on Numba's CUDA simulator over the simulated driver."""

import gc

import numpy as np
import pytest
from numba import cuda

import numba_streamsafe as nss
from numba_streamsafe import InvalidArgument, StreamMisuse

DTYPES = [np.int8, np.uint16, np.int32, np.int64, np.float32, np.float64, np.complex64, np.bool_]


def sample(shape, dtype, order="C"):
    values = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape) % 100
    if np.dtype(dtype).kind == "b":
        values = values % 2
    return np.array(values.astype(dtype), order=order)


# ------------------------------------------------------------- round trips
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape,order", [((37,), "C"), ((5, 7), "C"), ((5, 7), "F"),
                                         ((2, 3, 4), "C")], ids=["1d", "2d", "2d-F", "3d"])
def test_round_trip(rt, dtype, shape, order):
    h = sample(shape, dtype, order)
    d = nss.to_device(h)
    assert d.shape == h.shape and d.dtype == h.dtype
    back = nss.copy_to_host(d)
    assert isinstance(back, np.ndarray)
    np.testing.assert_array_equal(back, h)
    assert rt.driver.hazards == []


def test_round_trip_into_given_arrays(rt, streams):
    a, _ = streams
    h = sample((4, 6), np.float64)
    d = nss.device_array((4, 6), np.float64, stream=a)
    assert nss.to_device(h, to=d, stream=a) is d
    out = np.empty_like(h)
    assert nss.copy_to_host(d, out=out, stream=a) is out
    np.testing.assert_array_equal(out, h)


def test_round_trip_f_order_device_array(rt):
    h = sample((5, 7), np.int32, order="F")
    d = nss.device_array((5, 7), np.int32, order="F")
    assert d.flags["F_CONTIGUOUS"] and not d.flags["C_CONTIGUOUS"]
    nss.to_device(h, to=d)
    np.testing.assert_array_equal(nss.copy_to_host(d), h)


def test_to_device_copies_pageable_host_data_at_once(rt, streams):
    a, _ = streams
    h = np.arange(16, dtype=np.int64)
    d = nss.to_device(h, stream=a)
    h[:] = -1  # may change as soon as to_device returns
    np.testing.assert_array_equal(nss.copy_to_host(d, stream=a), np.arange(16))


def test_device_array_zero_size(rt):
    for shape in (0, (0,), (0, 3), (3, 0)):
        z = nss.device_array(shape, np.float32)
        assert z.size == 0
        assert nss.copy_to_host(z).shape == z.shape
        assert nss.block_of(z) is not None  # a minimal block gives it an identity
    e = nss.to_device(np.empty((0, 2), np.int16))
    assert e.shape == (0, 2)
    assert nss.copy_to_host(e).shape == (0, 2)


def test_device_array_shape_dtype_order(rt):
    d = nss.device_array(10)
    assert d.shape == (10,) and d.dtype == np.float64
    d = nss.device_array(np.int64(3), np.uint8)
    assert d.shape == (3,) and d.dtype == np.uint8
    d = nss.device_array((2, 3), "i4", order="F")
    assert d.strides == (4, 8)
    assert nss.block_of(d).nbytes == 24


@pytest.mark.parametrize("shape", [-1, (2, -3), (2.5,), ("4",)])
def test_device_array_bad_shape_is_invalid_argument(rt, shape):
    with pytest.raises(InvalidArgument, match="shape"):
        nss.device_array(shape)


def test_device_array_bad_order_is_invalid_argument(rt):
    with pytest.raises(InvalidArgument, match="order"):
        nss.device_array(4, order="K")


# ------------------------------------------------------------------ memset
@pytest.mark.parametrize("value", [0, 1, 0x5A, 255])
def test_memset_sets_every_byte(rt, streams, value):
    a, b = streams
    d = nss.to_device(np.arange(24, dtype=np.int32).reshape(4, 6), stream=a)
    nss.memset(d, value, stream=b)
    back = nss.copy_to_host(d, stream=a)
    assert (back.view(np.uint8) == value).all()
    assert rt.driver.hazards == []


@pytest.mark.parametrize("value", [256, -1, 1.5, "1", None])
def test_memset_rejects_non_bytes(rt, value):
    d = nss.to_device(np.ones(8, np.uint8))
    with pytest.raises(InvalidArgument, match="byte"):
        nss.memset(d, value)
    np.testing.assert_array_equal(nss.copy_to_host(d), np.ones(8))


@pytest.mark.parametrize("view", [lambda d: d[:, ::2], lambda d: d[:, 1]],
                         ids=["strided", "column"])
def test_memset_of_a_strided_view_is_invalid_argument(rt, view):
    d = nss.to_device(np.ones((4, 6), np.int32))
    before = dict(rt.driver.calls)
    with pytest.raises(InvalidArgument, match="contiguous") as info:
        nss.memset(view(d), 0)
    assert "memset the whole array" in str(info.value)  # what to do instead
    assert dict(rt.driver.calls) == before  # nothing queued
    np.testing.assert_array_equal(nss.copy_to_host(d), np.ones((4, 6)))


def test_memset_of_a_host_array_is_invalid_argument(rt):
    with pytest.raises(InvalidArgument, match="device array"):
        nss.memset(np.zeros(4, np.uint8), 0)


# -------------------------------------------------------------------- copy
def test_device_to_device_copy(rt, streams):
    a, b = streams
    src = nss.to_device(sample((6, 5), np.float32), stream=a)
    dst = nss.device_array((6, 5), np.float32, stream=b)
    nss.copy(dst, src, stream=b)
    np.testing.assert_array_equal(nss.copy_to_host(dst, stream=b), sample((6, 5), np.float32))
    assert rt.driver.hazards == []


@pytest.mark.parametrize("dst_shape,dst_dtype", [((6, 4), np.float32), ((30,), np.float32),
                                                  ((6, 5), np.float64), ((6, 5), np.int32)])
def test_copy_needs_matching_shape_and_dtype(rt, dst_shape, dst_dtype):
    src = nss.to_device(sample((6, 5), np.float32))
    dst = nss.to_device(np.zeros(dst_shape, dst_dtype))
    with pytest.raises(InvalidArgument, match="matching") as info:
        nss.copy(dst, src)
    assert str(src.shape) in str(info.value)
    np.testing.assert_array_equal(nss.copy_to_host(dst), np.zeros(dst_shape, dst_dtype))


def test_copy_from_or_to_host_is_invalid_argument(rt):
    d = nss.device_array(4, np.int64)
    with pytest.raises(InvalidArgument, match="src"):
        nss.copy(d, np.zeros(4, np.int64))
    with pytest.raises(InvalidArgument, match="dst"):
        nss.copy(np.zeros(4, np.int64), d)


def test_copy_to_host_of_a_host_array_is_invalid_argument(rt):
    with pytest.raises(InvalidArgument, match="device array") as info:
        nss.copy_to_host(np.zeros(4))
    assert "to_device" in str(info.value)


def test_copy_to_host_out_must_be_numpy(rt):
    d = nss.device_array(4, np.int64)
    with pytest.raises(InvalidArgument, match="out"):
        nss.copy_to_host(d, out=[0, 0, 0, 0])


def test_to_device_into_a_host_array_is_invalid_argument(rt):
    with pytest.raises(InvalidArgument, match="device array"):
        nss.to_device(np.zeros(4), to=np.zeros(4))


def test_foreign_arrays_in_copies_are_refused_in_strict_mode(rt):
    foreign = cuda.to_device(np.arange(4, dtype=np.int64))
    d = nss.device_array(4, np.int64)
    with pytest.raises(StreamMisuse):
        nss.copy(d, foreign)
    with pytest.raises(StreamMisuse):
        nss.copy_to_host(foreign)


# ---------------------------------------------------------- stream scopes
def test_stream_scope_orders_device_array_on_its_stream(rt, streams):
    a, _ = streams
    assert nss.current_stream() is None
    with nss.stream_scope(a) as s:
        assert s is a and nss.current_stream() is a
        d = nss.device_array(8, np.int32)
        e = nss.to_device(np.arange(8))
    assert nss.current_stream() is None
    assert nss.block_of(d).stream == rt.stream_handle(a)
    assert nss.block_of(e).stream == rt.stream_handle(a)
    f = nss.device_array(8, np.int32)
    assert nss.block_of(f).stream == rt.stream_handle(None)


def test_stream_scopes_nest(rt, streams):
    a, b = streams
    with nss.stream_scope(a):
        outer1 = nss.device_array(4)
        with nss.stream_scope(b):
            assert nss.current_stream() is b
            inner = nss.device_array(4)
            explicit = nss.device_array(4, stream=a)  # an explicit stream wins over the scope
        assert nss.current_stream() is a
        outer2 = nss.device_array(4)
    assert nss.current_stream() is None
    ha, hb = rt.stream_handle(a), rt.stream_handle(b)
    assert [nss.block_of(x).stream for x in (outer1, inner, explicit, outer2)] == [ha, hb, ha, ha]


def test_stream_scopes_are_per_thread(rt, streams):
    """A scope opened on one thread is not seen by another; a new thread starts with none."""
    import threading

    a, b = streams
    seen: dict[str, object] = {}
    ready, done = threading.Event(), threading.Event()

    def other() -> None:
        seen["start"] = nss.current_stream()
        with nss.stream_scope(b):
            seen["inside"] = nss.current_stream()
            ready.set()
            done.wait(10)
        seen["end"] = nss.current_stream()

    with nss.stream_scope(a):
        t = threading.Thread(target=other)
        t.start()
        assert ready.wait(10)
        assert nss.current_stream() is a  # the other thread's scope is its own
        done.set()
        t.join(10)
    assert seen == {"start": None, "inside": b, "end": None}
    assert nss.current_stream() is None


def test_stream_scope_is_restored_after_an_error(rt, streams):
    a, _ = streams
    with pytest.raises(RuntimeError):
        with nss.stream_scope(a):
            raise RuntimeError("boom")
    assert nss.current_stream() is None


def test_stream_scope_orders_copies_given_no_stream(rt, streams):
    a, b = streams
    d = nss.to_device(np.arange(8), stream=a)
    with nss.stream_scope(b):
        out = nss.copy_to_host(d)  # on b, after the copy on a
    np.testing.assert_array_equal(out, np.arange(8))
    assert rt.driver.hazards == []
    with nss.tracking(False), nss.stream_scope(a):
        nss.memset(d, 0)
        with nss.stream_scope(b):
            nss.copy_to_host(d)
    assert rt.driver.hazards  # the scopes put the untracked copies on two streams


# ------------------------------------------------- copies across streams
@pytest.mark.parametrize("tracked", [True, False], ids=["tracked", "untracked"])
def test_to_device_then_copy_to_host_on_another_stream(rt, streams, tracked):
    a, b = streams
    h = sample((64,), np.int64)
    with nss.tracking(tracked):
        d = nss.to_device(h, stream=a)
        out = nss.copy_to_host(d, stream=b)
    np.testing.assert_array_equal(out, h)
    if tracked:
        assert rt.driver.hazards == []
    else:
        assert any(z.kind == "read-after-write" for z in rt.driver.hazards), rt.driver.hazards


@pytest.mark.parametrize("tracked", [True, False], ids=["tracked", "untracked"])
def test_copy_chain_across_streams(rt, streams, tracked):
    a, b = streams
    with nss.tracking(tracked):
        src = nss.to_device(np.arange(32), stream=a)
        dst = nss.device_array(32, np.int64, stream=b)
        nss.copy(dst, src, stream=b)  # reads src written on a
        nss.memset(src, 0, stream=a)  # overwrites src read on b
        out = nss.copy_to_host(dst, stream=a)  # reads dst written on b
    np.testing.assert_array_equal(out, np.arange(32))
    assert (rt.driver.hazards == []) is tracked, rt.driver.hazards


# -------------------------------------------------------------- accounting
def test_all_bytes_come_back_after_delete_and_reap(rt, streams):
    a, b = streams
    arrays = [nss.device_array(100, np.float64, stream=a),
              nss.to_device(np.arange(50), stream=b),
              nss.device_array((3, 4), np.int8, stream=None),
              nss.device_array(0, np.int32, stream=a)]
    nss.copy_to_host(arrays[1], stream=a)
    view = arrays[0][10:20]
    assert rt.bytes_outstanding() == 800 + 400 + 12 + 1
    del arrays
    gc.collect()
    rt.flush()
    assert rt.stats().live_bytes == 800  # the view keeps its array's block
    assert rt.bytes_outstanding() == 800 + 400 + 12 + 1  # the rest is pending until reaped
    del view
    gc.collect()
    rt.reap()
    assert rt.bytes_outstanding() == 0
    assert rt.stats().live_blocks == 0
    assert rt.driver.hazards == []


def test_to_device_keeps_fortran_order(rt, streams):
    """As Numba's cuda.to_device: a Fortran-ordered host array stays Fortran-ordered."""
    a, _ = streams
    host = np.asfortranarray(np.arange(24, dtype=np.int32).reshape(4, 6))
    d = nss.to_device(host, stream=a)
    assert d.strides == host.strides and d.shape == host.shape
    np.testing.assert_array_equal(nss.copy_to_host(d, stream=a), host)
    c = nss.to_device(np.ascontiguousarray(host), stream=a)
    assert c.strides == (24, 4)


def test_to_device_keeps_a_zero_dim_array_zero_dim(rt, streams):
    """As Numba's cuda.to_device: a 0-d host array stays 0-d (its shape and
    strides are ``()``); ``np.ascontiguousarray`` would make it 1-d."""
    from numba import cuda

    a, _ = streams
    host = np.array(2.5)
    d = nss.to_device(host, stream=a)
    numba_d = cuda.to_device(host)
    assert d.shape == numba_d.shape == () and d.strides == numba_d.strides == ()
    assert d.size == 1
    back = nss.copy_to_host(d, stream=a)
    assert back.shape == () and back == 2.5
