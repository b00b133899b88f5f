"""A pytest plugin: each test that makes a race fails, with the race's report.

Installed with the package as a pytest entry point, and inert until asked
for: ``pytest --streamsafe``, or ``pytest -p numba_streamsafe.pytest_plugin``
(which also works where plugins are not loaded from entry points,
``PYTEST_DISABLE_PLUGIN_AUTOLOAD=1``). The entry point is the small module
``_numba_streamsafe_pytest`` (the option and that switch), which imports
this one only when asked: a session that does not ask imports nothing of
the package.

Once on, each test's setup, call and teardown run inside a race check that
collects every race found in them, where the library finds races:

* in check mode (``NUMBA_STREAMSAFE_MODE=check``), on a GPU or the simulator;
* on Numba's CUDA simulator, by its checker;
* on a GPU in ordering mode, by the race check (each wait the program's own
  ordering did not make needed; see :func:`numba_streamsafe.race_check`).

Races are found on the library's memory: its own arrays
(:func:`numba_streamsafe.to_device`, ``device_array``, ``@tracked_kernel``)
always, and Numba's own (``cuda.device_array``, ``cuda.to_device``, plain
``cuda.jit`` launches) where the library is Numba's memory manager
(``NUMBA_CUDA_MEMORY_MANAGER=numba_streamsafe``). Where it is not, the
header says so and the first test warns: a race between two of Numba's own
arrays fails no test there.

A race is found when its second access is queued, so it is the test that
queued it that fails (an error where it was the setup or the teardown),
with every race of that phase in full (both stacks, the allocation, the
streams, the fix) and the test's id. Frees the test left queued (arrays
it dropped) are made before its phase ends, so a free that races is the
test's too. Races a ``race_check`` block inside the test collected are the
test's own business and fail nothing. With ``NUMBA_STREAMSAFE_REPORT_FILE``
each race's JSON line names the test.

Each pytest-xdist worker is a process, checked on its own. Races found
outside every test (at the session's end, say) are left to the process's
exit report (``NUMBA_STREAMSAFE_CHECK_REPORT``).
"""

from __future__ import annotations

import warnings
from collections.abc import Generator
from typing import Any

import pytest

# The option and the switch, from the entry point's module: hooks of this module too, where
# -p loads it (NAME: this module's name, as -p names it, and the entry point's).
from _numba_streamsafe_pytest import NAME, pytest_addoption, pytest_configure  # noqa: F401
from numba_streamsafe.core.settings import settings
from numba_streamsafe.diagnostics import races
from numba_streamsafe.runtime import installed_devices, installed_runtime

__all__ = ["RacesInTest", "RacePlugin"]


class RacesInTest(AssertionError):
    """A test's phase made races that no ``race_check`` inside it collected.

    Attributes
    ----------
    nodeid : str
        The test.
    hazards : list of Hazard
        The races, in the order found.
    """

    def __init__(self, nodeid: str, when: str, hazards: list[Any]) -> None:
        self.nodeid = nodeid
        self.hazards = hazards
        phase = "" if when == "call" else f" (in its {when})"
        reports = "\n".join(f"{i + 1}. {h.report()}" for i, h in enumerate(hazards))
        super().__init__(
            f"numba_streamsafe: {nodeid} made {len(hazards)} race(s){phase}, each found when "
            f"the test queued its second access:\n{reports}")


class RacePlugin:
    """The plugin's hooks while it is on (registered by ``pytest_configure``)."""

    def __init__(self) -> None:
        #: Whether races can be found in this process (decided at the first test).
        self.active: bool | None = None

    def pytest_report_header(self, config: pytest.Config) -> str:
        return f"numba_streamsafe: each test that makes a race fails ({_where()})"

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Generator[None, Any, Any]:
        return (yield from self._phase(item, "setup"))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, Any, Any]:
        return (yield from self._phase(item, "call"))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item,
                                nextitem: pytest.Item | None) -> Generator[None, Any, Any]:
        return (yield from self._phase(item, "teardown"))

    def _phase(self, item: pytest.Item, when: str) -> Generator[None, Any, Any]:
        """Run one phase of ``item`` inside a race check; raise
        :class:`RacesInTest` for the races it made that nothing inside it
        collected (chained to the phase's own error, if it raised one)."""
        if self.active is False:
            return (yield)
        check = _PhaseCheck(stop_at_first=False)
        error: BaseException | None = None
        races.set_report_context(item.nodeid)
        try:
            with races.watching(check, warn_stacklevel=None):
                if self.active is None:
                    self.active = races.checking_anything()
                    if not self.active:
                        warnings.warn(pytest.PytestWarning(
                            "numba_streamsafe: no race can be found in this process (no GPU, "
                            "and not Numba's CUDA simulator), so no test fails for one; run "
                            f"under NUMBA_ENABLE_CUDASIM=1 {_SELECT} to check on the CPU"),
                            stacklevel=2)
                    elif not _numba_checked():
                        warnings.warn(pytest.PytestWarning(
                            f"numba_streamsafe: {_UNCHECKED}"), stacklevel=2)
                try:
                    result = yield
                except BaseException as exc:  # the phase's own failure
                    error = exc
                _flush()
        finally:
            races.set_report_context(None)
        found = [h for h in check.hazards if not races.claimed(h)]
        if found:
            races.claim(found)
            raise RacesInTest(item.nodeid, when, found) from error
        if error is not None:
            raise error
        return result


class _PhaseCheck(races.RaceCheck):
    """The race check of one phase: it collects without claiming, so that
    what a ``race_check`` inside the test collected stays the test's."""

    claims = False


def _flush() -> None:
    """Make the frees queued by the arrays the test dropped, on every installed
    runtime (their races are the test's)."""
    for device in installed_devices():
        rt = installed_runtime(device)
        if rt is not None:
            try:
                with rt.activate():
                    rt.flush()
            except Exception:  # noqa: BLE001 - a broken runtime is the test's own failure
                pass


#: The setting that makes the library Numba's memory manager.
_SELECT = "NUMBA_CUDA_MEMORY_MANAGER=numba_streamsafe"

#: What a run where the library is not Numba's memory manager leaves unchecked.
_UNCHECKED = (
    "the library is not Numba's memory manager in this process, so races between Numba's "
    "own arrays (cuda.device_array, cuda.to_device, plain cuda.jit launches on them) fail no "
    "test; only the library's arrays (numba_streamsafe.to_device, device_array, "
    f"@tracked_kernel) are checked. Set {_SELECT} in the environment that starts pytest "
    "to check Numba's too")


def _numba_checked() -> bool:
    """Whether Numba's own arrays and launches are the library's here: the
    environment selects the plugin, or transparent mode's hooks are in."""
    from numba_streamsafe.numba import sim_plugin, transparent

    return sim_plugin.selected() or transparent.installed()


def _where() -> str:
    """Which check finds the races here, and on what, in words."""
    try:
        config = settings()
    except Exception as exc:  # noqa: BLE001 - a bad setting: said in the header
        return f"settings refused: {exc}"
    if config.mode == "check":
        where = "check mode"
    elif config.driver == "sim":
        where = "the simulator's checker"
    else:
        where = "the race check in ordering mode"
    from numba_streamsafe.numba import sim_plugin

    if not sim_plugin.selected():
        where += f"; on the library's arrays only, Numba's own need {_SELECT}"
    return where
