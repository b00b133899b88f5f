"""Where the examples run: the GPU when the CUDA driver finds one, else Numba's CUDA simulator.

Import this module before anything imports ``numba.cuda``: without a GPU it sets
``NUMBA_ENABLE_CUDASIM=1``, and the library then runs over its simulated driver,
whose checker reports every unordered pair of accesses (a race).
"""

from __future__ import annotations

import os
from typing import Any

from gpu_present import gpu_present

if "NUMBA_ENABLE_CUDASIM" not in os.environ and not gpu_present():
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

from numba import config  # noqa: E402

import numba_streamsafe as nss  # noqa: E402

#: True when the kernels run on Numba's CUDA simulator (no GPU).
SIMULATOR = bool(config.ENABLE_CUDASIM)


def launch_shape(n: int) -> tuple[int, int]:
    """Grid and block for a grid-stride kernel over ``n`` items.

    A few threads on the simulator (each one is a Python thread there); on a
    GPU one thread per item, up to 16 blocks of 256 per SM of an H100.
    """
    if SIMULATOR:
        return 2, 16
    return max(1, min((n + 255) // 256, 132 * 16)), 256


def host_sync(stream: Any) -> None:
    """Wait on the host for ``stream`` (on the simulator, tell the simulated driver too,
    so its checker knows that the host now comes after the stream's work)."""
    if SIMULATOR:
        rt = nss.get_runtime()
        rt.driver.stream_synchronize(rt.stream_handle(stream))
    else:
        stream.synchronize()


def race_text(index: int) -> str | None:
    """The simulated driver's report of the race numbered ``index`` (None if none)."""
    found = list(getattr(nss.get_runtime().driver, "hazards", ()))
    return str(found[index]) if index < len(found) else None


def hazards_now() -> int:
    """How many races the simulated driver has seen so far (0 on a GPU, which has no checker)."""
    return len(getattr(nss.get_runtime().driver, "hazards", ()))
