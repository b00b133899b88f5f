"""Races found by the simulated driver's checker, or in check mode by the
tracking resource (on a GPU as on the simulator), for a user's own tests:
:func:`race_check` and :func:`hazards`; and the process's own report of
them (:func:`start_reports`): check mode's, and on the simulator an exit
summary of the hazards no race check collected, with an exit status where
``NUMBA_STREAMSAFE_CHECK_REPORT=exit`` asks, and the JSON lines of
``NUMBA_STREAMSAFE_REPORT_FILE``."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from numba_streamsafe._driver import sim_model as sim
from numba_streamsafe.core.errors import RaceDetected
from numba_streamsafe.core.settings import settings
from numba_streamsafe.runtime import get_runtime, installed_devices, installed_runtime

__all__ = ["RaceCheck", "race_check", "watching", "checking_anything", "hazards",
           "start_check_mode", "start_reports", "set_report_context", "claim", "claimed",
           "EXIT_STATUS"]

#: The exit status of a process whose exit report found races, where
#: ``NUMBA_STREAMSAFE_CHECK_REPORT=exit`` asks for one.
EXIT_STATUS = 1


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
    copy, argument, stream, the user's stack where it was queued, who made
    the stream); ``h.allocated`` is the memory's allocation, ``h.report()``
    the full report with the fix, ``h.record()`` the same as a JSON object.

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

    #: Whether the hazards it collects are its own (a block's, which reports
    #: them): the process's exit report then leaves them out.
    claims = True

    def __init__(self, stop_at_first: bool) -> None:
        self.stop_at_first = stop_at_first
        self.hazards: list[sim.Hazard] = []
        #: Per system, the hazards it had found when the check began or last looked.
        self._seen: dict[int, int] = {id(s): len(s.hazards) for s in _systems()}
        self._lock = threading.Lock()

    def collect(self, system: Any) -> list[sim.Hazard]:
        """The hazards ``system`` found since this check last looked (kept in
        :attr:`hazards`; each written to the report file once, and claimed
        where the check :attr:`claims` them)."""
        with self._lock:
            start = self._seen.get(id(system), 0)
            new = system.hazards[start:]
            self._seen[id(system)] = start + len(new)
            self.hazards.extend(new)
        for hazard in new:
            _found(hazard, self.claims)
        return list(new)


@contextlib.contextmanager
def race_check(*, stop_at_first: bool = True) -> Iterator[RaceCheck]:
    """Check the block for races on the simulated driver.

    Every hazard the simulated driver finds inside the block (two conflicting
    accesses of which neither is ordered after the other) is collected; with
    ``stop_at_first`` (the default), the kernel or copy whose access makes the
    first one raises :class:`~numba_streamsafe.core.errors.RaceDetected` (a
    hazard found at a free is raised at the next launch or copy, or when the
    block ends). The message (``err.hazard.report()``) and ``err.hazard``
    name both accesses: the kernel or copy, the argument, the stream and the
    stack of the call in your code; where the memory was allocated; and the fix.

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
    check = RaceCheck(stop_at_first)
    with watching(check, warn_stacklevel=5):
        yield check
    if stop_at_first and check.hazards:
        raise RaceDetected(check.hazards[0])


def checking_anything() -> bool:
    """Whether a race check finds races here now: a simulated driver or a
    checking resource reports, or a GPU runtime in ordering mode is watched."""
    config = settings()
    return bool(_systems()) or config.driver == "sim" or config.mode == "check"


@contextlib.contextmanager
def watching(check: RaceCheck, warn_stacklevel: int | None = 3) -> Iterator[RaceCheck]:
    """Collect into ``check`` every hazard found inside the block, where
    :func:`race_check` looks (it runs its block in this): the installed
    runtimes watched on a GPU in ordering mode, every hazard told as it is
    found (a ``check.stop_at_first`` check raises at the first), and those
    found at frees collected when the block ends, whether it raised or not.
    Warns (at ``warn_stacklevel``; None: never) where nothing can be checked
    (:func:`checking_anything`)."""
    watched = _watch()
    if warn_stacklevel is not None and not checking_anything():
        warnings.warn("race_check(): no runtime uses the simulated driver, so nothing is "
                      "checked; run under Numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1, with "
                      "NUMBA_CUDA_MEMORY_MANAGER=numba_streamsafe for Numba's own arrays) to "
                      "find races on the CPU, or set NUMBA_STREAMSAFE_MODE=check to find "
                      "them on a GPU", RuntimeWarning, stacklevel=warn_stacklevel)
    sim.watchers.append(check)
    try:
        yield check
    finally:
        sim.watchers.remove(check)
        with contextlib.suppress(RaceDetected):  # collected below
            _catch_up()
        for resource in watched:  # its races found at frees since the last launch too
            resource.watch_races(False)
        for system in _systems():
            check.collect(system)


# ------------------------------------------------------------ the process's report
#: Hazards a race check's block collected (which reports them), by id: the
#: process's exit report leaves them out. Holding them keeps the ids unique.
_claimed: dict[int, sim.Hazard] = {}
#: Hazards written to the report file, by id (each once).
_written: dict[int, sim.Hazard] = {}
#: What the races found now are attributed to (the test running, set by the
#: pytest plugin), written with each in the report file.
_context: str | None = None
_found_lock = threading.Lock()
#: The report file could not be written (warned once).
_file_failed = False


def set_report_context(name: str | None) -> None:
    """Attribute the races found from now on to ``name`` (a test's id; None:
    nothing) in the report file (``NUMBA_STREAMSAFE_REPORT_FILE``)."""
    global _context
    _context = name


def claim(found: list[sim.Hazard]) -> None:
    """Mark ``found`` as reported elsewhere (a test that failed on them): the
    process's exit report leaves them out."""
    with _found_lock:
        for hazard in found:
            _claimed[id(hazard)] = hazard


def claimed(hazard: sim.Hazard) -> bool:
    """Whether ``hazard`` was collected by a race check's block (or
    :func:`claim` ed): reported there, not by the process's exit report."""
    return id(hazard) in _claimed


def _found(hazard: sim.Hazard, own: bool) -> None:
    """A race check collected ``hazard``: claim it where its block reports
    it (``own``), and write it to the report file the first time."""
    global _file_failed
    with _found_lock:
        if own:
            _claimed[id(hazard)] = hazard
        if id(hazard) in _written:
            return
        _written[id(hazard)] = hazard
    path = settings().report_file
    if path is None or _file_failed:
        return
    record: dict[str, Any] = (hazard.record() if hasattr(hazard, "record")
                              else {"kind": hazard.kind, "report": str(hazard)})
    record["test"] = _context
    record["pid"] = os.getpid()
    line = (json.dumps(record) + "\n").encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)  # one write per line: processes may share the file
        finally:
            os.close(fd)
    except OSError as exc:
        _file_failed = True
        warnings.warn(f"NUMBA_STREAMSAFE_REPORT_FILE={path!r} cannot be written ({exc}); the "
                      "races are not written there. Set it to a writable path, or unset it",
                      RuntimeWarning, stacklevel=2)


class _ProcessReport(RaceCheck):
    """The process's own race check: every hazard the installed runtimes
    report, summarised at exit (those no block collected)."""

    claims = False

    def __init__(self, stop_at_first: bool, kind: str) -> None:
        super().__init__(stop_at_first)
        #: ``"check"`` (check mode) or ``"sim"`` (the simulator's checker).
        self.kind = kind

    def unclaimed(self) -> list[sim.Hazard]:
        """Every hazard found so far (the installed runtimes' looked at now)
        that no block collected."""
        for system in _systems():
            self.collect(system)
        return [h for h in self.hazards if id(h) not in _claimed]


#: The process's report (check mode, or the simulator's), once started.
_report: _ProcessReport | None = None
#: The process's check-mode watcher (``NUMBA_STREAMSAFE_MODE=check``), once started.
_check_mode: RaceCheck | None = None


def start_check_mode() -> RaceCheck | None:
    """Watch the whole process for races when ``NUMBA_STREAMSAFE_MODE=check``
    (idempotent; None in ordering mode).

    With ``NUMBA_STREAMSAFE_CHECK_REPORT=raise`` (the default) the launch or
    copy that makes the first race raises
    :class:`~numba_streamsafe.core.errors.RaceDetected` (a race found at a free,
    at that free); with ``exit`` every race is collected, a summary is
    written to standard error when the process exits, and the process then
    exits with status :data:`EXIT_STATUS` if any race was found.

    Returns
    -------
    RaceCheck or None
        The process's check, whose ``hazards`` grow as races are found.
    """
    start_reports()
    return _check_mode


def start_reports() -> RaceCheck | None:
    """Start the process's report of its races (idempotent): in check mode,
    :func:`start_check_mode`'s watcher; on the simulated driver in ordering
    mode, an exit report of the hazards its checker found that no race
    check collected (a summary on standard error, and with
    ``NUMBA_STREAMSAFE_CHECK_REPORT=exit`` exit status :data:`EXIT_STATUS`
    where there are any). None elsewhere (a GPU in ordering mode).

    Returns
    -------
    RaceCheck or None
        The process's report.
    """
    global _report, _check_mode
    config = settings()
    if config.mode != "check" and config.driver != "sim":
        return None
    with _start_lock:
        if _report is None:
            if config.mode == "check":
                _report = _ProcessReport(config.check_report == "raise", "check")
                _check_mode = _report
                sim.watchers.append(_report)
                if config.check_report == "exit":
                    _at_exit(_report, exit_status=True)
            else:
                _report = _ProcessReport(False, "sim")
                _at_exit(_report, exit_status=config.check_report == "exit")
    return _report


_start_lock = threading.Lock()


def _at_exit(report: _ProcessReport, exit_status: bool) -> None:
    """Summarise ``report`` when the process exits, as the first exit handler
    to run (moved there as the interpreter starts to shut down), so that with
    ``exit_status`` the others can run before the status is set."""
    def summary() -> None:
        atexit.unregister(summary)  # it may run the other handlers itself
        _summary(report, exit_status)

    atexit.register(summary)

    def run_first() -> None:
        atexit.unregister(summary)
        atexit.register(summary)

    with contextlib.suppress(AttributeError, RuntimeError):  # an interpreter without it
        threading._register_atexit(run_first)  # type: ignore[attr-defined]


def _summary(report: _ProcessReport, exit_status: bool) -> None:
    """Write the races ``report`` found that no block collected to standard
    error; with ``exit_status`` and any found, run the other exit handlers
    and end the process with :data:`EXIT_STATUS`."""
    with contextlib.suppress(Exception):  # what the driver observer noted last
        _catch_up()
    found = report.unclaimed()
    claimed = len(report.hazards) - len(found)
    print(_summary_text(report.kind, found, claimed), file=sys.stderr, end="")
    if not (exit_status and found):
        return
    try:
        atexit._run_exitfuncs()  # the others, in their order, before the status is set
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(EXIT_STATUS)


#: Groups of races shown in full in the exit summary (the rest are counted).
_SHOWN = 20


def _summary_text(kind: str, found: list[sim.Hazard], claimed: int) -> str:
    """The exit summary: the races ``found``, those of one pair of sides
    (the same works and stacks) grouped, each group's first in full."""
    elsewhere = (f" ({claimed} more reported by race checks)" if claimed else "")
    if not found:
        if kind != "check":
            return ""
        if claimed:
            return f"numba_streamsafe check mode: no race found outside the race " \
                   f"checks{elsewhere}\n"
        return "numba_streamsafe check mode: no race found\n"
    groups: dict[Any, list[sim.Hazard]] = {}
    for hazard in found:
        groups.setdefault(_pair(hazard), []).append(hazard)
    if kind == "check":
        head = f"numba_streamsafe check mode: {len(found)} race(s) found{elsewhere}:"
    else:
        head = (f"numba_streamsafe: the simulator's checker found {len(found)} race(s) that no "
                f"race check collected{elsewhere}:")
    lines = [head]
    for i, members in enumerate(list(groups.values())[:_SHOWN]):
        first = members[0]
        text = first.report() if hasattr(first, "report") else f"race: {first}"
        more = f" (and {len(members) - 1} more of this pair)" if len(members) > 1 else ""
        body = text.replace("\n", "\n     ")
        lines.append(f"  {i + 1}. {body}{more}")
    if len(groups) > _SHOWN:
        lines.append(f"  ... and {len(groups) - _SHOWN} more pairs"
                     + (" (every race is in NUMBA_STREAMSAFE_REPORT_FILE)"
                        if settings().report_file else ""))
    if kind != "check" and not report_exit_status():
        lines.append("  (set NUMBA_STREAMSAFE_CHECK_REPORT=exit to exit with status "
                     f"{EXIT_STATUS} when there are any)")
    return "\n".join(lines) + "\n"


def report_exit_status() -> bool:
    """Whether the exit report sets the exit status (``NUMBA_STREAMSAFE_CHECK_REPORT=exit``)."""
    return settings().check_report == "exit"


def _pair(hazard: sim.Hazard) -> Any:
    """What makes two races the same pair in the summary: the kind, and each
    side's work, argument and stack (not the address or the stream)."""
    sides = []
    for side in (hazard.first, hazard.second):
        sides.append(None if side is None else (side.label, side.param, side.stack))
    if hazard.first is None:
        return (hazard.kind, hazard.earlier, hazard.later, hazard.address)
    return (hazard.kind, *sides)
