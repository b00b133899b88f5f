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
                                          collected and summarised when the process exits
========================================  ===============================================
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

from numba_streamsafe.core.errors import InvalidArgument

__all__ = ["Settings", "settings", "reload_settings"]

_OFF = ("0", "false", "no", "off")
_ONOFF = {"1": "on", "true": "on", "yes": "on", "on": "on",
          "0": "off", "false": "off", "no": "off", "off": "off"}


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
    observe: str = "auto"

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
            observe=_ONOFF.get(os.environ.get("NUMBA_STREAMSAFE_OBSERVE", "").strip().lower(),
                               None) or _choice("NUMBA_STREAMSAFE_OBSERVE", "auto",
                                                ("auto", "on", "off", "1", "0")),
        )

    @property
    def observing(self) -> bool:
        """Whether tracking resources observe other code's calls
        (``NUMBA_STREAMSAFE_OBSERVE``; ``auto``: in check mode)."""
        return self.observe == "on" or (self.observe == "auto" and self.mode == "check")


_current: Settings | None = None
_lock = threading.Lock()


def settings() -> Settings:
    """The settings, read from the environment on first use."""
    current = _current
    if current is None:
        current = reload_settings()
    return current


def reload_settings() -> Settings:
    """Read the environment again and return the new settings."""
    global _current
    with _lock:
        _current = Settings.from_env()
        return _current
