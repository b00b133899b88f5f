"""The simulated device's memory: a stream-ordered pool that hands a freed
address back to an allocation ordered after the free, chunks backed by host
memory, and foreign ranges (:class:`SimPool`, held by :class:`~.sim.SimDriver`,
which orders the calls and checks their accesses)."""

from __future__ import annotations

import bisect
import ctypes
from collections.abc import Callable

import numpy as np

from numba_streamsafe._driver.base import (
    CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_OUT_OF_MEMORY,
)
from numba_streamsafe._driver.sim_model import ALIGN, Chunk, Op, SimSystem, round_capacity
from numba_streamsafe.core.errors import DriverError, StreamMisuse

__all__ = ["SimPool"]


class SimPool:
    """The chunks of one simulated device: live allocations, freed chunks
    pooled for reuse, and foreign ranges (external chunks), with the pool's
    reserved and used bytes and their high-water marks. The caller holds the
    system's lock around every call.

    Parameters
    ----------
    system : SimSystem
        The machine: it hands out the addresses of chunks without backing.
    capacity : int
        Bytes the device holds.
    backing : bool
        Back every chunk with real host memory whose address is the device
        address.
    """

    def __init__(self, system: SimSystem, capacity: int, backing: bool) -> None:
        self.system = system
        self.capacity = capacity
        self.backing = backing
        #: Attributes set with :meth:`set_attribute`.
        self.attributes: dict[str, int] = {}
        self._bases: list[int] = []
        self._chunks: dict[int, Chunk] = {}
        self._pooled: list[Chunk] = []
        self._reserved = 0
        self._reserved_high = 0
        self._used = 0
        self._used_high = 0

    # ------------------------------------------------------------ allocation
    def take(self, nbytes: int, op: Op, ordered: Callable[[Op, Op], bool], call: str) -> Chunk:
        """A live chunk of at least ``nbytes`` for the allocation ``op``: the
        newest pooled chunk whose free is ordered before ``op`` (CUDA's pool
        prefers the most recently freed block), else a new one.

        Raises
        ------
        DriverError
            ``CUDA_ERROR_OUT_OF_MEMORY``: the device is full once completed
            frees are trimmed.
        """
        for i in range(len(self._pooled) - 1, -1, -1):
            chunk = self._pooled[i]
            if (chunk.capacity >= nbytes and chunk.free_op is not None
                    and ordered(chunk.free_op, op)):
                del self._pooled[i]
                chunk.live = True
                chunk.nbytes = nbytes
                chunk.free_op = None
                chunk.allocated = chunk.freed = ()  # a new allocation: told anew
                break
        else:
            chunk = self.new_chunk(nbytes, call)
        chunk.in_use = True
        self._used += chunk.capacity
        self._used_high = max(self._used_high, self._used)
        return chunk

    def new_chunk(self, nbytes: int, call: str) -> Chunk:
        """A new live chunk of ``nbytes`` (reserved from the device, trimming
        completed frees first when it is full).

        Raises
        ------
        DriverError
            ``CUDA_ERROR_OUT_OF_MEMORY``.
        """
        cap = round_capacity(nbytes)
        if self._reserved + cap > self.capacity:
            self.trim_completed(0)
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
        chunk.live = True
        chunk.nbytes = nbytes
        return chunk

    def pool(self, chunk: Chunk, op: Op) -> None:
        """``chunk`` is freed by ``op`` (queued on a stream): it stays reserved,
        for an allocation ordered after ``op``."""
        chunk.live = False
        chunk.free_op = op
        self._unuse(chunk)
        self._pooled.append(chunk)

    def release(self, chunk: Chunk, op: Op | None = None) -> None:
        """``chunk`` (freed by ``op``, if given) goes back to the device; an
        external chunk is forgotten."""
        if op is not None:
            chunk.live = False
            chunk.free_op = op
        del self._chunks[chunk.base]
        self._bases.pop(bisect.bisect_left(self._bases, chunk.base))
        self._unuse(chunk)  # a pool allocation freed by cuMemFree, or taken by a reset
        if not chunk.external:
            self._reserved -= chunk.capacity

    def _unuse(self, chunk: Chunk) -> None:
        """``chunk`` is no longer handed out by the pool (if it was)."""
        if chunk.in_use:
            chunk.in_use = False
            self._used -= chunk.capacity

    def live_chunk(self, ptr: int, call: str) -> Chunk:
        """The live allocation that begins at ``ptr``.

        Raises
        ------
        DriverError
            ``CUDA_ERROR_INVALID_VALUE``: none does.
        """
        chunk = self._chunks.get(ptr)
        if chunk is None or not chunk.live:
            raise DriverError(call, CUDA_ERROR_INVALID_VALUE, f"{ptr:#x} is not an allocation")
        return chunk

    def external(self, ptr: int) -> Chunk | None:
        """The live external chunk that begins at ``ptr``, if any."""
        chunk = self._chunks.get(ptr)
        if chunk is None or not chunk.external or not chunk.live:
            return None
        return chunk

    def add_external(self, ptr: int, nbytes: int) -> Chunk:
        """A live external chunk over ``nbytes`` at ``ptr`` (memory another
        library allocated), backed by the host bytes at ``ptr`` where the pool
        keeps bytes.

        Raises
        ------
        DriverError
            ``CUDA_ERROR_INVALID_VALUE``: the range overlaps a chunk of this
            device.
        """
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
        return chunk

    def trim_completed(self, keep_bytes: int) -> None:
        """Give pooled chunks whose free the host has completed back to the
        device, newest kept first, until at most ``keep_bytes`` stay pooled."""
        kept = []
        pooled = 0
        system = self.system
        for chunk in reversed(self._pooled):
            op = chunk.free_op
            done = op is not None and system.covers(system.host_clock, op)
            if done and pooled + chunk.capacity > keep_bytes:
                self.release(chunk)
            else:
                pooled += chunk.capacity
                kept.append(chunk)
        kept.reverse()
        self._pooled = kept

    def clear(self) -> None:
        """Every chunk goes back (a context reset)."""
        for chunk in list(self._chunks.values()):
            self.release(chunk)
        self._pooled = []

    # ---------------------------------------------------------------- lookup
    def chunk_at(self, address: int) -> Chunk | None:
        """The chunk of this device whose reserved bytes hold ``address``."""
        i = bisect.bisect_right(self._bases, address) - 1
        if i < 0:
            return None
        chunk = self._chunks[self._bases[i]]
        if address >= chunk.base + chunk.capacity:
            return None
        return chunk

    @staticmethod
    def backed(chunk: Chunk | None, ptr: int, nbytes: int) -> np.ndarray | None:
        """The backing bytes of ``ptr``..``ptr+nbytes`` in ``chunk`` up to its
        end, or None (no chunk, or no backing)."""
        if chunk is None or chunk.buffer is None:
            return None
        start = ptr - chunk.buffer.ctypes.data
        end = min(ptr + nbytes, chunk.base + chunk.capacity) - chunk.buffer.ctypes.data
        return chunk.buffer[start:end]

    def buffer(self, ptr: int, nbytes: int) -> np.ndarray:
        """A NumPy ``uint8`` view of ``nbytes`` backed bytes at ``ptr``.

        Raises
        ------
        StreamMisuse
            The range is not backed memory of this device.
        """
        chunk = self.chunk_at(ptr)
        if chunk is None or chunk.buffer is None or ptr + nbytes > chunk.base + chunk.capacity:
            raise StreamMisuse(f"{ptr:#x}+{nbytes} is not backed simulated memory")
        start = ptr - chunk.buffer.ctypes.data
        return chunk.buffer[start:start + nbytes]

    # ----------------------------------------------------------------- figures
    @property
    def reserved(self) -> int:
        """Bytes held by live and pooled chunks."""
        return self._reserved

    def set_attribute(self, name: str, value: int) -> None:
        """Record a pool attribute; setting a high-water mark resets it to the
        current figure (as CUDA's pool does)."""
        self.attributes[name] = value
        if name == "RESERVED_MEM_HIGH":
            self._reserved_high = self._reserved
        elif name == "USED_MEM_HIGH":
            self._used_high = self._used

    def attribute(self, name: str) -> int:
        """The pool's reserved and used bytes and their high-water marks (the
        other attributes as last set, 0 if never)."""
        values = {"RESERVED_MEM_CURRENT": self._reserved,
                  "RESERVED_MEM_HIGH": self._reserved_high,
                  "USED_MEM_CURRENT": self._used, "USED_MEM_HIGH": self._used_high}
        if name in values:
            return values[name]
        return self.attributes.get(name, 0)
