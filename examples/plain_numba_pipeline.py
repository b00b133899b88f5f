"""A three-stream pipeline written against plain Numba: no import of numba_streamsafe.

Run it as it is, then with the library's plugin selected::

    python examples/plain_numba_pipeline.py                  # races on a GPU
    NUMBA_CUDA_MEMORY_MANAGER=numba_streamsafe python examples/plain_numba_pipeline.py

With the plugin selected, transparent mode orders every launch and copy of
Numba's on the library's memory, so the result is right; without it the
stages race. On a machine without a CUDA driver, the plugin's selection runs
it on Numba's CUDA simulator (the library says so in one line), where the
library's checker reports each race with the kernel, the argument, the stream
and this file's line: ``hazards: 0`` with the plugin. Run as it is there
(no plugin), the program picks the simulator itself; the simulator runs one
stream's work at a time, so a race cannot make a round wrong, and the example
counts its races with the library's checker in a child process (the plugin
selected, transparent mode off: ``NUMBA_STREAMSAFE_TRANSPARENT=0``).

The stages:

1. the keys are uploaded on stream ``up``, and stream ``a`` waits for the
   upload through a Numba event (ordered by hand, correctly);
2. on ``a``, a slow kernel writes ``scaled`` from the keys;
3. on ``b``, a kernel reads ``scaled`` into ``squared``: nothing orders it
   after stage 2 (the bug the library removes);
4. on ``a``, ``scaled`` is overwritten for the next round: nothing orders it
   after stage 3's read;
5. ``squared`` is copied back on ``b``, and ``b`` is synchronised; then
   ``scaled`` is dropped, and its memory may be handed out again at once.

With ``--events`` the program orders stages 3 and 4 itself with Numba events,
as hand-ordered code does: the plugin then queues none of its own waits (it
follows the program's events: ``waits_skipped``), and check mode
(``NUMBA_STREAMSAFE_MODE=check``, which reports the races of the program as
written) finds none.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from gpu_present import gpu_present

#: The library's plugin as the environment selects it (the program imports nothing of it).
PLUGIN_SELECTED = os.environ.get("NUMBA_CUDA_MEMORY_MANAGER", "").strip() == "numba_streamsafe"
if not PLUGIN_SELECTED and "NUMBA_ENABLE_CUDASIM" not in os.environ and not gpu_present():
    # As it is, without a GPU: Numba's CUDA simulator (with the plugin selected the
    # library picks it where there is no CUDA driver, and says so).
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

import numpy as np  # noqa: E402
from numba import config, cuda  # noqa: E402

SIMULATOR = bool(config.ENABLE_CUDASIM)


@cuda.jit
def scale(keys, out, factor, spins):
    i = cuda.grid(1)
    if i < out.size:
        if spins > 0:
            cuda.nanosleep(spins)  # a slow producer: the race shows on a GPU
        out[i] = keys[i] * factor


@cuda.jit
def square(src, dst):
    i = cuda.grid(1)
    if i < src.size:
        dst[i] = src[i] * src[i]


def run(n: int, spins: int, block: int = 128, events: bool = False) -> bool:
    """One round of the pipeline; True when its result is right. ``events``:
    stages 3 and 4 are ordered by the program's own Numba events."""
    grid = (n + block - 1) // block
    up, a, b = cuda.stream(), cuda.stream(), cuda.stream()
    host = np.arange(n, dtype=np.int64)
    keys = cuda.to_device(host, stream=up)
    uploaded = cuda.event()
    uploaded.record(up)
    uploaded.wait(a)                                     # stage 1: ordered by hand
    scaled = cuda.device_array(n, dtype=np.int64)
    squared = cuda.device_array(n, dtype=np.int64)
    scale[grid, block, a](keys, scaled, 3, spins)        # stage 2
    if events:
        _after(a, b)
    square[grid, block, b](scaled, squared)              # stage 3: needs stage 2
    if events:
        _after(b, a)
    scale[grid, block, a](keys, scaled, -1, 0)           # stage 4: needs stage 3's read
    out = squared.copy_to_host(stream=b)                 # stage 5
    b.synchronize()
    del scaled                                           # freed after b's read
    a.synchronize()
    return bool((out == (3 * host) ** 2).all())


def _after(producer: object, consumer: object) -> None:
    """Order ``consumer``'s next work after ``producer``'s work so far (a Numba event)."""
    done = cuda.event()
    done.record(producer)
    done.wait(consumer)


#: Lines of a failed child process's error output shown (its traceback's end).
ERROR_LINES = 8


def _hazards_as_it_is(args: argparse.Namespace) -> str:
    """This program's races as the library's checker sees them on the simulator:
    the same rounds in a child process, with the plugin selected and transparent
    mode off (the program as it is, watched but not ordered)."""
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", "NUMBA_STREAMSAFE_TRANSPARENT": "0",
           "NUMBA_CUDA_MEMORY_MANAGER": "numba_streamsafe"}
    command = [sys.executable, os.path.abspath(__file__), "--n", str(args.n),
               "--repeat", str(args.repeat), *(["--events"] if args.events else [])]
    child = subprocess.run(command, env=env, capture_output=True, text=True)
    found = [line for line in child.stdout.splitlines() if line.startswith("hazards:")]
    if not found and child.returncode != 0:
        tail = "\n".join(f"  {line}" for line in child.stderr.strip().splitlines()[-ERROR_LINES:])
        return (f"hazards: not counted: the child process that counts them failed (exit status "
                f"{child.returncode}); the end of its error output:\n{tail}")
    if not found:
        return ("hazards: not counted (numba_streamsafe is not installed, or its start-up hook "
                "is not: select the plugin to see them)")
    return (f"{found[0]} (the library's checker on this program as it is: "
            "NUMBA_CUDA_MEMORY_MANAGER=numba_streamsafe NUMBA_STREAMSAFE_TRANSPARENT=0: "
            "the races that make rounds wrong on a GPU)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=256 if SIMULATOR else 1 << 16,
                        help="keys per round, at least 1")
    parser.add_argument("--repeat", type=int, default=3 if SIMULATOR else 20,
                        help="rounds, at least 1")
    parser.add_argument("--spins", type=int, default=0 if SIMULATOR else 1_000_000,
                        help="nanoseconds each thread of stage 2 sleeps (GPU)")
    parser.add_argument("--events", action="store_true",
                        help="order stages 3 and 4 with the program's own Numba events")
    args = parser.parse_args(argv)
    if args.n < 1:
        parser.error(f"--n must be at least 1, got {args.n}")
    if args.repeat < 1:
        parser.error(f"--repeat must be at least 1, got {args.repeat}")
    if args.spins < 0:
        parser.error(f"--spins must be non-negative, got {args.spins}")
    scale[1, 32](cuda.to_device(np.zeros(32, np.int64)), cuda.device_array(32, np.int64), 1, 0)
    cuda.synchronize()                                   # compiled before timing the race
    lib = sys.modules.get("numba_streamsafe")  # loaded by the plugin's selection, if any
    where = "Numba's CUDA simulator" if SIMULATOR else "the GPU"
    print(f"plain Numba pipeline on {where}; plugin {'loaded' if lib else 'not loaded'}")
    wrong = sum(not run(args.n, args.spins, events=args.events) for _ in range(args.repeat))
    serial = " (the simulator runs one stream's work at a time)" if SIMULATOR else ""
    print(f"result: {args.repeat - wrong}/{args.repeat} rounds right{serial}")
    if lib is None and SIMULATOR:
        print(_hazards_as_it_is(args))
    if lib is not None:
        stats = lib.memory_stats()
        print(f"the library's waits: {stats['waits_inserted']} queued, "
              f"{stats['waits_skipped']} skipped (the program's own ordering covered them)")
    if lib is not None and SIMULATOR:
        found = lib.hazards()
        print(f"hazards: {len(found)}")
        if found:
            print(f"first: {found[0]}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
