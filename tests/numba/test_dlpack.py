"""DLPack on the simulated driver.

Export: the capsule's fields (legacy and versioned), the consumer's stream
ordered after the array's uses (and racing without it, the negative
control), the capsule's keep-alive, bad stream values.

Import: :func:`numba_streamsafe.import_array` (a copy) and the borrowed,
zero-copy :func:`numba_streamsafe.from_dlpack` and
:func:`numba_streamsafe.from_cuda_array_interface`, over producers of memory
the library did not allocate (a foreign tensor in the simulated driver's
memory, written and freed on its own stream; host memory the driver did not
know), ordered after the producer and released only after every tracked
use (each with its negative control).
"""

from __future__ import annotations

import ctypes
import gc
import weakref

import numpy as np
import pytest
from numba import cuda

import numba_streamsafe as nss
from numba_streamsafe import Access, InvalidArgument, Read, StreamMisuse, Write, tracked_kernel
from numba_streamsafe.core.errors import InvalidArgumentType
from numba_streamsafe.numba.interop import dlpack

N = 64


@tracked_kernel
def fill(out: Write, value):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = value


@tracked_kernel
def copy(src: Read, dst: Write):
    i = cuda.grid(1)
    if i < src.size:
        dst[i] = src[i]


def _tensor(capsule):
    """The capsule's tensor, read in place: the caller keeps ``capsule`` alive
    while it reads (a capsule collected unconsumed frees the tensor)."""
    address = dlpack._pyapi.PyCapsule_GetPointer(capsule, b"dltensor")
    return dlpack.DLManagedTensor.from_address(address).dl_tensor


def _versioned(capsule):
    """As :func:`_tensor`, for a versioned capsule."""
    address = dlpack._pyapi.PyCapsule_GetPointer(capsule, b"dltensor_versioned")
    return dlpack.DLManagedTensorVersioned.from_address(address)


def _consume_versioned(capsule):
    address = dlpack._pyapi.PyCapsule_GetPointer(capsule, b"dltensor_versioned")
    dlpack._pyapi.PyCapsule_SetName(capsule, b"used_dltensor_versioned")
    managed = dlpack.DLManagedTensorVersioned.from_address(address)
    managed.deleter(ctypes.cast(address, ctypes.POINTER(dlpack.DLManagedTensorVersioned)))


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
    capsule = dlpack.export_dlpack(v, stream=-1)
    t = _tensor(capsule)
    assert [t.strides[i] for i in range(2)] == [6, 2] and [t.shape[i] for i in range(2)] == [4, 3]
    for dtype, code in ((np.int8, 0), (np.uint16, 1), (np.complex128, 5), (np.bool_, 6)):
        capsule = dlpack.export_dlpack(nss.device_array(3, dtype, stream=a), stream=-1)
        t = _tensor(capsule)
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
        from numba_streamsafe.numba.interop.boundaries import export_interface

        export_interface(x, {"stream": c, "version": 3})
    rt.driver.destroy_stream(c)                      # behind the library's back
    block = nss.block_of(x)
    del x
    gc.collect()
    rt.flush()
    assert block.state is nss.BlockState.FREED, caplog.text
    assert "will retry" not in caplog.text


# ------------------------------------------------------------ export, DLPack 1.0
def test_a_consumer_of_dlpack_1_gets_a_versioned_capsule(rt, streams):
    a, _ = streams
    x = nss.device_array((3, 5), np.float64, stream=a)
    capsule = dlpack.export_dlpack(x[:, 1:4], stream=-1, max_version=(1, 2))
    assert dlpack._pyapi.PyCapsule_IsValid(capsule, b"dltensor_versioned")
    m = _versioned(capsule)
    assert (m.version.major, m.version.minor) == (1, 0) and m.flags == 0  # writable, no copy
    t = m.dl_tensor
    assert [t.shape[i] for i in range(2)] == [3, 3] and [t.strides[i] for i in range(2)] == [5, 1]
    assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == (2, 64, 1)
    assert (t.device.device_type, t.device.device_id) == (dlpack.KDL_CUDA, 0)
    assert t.data == nss.block_of(x).ptr + 8
    _consume_versioned(capsule)
    for older in (None, (0, 8)):
        assert dlpack._pyapi.PyCapsule_IsValid(
            dlpack.export_dlpack(x, stream=-1, max_version=older), b"dltensor")
    with pytest.raises(InvalidArgumentType, match="max_version"):
        dlpack.export_dlpack(x, stream=-1, max_version="1.0")


def test_a_zero_size_array_exports(rt, streams):
    a, _ = streams
    x = nss.device_array((0, 4), np.int32, stream=a)
    capsule = dlpack.export_dlpack(x, stream=-1, max_version=(1, 0))
    t = _versioned(capsule).dl_tensor
    assert t.ndim == 2 and [t.shape[i] for i in range(2)] == [0, 4]


@pytest.mark.parametrize("versioned", [False, True])
def test_the_deleter_or_the_capsule_releases_the_array(rt, streams, versioned):
    """The capsule keeps the array alive (a weakref shows it) until the consumer
    calls the deleter; a capsule never consumed releases it when collected."""
    a, _ = streams
    max_version = (1, 0) if versioned else None
    consume = _consume_versioned if versioned else _consume
    before = dlpack.live_exports()
    x = nss.device_array(N, np.int64, stream=a)
    alive = weakref.ref(x)
    capsule = dlpack.export_dlpack(x, stream=-1, max_version=max_version)
    del x
    gc.collect()
    assert alive() is not None and dlpack.live_exports() == before + 1
    consume(capsule)
    gc.collect()
    assert alive() is None and dlpack.live_exports() == before
    y = nss.device_array(N, np.int64, stream=a)
    alive = weakref.ref(y)
    capsule = dlpack.export_dlpack(y, stream=-1, max_version=max_version)
    del y, capsule                                   # never consumed
    gc.collect()
    assert alive() is None and dlpack.live_exports() == before


def test_a_versioned_export_orders_the_consumer_stream(rt, streams):
    a, b = streams
    c = rt.driver.create_stream()
    x = nss.device_array(N, np.int64, stream=a)
    fill[2, 32, b](x, 1)
    _consume_versioned(dlpack.export_dlpack(x, stream=c, max_version=(1, 0)))
    _foreign(rt, c, x, Access.READ_WRITE)
    assert rt.driver.hazards == []


def test_a_non_native_byte_order_has_no_dlpack_code(rt, streams):
    a, _ = streams
    x = nss.device_array(4, np.dtype(">i4"), stream=a)
    with pytest.raises(InvalidArgument, match="no DLPack code"):
        dlpack.export_dlpack(x, stream=-1)


# ------------------------------------------------- import without a copy (borrowed)
class SimTensor:
    """Another library's device array: memory of the simulated driver that
    numba_streamsafe did not allocate, written on the producer's stream ``p``
    and freed there when the object goes (as PyTorch's caching allocator hands
    a freed block to the next allocation on its stream). A DLPack producer
    that orders ``p`` before its consumer's stream, and a CUDA Array Interface
    producer that names ``p`` (or no stream, with ``name_stream=False``)."""

    def __init__(self, rt, p, shape=(N,), dtype=np.int64, *, name_stream=True, flags=0,
                 device=(dlpack.KDL_CUDA, 0)):
        self.rt, self.p, self.name_stream, self.flags, self.device = (
            rt, p, name_stream, flags, device)
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.nbytes = int(np.prod(self.shape)) * self.dtype.itemsize
        self.freed = self.nbytes == 0                # an empty tensor holds no memory
        self.asked = []
        self.ptr = rt.driver.alloc_async(self.nbytes, p) if self.nbytes else 0
        self.host = np.ndarray(self.shape, self.dtype,
                               rt.driver.buffer(self.ptr, self.nbytes) if self.nbytes else None)

    def write(self, value):
        """The producer's kernel on ``p``."""
        self.host[...] = value
        self.rt.driver.trace_access(self.p, [(self.ptr, self.nbytes, Access.WRITE)],
                                    "producer write")

    def free(self):
        if not self.freed:
            self.freed = True
            self.rt.driver.free_async(self.ptr, self.p)

    def __del__(self):
        self.free()

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, *, stream=None, max_version=None):
        self.asked.append(stream)
        if stream != -1:
            self.rt.order_after_stream(0 if stream in (None, 1) else stream, self.p)
        strides = tuple(s // self.dtype.itemsize
                        for s in np.empty(self.shape, self.dtype).strides)  # C order
        capsule = dlpack.make_capsule(self.ptr, self.shape, strides, self.dtype,
                                      self.device[1], self, versioned=True)
        _versioned(capsule).flags = self.flags
        return capsule

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr, False),
                "version": 3, "strides": None,
                "stream": self.p if self.name_stream else None}


def _host(rt, array, stream):
    return nss.copy_to_host(array, stream=stream)


def test_from_dlpack_borrows_the_memory_ordered_after_the_producer(rt, streams):
    a, b = streams
    p = rt.driver.create_stream()
    t = SimTensor(rt, p)
    t.write(7)                                       # on p, just before the import
    x = nss.from_dlpack(t, stream=a)
    assert t.asked == [rt.stream_handle(a)]
    block = nss.block_of(x)
    assert block.borrowed and block.ptr == t.ptr and block.nbytes == t.nbytes
    assert rt.stats().live_blocks == 0 and rt.bytes_outstanding() == 0   # not an allocation
    out = nss.device_array(N, np.int64, stream=b)
    copy[2, 32, b](x, out)                           # b waits for a, after p
    np.testing.assert_array_equal(_host(rt, out, b), 7)
    fill[2, 32, b](x, 9)                             # a write through the borrowed array ...
    rt.driver.synchronize()
    np.testing.assert_array_equal(t.host, 9)         # ... lands in the producer's memory
    assert rt.driver.hazards == []


def test_without_the_ordering_the_import_races(rt, streams):
    """The negative control: with tracking off the producer is asked for no
    ordering (stream=-1), and the read races with its write."""
    a, b = streams
    p = rt.driver.create_stream()
    t = SimTensor(rt, p)
    t.write(7)
    out = nss.device_array(N, np.int64, stream=b)
    with nss.tracking(False):
        x = nss.from_dlpack(t, stream=a)
        copy[2, 32, b](x, out)
    assert t.asked == [-1]
    assert "read-after-write" in {h.kind for h in rt.driver.hazards}


def test_the_release_waits_for_every_use_and_keeps_the_producer_alive(rt, streams):
    """When the last array over the memory goes, the import stream waits for
    the uses on other streams, and the producer stays alive until that stream
    has completed them: its free on its own stream is then ordered after the
    tracked kernel (no hazard)."""
    a, b = streams
    p = rt.driver.create_stream()
    t = SimTensor(rt, p)
    t.write(7)
    x = nss.from_dlpack(t, stream=a)
    view = x[8:16]                                   # a view keeps the lease too
    out = nss.device_array(N, np.int64, stream=b)
    copy[2, 32, b](x, out)                           # in flight on b
    alive = weakref.ref(t)
    del x, t
    gc.collect()
    rt.flush()
    assert alive() is not None and nss.block_of(view).state is nss.BlockState.LIVE
    block = nss.block_of(view)
    del view
    gc.collect()
    rt.flush()                                       # the release: a waits for b's read
    assert block.state is nss.BlockState.FREED
    assert alive() is not None                       # kept until a has completed it
    rt.reap()                                        # a synchronised: the producer goes
    gc.collect()
    assert alive() is None
    assert rt.driver.hazards == []                   # its free on p came after b's read


def test_a_producer_that_frees_under_a_use_in_flight_races(rt, streams):
    """The negative control: the producer's free on its stream, not ordered
    after the tracked kernel (what happens when nothing keeps it alive)."""
    a, b = streams
    p = rt.driver.create_stream()
    t = SimTensor(rt, p)
    t.write(7)
    x = nss.from_dlpack(t, stream=a)
    out = nss.device_array(N, np.int64, stream=b)
    copy[2, 32, b](x, out)
    t.free()                                         # behind the library's back
    assert "write-after-read" in {h.kind for h in rt.driver.hazards}


def test_an_unused_release_is_dropped_at_the_next_import(rt, streams):
    """Released producers are let go without a reap once their stream is idle."""
    a, _ = streams
    p = rt.driver.create_stream()
    t = SimTensor(rt, p)
    alive = weakref.ref(t)
    x = nss.from_dlpack(t, stream=a)
    del x, t
    gc.collect()
    rt.flush()
    other = SimTensor(rt, p)
    rt.driver.synchronize()                          # a (and p) idle now
    nss.from_dlpack(other, stream=a)
    gc.collect()
    assert alive() is None


def test_importing_the_same_memory_again_shares_its_block(rt, streams):
    a, b = streams
    p = rt.driver.create_stream()
    t = SimTensor(rt, p)
    x = nss.from_dlpack(t, stream=a)
    t.write(3)                                       # the producer writes again, on p
    y = nss.from_dlpack(t, stream=b)                 # ordered after it on b
    assert nss.block_of(y) is nss.block_of(x)
    out = nss.device_array(N, np.int64, stream=a)
    copy[2, 32, a](x, out)                           # a waits for the re-import on b
    np.testing.assert_array_equal(_host(rt, out, a), 3)
    assert rt.driver.hazards == []
    block = nss.block_of(x)
    del x
    gc.collect()
    rt.flush()
    assert block.state is nss.BlockState.LIVE        # y still uses it
    del y
    gc.collect()
    rt.flush()
    assert block.state is nss.BlockState.FREED


def _part(t, start, n):
    """Another producer over elements ``start`` .. ``start + n`` of ``t``'s memory
    (``t`` frees it)."""
    part = SimTensor.__new__(SimTensor)
    part.__dict__.update(t.__dict__, shape=(n,), ptr=t.ptr + start * t.dtype.itemsize,
                         nbytes=n * t.dtype.itemsize, freed=True, asked=[],
                         host=t.host[start:start + n] if start + n <= t.host.size else None)
    return part


def test_a_view_of_a_borrowed_block_imports_into_it(rt, streams):
    a, _ = streams
    p = rt.driver.create_stream()
    big = SimTensor(rt, p)
    big.write(0)  # the simulated pool's memory holds whatever it held before
    x = nss.from_dlpack(big, stream=a)
    y = nss.from_dlpack(_part(big, 16, 16), stream=a)
    assert nss.block_of(y) is nss.block_of(x)
    fill[1, 32, a](y, 5)
    rt.driver.synchronize()
    assert (big.host[16:32] == 5).all() and (big.host[:16] != 5).all()
    with pytest.raises(InvalidArgument, match="run past the end"):
        nss.from_dlpack(_part(big, 48, 32), stream=a)
    assert rt.driver.hazards == []


def test_from_cuda_array_interface_waits_for_the_named_stream(rt, streams):
    a, b = streams
    p = rt.driver.create_stream()
    t = SimTensor(rt, p)
    t.write(4)
    x = nss.from_cuda_array_interface(t, stream=a)
    assert t.asked == [] and nss.block_of(x).borrowed
    out = nss.device_array(N, np.int64, stream=b)
    copy[2, 32, b](x, out)
    np.testing.assert_array_equal(_host(rt, out, b), 4)
    assert rt.driver.hazards == []


def test_an_interface_without_its_stream_races(rt, streams):
    """The negative control: a producer that names no stream."""
    a, b = streams
    p = rt.driver.create_stream()
    t = SimTensor(rt, p, name_stream=False)
    t.write(4)
    x = nss.from_cuda_array_interface(t, stream=a)
    out = nss.device_array(N, np.int64, stream=b)
    copy[2, 32, b](x, out)
    assert "read-after-write" in {h.kind for h in rt.driver.hazards}


class HostInterface:
    """A producer whose memory the simulated driver never saw (host memory, as
    device memory is under Numba's CUDA simulator)."""

    def __init__(self, data):
        self.data = data

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.data.shape, "typestr": self.data.dtype.str, "version": 3,
                "data": (self.data.ctypes.data, False), "strides": None, "stream": None}


def test_memory_the_driver_never_saw_is_registered_and_checked(rt, streams):
    a, b = streams
    data = np.arange(N, dtype=np.int64)
    x = nss.from_cuda_array_interface(HostInterface(data), stream=a)
    fill[2, 32, a](x, 2)
    rt.driver.synchronize()
    np.testing.assert_array_equal(data, 2)           # no copy: the kernel wrote the data
    assert rt.driver.hazards == []
    fill[2, 32, b](x, 3)                             # ordered after a's fill: no hazard
    block = nss.block_of(x)
    rt.driver.trace_access(rt.stream_handle(b), [(block.ptr, block.nbytes, Access.READ)],
                           "unordered outside read")  # b after b: fine
    assert rt.driver.hazards == []
    c = rt.driver.create_stream()
    rt.driver.trace_access(c, [(block.ptr, block.nbytes, Access.READ)], "outside read on c")
    assert [h.kind for h in rt.driver.hazards] == ["read-after-write"]   # the checker sees it
    del x
    gc.collect()
    rt.flush()                                       # released: checked as a free on a
    assert block.state is nss.BlockState.FREED
    kinds = [h.kind for h in rt.driver.hazards]
    assert kinds.count("write-after-read") == 1      # c's read was not ordered before it


def test_a_tracked_array_lent_back_keeps_its_block(rt, streams):
    """An array of the library that comes back through another library's
    DLPack export is not borrowed: it is its own block, and the import is a
    read-write use on the import stream."""
    a, b = streams
    x = nss.device_array(N, np.int64, stream=a)
    fill[2, 32, b](x, 6)

    class Lent:                                      # another library's view of x
        def __dlpack__(self, *, stream=None, max_version=None):
            return dlpack.export_dlpack(x, stream=stream, max_version=max_version)

    c = cuda.stream()
    y = nss.from_dlpack(Lent(), stream=c)
    assert nss.block_of(y) is nss.block_of(x) and not nss.block_of(y).borrowed
    out = nss.device_array(N, np.int64, stream=c)
    copy[2, 32, c](y, out)
    np.testing.assert_array_equal(_host(rt, out, c), 6)
    fill[2, 32, a](x, 1)                             # waits for c's use of y
    assert rt.driver.hazards == []


def test_strict_kernels_take_a_borrowed_array(rt, streams):
    a, _ = streams
    p = rt.driver.create_stream()
    x = nss.from_dlpack(SimTensor(rt, p), stream=a)
    fill[2, 32, a](x, 1)                             # no allow_foreign needed
    assert rt.driver.hazards == []


def test_a_zero_size_import_is_an_empty_array(rt, streams):
    a, _ = streams
    p = rt.driver.create_stream()
    x = nss.from_dlpack(SimTensor(rt, p, shape=(0, 3)), stream=a)
    assert x.shape == (0, 3) and not nss.block_of(x).borrowed


def test_imports_that_cannot_be_borrowed_are_refused(rt, streams):
    a, _ = streams
    p = rt.driver.create_stream()
    with pytest.raises(InvalidArgumentType, match="from_cuda_array_interface"):
        nss.from_dlpack(HostInterface(np.zeros(4)), stream=a)
    with pytest.raises(InvalidArgumentType, match="__cuda_array_interface__"):
        nss.from_cuda_array_interface(object(), stream=a)
    with pytest.raises(InvalidArgument, match="not CUDA device memory"):
        nss.from_dlpack(SimTensor(rt, p, device=(1, 0)), stream=a)
    with pytest.raises(InvalidArgument, match="on device 3"):
        nss.from_dlpack(SimTensor(rt, p, device=(dlpack.KDL_CUDA, 3)), stream=a)
    with pytest.raises(InvalidArgument, match="read-only"):
        nss.from_dlpack(SimTensor(rt, p, flags=dlpack.FLAG_READ_ONLY), stream=a)
    t = SimTensor(rt, p)
    with pytest.raises(InvalidArgument, match="negative strides"):
        nss.from_cuda_array_interface(type("Reversed", (), {"__cuda_array_interface__": dict(
            t.__cuda_array_interface__, data=(t.ptr + t.nbytes - 8, False),
            strides=(-8,))})(), stream=a)
    with pytest.raises(InvalidArgument, match="does not allow"):
        nss.from_cuda_array_interface(type("Zero", (), {"__cuda_array_interface__": dict(
            t.__cuda_array_interface__, stream=0)})(), stream=a)
    with pytest.raises(InvalidArgument, match="mask"):
        nss.from_cuda_array_interface(type("Masked", (), {"__cuda_array_interface__": dict(
            t.__cuda_array_interface__, mask=object())})(), stream=a)
    with pytest.raises(InvalidArgumentType, match="not an unconsumed DLPack capsule"):
        nss.from_dlpack(type("Bad", (), {"__dlpack__": lambda self, **kw: 42})(), stream=a)
    assert rt.driver.hazards == [] and rt.stats().live_blocks == 0


def test_an_untracking_runtime_refuses_to_borrow(streams):
    from numba_streamsafe._driver.sim import SimDriver
    from numba_streamsafe.resources import DirectResource
    from numba_streamsafe.runtime import DeviceRuntime, set_runtime

    rt = DeviceRuntime(DirectResource(SimDriver()))
    old = set_runtime(rt, 0)
    try:
        p = rt.driver.create_stream()
        with pytest.raises(StreamMisuse, match="does not track"):
            nss.from_dlpack(SimTensor(rt, p), stream=p)
    finally:
        if old is not None:
            set_runtime(old, 0)


def test_a_context_reset_forgets_borrowed_memory_without_freeing_it(rt, streams):
    a, _ = streams
    p = rt.driver.create_stream()
    t = SimTensor(rt, p)
    x = nss.from_dlpack(t, stream=a)
    block = nss.block_of(x)
    frees = rt.driver.calls["cuMemFree"]
    rt.reset()
    assert block.state is nss.BlockState.FREED and block.keep is None
    assert rt.driver.calls["cuMemFree"] == frees     # the producer's memory is its own
    del x
    gc.collect()
    rt.flush()                                       # the stale release does nothing


def test_a_trace_shows_the_borrow_and_the_release(rt, streams):
    a, b = streams
    p = rt.driver.create_stream()
    t = SimTensor(rt, p)
    with nss.trace() as tr:
        x = nss.from_dlpack(t, stream=a)
        fill[2, 32, b](x, 1)
        del x
        gc.collect()
        rt.flush()
    kinds = [m.what for m in tr.memory]
    assert kinds[0] == "borrow" and kinds[-1] == "release", kinds
    (wait,) = tr.waits
    assert (wait.after_label, wait.stream, wait.on_stream) == (
        "borrow", rt.stream_handle(b), rt.stream_handle(a))


def test_import_array_keeps_a_temporary_producer_until_the_copy_is_done(rt, streams):
    """The copy reads the producer's memory on the import stream; a producer
    dropped at once (a temporary) must not free it under the copy."""
    _, b = streams
    p = rt.driver.create_stream()
    t = SimTensor(rt, p)
    t.write(5)
    alive = weakref.ref(t)
    out = nss.import_array(t, stream=b)
    del t
    gc.collect()
    rt.flush()
    assert alive() is not None                       # the copy on b may not have run
    rt.reap()
    gc.collect()
    assert alive() is None                           # freed on p after the copy
    np.testing.assert_array_equal(_host(rt, out, b), 5)
    assert rt.driver.hazards == []


_CAPSULES_AT_EXIT = """
import numpy as np
from numba_streamsafe.numba.interop import dlpack
class Holder:
    pass
h = Holder()
h.me = h  # a cycle: collected while the interpreter shuts down
h.capsules = [dlpack.make_capsule(4096, (8,), (1,), np.dtype(np.float64), 0, h, versioned=v)
              for v in (False, True)]
del h
"""


def test_capsules_alive_at_exit_do_not_crash_the_interpreter(child_env, repo_root):
    """A capsule of this module that lives until the interpreter shuts down
    (a borrowed array kept to the end) runs its destructor then: the ctypes
    thunks it calls must still exist (they were freed with the module's
    globals, and the process died of a segmentation fault)."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-X", "faulthandler", "-c", _CAPSULES_AT_EXIT],
                          cwd=repo_root, env=child_env(), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and "Fatal Python error" not in proc.stderr, proc.stderr
    assert "Exception ignored" not in proc.stderr, proc.stderr
