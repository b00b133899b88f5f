"""Declared accesses checked against the kernel's IR, and inferred ones.

At a tracked kernel's first launch (before anything is queued),
:func:`prepare` compares each declared access with what the kernel does
(:mod:`numba_streamsafe.numba.accesses.inference`):

* a parameter declared ``Read`` that the kernel writes raises
  :class:`~numba_streamsafe.core.errors.AccessMismatch` (kernel, parameter,
  ``file:line`` of the write);
* a parameter declared ``Write`` or ``ReadWrite`` that the kernel never
  writes gives an :class:`~numba_streamsafe.core.errors.AccessWarning` (it costs
  waits, not safety);
* with ``access="infer"``, every parameter without a declaration takes the
  inferred access when it is given an array.

A write the analysis only assumed (an argument passed to a call it cannot
see into) is not an error: it warns that the declaration could not be
verified.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any

from numba_streamsafe.core.access import Access
from numba_streamsafe.core.errors import AccessMismatch, AccessWarning, InvalidArgument
from numba_streamsafe.numba.accesses.inference import ParamUse, infer_params

__all__ = ["prepare", "inferred", "is_array", "user_stacklevel"]

Params = tuple[tuple[str, Access | None], ...]


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes a warning raised by the caller name the
    user's line: the first frame outside this package."""
    level, frame = 2, sys._getframe(2)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE):
        level += 1
        frame = frame.f_back  # type: ignore[assignment]
    return level


def is_array(arg: Any) -> bool:
    """Whether a kernel argument is an array (host, device or foreign)."""
    return (hasattr(arg, "__cuda_array_interface__") or hasattr(arg, "__array_interface__")
            or hasattr(arg, "gpu_data"))


def arrays_in(arg: Any) -> list[Any]:
    """The arrays a kernel argument passes: itself when it is one, the arrays
    inside it when it is a tuple (namedtuples and nested tuples too)."""
    if isinstance(arg, tuple):
        return [a for member in arg for a in arrays_in(member)]
    return [arg] if is_array(arg) else []


def holds_arrays(arg: Any) -> bool:
    """Whether a kernel argument is an array or a tuple with an array inside."""
    return bool(arrays_in(arg))


def _check(kernel: str, params: Params, uses: tuple[ParamUse, ...]) -> None:
    for (name, declared), use in zip(params, uses, strict=True):
        if declared is None:
            continue
        if declared is Access.READ and use.written:
            if use.why is None:
                raise AccessMismatch(kernel, name, use.where)
            warnings.warn(
                f"kernel {kernel!r}: cannot verify that parameter {name!r} (declared Read) is "
                f"not written: it is {use.why} at {use.where}. Declare it ReadWrite if that "
                "call writes it", AccessWarning, stacklevel=user_stacklevel())
        elif declared & Access.WRITE and not use.written:
            why = "" if use.read else (" (the kernel does not touch it; an array parameter "
                                       "still needs an access in strict mode)")
            warnings.warn(
                f"kernel {kernel!r} never writes parameter {name!r}, declared "
                f"{'ReadWrite' if declared is Access.READ_WRITE else 'Write'}: declare it "
                f"Read{why} to spare waits", AccessWarning, stacklevel=user_stacklevel())


def inferred(py_func: Any) -> dict[str, Access | None]:
    """The inferred access per parameter; empty when the IR cannot be read."""
    try:
        return {u.name: u.access for u in infer_params(py_func)}
    except Exception:
        return {}


def prepare(kernel: str, py_func: Any, params: Params, args: tuple[Any, ...], *,
            infer: bool, check: bool) -> Params:
    """The parameters' accesses to launch with: checked when ``check``, with
    the undeclared ones inferred when ``infer`` (for the arguments of this,
    the first, launch).

    Raises
    ------
    AccessMismatch
        ``check`` and a parameter declared Read is written.
    InvalidArgument
        ``infer`` and the kernel's IR cannot be read.
    """
    try:
        uses = infer_params(py_func)
    except Exception as exc:
        if infer:
            raise InvalidArgument(
                f"kernel {kernel!r}: access='infer' cannot read the kernel's IR ({exc}); "
                "declare its parameters' accesses instead") from exc
        warnings.warn(f"kernel {kernel!r}: its declared accesses are not checked: the IR "
                      f"could not be read ({exc})", AccessWarning, stacklevel=user_stacklevel())
        return params
    if check:
        _check(kernel, params, uses)
    if not infer:
        return params
    out = []
    for (name, declared), use, arg in zip(params, uses, args, strict=True):
        if declared is None and holds_arrays(arg):
            declared = use.access
        out.append((name, declared))
    return tuple(out)
