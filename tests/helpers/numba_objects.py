"""Stand-ins for Numba's device objects as transparent mode's hooks of Numba's
copies and fills read them (:mod:`numba_streamsafe.numba.copies`): a device
array's ``gpu_data``, a memory pointer's ``owner``, ``device_pointer_value``
and ``size``, a stream object's ``handle``, and an event's ``handle`` as the
hooks of the program's own ordering read it
(:mod:`numba_streamsafe.numba.program_order`). For running those hooks on the
CPU, against the simulated driver (``tests/numba/test_copies.py``,
``benchmarks/hooks_host.py``)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

__all__ = ["NumbaMemory", "NumbaArray", "NumbaStream", "NumbaEvent"]


class NumbaMemory:
    """What the hooks read of Numba's ``MemoryPointer`` over ``block``."""

    def __init__(self, block: Any) -> None:
        self.owner = SimpleNamespace(_nss_block=block)
        self.device_pointer_value = block.ptr
        self.size = block.nbytes


class NumbaArray:
    """What the hooks read of Numba's device array over ``block``."""

    def __init__(self, block: Any) -> None:
        self.gpu_data = NumbaMemory(block)


class NumbaStream:
    """A stream object as Numba passes it: it carries its handle, and takes
    attributes."""

    def __init__(self, handle: int) -> None:
        self.handle = handle


class NumbaEvent:
    """An event as Numba makes it: it carries its driver handle, and takes
    attributes."""

    def __init__(self, handle: int) -> None:
        self.handle = handle
