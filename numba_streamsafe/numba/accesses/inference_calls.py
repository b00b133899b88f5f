"""What the access inference knows of the calls a kernel makes: the calls
that only read their array arguments, Numba's atomics, device functions, and
attribute lookups that see through Numba's CUDA simulator
(:mod:`numba_streamsafe.numba.accesses.inference`)."""

from __future__ import annotations

import cmath
import math
import operator
from collections.abc import Callable
from typing import Any

__all__ = ["MISSING", "METADATA_CALLS", "atomics", "resolve_attr", "device_py_func",
           "is_read_only_call"]

#: What :func:`resolve_attr` gives for an attribute it cannot find.
MISSING = object()

#: Calls that only read their array arguments (besides metadata-only ``len``).
_READ_ONLY_MODULES = (math, cmath)
METADATA_CALLS = frozenset({len})
_READ_ONLY_BUILTINS = frozenset({
    range, min, max, abs, int, float, bool, complex, round, sum, any, all, enumerate, zip,
    print, divmod, pow, isinstance, tuple, slice, reversed, hash, type, iter, next,
    operator.getitem, operator.add, operator.sub, operator.mul, operator.truediv,
    operator.floordiv, operator.mod, operator.neg, operator.pos,
})


def atomics() -> frozenset[Any]:
    try:
        from numba.cuda import stubs
    except ImportError:  # pragma: no cover - Numba is a dependency
        return frozenset()
    atomic = getattr(stubs, "atomic", None)
    if atomic is None:
        return frozenset()
    out = set()
    for name in dir(atomic):
        if not name.startswith("_"):
            try:
                out.add(getattr(atomic, name))
            except Exception:
                continue
    return frozenset(out)


def resolve_attr(base: Any, attr: str) -> Any:
    """``getattr(base, attr)``, or :data:`MISSING`. Under Numba's CUDA
    simulator the ``numba.cuda`` module a kernel names holds no device
    functions (the simulator swaps them in while a kernel runs): they are
    looked up in ``numba.cuda.stubs``, where the GPU target's come from too."""
    try:
        return getattr(base, attr)
    except Exception:
        pass
    if getattr(base, "__name__", None) == "numba.cuda":
        try:
            from numba.cuda import stubs

            return getattr(stubs, attr)
        except Exception:
            pass
    return MISSING


def device_py_func(value: Any) -> Callable[..., Any] | None:
    """The Python function of a CUDA device function (dispatcher or simulator kernel)."""
    py = getattr(value, "py_func", None)
    if py is not None and hasattr(py, "__code__"):
        return py  # type: ignore[no-any-return]
    return None


def is_read_only_call(value: Any) -> bool:
    if value in _READ_ONLY_BUILTINS:
        return True
    module = getattr(value, "__module__", None) or ""
    if any(value is getattr(m, getattr(value, "__name__", ""), None) for m in _READ_ONLY_MODULES):
        return True
    if isinstance(value, type) and value.__module__ == "builtins":
        return True
    # numba.cuda's thread-index and sync helpers, numpy's scalar and reading functions.
    if module.startswith(("numba.cuda", "numba_cuda")) and getattr(value, "__name__", "") in {
            "grid", "gridsize", "syncthreads", "syncwarp", "threadfence", "threadfence_block",
            "threadfence_system", "laneid", "warpsize", "nanosleep", "fma", "cbrt", "selp",
            "popc", "brev", "clz", "ffs", "activemask", "lanemask_lt"}:
        return True
    return module.startswith("numpy") and callable(value)
