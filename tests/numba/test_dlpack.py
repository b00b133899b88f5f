"""DLPack on the simulated driver: the exported capsule's fields, the
consumer's stream ordered after the array's uses (and racing without it, the
negative control), the capsule's keep-alive, bad stream values, and
:func:`numba_streamsafe.import_array` from DLPack and CUDA Array Interface
producers, ordered after them."""

from __future__ import annotations

import ctypes
import gc

import numpy as np
import pytest
from numba import cuda

import numba_streamsafe as nss
from numba_streamsafe import Access, InvalidArgument, Write, tracked_kernel
from numba_streamsafe.errors import InvalidArgumentType
from numba_streamsafe.numba import dlpack

N = 64


@tracked_kernel
def fill(out: Write, value):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = value


def _tensor(capsule):
    address = dlpack._pyapi.PyCapsule_GetPointer(capsule, b"dltensor")
    return dlpack.DLManagedTensor.from_address(address).dl_tensor


def _consume(capsule):
    """What a consumer does: take the tensor, rename the capsule, call the deleter."""
    address = dlpack._pyapi.PyCapsule_GetPointer(capsule, b"dltensor")
    dlpack._pyapi.PyCapsule_SetName(capsule, b"used_dltensor")
    managed = dlpack.DLManagedTensor.from_address(address)
    managed.deleter(ctypes.cast(address, ctypes.POINTER(dlpack.DLManagedTensor)))


def _foreign(rt, stream, array, access, label="consumer"):
    block = nss.block_of(array)
    rt.driver.trace_access(stream, [(block.ptr, block.nbytes, access)], label)


def test_capsule_fields(rt, streams):
    a, _ = streams
    x = nss.device_array((4, 6), np.float32, stream=a)
    capsule = dlpack.export_dlpack(x, stream=rt.stream_handle(a))
    t = _tensor(capsule)
    assert (t.device.device_type, t.device.device_id) == (dlpack.KDL_CUDA, 0)
    assert t.ndim == 2 and [t.shape[i] for i in range(2)] == [4, 6]
    assert [t.strides[i] for i in range(2)] == [6, 1]
    assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == (2, 32, 1)
    assert t.data == nss.block_of(x).ptr and t.byte_offset == 0
    _consume(capsule)
    v = x[:, ::2]                                    # a strided view
    t = _tensor(dlpack.export_dlpack(v, stream=-1))
    assert [t.strides[i] for i in range(2)] == [6, 2] and [t.shape[i] for i in range(2)] == [4, 3]
    for dtype, code in ((np.int8, 0), (np.uint16, 1), (np.complex128, 5), (np.bool_, 6)):
        t = _tensor(dlpack.export_dlpack(nss.device_array(3, dtype, stream=a), stream=-1))
        assert (t.dtype.code, t.dtype.bits) == (code, 8 * np.dtype(dtype).itemsize)
    assert dlpack.dlpack_device(x) == (dlpack.KDL_CUDA, 0)


def test_the_consumer_stream_waits_for_the_last_write(rt, streams):
    a, b = streams
    c = rt.driver.create_stream()
    x = nss.device_array(N, np.int64, stream=a)
    fill[2, 32, b](x, 1)                             # written on b, allocated on a
    _consume(dlpack.export_dlpack(x, stream=c))
    _foreign(rt, c, x, Access.READ_WRITE)            # the consumer's work on its stream
    assert rt.driver.hazards == []
    # The export is recorded on c (sealed at once: c is known by its handle only),
    # so later tracked work on the array waits for c up to the export.
    waits = rt.resource.marks.waits
    fill[2, 32, a](x, 2)
    assert rt.resource.marks.waits == waits + 1


def test_without_the_ordering_the_consumer_races(rt, streams):
    """The negative control: stream=-1 asks for no ordering."""
    a, b = streams
    c = rt.driver.create_stream()
    x = nss.device_array(N, np.int64, stream=a)
    fill[2, 32, b](x, 1)
    _consume(dlpack.export_dlpack(x, stream=-1))
    _foreign(rt, c, x, Access.READ)
    assert [h.kind for h in rt.driver.hazards] == ["read-after-write"]


def test_the_capsule_keeps_the_array_alive_until_released(rt, streams):
    a, _ = streams
    x = nss.device_array(N, np.int64, stream=a)
    block = nss.block_of(x)
    before = dlpack.live_exports()
    capsule = dlpack.export_dlpack(x, stream=-1)
    del x
    gc.collect()
    rt.flush()
    assert block.state is nss.BlockState.LIVE and dlpack.live_exports() == before + 1
    del capsule                                      # never consumed: released with it
    gc.collect()
    rt.flush()
    assert dlpack.live_exports() == before and block.state is nss.BlockState.FREED
    y = nss.device_array(N, np.int64, stream=a)
    _consume(dlpack.export_dlpack(y, stream=-1))     # consumed: the deleter released it
    assert dlpack.live_exports() == before


def test_bad_stream_values(rt, streams):
    a, _ = streams
    x = nss.device_array(N, np.int64, stream=a)
    with pytest.raises(InvalidArgument, match="not allowed for CUDA"):
        dlpack.export_dlpack(x, stream=0)
    with pytest.raises(InvalidArgument, match="not allowed"):
        dlpack.export_dlpack(x, stream=-2)
    with pytest.raises(InvalidArgumentType, match="int or None"):
        dlpack.export_dlpack(x, stream="s")
    with pytest.raises(BufferError, match="copy"):
        dlpack.export_dlpack(x, stream=-1, copy=True)
    with pytest.raises(BufferError, match="asked for"):
        dlpack.export_dlpack(x, stream=-1, dl_device=(1, 0))
    with pytest.raises(InvalidArgument, match="no DLPack code"):
        dlpack.export_dlpack(nss.device_array(3, np.dtype([("a", "i4")]), stream=a), stream=-1)
    assert dlpack.live_exports() == 0


class _CAIProducer:
    """A foreign producer of device data that names the stream it wrote on."""

    def __init__(self, array, stream):
        self._array = array
        self._stream = stream

    @property
    def __cuda_array_interface__(self):
        block = nss.block_of(self._array)
        return {"shape": self._array.shape, "typestr": self._array.dtype.str,
                "data": (block.ptr, False), "version": 3, "strides": None,
                "stream": self._stream}


def test_import_waits_for_the_producer_stream(rt, streams):
    a, b = streams
    p = rt.driver.create_stream()
    src = nss.to_device(np.arange(N, dtype=np.int64), stream=a)
    rt.driver.synchronize()
    _foreign(rt, p, src, Access.WRITE, "producer")   # the producer writes on its stream
    imported = nss.import_array(_CAIProducer(src, p), stream=b)
    np.testing.assert_array_equal(nss.copy_to_host(imported, stream=b), np.arange(N))
    fill[2, 32, a](imported, 5)                     # the import is a tracked array
    assert rt.driver.hazards == []
    assert nss.block_of(imported) is not None


def test_import_without_the_producer_stream_races(rt, streams):
    """The negative control: a producer that does not name its stream."""
    a, b = streams
    p = rt.driver.create_stream()
    src = nss.to_device(np.arange(N, dtype=np.int64), stream=a)
    rt.driver.synchronize()
    _foreign(rt, p, src, Access.WRITE, "producer")
    nss.import_array(_CAIProducer(src, None), stream=b)
    assert "read-after-write" in {h.kind for h in rt.driver.hazards}


class _DLPackProducer:
    """A DLPack-only producer: it orders its stream before the consumer's."""

    def __init__(self, rt, array, stream):
        self._rt, self._array, self._stream = rt, array, stream
        self.asked = []

    def __dlpack__(self, *, stream=None, max_version=None):
        self.asked.append(stream)
        handle = 0 if stream in (None, 1) else stream
        self._rt.order_after_stream(handle, self._stream)
        return dlpack.export_dlpack(self._array, stream=-1)

    def __dlpack_device__(self):
        return (dlpack.KDL_CUDA, 0)


def test_import_from_a_dlpack_producer(rt, streams):
    a, b = streams
    p = rt.driver.create_stream()
    src = nss.to_device(np.arange(N, dtype=np.float32).reshape(8, 8), stream=a)
    rt.driver.synchronize()
    _foreign(rt, p, src, Access.WRITE, "producer")
    producer = _DLPackProducer(rt, src, p)
    imported = nss.import_array(producer, stream=b)
    assert producer.asked == [rt.stream_handle(b)]
    np.testing.assert_array_equal(nss.copy_to_host(imported, stream=b),
                                  np.arange(N, dtype=np.float32).reshape(8, 8))
    assert rt.driver.hazards == []


def test_import_refuses_what_it_cannot_copy(rt, streams):
    a, b = streams
    src = nss.device_array((8, 8), np.float32, stream=a)
    with pytest.raises(InvalidArgument, match="neither"):
        nss.import_array(object(), stream=b)
    view = _CAIProducer(src, None)
    desc = view.__cuda_array_interface__
    strided = type("Strided", (), {"__cuda_array_interface__": dict(desc, strides=(64, 8))})()
    with pytest.raises(InvalidArgument, match="not contiguous"):
        nss.import_array(strided, stream=b)


@pytest.mark.parametrize("export", ["dlpack", "interface"])
def test_a_consumer_stream_destroyed_later_does_not_block_the_free(rt, streams, export, caplog):
    """The consumer's stream is known by its handle only; its owner may destroy
    it right after the export. The export's mark is sealed at once, so the
    array's free (which waits for it) still works afterwards."""
    a, b = streams
    c = rt.driver.create_stream()
    x = nss.device_array(N, np.int64, stream=a)
    fill[2, 32, b](x, 1)
    if export == "dlpack":
        _consume(dlpack.export_dlpack(x, stream=c))
    else:
        from numba_streamsafe.numba.arrays import export_interface

        export_interface(x, {"stream": c, "version": 3})
    rt.driver.destroy_stream(c)                      # behind the library's back
    block = nss.block_of(x)
    del x
    gc.collect()
    rt.flush()
    assert block.state is nss.BlockState.FREED, caplog.text
    assert "will retry" not in caplog.text
