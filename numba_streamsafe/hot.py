"""The compiled hot path (``numba_streamsafe._hot``), when it is built and not
switched off.

The C module does, over the same Python objects, what these pure-Python
functions do: :meth:`AsyncResource.preflight
<numba_streamsafe.resources.AsyncResource.preflight>` and ``commit``, and a
tracked kernel's whole direct launch (argument resolution, the wait
decisions, packing, ``cuLaunchKernel`` called through libcuda, commit) for
launches whose arrays and streams it has seen before. Whatever it does not
cover it hands back, untouched, to the Python path.

``NUMBA_STREAMSAFE_PURE_PYTHON=1`` (read at import) leaves the module unused:
everything then runs the pure-Python code, which is the reference the
compiled path is tested against.
"""

from __future__ import annotations

import os
from types import ModuleType

__all__ = ["hot", "pure_python"]

#: Whether the pure-Python path was asked for (``NUMBA_STREAMSAFE_PURE_PYTHON``).
pure_python = os.environ.get("NUMBA_STREAMSAFE_PURE_PYTHON", "0").strip() not in ("", "0")

hot: ModuleType | None = None
if not pure_python:
    try:
        from numba_streamsafe import _hot as hot  # type: ignore[attr-defined, no-redef]
    except ImportError:  # not built (a source checkout without a compiler): pure Python
        hot = None
