"""Where the user's code called the library: the user's frames of the
calling thread's stack (a *stack*), for the race reports (check mode's, a
race check's and the simulator's).

A stack is a tuple of ``(file name, line)`` pairs, the innermost frame
first, of at most :func:`stack_depth` frames (``NUMBA_STREAMSAFE_STACK_DEPTH``):
what :func:`user_stack` returns, and what the reports and whoever feeds them
(a driver-level observer, say) hand around. The user's frames are those
outside this package, Numba and the installed libraries (the
``site-packages`` Numba is installed in) and the standard library; the walk
stops at a test runner's frames (pytest's, pluggy's, ``runpy``'s), below
which no frame is the user's.

The launch paths capture with :func:`capture_stack` instead, which makes no
text and looks up no line: a flat tuple ``(code, offset, code, offset, ...)``
of each frame's code object and last instruction. :func:`resolve_stack`
turns it into the pairs when a race is reported, and takes either form.

Part of the engine (:mod:`numba_streamsafe.compiled`), written in Cython's
pure-Python mode (C declarations in ``sites.pxd``, with the compiled walk
over the frames): check mode's compiled launch captures the stack of every
launch, since a race found later names the earlier side.
"""

from __future__ import annotations

import os
import sys
import sysconfig

import cython

from numba_streamsafe.core import settings as _settings

__all__ = ["capture_stack", "user_stack", "resolve_stack", "user_frames", "set_stack_depth",
           "stack_depth", "Stack", "DEFAULT_DEPTH", "COMPILED"]

#: Whether this module runs compiled (else it runs as Python source).
COMPILED: bool = cython.compiled

#: A stack: ``(file name, line)`` of each of the user's frames, innermost first.
Stack = tuple

#: Frames a stack keeps when the setting does not say.
DEFAULT_DEPTH = _settings.DEFAULT_DEPTH

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


def _take(config: _settings.Settings) -> None:
    """The depth of newly read settings (``NUMBA_STREAMSAFE_STACK_DEPTH``)."""
    set_stack_depth(config.stack_depth)


_settings.on_reload.append(_take)
if _settings.loaded() is not None:
    _take(_settings.loaded())  # type: ignore[arg-type]


def stack_depth() -> int:
    """The frames a stack keeps at most."""
    return _depth


@cython.ccall
def capture_stack() -> tuple:
    """The calling thread's user frames, innermost first, at most
    :func:`stack_depth` of them, unresolved: ``(code, offset, ...)`` (an empty
    tuple where none is found). No text is made and no line looked up; each
    file name is classified once. :func:`resolve_stack` gives the pairs."""
    if _depth <= 0:
        return ()
    if cython.compiled:
        return nss_capture_stack(  # type: ignore[name-defined]  # noqa: F821 (sites.pxd)
            _kinds, _depth, _kind_of)
    out: list = []
    n: cython.Py_ssize_t = 0
    kinds: dict = _kinds
    frame = sys._getframe(0)  # this function's own: the package's, skipped
    while frame is not None and n < _depth:
        code = frame.f_code
        kind = kinds.get(code.co_filename)
        if kind is None:
            kind = kinds[code.co_filename] = _kind_of(code.co_filename)
        if kind == _STOP:
            break
        if kind == _USER:
            out.append(code)
            out.append(frame.f_lasti)
            n += 1
        frame = frame.f_back  # type: ignore[assignment]
    return tuple(out)


def user_stack() -> tuple:
    """The calling thread's stack: ``(file, line)`` of each of the user's
    frames, innermost first, at most :func:`stack_depth` of them (an empty
    tuple where none is found)."""
    return resolve_stack(capture_stack())


#: ``(code, offset)`` -> its line, for :func:`resolve_stack` (the code objects
#: are kept by the stacks that name them).
_lines: dict = {}


def resolve_stack(stack: tuple | None) -> tuple:
    """``stack`` as ``(file, line)`` pairs: a stack :func:`capture_stack`
    made is resolved; pairs (or None: an empty stack) are returned as they are."""
    if not stack:
        return ()
    if stack[0].__class__ is tuple:
        return stack
    out = []
    for i in range(0, len(stack) - 1, 2):
        code, offset = stack[i], stack[i + 1]
        out.append((code.co_filename, _line_of(code, offset)))
    return tuple(out)


def _line_of(code: object, offset: int) -> int:
    """The line of the instruction at byte ``offset`` of ``code`` (as
    ``frame.f_lineno`` reads it)."""
    key = (code, offset)
    line = _lines.get(key)
    if line is None:
        line = 0
        for start, end, number in code.co_lines():  # type: ignore[attr-defined]
            if start <= offset < end:
                line = number if number is not None else 0
                break
        if not line:
            line = code.co_firstlineno  # type: ignore[attr-defined]
        if len(_lines) > 65536:
            _lines.clear()
        _lines[key] = line
    return line  # type: ignore[no-any-return]


def user_frames(frames: object) -> tuple:
    """``frames`` (``[(code or file name, line), ...]``, innermost first, every
    frame: as the driver observer keeps a caller's stack) as a stack: the
    user's frames, at most :func:`stack_depth` of them, up to a test runner's."""
    if not frames:
        return ()
    out: list = []
    kinds: dict = _kinds
    for code, line in frames:  # type: ignore[attr-defined]
        if len(out) >= _depth:
            break
        name = getattr(code, "co_filename", code)
        kind = kinds.get(name)
        if kind is None:
            kind = kinds[name] = _kind_of(name)
        if kind == _STOP:
            break
        if kind == _USER:
            out.append((name, line))
    return tuple(out)
