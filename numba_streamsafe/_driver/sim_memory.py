"""The simulated driver's memory: a stream-ordered pool that hands a freed
address back to an allocation ordered after the free, chunks backed by host
memory, foreign ranges, copies and fills (a part of :class:`~.sim.SimDriver`)."""

from __future__ import annotations

import bisect
import ctypes
from typing import Any

import numpy as np

from numba_streamsafe._driver.base import (
    CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_OUT_OF_MEMORY,
)
from numba_streamsafe._driver.sim_model import (
    ALIGN,
    Chunk,
    Op,
    SimSystem,
    check_fill_args,
    round_capacity,
)
from numba_streamsafe.core.access import Access
from numba_streamsafe.core.errors import DriverError, StreamMisuse

__all__ = ["SimMemory"]


class SimMemory:
    """The memory calls of :class:`~.sim.SimDriver` (which holds the state)."""

    # The state and the calls of SimDriver these methods use (for type checkers).
    system: SimSystem
    backing: bool
    capacity: int
    pool_attributes: dict[str, int]
    _lock: Any
    _bases: list[int]
    _chunks: dict[int, Chunk]
    _pool: list[Chunk]
    _host_clock: dict[int, int]
    _reserved: int
    _reserved_high: int
    _used: int
    _used_high: int
    _check: Any
    _chunk_at: Any
    _enqueue: Any
    _enter: Any
    _host_op: Any
    _join_device: Any
    _ordered: Any
    _owner_of: Any
    _stream: Any
    _trace: Any
    stream_synchronize: Any

    def alloc_async(self, nbytes: int, stream: int) -> int:
        with self._lock:
            self._enter("cuMemAllocAsync")
            if nbytes <= 0:
                raise DriverError("cuMemAllocAsync", CUDA_ERROR_INVALID_VALUE,
                                  "size must be positive")
            op = self._enqueue(stream, "cuMemAllocAsync", "cuMemAllocAsync")
            chunk = self._take_from_pool(nbytes, op)
            if chunk is None:
                chunk = self._new_chunk(nbytes, "cuMemAllocAsync")
            chunk.live = True
            chunk.nbytes = nbytes
            chunk.free_op = None
            self._used += chunk.capacity
            self._used_high = max(self._used_high, self._used)
            self._check(chunk, chunk.base, nbytes, Access.WRITE, op)
            return chunk.base

    def alloc(self, nbytes: int) -> int:
        with self._lock:
            self._enter("cuMemAlloc")
            if nbytes <= 0:
                raise DriverError("cuMemAlloc", CUDA_ERROR_INVALID_VALUE, "size must be positive")
            chunk = self._new_chunk(nbytes, "cuMemAlloc")
            chunk.live = True
            chunk.nbytes = nbytes
            op = self._host_op("cuMemAlloc")
            self._check(chunk, chunk.base, nbytes, Access.WRITE, op)
            return chunk.base

    def _take_from_pool(self, nbytes: int, op: Op) -> Chunk | None:
        # Newest first: CUDA's pool prefers the most recently freed block.
        for i in range(len(self._pool) - 1, -1, -1):
            chunk = self._pool[i]
            if chunk.capacity >= nbytes and chunk.free_op is not None and self._ordered(
                chunk.free_op, op
            ):
                del self._pool[i]
                return chunk
        return None

    def _new_chunk(self, nbytes: int, call: str) -> Chunk:
        cap = round_capacity(nbytes)
        if self._reserved + cap > self.capacity:
            self._trim_completed(0)
            if self._reserved + cap > self.capacity:
                free = self.capacity - self._reserved
                raise DriverError(call, CUDA_ERROR_OUT_OF_MEMORY,
                                  f"{nbytes} bytes requested, {free} free")
        if self.backing:
            buffer = np.empty(cap + ALIGN, dtype=np.uint8)
            base = (buffer.ctypes.data + ALIGN - 1) // ALIGN * ALIGN
        else:
            buffer = None
            base = self.system.take_handles((cap >> 20) + 1) << 20
        chunk = Chunk(base, cap, buffer)
        self._reserved += cap
        self._reserved_high = max(self._reserved_high, self._reserved)
        bisect.insort(self._bases, base)
        self._chunks[base] = chunk
        return chunk

    def free_async(self, ptr: int, stream: int) -> None:
        with self._lock:
            self._enter("cuMemFreeAsync")
            chunk = self._live_chunk(ptr, "cuMemFreeAsync")
            op = self._enqueue(stream, "cuMemFreeAsync", "cuMemFreeAsync")
            self._check(chunk, chunk.base, chunk.nbytes, Access.WRITE, op)
            chunk.live = False
            chunk.free_op = op
            self._used -= chunk.capacity
            self._pool.append(chunk)

    def free(self, ptr: int) -> None:
        with self._lock:
            self._enter("cuMemFree")
            chunk = self._live_chunk(ptr, "cuMemFree")
            # cuMemFree synchronises the device before releasing the memory.
            self._join_device()
            op = self._host_op("cuMemFree")
            self._check(chunk, chunk.base, chunk.nbytes, Access.WRITE, op)
            chunk.live = False
            chunk.free_op = op
            self._release(chunk)

    def _live_chunk(self, ptr: int, call: str) -> Chunk:
        chunk = self._chunks.get(ptr)
        if chunk is None or not chunk.live:
            raise DriverError(call, CUDA_ERROR_INVALID_VALUE, f"{ptr:#x} is not an allocation")
        return chunk

    def _release(self, chunk: Chunk) -> None:
        del self._chunks[chunk.base]
        self._bases.pop(bisect.bisect_left(self._bases, chunk.base))
        if not chunk.external:
            self._reserved -= chunk.capacity

    def register_foreign(self, ptr: int, nbytes: int, stream: int) -> None:
        """Check accesses to ``nbytes`` at ``ptr``, memory another library allocated
        and hands over on ``stream`` (a borrowed block), from now on.

        A range inside a live allocation the model knows (of any device of the
        system) needs nothing: its accesses are checked already. Other memory
        becomes an external chunk, ready after the work queued on ``stream``
        so far (its last write is a hand-over on ``stream``) and, when the
        driver keeps bytes (``backing=True``), backed by the host memory at
        ``ptr`` itself: under Numba's CUDA simulator device memory is host
        memory, so ``ptr`` must be the address of ``nbytes`` live host bytes.

        Raises
        ------
        DriverError
            ``nbytes`` is not positive, or the range runs into freed memory or
            past the end of an allocation (``CUDA_ERROR_INVALID_VALUE``);
            ``stream`` does not exist.
        """
        with self._lock:
            self._enter("register_foreign")
            if not isinstance(nbytes, int) or nbytes <= 0:
                raise DriverError("register_foreign", CUDA_ERROR_INVALID_VALUE,
                                  f"size {nbytes!r} is not a positive int")
            self._stream(stream, "register_foreign")
            chunk = self._owner_of(ptr)[1]
            if chunk is not None:
                if chunk.live and ptr + nbytes <= chunk.base + chunk.nbytes:
                    return
                what = "freed memory" if not chunk.live else "past the end of an allocation"
                raise DriverError("register_foreign", CUDA_ERROR_INVALID_VALUE,
                                  f"{ptr:#x}+{nbytes} runs into {what} at {chunk.base:#x}")
            i = bisect.bisect_left(self._bases, ptr)
            if i < len(self._bases) and self._bases[i] < ptr + nbytes:
                raise DriverError("register_foreign", CUDA_ERROR_INVALID_VALUE,
                                  f"{ptr:#x}+{nbytes} overlaps the allocation at "
                                  f"{self._bases[i]:#x}")
            buffer = None
            if self.backing:
                buffer = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(ptr))
            chunk = Chunk(ptr, nbytes, buffer, external=True)
            chunk.live = True
            chunk.nbytes = nbytes
            bisect.insort(self._bases, ptr)
            self._chunks[ptr] = chunk
            self._check(chunk, ptr, nbytes, Access.WRITE,
                        self._enqueue(stream, "foreign memory handed over", "register_foreign"))

    def release_foreign(self, ptr: int, stream: int) -> None:
        """The borrowed memory at ``ptr`` is released on ``stream``: for an external
        chunk (:meth:`register_foreign`), checked as a free there (every use
        must be ordered before it), then forgotten. A range of an allocation
        the model knows stays as it is (its owner frees it)."""
        with self._lock:
            self._enter("release_foreign")
            chunk = self._chunks.get(ptr)
            if chunk is None or not chunk.external or not chunk.live:
                return
            op = self._enqueue(stream, "release of borrowed memory", "release_foreign")
            self._check(chunk, chunk.base, chunk.nbytes, Access.WRITE, op)
            chunk.live = False
            chunk.free_op = op
            self._release(chunk)

    def _trim_completed(self, keep_bytes: int) -> None:
        kept = []
        pooled = 0
        for chunk in reversed(self._pool):
            done = chunk.free_op is not None and self._host_clock.get(chunk.free_op.stream, 0) >= (
                chunk.free_op.seq
            )
            if done and pooled + chunk.capacity > keep_bytes:
                self._release(chunk)
            else:
                pooled += chunk.capacity
                kept.append(chunk)
        kept.reverse()
        self._pool = kept

    def pool_trim(self, keep_bytes: int = 0) -> None:
        with self._lock:
            self._enter("cuMemPoolTrimTo")
            self._trim_completed(keep_bytes)

    def set_pool_attribute(self, name: str, value: int) -> None:
        """Record a pool attribute (the model keeps freed memory pooled until a
        trim or an out-of-memory, whatever the release threshold)."""
        with self._lock:
            self._enter("cuMemPoolSetAttribute")
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise DriverError("cuMemPoolSetAttribute", CUDA_ERROR_INVALID_VALUE,
                                  f"pool attribute {name} cannot be {value!r}")
            self.pool_attributes[name] = value
            if name == "RESERVED_MEM_HIGH":
                self._reserved_high = self._reserved
            elif name == "USED_MEM_HIGH":
                self._used_high = self._used

    def get_pool_attribute(self, name: str) -> int:
        """The pool's reserved and used bytes and their high-water marks (the
        other attributes as last set, 0 if never)."""
        with self._lock:
            self._enter("cuMemPoolGetAttribute")
            values = {"RESERVED_MEM_CURRENT": self._reserved,
                      "RESERVED_MEM_HIGH": self._reserved_high,
                      "USED_MEM_CURRENT": self._used, "USED_MEM_HIGH": self._used_high}
            if name in values:
                return values[name]
            return self.pool_attributes.get(name, 0)

    def mem_info(self) -> tuple[int, int]:
        with self._lock:
            self._enter("cuMemGetInfo")
            return self.capacity - self._reserved, self.capacity

    @property
    def reserved_bytes(self) -> int:
        """Bytes held by live and pooled chunks."""
        return self._reserved

    def buffer(self, ptr: int, nbytes: int) -> np.ndarray:
        """A NumPy ``uint8`` view of ``nbytes`` simulated device bytes at ``ptr``."""
        with self._lock:
            chunk = self._chunk_at(ptr)
            if chunk is None or chunk.buffer is None or ptr + nbytes > chunk.base + chunk.capacity:
                raise StreamMisuse(f"{ptr:#x}+{nbytes} is not backed simulated memory")
            start = ptr - chunk.buffer.ctypes.data
            return chunk.buffer[start:start + nbytes]

    def memset_async(self, ptr: int, value: int, nbytes: int, stream: int) -> None:
        """Queue the fill of ``nbytes`` bytes at ``ptr`` with the byte ``value`` on ``stream``.

        The model of ``cuMemsetD8Async``: checked as a write of the range by
        ``stream``, like a kernel (:meth:`trace_access`), so an unordered fill is
        a hazard. The backing bytes are filled at once; a range without backing
        (``backing=False``, or past the end of its chunk) is checked only.

        Raises
        ------
        DriverError
            ``value`` is not a byte or ``nbytes`` is negative
            (``CUDA_ERROR_INVALID_VALUE``); ``stream`` does not exist.
        """
        with self._lock:
            self._enter("cuMemsetD8Async")
            check_fill_args("cuMemsetD8Async", value, nbytes)
            op = self._enqueue(stream, "cuMemsetD8Async", "cuMemsetD8Async")
            if nbytes:
                self._trace(((ptr, nbytes, Access.WRITE),), op)
                view = self._backed_view(ptr, nbytes)
                if view is not None:
                    view[:] = value

    def copy_to_host(self, ptr: int, nbytes: int, stream: int) -> bytes:
        """Copy ``nbytes`` bytes at ``ptr`` to the host on ``stream``, then synchronise it.

        The model of ``cuMemcpyDtoHAsync`` followed by ``cuStreamSynchronize``:
        checked as a read of the range by ``stream``, like a kernel
        (:meth:`trace_access`); afterwards the host is ordered after everything
        queued on ``stream``.

        Raises
        ------
        DriverError
            ``nbytes`` is negative, or the range is not memory of this driver
            (``CUDA_ERROR_INVALID_VALUE``); ``stream`` does not exist.
        StreamMisuse
            This driver keeps no bytes (``backing=False``): build it with
            ``SimDriver(backing=True)`` to read device memory back.
        """
        with self._lock:
            self._enter("cuMemcpyDtoHAsync")
            check_fill_args("cuMemcpyDtoHAsync", 0, nbytes)
            self._stream(stream, "cuMemcpyDtoHAsync")
            data = b""
            if nbytes:
                if not self.backing:
                    raise StreamMisuse(
                        f"cannot copy {nbytes} B at {ptr:#x} to the host: this SimDriver was "
                        "built with backing=False and keeps no bytes; use SimDriver(backing=True)"
                    )
                chunk = self._chunk_at(ptr)
                if chunk is None or ptr + nbytes > chunk.base + chunk.capacity:
                    raise DriverError("cuMemcpyDtoHAsync", CUDA_ERROR_INVALID_VALUE,
                                      f"{ptr:#x}+{nbytes} is not memory of this device")
                op = self._enqueue(stream, "cuMemcpyDtoHAsync", "cuMemcpyDtoHAsync")
                self._trace(((ptr, nbytes, Access.READ),), op)
                view = self._backed_view(ptr, nbytes)
                data = view.tobytes() if view is not None else b""
            self.stream_synchronize(stream)
            return data

    def copy_async(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        """Queue the copy of ``nbytes`` bytes from ``src`` to ``dst`` on ``stream``
        (``cuMemcpyAsync``): either may be memory of another device of the system,
        which needs no peer access. Checked as a read of ``src`` and a write of
        ``dst``; the backing bytes move at once.

        Raises
        ------
        DriverError
            ``nbytes`` is negative; ``stream`` does not exist.
        """
        with self._lock:
            self._enter("cuMemcpyAsync")
            check_fill_args("cuMemcpyAsync", 0, nbytes)
            op = self._enqueue(stream, "cuMemcpyAsync", "cuMemcpyAsync")
            if nbytes:
                self._trace(((src, nbytes, Access.READ), (dst, nbytes, Access.WRITE)), op)
                source = self._backed_view(src, nbytes)
                target = self._backed_view(dst, nbytes)
                if source is not None and target is not None:
                    n = min(len(source), len(target))
                    target[:n] = source[:n]

    def _backed_view(self, ptr: int, nbytes: int) -> np.ndarray | None:
        """The backing bytes of ``ptr``..``ptr+nbytes`` up to the end of its chunk, or None."""
        chunk = self._owner_of(ptr)[1]
        if chunk is None or chunk.buffer is None:
            return None
        start = ptr - chunk.buffer.ctypes.data
        end = min(ptr + nbytes, chunk.base + chunk.capacity) - chunk.buffer.ctypes.data
        return chunk.buffer[start:end]
