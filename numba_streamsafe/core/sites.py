"""Where the user's code called the library: the innermost frame outside this
package and Numba, for the race reports (check mode's and the simulator's).

Part of the engine (:mod:`numba_streamsafe.compiled`), written in Cython's
pure-Python mode (C declarations in ``sites.pxd``): check mode's compiled
launch asks for the site of every launch.
"""

from __future__ import annotations

import os
import sys

import cython

__all__ = ["user_site", "site_text", "COMPILED"]

#: Whether this module runs compiled (else it runs as Python source).
COMPILED: bool = cython.compiled

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_NUMBA: str | None = None
#: Per file name: whether it is the library's or Numba's (looked at once). Keyed
#: by the name, whose hash the string keeps, not by the code object, whose hash is
#: computed anew from its contents at every lookup.
_ours: dict[str, bool] = {}


def _is_ours(path: str) -> bool:
    global _NUMBA
    if _NUMBA is None:
        import numba

        _NUMBA = os.path.dirname(os.path.dirname(os.path.abspath(numba.__file__)))
    path = os.path.abspath(path)
    return (path.startswith(_PACKAGE) or path.startswith(_NUMBA) or "numba_cuda" in path
            or path.startswith("<frozen"))


def user_site() -> tuple[str, int] | None:
    """``(file, line)`` of the innermost caller outside this package and Numba,
    or None. Cheap once each code object on the way was looked at."""
    frame = sys._getframe(0)  # this function's own when run as Python: the package's
    ours = _ours
    while frame is not None:
        name = frame.f_code.co_filename
        mine = ours.get(name)
        if mine is None:
            mine = ours[name] = _is_ours(name)
        if not mine:
            return name, frame.f_lineno
        frame = frame.f_back  # type: ignore[assignment]
    return None


def site_text(site: tuple[str, int] | None) -> str | None:
    """``file:line`` of a :func:`user_site`."""
    return None if site is None else f"{site[0]}:{site[1]}"


def user_site_of(frames: object) -> tuple[str, int] | None:
    """``(file, line)`` of the innermost of ``frames`` outside this package and
    Numba: ``[(code or file name, line), ...]`` innermost first, as the driver
    observer keeps a caller's stack; None for no frames or none of the user's."""
    if not frames:
        return None
    for code, line in frames:  # type: ignore[attr-defined]
        name = getattr(code, "co_filename", code)
        mine = _ours.get(name)
        if mine is None:
            mine = _ours[name] = _is_ours(name)
        if not mine:
            return name, line
    return None
