"""``stream_handle``: one normal form for the stream objects users hold."""

from __future__ import annotations

import ctypes
import sys
import types

import pytest

from numba_streamsafe.core.streams import (
    LEGACY_DEFAULT,
    PER_THREAD_DEFAULT,
    default_stream_handle,
    stream_handle,
)


class CudaStreamProtocol:
    """Like a ``cuda.core`` Stream: ``__cuda_stream__()`` returns ``(version, handle)``."""

    def __init__(self, handle: int) -> None:
        self._handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self._handle)


class HandleAttribute:
    """Like a Numba Stream: ``.handle`` is a ``ctypes.c_void_p``."""

    def __init__(self, handle: int | None) -> None:
        self.handle = ctypes.c_void_p(handle)


def test_none_is_the_legacy_default_stream_before_numba_loads(monkeypatch):
    monkeypatch.setitem(sys.modules, "numba.core.config", None)  # as if not imported
    monkeypatch.delenv("NUMBA_CUDA_PER_THREAD_DEFAULT_STREAM", raising=False)
    assert stream_handle(None) == LEGACY_DEFAULT == 0
    monkeypatch.setenv("NUMBA_CUDA_PER_THREAD_DEFAULT_STREAM", "0")
    assert stream_handle(None) == 0
    monkeypatch.setenv("NUMBA_CUDA_PER_THREAD_DEFAULT_STREAM", "1")
    assert stream_handle(None) == PER_THREAD_DEFAULT == 2


def test_numba_configuration_decides_once_loaded(monkeypatch):
    config = types.SimpleNamespace(CUDA_PER_THREAD_DEFAULT_STREAM=1)
    monkeypatch.setitem(sys.modules, "numba.core.config", config)
    monkeypatch.delenv("NUMBA_CUDA_PER_THREAD_DEFAULT_STREAM", raising=False)
    assert stream_handle(None) == default_stream_handle() == PER_THREAD_DEFAULT
    config.CUDA_PER_THREAD_DEFAULT_STREAM = 0
    monkeypatch.setenv("NUMBA_CUDA_PER_THREAD_DEFAULT_STREAM", "1")  # Numba would not see it
    assert stream_handle(None) == LEGACY_DEFAULT


@pytest.mark.parametrize("handle", [0, 2, 0x1000, 0x7F00DEAD0000, 2**63])
def test_ints_are_handles(handle):
    assert stream_handle(handle) == handle


def test_negative_int_is_refused():
    with pytest.raises(TypeError, match="non-negative"):
        stream_handle(-1)


@pytest.mark.parametrize("handle", [0, 0x1000, 0x7F00DEAD0000])
def test_cuda_stream_protocol(handle):
    assert stream_handle(CudaStreamProtocol(handle)) == handle


def test_cuda_stream_protocol_as_a_tuple_attribute():
    obj = type("S", (), {"__cuda_stream__": (0, 0x4242)})()
    assert stream_handle(obj) == 0x4242


@pytest.mark.parametrize("handle", [0x1000, 0x7F00DEAD0000])
def test_handle_attribute_c_void_p(handle):
    assert stream_handle(HandleAttribute(handle)) == handle


def test_null_c_void_p_handle_is_the_legacy_stream():
    assert stream_handle(HandleAttribute(None)) == 0


def test_handle_attribute_none_means_no_handle():
    obj = type("S", (), {"handle": None})()
    assert stream_handle(obj) is None


@pytest.mark.parametrize("bad", [1.5, 0.0, "0x1000", "stream", b"s", True, [1], object()])
def test_objects_that_name_no_stream_are_type_errors(bad):
    with pytest.raises(TypeError, match="cannot use .* as a CUDA stream|non-negative"):
        stream_handle(bad)


class TorchLikeStream:
    """The shape of ``torch.cuda.Stream``: the handle in ``cuda_stream``."""

    def __init__(self, handle: int) -> None:
        self.cuda_stream = handle


class CupyLikeStream:
    """The shape of ``cupy.cuda.Stream`` / ``ExternalStream``: the handle in ``ptr``."""

    def __init__(self, handle: int) -> None:
        self.ptr = handle


@pytest.mark.parametrize("make", [TorchLikeStream, CupyLikeStream])
@pytest.mark.parametrize("handle", [0, 0x2000, 0x7F00DEAD0000])
def test_pytorch_and_cupy_streams(make, handle):
    assert stream_handle(make(handle)) == handle


def test_a_foreign_stream_object_is_kept_alive_as_the_owner():
    from numba_streamsafe._driver.sim import SimDriver
    from numba_streamsafe.resources import AsyncResource
    from numba_streamsafe.runtime import DeviceRuntime

    rt = DeviceRuntime(AsyncResource(SimDriver()))
    handle = rt.driver.create_stream()
    foreign = TorchLikeStream(handle)
    assert rt.stream_ref(foreign) == (handle, foreign)
