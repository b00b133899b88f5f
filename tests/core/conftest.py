"""Fixtures of the core tests: the resources and the runtime over the simulated driver.

Nothing here imports Numba; every test runs on the CPU against
:class:`~numba_streamsafe._driver.sim.SimDriver`, whose happens-before checker
lists every unordered pair of conflicting accesses in ``sim.hazards``.
"""

from __future__ import annotations

import pytest

from numba_streamsafe._driver.sim import SimDriver
from numba_streamsafe.resources import AsyncResource
from numba_streamsafe.runtime import DeviceRuntime


@pytest.fixture
def sim() -> SimDriver:
    """A fresh simulated device (no host backing: the core never touches the bytes)."""
    return SimDriver(backing=False)


@pytest.fixture
def res(sim: SimDriver) -> AsyncResource:
    """The tracking resource over ``sim`` (lazy fences, the default)."""
    return AsyncResource(sim)


@pytest.fixture
def rt(res: AsyncResource) -> DeviceRuntime:
    """An owned runtime over ``res`` (not installed process-wide)."""
    return DeviceRuntime(res)


@pytest.fixture
def two_streams(sim: SimDriver) -> tuple[int, int]:
    return sim.create_stream(), sim.create_stream()


@pytest.fixture
def four_streams(sim: SimDriver) -> tuple[int, int, int, int]:
    return tuple(sim.create_stream() for _ in range(4))  # type: ignore[return-value]

