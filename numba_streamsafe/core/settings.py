"""The ``NUMBA_STREAMSAFE_*`` environment variables, read into one dataclass.

:func:`settings` reads them once, when ``numba_streamsafe`` is imported (a
bad value, or a ``NUMBA_STREAMSAFE_`` name that is no setting, is refused
then: :class:`~numba_streamsafe.core.errors.InvalidSetting`, one line);
:func:`reload_settings` reads them again (for tests, or a program that changes
its environment before building runtimes). ``NUMBA_STREAMSAFE_PURE_PYTHON``
(``0`` or ``1``) is read by :mod:`numba_streamsafe.compiled`, with
:func:`flag`, before anything else; its name is known here.
A switch takes ``1``, ``true``, ``yes``, ``on`` or ``0``, ``false``, ``no``,
``off`` (any case).

========================================  ===============================================
variable                                  meaning
========================================  ===============================================
``NUMBA_STREAMSAFE_DRIVER``               ``cuda`` or ``sim``; unset: ``sim`` when Numba's
                                          CUDA simulator is on (``NUMBA_ENABLE_CUDASIM=1``)
``NUMBA_STREAMSAFE_RESOURCE``             ``async`` (tracked, stream-ordered) or ``direct``
                                          (``cuMemAlloc``, untracked)
``NUMBA_STREAMSAFE_FENCES``               ``lazy`` or ``eager``
``NUMBA_STREAMSAFE_UPSTREAM``             ``driver`` (the device's stream-ordered pool) or
                                          ``rmm`` (RMM's current resource of each device)
``NUMBA_STREAMSAFE_DIRECT_LAUNCH``        ``0`` (or false/no/off) sends every tracked launch
                                          through Numba's launch path
``NUMBA_STREAMSAFE_CHECK_ACCESS``         ``0`` (or false/no/off) turns off the check of
                                          declared accesses against the kernel's IR at
                                          its first launch
``NUMBA_STREAMSAFE_ACCESS``               ``declared`` (default) or ``infer``: every tracked
                                          kernel ignores its declarations and infers every
                                          parameter's access (to compare a program's
                                          declarations with what its kernels do)
``NUMBA_STREAMSAFE_TRANSPARENT``          ``0`` (or false/no/off) leaves plain Numba
                                          launches, copies and fills unordered (on
                                          Numba's CUDA simulator the checker still sees
                                          them); on by default with the plugin selected
``NUMBA_STREAMSAFE_IPC``                  ``1`` (or true/yes/on): blocks are ``cuMemAlloc``
                                          allocations that CUDA IPC can export, tracked
                                          as any block and freed with ``cuMemFree`` after
                                          their uses; ``get_ipc_handle`` works
``NUMBA_STREAMSAFE_MODE``                 ``order`` (default): launches, copies and frees
                                          are ordered; ``check``: the program runs as
                                          written (no wait queued for its uses, no free
                                          delayed; new memory is ordered) and
                                          its races are reported, on a GPU as on the
                                          simulator
``NUMBA_STREAMSAFE_OBSERVE``             ``auto`` (default): on in check mode, off in
                                          ordering mode; ``on`` / ``1``: the tracking
                                          resource learns the ordering, copies and
                                          fills other code makes (CuPy, PyTorch,
                                          cuda.core) from the driver observer (CUPTI:
                                          no profiler can run meanwhile); ``off`` / ``0``
``NUMBA_STREAMSAFE_CUPTI``                the CUPTI library the observer loads (a path);
                                          unset: found beside the CUDA libraries
``NUMBA_STREAMSAFE_CHECK_REPORT``         in check mode, ``raise`` (default): the launch
                                          or copy that makes the first race raises
                                          ``RaceDetected``; ``exit``: every race is
                                          collected and summarised when the process
                                          exits, which then exits with status 1 if any
                                          was found (on the simulator outside check
                                          mode: the status of the exit summary)
``NUMBA_STREAMSAFE_STACK_DEPTH``          the user's frames a race report keeps of each
                                          side's stack, the allocation's and the free's:
                                          an int from 0 to 256 (default 8; 0: no line)
``NUMBA_STREAMSAFE_LAUNCH_GIL``           ``auto`` (default): a compiled launch keeps the
                                          GIL through ``cuLaunchKernel`` while launches
                                          return promptly, and releases it after one was
                                          held up in the driver or once the program
                                          queued a Python host callback through Numba;
                                          ``release``: every launch releases it (for
                                          programs whose other libraries queue Python
                                          host callbacks)
``NUMBA_STREAMSAFE_REPORT_FILE``          a path: each race reported is appended to it
                                          as one line of JSON (both sides, their
                                          stacks and streams, the allocation, the fix);
                                          unset: no file
========================================  ===============================================
"""

from __future__ import annotations

import difflib
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, fields

from numba_streamsafe.core.errors import InvalidSetting, show_in_one_line

__all__ = ["Settings", "settings", "reload_settings", "loaded", "on_reload", "flag", "PREFIX",
           "reporting"]

#: What every variable of the library's starts with.
PREFIX = "NUMBA_STREAMSAFE_"
_ON = ("1", "true", "yes", "on")
_OFF = ("0", "false", "no", "off")
#: Variables read outside :class:`Settings` (by the module named).
_READ_ELSEWHERE = ("NUMBA_STREAMSAFE_PURE_PYTHON",  # numba_streamsafe.compiled
                   "NUMBA_STREAMSAFE_CUPTI",  # numba_streamsafe._driver.observer (a path)
                   "NUMBA_STREAMSAFE_BUILD")  # setup.py, at build time


def _refused(name: str, value: str, allowed: tuple[str, ...], message: str) -> InvalidSetting:
    """The error for a bad variable; left uncaught, it prints as its one line."""
    show_in_one_line()
    return InvalidSetting(name, value, allowed, message)


def _bad_value(name: str, value: str, allowed: tuple[str, ...]) -> InvalidSetting:
    *first, last = (repr(a) for a in allowed)
    return _refused(name, value, allowed,
                    f"{name}={value!r} is not one of its values: use {', '.join(first)} or "
                    f"{last} (or unset it)")

#: The most frames a stack keeps (``NUMBA_STREAMSAFE_STACK_DEPTH``).
_MAX_DEPTH = 256
#: The frames a race report's stack keeps when ``NUMBA_STREAMSAFE_STACK_DEPTH``
#: does not say (``numba_streamsafe.core.sites`` takes it; this module imports no
#: module of the engine, so that ``numba_streamsafe.compiled`` can read it first).
DEFAULT_DEPTH = 8


def _count(name: str, default: int, high: int) -> int:
    given = os.environ.get(name, "").strip()
    if not given:
        return default
    try:
        value = int(given)
    except ValueError:
        value = -1
    if not 0 <= value <= high:
        raise _refused(name, given, (f"0 to {high}",),
                       f"{name}={given!r} is not one of its values: use an int from 0 to "
                       f"{high} (or unset it)")
    return value


def _choice(name: str, default: str, allowed: tuple[str, ...]) -> str:
    given = os.environ.get(name, "").strip()
    value = given.lower() or default
    if value not in allowed:
        raise _bad_value(name, given, allowed)
    return value


def flag(name: str, default: bool) -> bool:
    """The switch ``name``: ``default`` when it is unset or empty.

    Raises
    ------
    InvalidSetting
        The variable holds neither an on nor an off value.
    """
    given = os.environ.get(name, "").strip()
    value = given.lower()
    if not value:
        return default
    if value in _ON:
        return True
    if value in _OFF:
        return False
    raise _bad_value(name, given, ("1", "0", "true", "false", "yes", "no", "on", "off"))


def _observe() -> str:
    """``NUMBA_STREAMSAFE_OBSERVE``: ``auto`` (unset, empty or ``auto``), ``on`` or ``off``."""
    given = os.environ.get("NUMBA_STREAMSAFE_OBSERVE", "").strip()
    value = given.lower()
    if value in ("", "auto"):
        return "auto"
    if value in _ON:
        return "on"
    if value in _OFF:
        return "off"
    raise _bad_value("NUMBA_STREAMSAFE_OBSERVE", given, ("auto", "1", "0"))


def _known() -> tuple[str, ...]:
    return (*(PREFIX + f.name.upper() for f in fields(Settings)), *_READ_ELSEWHERE)


def _check_names() -> None:
    """Refuse a ``NUMBA_STREAMSAFE_`` variable that names no setting (a
    misspelt one would otherwise leave its setting at the default, unnoticed)."""
    known = _known()
    for name in sorted(os.environ):
        if name.startswith(PREFIX) and name not in known:
            close = difflib.get_close_matches(name[len(PREFIX):],
                                              [k[len(PREFIX):] for k in known], n=1)
            hint = f"did you mean {PREFIX}{close[0]}? " if close else ""
            raise _refused(name, os.environ[name], known,
                           f"{name}={os.environ[name]!r}: {name} is not a setting of "
                           f"numba_streamsafe: {hint}the settings are "
                           f"{', '.join(known)} (or unset it)")


def reporting() -> bool:
    """True while ``python -m numba_streamsafe`` imports the package: its
    report lists a bad setting (and exits non-zero) instead of being refused
    before it can run. (Python sets ``sys.argv[0]`` to ``"-m"`` while it finds
    the module to run.)"""
    if sys.argv[:1] != ["-m"]:
        return False
    argv = getattr(sys, "orig_argv", [])
    return any(a == "-m" and b == "numba_streamsafe" for a, b in zip(argv, argv[1:], strict=False))


@dataclass(frozen=True)
class Settings:
    """The library's settings from the environment (see the module docstring)."""

    driver: str = "cuda"
    resource: str = "async"
    fences: str = "lazy"
    upstream: str = "driver"
    direct_launch: bool = True
    check_access: bool = True
    access: str = "declared"
    ipc: bool = False
    transparent: bool = True
    mode: str = "order"
    check_report: str = "raise"
    observe: str = "auto"
    stack_depth: int = DEFAULT_DEPTH
    report_file: str | None = None
    launch_gil: str = "auto"

    @classmethod
    def from_env(cls) -> Settings:
        """Read the variables now.

        Raises
        ------
        InvalidSetting
            A variable holds a value it does not take, or a ``NUMBA_STREAMSAFE_``
            variable names no setting (the one-line message names the variable,
            its value and what it takes).
        """
        _check_names()
        flag(_READ_ELSEWHERE[0], False)
        simulator = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")
        return cls(
            driver=_choice("NUMBA_STREAMSAFE_DRIVER", "sim" if simulator else "cuda",
                           ("cuda", "sim")),
            resource=_choice("NUMBA_STREAMSAFE_RESOURCE", "async", ("async", "direct")),
            fences=_choice("NUMBA_STREAMSAFE_FENCES", "lazy", ("lazy", "eager")),
            upstream=_choice("NUMBA_STREAMSAFE_UPSTREAM", "driver", ("driver", "rmm")),
            direct_launch=flag("NUMBA_STREAMSAFE_DIRECT_LAUNCH", True),
            check_access=flag("NUMBA_STREAMSAFE_CHECK_ACCESS", True),
            access=_choice("NUMBA_STREAMSAFE_ACCESS", "declared", ("declared", "infer")),
            ipc=flag("NUMBA_STREAMSAFE_IPC", False),
            transparent=flag("NUMBA_STREAMSAFE_TRANSPARENT", True),
            mode=_choice("NUMBA_STREAMSAFE_MODE", "order", ("order", "check")),
            check_report=_choice("NUMBA_STREAMSAFE_CHECK_REPORT", "raise", ("raise", "exit")),
            observe=_observe(),
            stack_depth=_count("NUMBA_STREAMSAFE_STACK_DEPTH", DEFAULT_DEPTH, _MAX_DEPTH),
            report_file=os.environ.get("NUMBA_STREAMSAFE_REPORT_FILE", "").strip() or None,
            launch_gil=_choice("NUMBA_STREAMSAFE_LAUNCH_GIL", "auto", ("auto", "release")),
        )

    @property
    def observing(self) -> bool:
        """Whether tracking resources observe other code's calls
        (``NUMBA_STREAMSAFE_OBSERVE``; ``auto``: in check mode)."""
        return self.observe == "on" or (self.observe == "auto" and self.mode == "check")


_current: Settings | None = None
_lock = threading.Lock()


def settings() -> Settings:
    """The settings, read from the environment on first use (the package's
    import).

    Raises
    ------
    InvalidSetting
        A variable is refused (see :meth:`Settings.from_env`).
    """
    current = _current
    if current is None:
        current = reload_settings()
    return current


def reload_settings() -> Settings:
    """Read the environment again and return the new settings (the race
    reports' stack depth takes effect at once).

    Raises
    ------
    InvalidSetting
        A variable is refused (see :meth:`Settings.from_env`); the settings
        in force stay as they were.
    """
    global _current
    with _lock:
        _current = Settings.from_env()
        for hook in on_reload:
            hook(_current)
        return _current


def loaded() -> Settings | None:
    """The settings read so far (None before the first read)."""
    return _current


#: Called with the new settings each time they are read (:func:`reload_settings`):
#: the parts that keep a setting of their own (the race reports' stack depth,
#: ``numba_streamsafe.core.sites``) take it there.
on_reload: list[Callable[[Settings], None]] = []
