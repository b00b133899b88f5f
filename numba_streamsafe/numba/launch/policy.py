"""The Numba layer's switches for one runtime: whether launches are fenced and
whether covered overloads launch directly.

Part of the engine (:mod:`numba_streamsafe.compiled`), written in Cython's
pure-Python mode (C declarations in ``policy.pxd``): the compiled launch
reads the switches as C fields.
"""

from __future__ import annotations

import weakref
from typing import Any

import cython

from numba_streamsafe.core.settings import settings
from numba_streamsafe.runtime import DeviceRuntime

__all__ = ["LaunchPolicy", "launch_policy", "COMPILED"]

#: Whether this module runs compiled (else it runs as Python source).
COMPILED: bool = cython.compiled


@cython.cclass
class LaunchPolicy:
    """How tracked kernels and copies launch on one runtime.

    Attributes
    ----------
    tracking : bool
        When False, tracked kernels and copies launch without waits or marks,
        as plain Numba would (to show races; see :func:`numba_streamsafe.tracking`).
        A runtime whose stack cannot track (``DirectResource``) starts with it
        off. In check mode (``NUMBA_STREAMSAFE_MODE=check``) the tracking
        resource checks the uses instead of ordering them.
    direct_launch : bool
        When True, tracked kernels launch covered overloads with one
        ``cuLaunchKernel`` (:mod:`numba_streamsafe.numba.launch.launch_plan`) instead of
        Numba's launch path. Needs a driver that launches
        (``Driver.supports_direct_launch``); ``NUMBA_STREAMSAFE_DIRECT_LAUNCH=0``
        turns it off.
    """

    def __init__(self, rt: Any) -> None:
        self.tracking = rt.resource.supports_tracking()
        self.direct_launch = rt.driver.supports_direct_launch and settings().direct_launch

    def __repr__(self) -> str:
        return f"<LaunchPolicy tracking={self.tracking} direct_launch={self.direct_launch}>"


#: id(runtime) -> its policy; an entry goes with its runtime.
_policies: dict[int, LaunchPolicy] = {}


def launch_policy(rt: DeviceRuntime) -> LaunchPolicy:
    """The launch policy of ``rt``, made on first use and kept for its lifetime."""
    policy = _policies.get(id(rt))
    if policy is None:
        policy = _policies[id(rt)] = LaunchPolicy(rt)
        weakref.finalize(rt, _policies.pop, id(rt), None)
    return policy
