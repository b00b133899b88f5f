"""Races found by the simulated driver's checker, or in check mode by the
tracking resource (on a GPU as on the simulator), for a user's own tests:
:func:`race_check` and :func:`hazards`."""

from __future__ import annotations

import atexit
import contextlib
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from numba_streamsafe._driver import sim_model as sim
from numba_streamsafe.core.errors import RaceDetected
from numba_streamsafe.core.settings import settings
from numba_streamsafe.runtime import get_runtime, installed_devices, installed_runtime

__all__ = ["RaceCheck", "race_check", "hazards", "start_check_mode"]


def _systems() -> list[Any]:
    """Where the installed runtimes' races are reported, each once: a checking
    resource's race log (check mode), else a simulated driver's system."""
    out: dict[int, Any] = {}
    for device in installed_devices():
        rt = installed_runtime(device)
        resource = getattr(rt, "resource", None)
        log = getattr(getattr(resource, "tracker", None), "race_log", None)
        if log is not None:
            out[id(log)] = log
            continue
        system = getattr(getattr(rt, "driver", None), "system", None)
        if isinstance(system, sim.SimSystem) and system.reports:
            out[id(system)] = system
    return list(out.values())


def _catch_up() -> None:
    """Let each installed runtime's tracking resource apply what the driver
    observer noted since its last decision (another library's last copy, say),
    so that a race check or summary that ends now sees its races."""
    for device in installed_devices():
        rt = installed_runtime(device)
        catch_up = getattr(getattr(getattr(rt, "resource", None), "tracker", None),
                           "catch_up", None)
        if catch_up is not None:
            catch_up()


def _watch() -> list[Any]:
    """Start a race check's watch of each installed runtime's tracking
    resource that orders on a real driver (ordering mode on a GPU); the
    current device's runtime is installed first where none is. Returns the
    resources watched."""
    if settings().driver == "sim":
        return []
    if not installed_devices():
        with contextlib.suppress(Exception):  # no GPU (nothing to watch): the warning says so
            get_runtime()
    out: list[Any] = []
    for device in installed_devices():
        rt = installed_runtime(device)
        resource = getattr(getattr(rt, "resource", None), "tracker", None)
        watch = getattr(resource, "watch_races", None)
        if (rt is None or watch is None or getattr(rt.driver, "system", None) is not None
                or getattr(resource, "checking", True)):
            continue  # the simulated driver's checker, or check mode's, reports
        watch(True)
        out.append(resource)
    try:
        if out:  # Numba's events and synchronises are followed, plugin selected or not
            for follow in on_watch:
                follow()
    except BaseException:
        for resource in out:
            resource.watch_races(False)
        raise
    return out


#: Called when a race check starts watching a GPU runtime in ordering mode: the
#: Numba layer adds what makes the library follow Numba's events and synchronises
#: (transparent mode's hooks), which the reports then count as the program's ordering.
on_watch: list[Callable[[], None]] = []


def hazards() -> list[sim.Hazard]:
    """Every hazard found so far by the installed runtimes: in check mode the
    races their resources reported, on a GPU in ordering mode those the
    :func:`race_check` blocks found, else those their simulated drivers
    found. Each names both accesses: ``h.first`` and ``h.second`` (kernel or
    copy, argument, stream, the ``file:line`` of the user's call).

    Returns
    -------
    list of Hazard
        In the order found; empty where no simulated driver is installed.
    """
    _catch_up()
    out: list[sim.Hazard] = []
    for system in _systems():
        out.extend(system.hazards)
    return out


class RaceCheck:
    """The hazards found inside one :func:`race_check` block (``hazards``).

    Parameters
    ----------
    stop_at_first : bool
        Whether the block raises at the first hazard (see :func:`race_check`)."""

    def __init__(self, stop_at_first: bool) -> None:
        self.stop_at_first = stop_at_first
        self.hazards: list[sim.Hazard] = []
        #: Per system, the hazards it had found when the check began or last looked.
        self._seen: dict[int, int] = {id(s): len(s.hazards) for s in _systems()}
        self._lock = threading.Lock()

    def collect(self, system: Any) -> list[sim.Hazard]:
        """The hazards ``system`` found since this check last looked (kept in
        :attr:`hazards`)."""
        with self._lock:
            start = self._seen.get(id(system), 0)
            new = system.hazards[start:]
            self._seen[id(system)] = start + len(new)
            self.hazards.extend(new)
            return list(new)


@contextlib.contextmanager
def race_check(*, stop_at_first: bool = True) -> Iterator[RaceCheck]:
    """Check the block for races on the simulated driver.

    Every hazard the simulated driver finds inside the block (two conflicting
    accesses of which neither is ordered after the other) is collected; with
    ``stop_at_first`` (the default), the kernel or copy whose access makes the
    first one raises :class:`~numba_streamsafe.core.errors.RaceDetected` (a
    hazard found at a free is raised at the next launch or copy, or when the
    block ends). The message and ``err.hazard`` name both accesses: the
    kernel or copy, the argument, the stream and the ``file:line`` of the
    call in your code.

    Where the checks run:

    * on the simulated driver (Numba's CUDA simulator, or
      ``NUMBA_STREAMSAFE_DRIVER=sim``): its happens-before checker;
    * in check mode (``NUMBA_STREAMSAFE_MODE=check``), on a GPU as on the
      simulator: the tracking resource, which orders nothing;
    * on a GPU in ordering mode (the default): the tracking resource of the
      current device (and of every device in use) watches the block. The
      library still orders every use, so the block runs correctly; each wait
      it queues that the program's own synchronisation did not make needed
      is reported as the race it would be without the library. Only pairs of
      uses made inside the block are named, and where the legacy default
      stream takes part a race may go unreported (its implicit ordering is
      followed in check mode only); a reported race is always one. From the
      first such block on, Numba's events and synchronises are followed
      whether the plugin is selected or not (transparent mode's hooks, as in
      check mode); in ordering mode that only skips waits they make needless.

    Where none of these applies (no tracking resource, say) it warns that
    nothing is checked.

    Parameters
    ----------
    stop_at_first : bool
        Raise at the first hazard (default); False collects them all in
        ``RaceCheck.hazards`` and raises nothing.

    Yields
    ------
    RaceCheck
        Holds the hazards found inside the block.

    Raises
    ------
    RaceDetected
        With ``stop_at_first``: at the launch or copy that makes the first
        hazard (or at the block's end, for one found at a free).

    Examples
    --------
    >>> with nss.race_check():                      # doctest: +SKIP
    ...     produce[grid, block, a](x)
    ...     consume[grid, block, b](x, y)            # raises RaceDetected if unordered
    """
    watched = _watch()
    check = RaceCheck(stop_at_first)
    config = settings()
    if not _systems() and config.driver != "sim" and config.mode != "check":
        warnings.warn("race_check(): no runtime uses the simulated driver, so nothing is "
                      "checked; run under Numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1) to "
                      "find races on the CPU, or set NUMBA_STREAMSAFE_MODE=check to find "
                      "them on a GPU", RuntimeWarning, stacklevel=3)
    sim.watchers.append(check)
    failed = False
    try:
        yield check
    except BaseException:
        failed = True
        raise
    finally:
        sim.watchers.remove(check)
        with contextlib.suppress(RaceDetected):  # collected below
            _catch_up()
        for resource in watched:  # its races found at frees since the last launch too
            resource.watch_races(False)
        for system in _systems():
            check.collect(system)
    if not failed and stop_at_first and check.hazards:
        raise RaceDetected(check.hazards[0])


#: The process's check-mode watcher (``NUMBA_STREAMSAFE_MODE=check``), once started.
_check_mode: RaceCheck | None = None


def start_check_mode() -> RaceCheck | None:
    """Watch the whole process for races when ``NUMBA_STREAMSAFE_MODE=check``
    (idempotent; None in ordering mode).

    With ``NUMBA_STREAMSAFE_CHECK_REPORT=raise`` (the default) the launch or
    copy that makes the first race raises
    :class:`~numba_streamsafe.core.errors.RaceDetected` (a race found at a free,
    at that free); with ``exit`` every race is collected and a summary is
    written to standard error when the process exits.

    Returns
    -------
    RaceCheck or None
        The process's check, whose ``hazards`` grow as races are found.
    """
    global _check_mode
    config = settings()
    if config.mode != "check":
        return None
    with _start_lock:
        if _check_mode is None:
            _check_mode = RaceCheck(stop_at_first=config.check_report == "raise")
            sim.watchers.append(_check_mode)
            if config.check_report == "exit":
                atexit.register(_summary, _check_mode)
    return _check_mode


_start_lock = threading.Lock()


def _summary(check: RaceCheck) -> None:
    """Write the races ``check`` collected to standard error."""
    with contextlib.suppress(Exception):  # at exit: report what can be
        _catch_up()
    for system in _systems():
        check.collect(system)
    found = check.hazards
    if not found:
        print("numba_streamsafe check mode: no race found", file=sys.stderr)
        return
    lines = "\n".join(f"  {i + 1}. {h}" for i, h in enumerate(found))
    print(f"numba_streamsafe check mode: {len(found)} race(s) found:\n{lines}",
          file=sys.stderr)
