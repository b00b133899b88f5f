"""The library's part of a plain kernel's first launch, timed where it runs:
the access inference of the kernel (``numba_streamsafe.numba.accesses.inference``)
and the launch plan of the overload (``launch_plan.build_plan``). For the
benchmarks that run plain kernels under the plugin (``first_launch.py``,
``real_programs.py``); importing this module imports neither Numba nor the
library.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def time_first_launch_work(add: Callable[[str, float], None]) -> None:
    """From now on, each access inference and launch plan of this process
    reports its seconds to ``add(label, seconds)``, ``label`` being
    ``"inference"`` or ``"plan"``."""
    from numba_streamsafe.numba.accesses import inference
    from numba_streamsafe.numba.launch import launch_plan

    def timed(fn: Callable[..., Any], label: str) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                add(label, time.perf_counter() - start)
        return wrapper

    inference._Walker.run = timed(inference._Walker.run, "inference")
    launch_plan.build_plan = timed(launch_plan.build_plan, "plan")
