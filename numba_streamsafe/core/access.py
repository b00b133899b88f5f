"""Access kinds and their lattice.

``Access.READ | Access.WRITE == Access.READ_WRITE``: merging two declared uses
of one block in a launch gives the join of the two. Access is an ``IntEnum``
so that the bit tests on the launch path are plain integer operations.
"""

from __future__ import annotations

import enum

from numba_streamsafe.core.errors import InvalidArgument

__all__ = ["Access", "Read", "Write", "ReadWrite", "as_access", "annotation_access"]


class Access(enum.IntEnum):
    """How a launch or copy uses a block."""

    READ = 1
    WRITE = 2
    READ_WRITE = 3

    @property
    def reads(self) -> bool:
        return bool(self & 1)

    @property
    def writes(self) -> bool:
        return bool(self & 2)

    def join(self, other: Access) -> Access:
        """The lattice join: the access that covers both."""
        return Access(self | other)


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
    InvalidArgument
        If ``value`` names no access kind.
    """
    if value.__class__ is Access:
        return value  # type: ignore[return-value]
    if isinstance(value, int) and not isinstance(value, bool) and value in (1, 2, 3):
        return Access(value)
    if isinstance(value, str):
        key = value.strip().lower().rsplit(".", 1)[-1]
        if key in _NAMES:
            return _NAMES[key]
    raise InvalidArgument(
        f"{value!r} is not an access kind; use Read, Write, ReadWrite or one of {sorted(_NAMES)}"
    )


def annotation_access(annotation: object) -> Access | None:
    """The access a parameter's annotation declares (``Read``, ``"r"``, or
    such a name quoted, as an unresolved annotation under ``from __future__
    import annotations`` arrives), or None when it declares none."""
    if isinstance(annotation, Access):
        return annotation
    if isinstance(annotation, str):
        text = annotation.strip()
        if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
            text = text[1:-1]
        try:
            return as_access(text)
        except ValueError:
            return None
    return None
