"""Work outside the library on a tracked array: ``lend`` and the ordered
``__cuda_array_interface__`` export, checked by the simulated driver (the
outside work is told to its checker as a kernel on a foreign stream)."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

import numba_streamsafe as nss
from numba_streamsafe import Access, InvalidArgument, Write, tracked_kernel

N = 64


@tracked_kernel
def fill(out: Write, value):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = value


def _foreign(rt, stream, array, access, label="foreign work"):
    """Outside work on ``stream`` touching ``array`` (only the checker sees it)."""
    block = nss.block_of(array)
    rt.driver.trace_access(stream, [(block.ptr, block.nbytes, access)], label)


class TorchLikeStream:
    def __init__(self, handle: int) -> None:
        self.cuda_stream = handle


def test_lend_orders_the_foreign_work_both_ways(rt, streams):
    a, b = streams
    f = TorchLikeStream(rt.driver.create_stream())
    x = nss.device_array(N, np.int64, stream=a)
    fill[2, 32, a](x, 1)
    with nss.lend(x, stream=f, access="rw") as lent:
        assert lent is x
        _foreign(rt, f.cuda_stream, x, Access.READ_WRITE)   # after fill on a
    fill[2, 32, b](x, 2)                                     # after the foreign work
    assert rt.driver.hazards == []


def test_without_lend_the_foreign_work_races(rt, streams):
    """The negative control of the test above."""
    a, b = streams
    f = rt.driver.create_stream()
    x = nss.device_array(N, np.int64, stream=a)
    fill[2, 32, a](x, 1)
    _foreign(rt, f, x, Access.READ_WRITE)
    fill[2, 32, b](x, 2)
    kinds = {h.kind for h in rt.driver.hazards}
    assert "write-after-write" in kinds or "read-after-write" in kinds
    assert "write-after-write" in kinds or "write-after-read" in kinds


def test_the_exported_interface_stream_waits_for_the_last_write(rt, streams):
    a, b = streams
    from numba_streamsafe.numba.interop.boundaries import export_interface

    x = nss.device_array(N, np.int64, stream=a)
    fill[2, 32, b](x, 1)                      # written on b, allocated on a
    exported = export_interface(x, {"stream": rt.stream_handle(a), "version": 3})
    _foreign(rt, exported["stream"], x, Access.READ, "consumer")
    assert rt.driver.hazards == []


def test_an_unordered_export_races(rt, streams):
    """The negative control: a consumer on the allocation stream, unordered."""
    a, b = streams
    x = nss.device_array(N, np.int64, stream=a)
    fill[2, 32, b](x, 1)
    _foreign(rt, rt.stream_handle(a), x, Access.READ, "consumer")
    assert [h.kind for h in rt.driver.hazards] == ["read-after-write"]


def test_an_export_without_a_stream_names_the_legacy_stream(rt, streams):
    from numba_streamsafe.numba.interop.boundaries import export_interface

    a, _ = streams
    x = nss.device_array(N, np.int64, stream=a)
    fill[2, 32, a](x, 1)
    assert export_interface(x, {"stream": None, "version": 3})["stream"] == 1
    _foreign(rt, 0, x, Access.READ, "consumer on the legacy stream")
    assert rt.driver.hazards == []


def test_lend_refuses_what_it_cannot_order(rt):
    with pytest.raises(InvalidArgument):
        with nss.lend(np.zeros(4), stream=0):
            pass
    x = nss.device_array(4, np.int64)
    with pytest.raises(InvalidArgument, match="access"):
        with nss.lend(x, stream=0, access="sometimes"):
            pass


def test_an_empty_view_is_launched_without_a_block(rt, streams):
    """Numba gives an empty array (an empty view too) a null pointer, which no
    block holds: it touches no bytes, so a tracked kernel takes it in strict mode."""
    a, _ = streams

    @tracked_kernel
    def size_of(x: nss.Read, out: Write):
        out[0] = x.size

    class Empty:
        size = 0
        __cuda_array_interface__ = {"shape": (0,), "typestr": "<f8", "data": (0, False),
                                    "version": 3, "strides": None}

    out = nss.device_array(1, np.int64, stream=a)
    _, uses, host = size_of._arguments(rt, (Empty(), out), a, strict=True, traced=False)
    assert not host and not uses.untracked and not uses.producers
    assert [use[1] for use in uses.blocks] == [Access.WRITE]  # out's only
