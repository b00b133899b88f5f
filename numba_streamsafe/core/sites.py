"""Where the user's code called the library: the user's frames of the
calling thread's stack (a *stack*), for the race reports (check mode's, a
race check's and the simulator's).

A stack is a tuple of ``(file name, line)`` pairs, the innermost frame
first, of at most :func:`stack_depth` frames (``NUMBA_STREAMSAFE_STACK_DEPTH``).
The user's frames are those outside this package, Numba and the installed
libraries (the ``site-packages`` Numba is installed in) and the standard
library; the walk stops at a test runner's frames (pytest's, pluggy's,
``runpy``'s), below which no frame is the user's. A stack is captured as
plain values, with no text made: the reports format it when a race is
reported (:mod:`numba_streamsafe.core.hazards`).

Part of the engine (:mod:`numba_streamsafe.compiled`), written in Cython's
pure-Python mode (C declarations in ``sites.pxd``): check mode's compiled
launch captures the stack of every launch, since a race found later names
the earlier side.
"""

from __future__ import annotations

import os
import sys
import sysconfig

import cython

__all__ = ["user_stack", "set_stack_depth", "stack_depth", "Stack", "DEFAULT_DEPTH",
           "COMPILED"]

#: Whether this module runs compiled (else it runs as Python source).
COMPILED: bool = cython.compiled

#: A stack: ``(file name, line)`` of each of the user's frames, innermost first.
Stack = tuple

#: Frames a stack keeps when the setting does not say.
DEFAULT_DEPTH = 8

_depth = cython.declare(cython.Py_ssize_t, DEFAULT_DEPTH)

#: Per file name, what its frames are: the user's (0), the library's or
#: another installed module's (1: skipped), a test runner's (2: the walk
#: stops). Looked at once per name; keyed by the name, whose hash the string
#: keeps, not by the code object, whose hash is computed anew at every lookup.
_kinds: dict = {}
_USER = cython.declare(cython.int, 0)
_SKIP = cython.declare(cython.int, 1)
_STOP = cython.declare(cython.int, 2)

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_roots: tuple | None = None
_RUNNERS = (os.sep + "_pytest" + os.sep, os.sep + "pluggy" + os.sep,
            os.sep + "runpy.py", "<frozen runpy>")


def _skipped_roots() -> tuple:
    """The folders whose files are not the user's: this package, the
    ``site-packages`` Numba lies in, and the standard library."""
    global _roots
    if _roots is None:
        import numba

        roots = [_PACKAGE,
                 os.path.dirname(os.path.dirname(os.path.abspath(numba.__file__)))]
        for key in ("stdlib", "platstdlib"):
            path = sysconfig.get_paths().get(key)
            if path:
                roots.append(os.path.abspath(path))
        _roots = tuple(roots)
    return _roots


def _kind_of(path: str) -> int:
    """What the frames of the file ``path`` are (see ``_kinds``)."""
    for runner in _RUNNERS:
        if runner in path:
            return _STOP
    if path.startswith("<frozen") or "numba_cuda" in path:
        return _SKIP
    full = os.path.abspath(path)
    for root in _skipped_roots():
        if full.startswith(root + os.sep) or full == root:
            return _SKIP
    return _USER


def set_stack_depth(depth: int) -> None:
    """Keep at most ``depth`` frames per stack from now on (``0``: none; the
    reports then name no line). :func:`~numba_streamsafe.core.settings.reload_settings`
    sets it from ``NUMBA_STREAMSAFE_STACK_DEPTH``."""
    global _depth
    _depth = depth


def stack_depth() -> int:
    """The frames a stack keeps at most."""
    return _depth


@cython.ccall
def user_stack() -> tuple:
    """The calling thread's stack: ``(file, line)`` of each of the user's
    frames, innermost first, at most :func:`stack_depth` of them (an empty
    tuple where none is found). No text is made; each file name is looked at
    once."""
    out: list = []
    n: cython.Py_ssize_t = 0
    depth: cython.Py_ssize_t = _depth
    if depth <= 0:
        return ()
    kinds: dict = _kinds
    frame = sys._getframe(0)  # this function's own when run as Python: the package's
    while frame is not None:
        name = frame.f_code.co_filename
        kind = kinds.get(name)
        if kind is None:
            kind = kinds[name] = _kind_of(name)
        if kind == _USER:
            out.append((name, frame.f_lineno))
            n += 1
            if n >= depth:
                break
        elif kind == _STOP:
            break
        frame = frame.f_back  # type: ignore[assignment]
    return tuple(out)
