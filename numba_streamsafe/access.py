"""Access kinds and their lattice.

``Access.READ | Access.WRITE == Access.READ_WRITE``: merging two declared uses
of one block in a launch gives the join of the two.
"""

from __future__ import annotations

import enum

__all__ = ["Access", "Read", "Write", "ReadWrite", "as_access"]


class Access(enum.IntFlag):
    """How a launch or copy uses a block."""

    READ = 1
    WRITE = 2
    READ_WRITE = 3

    @property
    def reads(self) -> bool:
        return bool(self & Access.READ)

    @property
    def writes(self) -> bool:
        return bool(self & Access.WRITE)


#: Annotation markers for :func:`numba_streamsafe.tracked_kernel` arguments.
Read = Access.READ
Write = Access.WRITE
ReadWrite = Access.READ_WRITE

_NAMES = {
    "r": Access.READ,
    "read": Access.READ,
    "w": Access.WRITE,
    "write": Access.WRITE,
    "rw": Access.READ_WRITE,
    "readwrite": Access.READ_WRITE,
    "read_write": Access.READ_WRITE,
}


def as_access(value: object) -> Access:
    """Normalise an :class:`Access`, or a name such as ``"r"``, ``"w"``, ``"rw"``.

    Raises
    ------
    ValueError
        If ``value`` names no access kind.
    """
    if isinstance(value, Access):
        if value not in (Access.READ, Access.WRITE, Access.READ_WRITE):
            raise ValueError(f"{value!r} is not an access kind; use Read, Write or ReadWrite")
        return value
    if isinstance(value, str):
        key = value.strip().lower().rsplit(".", 1)[-1]
        if key in _NAMES:
            return _NAMES[key]
    raise ValueError(
        f"{value!r} is not an access kind; use Read, Write, ReadWrite or one of {sorted(_NAMES)}"
    )
