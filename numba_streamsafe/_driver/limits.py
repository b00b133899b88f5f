"""The launch configurations CUDA accepts, and the error for those it refuses.

One check for both backends: the Numba layer runs it before a launch queues
anything, on the simulator and on a GPU, and the CUDA driver runs it again
when ``cuLaunchKernel`` refuses a launch that took the compiled path, so the
same configuration gives the same error everywhere.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

from numba_streamsafe.core.errors import InvalidLaunchConfig

__all__ = ["LaunchLimits", "SIMULATED", "check_launch", "normalize_dims"]


@dataclass(frozen=True)
class LaunchLimits:
    """A device's limits on one launch (CUDA's device attributes of the same names)."""

    max_threads_per_block: int = 1024
    max_block_dim: tuple[int, int, int] = (1024, 1024, 64)
    max_grid_dim: tuple[int, int, int] = (2**31 - 1, 65535, 65535)
    #: Dynamic shared memory a launch may ask for without a kernel attribute.
    max_shared_memory_per_block: int = 48 * 1024


#: The simulated device's limits: those of every CUDA GPU of compute capability 5 and up.
SIMULATED = LaunchLimits()

_AXES = "xyz"


def _dims(what: str, dim: Any) -> tuple[int, int, int]:
    values = dim if isinstance(dim, tuple) else (dim,)
    if not 1 <= len(values) <= 3:
        raise InvalidLaunchConfig(f"the {what} dimension {dim!r} has {len(values)} entries; "
                                  "give an int or a tuple of 1 to 3 ints")
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise InvalidLaunchConfig(f"the {what} dimension {dim!r} holds {v!r}, which is not "
                                      f"an int; give whole numbers, e.g. {what} = 256")
        if v <= 0:
            raise InvalidLaunchConfig(f"the {what} dimension {dim!r} holds {int(v)}: every "
                                      "dimension must be positive (at least 1)")
        out.append(int(v))
    while len(out) < 3:
        out.append(1)
    return out[0], out[1], out[2]


#: Configurations of plain ints found acceptable, by the identity of the
#: limits they were checked against (kept in the value, so an identity reused
#: by other limits is told apart): a kernel relaunched with one configuration
#: is checked once.
_accepted: dict[tuple[Any, ...], tuple[Any, LaunchLimits]] = {}
_ACCEPTED_MAX = 4096


def normalize_dims(dim: Any) -> tuple[int, int, int] | None:
    """``dim`` (an int or 1 to 3 ints, exact types) as three ints, or None
    when it is not plainly valid (a bool, an int subclass, a value that is
    not positive: :func:`check_launch` or Numba's path then reports it)."""
    if type(dim) is int:
        return (dim, 1, 1) if dim > 0 else None
    if type(dim) is tuple and 1 <= len(dim) <= 3:
        for d in dim:
            if type(d) is not int or d <= 0:
                return None
        return (dim + (1, 1))[:3]  # type: ignore[return-value]
    return None


def check_launch(grid: Any, block: Any, shmem: Any, limits: LaunchLimits
                 ) -> tuple[tuple[int, int, int], tuple[int, int, int], int]:
    """``(grid, block, shmem)`` as three ints, three ints and an int, if CUDA
    accepts them on a device of ``limits``.

    Raises
    ------
    InvalidLaunchConfig
        A dimension that is no positive int, over its axis' limit, a block of
        more threads than the device runs in one block, or dynamic shared
        memory over the limit; the message names the limit and the value.
    """
    plain = (type(shmem) is int and normalize_dims(grid) is not None
             and normalize_dims(block) is not None)
    if plain:
        key = (grid, block, shmem, id(limits))
        found = _accepted.get(key)
        if found is not None and found[1] is limits:
            return found[0]  # type: ignore[no-any-return]
    checked = _check(grid, block, shmem, limits)
    if plain:
        if len(_accepted) >= _ACCEPTED_MAX:
            _accepted.clear()
        _accepted[key] = (checked, limits)
    return checked


def _check(grid: Any, block: Any, shmem: Any, limits: LaunchLimits
           ) -> tuple[tuple[int, int, int], tuple[int, int, int], int]:
    g, b = _dims("grid", grid), _dims("block", block)
    threads = b[0] * b[1] * b[2]
    if threads > limits.max_threads_per_block:
        raise InvalidLaunchConfig(
            f"the block {block!r} has {threads} threads; a block holds at most "
            f"{limits.max_threads_per_block} threads on this device. Use fewer threads per "
            "block and more blocks")
    for what, dims, top in (("block", b, limits.max_block_dim), ("grid", g, limits.max_grid_dim)):
        for axis, value, limit in zip(_AXES, dims, top, strict=True):
            if value > limit:
                raise InvalidLaunchConfig(
                    f"the {what}'s {axis} dimension is {value}; this device allows at most "
                    f"{limit} on {axis}. Spread the work over the other dimensions")
    if isinstance(shmem, bool) or not isinstance(shmem, numbers.Integral) or int(shmem) < 0:
        raise InvalidLaunchConfig(f"dynamic shared memory {shmem!r} is not a non-negative int "
                                  "of bytes")
    nbytes = int(shmem)
    if nbytes > limits.max_shared_memory_per_block:
        raise InvalidLaunchConfig(
            f"the launch asks for {nbytes} bytes of dynamic shared memory; a launch may "
            f"ask for at most {limits.max_shared_memory_per_block} bytes on this device")
    return g, b, nbytes
