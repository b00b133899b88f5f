"""Destroying a stream from the Numba layer: finalizer-queued frees and reused handles."""

from __future__ import annotations

import gc

import numpy as np
from numba import cuda

import numba_streamsafe as nss
from numba_streamsafe import Read, Write, tracked_kernel


@tracked_kernel
def _fill(out: Write, value):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = value


@tracked_kernel
def _copy(src: Read, dst: Write):
    i = cuda.grid(1)
    if i < src.size:
        dst[i] = src[i]


def test_destroy_stream_right_after_del(rt):
    """The issue's example: the queued free of ``a`` runs before the stream goes."""
    s = cuda.stream()
    a = nss.device_array(16, stream=s)
    del a
    gc.collect()
    rt.destroy_stream(s)
    assert rt.bytes_outstanding() == 0
    rt.driver.assert_no_hazards()


def test_a_stream_that_reuses_a_destroyed_handle_waits_for_its_write(rt):
    """b writes x, b is destroyed, c gets b's handle and reads x: c waits."""
    sim = rt.driver
    a = cuda.stream()
    x = nss.device_array(256, np.int32, stream=a)
    y = nss.device_array(256, np.int32, stream=a)
    b = sim.create_stream()
    _fill[1, 256, b](x, 7)
    rt.destroy_stream(b)
    c = sim.create_stream()
    assert c == b
    _copy[1, 256, c](x, y)
    out = nss.copy_to_host(y, stream=a)
    assert (out == 7).all()
    sim.assert_no_hazards()
    del x, y
