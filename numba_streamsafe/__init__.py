"""numba_streamsafe: stream-ordered, cross-stream-safe device memory for Numba CUDA.

The core (``resources``, ``runtime``, ``recorder``) needs no Numba; the Numba
layer (``tracked_kernel``, the array helpers and the memory-manager plugin) is
imported on first use. ``NUMBA_CUDA_MEMORY_MANAGER=numba_streamsafe`` makes
Numba allocate through this package (``_numba_memory_manager``).
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

# First: it decides which build of the engine the imports below load.
from numba_streamsafe import compiled as _compiled  # noqa: F401
from numba_streamsafe.core import settings as _settings
from numba_streamsafe.core.access import Access, Read, ReadWrite, Write
from numba_streamsafe.core.blocks import Block, BlockId, BlockState, Generation
from numba_streamsafe.core.errors import (
    AccessMismatch,
    AccessWarning,
    DriverError,
    InvalidArgument,
    InvalidLaunchConfig,
    InvalidSetting,
    OutOfBounds,
    OutOfBudget,
    OutOfMemory,
    PeerAccessRequired,
    RaceDetected,
    StaleContext,
    StreamMisuse,
    StreamSafeError,
    UseAfterFree,
)
from numba_streamsafe.diagnostics import races as _races
from numba_streamsafe.diagnostics.memstats import memory_stats, reset_peak_stats
from numba_streamsafe.diagnostics.races import RaceCheck, hazards, race_check
from numba_streamsafe.diagnostics.recorder import (
    LaunchRecorder,
    RecorderMode,
    UncommittedLaunchWarning,
)
from numba_streamsafe.graphs import Graph, GraphCaptureError, graph
from numba_streamsafe.resources import (
    POOL_KEEP_ALL,
    AsyncResource,
    BudgetResource,
    DebugGuardResource,
    DirectResource,
    LoggingResource,
    MemoryResource,
    RmmUpstream,
)
from numba_streamsafe.runtime import (
    DeviceRuntime,
    enable_peer_access,
    get_runtime,
    set_runtime,
)

__version__ = "0.1.0"

if not (_compiled.pure_python or _compiled.python_build) and not sys.modules[
        "numba_streamsafe.resources.tracking.rules"].COMPILED:
    import warnings

    warnings.warn(
        "numba_streamsafe's compiled engine is not built, so it runs as Python: correct, with "
        "slower launches and allocations. Reinstall with a C compiler present (Cython is a "
        "build requirement) for the compiled engine, or set NUMBA_STREAMSAFE_PURE_PYTHON=1 to "
        "choose the Python build and silence this; `python -m numba_streamsafe` says which "
        "build runs", RuntimeWarning, stacklevel=2)

if "numba.cuda" in sys.modules and os.environ.get("NUMBA_ENABLE_CUDASIM", "0").strip() not in (
        "", "0"):
    # Numba's CUDA simulator has no memory managers: give it the plugin's routing
    # when the plugin is selected (numba_streamsafe.numba.sim_plugin). When
    # numba.cuda is not imported yet, the Numba layer does this on import.
    import numba_streamsafe.numba.arrays  # noqa: F401 - routes the simulator's calls
if os.environ.get("NUMBA_ENABLE_CUDASIM", "0").strip() not in ("", "0") and os.environ.get(
        "NUMBA_CUDA_MEMORY_MANAGER", "").strip() == "numba_streamsafe":
    # The plugin is selected on the simulator, which never loads plugins: its
    # module routes Numba's calls and turns transparent mode on.
    import numba_streamsafe.numba.emm  # noqa: F401

#: Check mode (``NUMBA_STREAMSAFE_MODE=check``): the races of the whole process
#: are reported (raised at the first, or summarised at exit), and the program's
#: own ordering made through Numba is followed from the Numba layer's first use.
#: Every setting is read here: a bad one is refused now, in one line
#: (InvalidSetting), also when Numba imports this package as its memory manager.
#: On the simulator the hazards its checker finds that no race check collected
#: are summarised at exit.
try:
    _races.start_reports()
    _CHECK = _races.start_check_mode() is not None
except InvalidSetting:
    if not _settings.reporting():
        raise
    _CHECK = False  # python -m numba_streamsafe lists the bad setting


def _follow_numba() -> None:
    """Hook Numba's events and synchronises: a race check that watches a GPU
    in ordering mode counts them as the program's ordering."""
    importlib.import_module("numba_streamsafe.numba.transparent").install()


_races.on_watch.append(_follow_numba)

_LAZY = {
    # Imported on first use: a program that never traces does not pay for it.
    "trace": "numba_streamsafe.diagnostics.tracing",
    "Trace": "numba_streamsafe.diagnostics.tracing",
    "tracked_kernel": "numba_streamsafe.numba.launch.kernel",
    "TrackedKernel": "numba_streamsafe.numba.launch.kernel",
    "device_array": "numba_streamsafe.numba.arrays",
    "to_device": "numba_streamsafe.numba.arrays",
    "copy_to_host": "numba_streamsafe.numba.arrays",
    "copy": "numba_streamsafe.numba.arrays",
    "memset": "numba_streamsafe.numba.arrays",
    "block_of": "numba_streamsafe.numba.arrays",
    "lend": "numba_streamsafe.numba.interop.boundaries",
    "import_array": "numba_streamsafe.numba.interop.imports",
    "from_dlpack": "numba_streamsafe.numba.interop.imports",
    "from_cuda_array_interface": "numba_streamsafe.numba.interop.imports",
    "export_interface": "numba_streamsafe.numba.interop.boundaries",
    "stream_scope": "numba_streamsafe.numba.scope",
    "current_stream": "numba_streamsafe.numba.scope",
    "tracking": "numba_streamsafe.numba.scope",
    "transparent": "numba_streamsafe.numba.scope",
    "use_device": "numba_streamsafe.numba.scope",
    "StreamSafeMemoryManager": "numba_streamsafe.numba.emm",
    "_numba_memory_manager": "numba_streamsafe.numba.emm",
}

__all__ = [
    "graph",
    "Graph",
    "GraphCaptureError",
    "race_check",
    "RaceCheck",
    "RaceDetected",
    "hazards",
    "memory_stats",
    "reset_peak_stats",
    "Access",
    "Read",
    "Write",
    "ReadWrite",
    "Block",
    "BlockId",
    "BlockState",
    "Generation",
    "StreamSafeError",
    "AccessMismatch",
    "AccessWarning",
    "DriverError",
    "InvalidArgument",
    "InvalidLaunchConfig",
    "InvalidSetting",
    "OutOfMemory",
    "OutOfBudget",
    "StreamMisuse",
    "UseAfterFree",
    "StaleContext",
    "OutOfBounds",
    "PeerAccessRequired",
    "MemoryResource",
    "AsyncResource",
    "RmmUpstream",
    "POOL_KEEP_ALL",
    "DirectResource",
    "LoggingResource",
    "BudgetResource",
    "DebugGuardResource",
    "DeviceRuntime",
    "get_runtime",
    "set_runtime",
    "enable_peer_access",
    "LaunchRecorder",
    "RecorderMode",
    "UncommittedLaunchWarning",
    *[name for name in _LAZY if not name.startswith("_")],
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'numba_streamsafe' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    if _CHECK and module.startswith("numba_streamsafe.numba."):
        # Numba's events and synchronises are followed, plugin selected or not.
        importlib.import_module("numba_streamsafe.numba.transparent").install()
    globals()[name] = value
    return value
