"""The initializer of :mod:`test_engine_builds`' child processes: it picks the
engine's build before anything imports the package (so it imports nothing
of it)."""

from __future__ import annotations

import os


def choose_build(pure: str) -> None:
    """``NUMBA_STREAMSAFE_PURE_PYTHON=pure`` in this child process."""
    os.environ["NUMBA_STREAMSAFE_PURE_PYTHON"] = pure
