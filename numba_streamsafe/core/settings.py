"""The ``NUMBA_STREAMSAFE_*`` environment variables, read into one dataclass.

:func:`settings` reads them once, when a process-wide runtime or launch policy
is first built; :func:`reload_settings` reads them again (for tests, or a
program that changes its environment before building runtimes).

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
``NUMBA_STREAMSAFE_REPORT_FILE``          a path: each race reported is appended to it
                                          as one line of JSON (both sides, their
                                          stacks and streams, the allocation, the fix);
                                          unset: no file
========================================  ===============================================
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

from numba_streamsafe.core.errors import InvalidArgument
from numba_streamsafe.core.sites import DEFAULT_DEPTH, set_stack_depth

__all__ = ["Settings", "settings", "reload_settings"]

_OFF = ("0", "false", "no", "off")

#: The most frames a stack keeps (``NUMBA_STREAMSAFE_STACK_DEPTH``).
_MAX_DEPTH = 256


def _count(name: str, default: int, high: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if not 0 <= value <= high:
        raise InvalidArgument(f"{name}={raw!r}: use an int from 0 to {high} (or unset it)")
    return value


def _choice(name: str, default: str, allowed: tuple[str, ...]) -> str:
    value = os.environ.get(name, "").strip().lower() or default
    if value not in allowed:
        raise InvalidArgument(
            f"{name}={value!r}: use {' or '.join(repr(a) for a in allowed)} (or unset it)"
        )
    return value


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
    stack_depth: int = DEFAULT_DEPTH
    report_file: str | None = None

    @classmethod
    def from_env(cls) -> Settings:
        """Read the variables now.

        Raises
        ------
        InvalidArgument
            A variable holds a value it does not take (the message names both).
        """
        simulator = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")
        return cls(
            driver=_choice("NUMBA_STREAMSAFE_DRIVER", "sim" if simulator else "cuda",
                           ("cuda", "sim")),
            resource=_choice("NUMBA_STREAMSAFE_RESOURCE", "async", ("async", "direct")),
            fences=_choice("NUMBA_STREAMSAFE_FENCES", "lazy", ("lazy", "eager")),
            upstream=_choice("NUMBA_STREAMSAFE_UPSTREAM", "driver", ("driver", "rmm")),
            direct_launch=os.environ.get("NUMBA_STREAMSAFE_DIRECT_LAUNCH", "1").strip().lower()
            not in _OFF,
            check_access=os.environ.get("NUMBA_STREAMSAFE_CHECK_ACCESS", "1").strip().lower()
            not in _OFF,
            access=_choice("NUMBA_STREAMSAFE_ACCESS", "declared", ("declared", "infer")),
            ipc=os.environ.get("NUMBA_STREAMSAFE_IPC", "0").strip().lower() not in _OFF,
            transparent=os.environ.get("NUMBA_STREAMSAFE_TRANSPARENT", "1").strip().lower()
            not in _OFF,
            mode=_choice("NUMBA_STREAMSAFE_MODE", "order", ("order", "check")),
            check_report=_choice("NUMBA_STREAMSAFE_CHECK_REPORT", "raise", ("raise", "exit")),
            stack_depth=_count("NUMBA_STREAMSAFE_STACK_DEPTH", DEFAULT_DEPTH, _MAX_DEPTH),
            report_file=os.environ.get("NUMBA_STREAMSAFE_REPORT_FILE", "").strip() or None,
        )


_current: Settings | None = None
_lock = threading.Lock()


def settings() -> Settings:
    """The settings, read from the environment on first use."""
    current = _current
    if current is None:
        current = reload_settings()
    return current


def reload_settings() -> Settings:
    """Read the environment again and return the new settings (the race
    reports' stack depth takes effect at once)."""
    global _current
    with _lock:
        _current = Settings.from_env()
        set_stack_depth(_current.stack_depth)
        return _current
