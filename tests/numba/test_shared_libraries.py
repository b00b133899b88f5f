"""numba_streamsafe.numba.shared_libraries: a library loaded into several
contexts (two GPUs of one kind) is unloaded once, by the last context that
drops it; at interpreter exit, one held by several contexts is left alone.

numba-cuda's own double unload crashes only on two real GPUs
(``tests/gpu/test_multi_gpu.py`` shows it and its absence); here the rule is
checked against stand-ins for Numba's contexts.
"""

from __future__ import annotations

import os
import subprocess
import sys

from numba_streamsafe.numba.shared_libraries import SharedLibraryUnload


class Context:
    def __init__(self, *handles: int) -> None:
        self.modules = {h: object() for h in handles}


class Handle:
    """A CUlibrary stand-in: an object whose int() is the handle."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __int__(self) -> int:
        return self.value


def make(contexts, exiting=False):
    unloaded: list[int] = []
    guard = SharedLibraryUnload(lambda h: unloaded.append(int(h)), lambda: contexts,
                                lambda: exiting)
    return guard, unloaded


def test_a_library_of_one_context_is_unloaded_when_that_context_drops_it():
    a = Context(7)
    guard, unloaded = make([a])
    del a.modules[7]                       # Context.unload_module
    guard(Handle(7))
    assert unloaded == [7] and guard.skipped == 0


def test_a_shared_library_is_unloaded_once_by_the_last_context():
    a, b = Context(7, 8), Context(7)
    guard, unloaded = make([a, b])
    del a.modules[7]
    guard(Handle(7))                       # b still holds 7
    assert unloaded == [] and guard.skipped == 1
    del b.modules[7]
    guard(Handle(7))
    assert unloaded == [7]
    del a.modules[8]
    guard(Handle(8))
    assert unloaded == [7, 8]


def test_at_exit_a_library_held_by_several_contexts_is_left_to_the_process_end():
    a, b = Context(7, 9), Context(7)
    guard, unloaded = make([a, b], exiting=True)
    guard(Handle(7))                       # a's finalizer: a and b still list it
    guard(Handle(7))                       # b's
    guard(Handle(9))                       # only a's: unloaded as before
    assert unloaded == [9] and guard.skipped == 2


def test_install_puts_the_guard_in_front_of_numbas_unload_once():
    """Numba's CUDA target (no GPU needed: nothing is called)."""
    code = (
        "from numba.cuda.cudadrv import driver as d\n"
        "from numba_streamsafe.numba import shared_libraries as s\n"
        "g = s.install()\n"
        "assert g is not None and d.driver.cuLibraryUnload is g\n"
        "assert s.install() is g\n"
        "assert g.unload.__name__ == 'cuLibraryUnload', g.unload\n"
        "print('OK')\n")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 0 and done.stdout.strip() == "OK", done.stderr[-3000:]
