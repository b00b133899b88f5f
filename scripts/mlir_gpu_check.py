"""numba-cuda-mlir on a GPU: what works under it and what is refused.

Run from the repository root on the GPU machine::

    python3 scripts/mlir_gpu_check.py [--out DIR] [--rounds N]

It prepares an environment of its own, then runs each check in a child
interpreter and prints a table (and ``DIR/mlir_gpu_check.json``, DIR being
``$OUT`` or ``./gpu-out``):

- **prepare**: numba-cuda-mlir's wheel, unpacked and packed again with xz
  (``.whl-mlir/NAME.tar.xz``, or split in parts ``NAME.tar.xz.KofN`` beside
  ``NAME.tar.xz.sha256`` in folders under ``.whl-mlir/``, so that each call
  carries less), unpacked into ``/tmp/mlir-site`` once every part has come;
  the wheels of ``.whl-mlir/`` and ``.whl/`` (NumPy below 2.5, which numba-cuda
  needs) installed there. The machine's own packages (numba-cuda,
  cuda-bindings, cuda-core) come after it. Each step is done once while the
  machine is kept (marker files); ``--prepare-only`` stops there, for a call
  that only brings a part.
- **numba-cuda-mlir alone**: a two-stream program (upload on ``a``, an event,
  the kernel on ``b``, the copy back) without the plugin: the baseline.
- **plugin**: the same program, ``NUMBA_CUDA_MEMORY_MANAGER=numba_streamsafe``
  with ``NUMBA_STREAMSAFE_TRANSPARENT=0``: the context's memory manager is the
  library's, allocations and frees go through the runtime, ``stream_scope``
  picks the allocation's stream, pinned host arrays still work; also through
  ``cuda.set_memory_manager``; the cost of a ``device_array`` cycle beside
  numba-cuda-mlir's own manager.
- **refused**: transparent mode (the plugin with the default settings), check
  mode, the simulated driver, a tracked kernel written for numba-cuda-mlir: each
  must stop with the library's one-line error.
- **numba-cuda beside it**: a numba-cuda tracked kernel in a process that uses
  numba-cuda-mlir with the plugin.

The carried files are made on any machine (the 71 MB wheel packs into 46.1 MB, in
two parts of 28 MiB and 16 MiB)::

    pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 -d DIR numba-cuda-mlir==0.6.0
    unzip -q DIR/numba_cuda_mlir-0.6.0-cp312-*.whl -d X
    N=numba_cuda_mlir-0.6.0-cp312.tar.xz
    tar --sort=name --owner=0 --group=0 --numeric-owner -C X -cf - numba_cuda_mlir \
        numba_cuda_mlir-0.6.0.dist-info | xz --x86 --lzma2=preset=9e,dict=192MiB > $N
    mkdir -p .whl-mlir/1 .whl-mlir/2
    head -c 29360128 $N > .whl-mlir/1/$N.1of2 && tail -c +29360129 $N > .whl-mlir/2/$N.2of2
    sha256sum $N | tee .whl-mlir/1/$N.sha256 > .whl-mlir/2/$N.sha256
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SITE = Path(os.environ.get("MLIR_SITE", "/tmp/mlir-site"))

PRELUDE = textwrap.dedent(r'''
    import json, os, sys, time, traceback
    import numpy as np

    def result(status, detail, **extra):
        print("RESULT " + json.dumps({"status": status, "detail": detail, **extra}))
        sys.exit(0)

    def refused_or_error(exc):
        import numba_streamsafe as nss
        line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if isinstance(exc, nss.StreamSafeError) and "numba-cuda-mlir" in str(exc):
            result("refused", f"{type(exc).__name__}: {line}",
                   one_line="\n" not in str(exc))
        traceback.print_exc()
        result("error", f"{type(exc).__name__}: {line}")

    ROUNDS = int(os.environ.get("MLIR_ROUNDS", "20"))
    N = 1 << 20

    def program():
        """A two-stream program ordered by its own event; returns the wrong rounds."""
        from numba_cuda_mlir import cuda

        @cuda.jit
        def scale(src, dst, k):
            i = cuda.grid(1)
            if i < src.size:
                dst[i] = src[i] * k

        a, b = cuda.stream(), cuda.stream()
        host = np.arange(N, dtype=np.float64)
        wrong = 0
        for _ in range(ROUNDS):
            x = cuda.to_device(host, stream=a)
            y = cuda.device_array_like(x, stream=a)
            done = cuda.event()
            done.record(a)
            done.wait(b)
            scale[(N + 255) // 256, 256, b](x, y, 2.0)
            out = y.copy_to_host(stream=b)
            b.synchronize()
            wrong += not np.array_equal(out, host * 2)
            del x, y
        return wrong

    def cycle_us(count=2000):
        """Microseconds per cuda.device_array (4 KiB) made and dropped."""
        from numba_cuda_mlir import cuda
        for _ in range(100):
            cuda.device_array(1024, np.float32)
        t0 = time.perf_counter()
        for _ in range(count):
            cuda.device_array(1024, np.float32)
        return (time.perf_counter() - t0) / count * 1e6
''')

CHECKS: dict[str, tuple[str, dict[str, str], str]] = {}


def check(name: str, expect: str, env: dict[str, str]):
    def add(body: str) -> str:
        CHECKS[name] = (expect, env, textwrap.dedent(body))
        return body
    return add


check("numba-cuda-mlir alone", "works", {})('''
    try:
        wrong = program()
        us = cycle_us()
    except Exception as exc:
        refused_or_error(exc)
    from numba_cuda_mlir import cuda
    manager = type(cuda.current_context().memory_manager).__name__
    result("works" if wrong == 0 else "wrong",
           f"{wrong} wrong of {ROUNDS} rounds; manager {manager}; {us:.1f} us/device_array",
           us=us)
''')

PLUGIN = {"NUMBA_CUDA_MEMORY_MANAGER": "numba_streamsafe", "NUMBA_STREAMSAFE_TRANSPARENT": "0"}

check("plugin (TRANSPARENT=0)", "works", PLUGIN)('''
    import gc
    try:
        wrong = program()
        import numba_streamsafe as nss
        from numba_cuda_mlir import cuda
        rt = nss.get_runtime()
        manager = type(cuda.current_context().memory_manager).__name__
        gc.collect(); cuda.synchronize(); rt.flush(); rt.reap()
        stats = rt.stats()
        # stream_scope picks the allocation's stream; the free is queued on it.
        a = cuda.stream()
        with nss.stream_scope(a):
            z = cuda.device_array(4096, np.uint8, stream=a)
        scoped = nss.block_of(z).stream == rt.stream_handle(a)
        frees = rt.stats().frees
        del z; gc.collect(); a.synchronize(); rt.flush()
        freed = rt.stats().frees == frees + 1
        pinned = cuda.pinned_array(16, np.float32)   # host memory: numba-cuda-mlir's own path
        pinned[:] = 1.0
        d = cuda.to_device(pinned)
        pinned_ok = bool((d.copy_to_host() == 1.0).all())
        us = cycle_us()
    except Exception as exc:
        refused_or_error(exc)
    ok = (wrong == 0 and manager == "MlirMemoryManager" and stats.allocations >= 2 * ROUNDS
          and stats.frees >= 2 * ROUNDS and scoped and freed and pinned_ok)
    result("works" if ok else "wrong",
           f"{wrong} wrong of {ROUNDS} rounds; manager {manager}; runtime allocations "
           f"{stats.allocations}, frees {stats.frees}; stream_scope {scoped}, its free {freed}; "
           f"pinned {pinned_ok}; {us:.1f} us/device_array", us=us)
''')

check("plugin via set_memory_manager", "works", {"NUMBA_STREAMSAFE_TRANSPARENT": "0"})('''
    try:
        import numba_streamsafe as nss
        from numba_cuda_mlir import cuda
        cuda.set_memory_manager(nss.StreamSafeMemoryManager)
        wrong = program()
        manager = type(cuda.current_context().memory_manager).__name__
        allocations = nss.get_runtime().stats().allocations
    except Exception as exc:
        refused_or_error(exc)
    ok = wrong == 0 and manager == "MlirMemoryManager" and allocations >= 2 * ROUNDS
    result("works" if ok else "wrong",
           f"{wrong} wrong of {ROUNDS} rounds; manager {manager}; runtime allocations "
           f"{allocations}")
''')

REFUSED = '''
    try:
        wrong = program()
    except Exception as exc:
        refused_or_error(exc)
    result("not refused", f"ran: {wrong} wrong of {ROUNDS} rounds")
'''
check("transparent mode (default settings)", "refused",
      {"NUMBA_CUDA_MEMORY_MANAGER": "numba_streamsafe"})(REFUSED)
check("check mode (NUMBA_STREAMSAFE_MODE=check)", "refused",
      {"NUMBA_CUDA_MEMORY_MANAGER": "numba_streamsafe", "NUMBA_STREAMSAFE_MODE": "check"})(REFUSED)
check("simulator (NUMBA_ENABLE_CUDASIM=1)", "refused",
      {**PLUGIN, "NUMBA_ENABLE_CUDASIM": "1"})(REFUSED)

check("tracked kernel (numba-cuda-mlir's cuda)", "refused", PLUGIN)('''
    try:
        import numba_streamsafe as nss
        from numba_cuda_mlir import cuda

        @nss.tracked_kernel
        def scale(src: nss.Read, dst: nss.Write, k):
            i = cuda.grid(1)
            if i < src.size:
                dst[i] = src[i] * k
    except nss.InvalidArgument as exc:
        result("refused", f"InvalidArgument: {exc}", one_line="\\n" not in str(exc))
    except Exception as exc:
        refused_or_error(exc)
    result("not refused", "the kernel was made")
''')

check("numba-cuda tracked kernel beside it", "works", PLUGIN)('''
    try:
        import numba_streamsafe as nss
        from numba import cuda as numba_cuda
        from numba_cuda_mlir import cuda

        wrong = program()  # numba-cuda-mlir's program, with the plugin

        @nss.tracked_kernel
        def scale(src: nss.Read, dst: nss.Write, k):
            i = numba_cuda.grid(1)
            if i < src.size:
                dst[i] = src[i] * k

        a, b = numba_cuda.stream(), numba_cuda.stream()
        host = np.arange(N, dtype=np.float64)
        x = nss.to_device(host, stream=a)
        y = nss.device_array(host.shape, host.dtype, stream=a)
        scale[(N + 255) // 256, 256, b](x, y, 3.0)    # waits for the upload on a
        out = nss.copy_to_host(y, stream=a)            # waits for the kernel on b
        a.synchronize()
        tracked_ok = bool(np.array_equal(out, host * 3))
    except Exception as exc:
        refused_or_error(exc)
    ok = wrong == 0 and tracked_ok
    result("works" if ok else "wrong",
           f"numba-cuda-mlir program {wrong} wrong of {ROUNDS}; numba-cuda tracked kernel "
           f"{'right' if tracked_ok else 'WRONG'}")
''')


def _parts(site: Path) -> list[str]:
    """Gather the carried parts of a split tarball (``NAME.tar.xz.KofN``, found anywhere
    under ``.whl-mlir/``) in ``site/.parts``; join each tarball whose N parts are all
    there (checked against ``NAME.tar.xz.sha256``). Returns the tarballs joined."""
    store = site / ".parts"
    store.mkdir(parents=True, exist_ok=True)
    for found in glob.glob(str(ROOT / ".whl-mlir" / "**" / "*.tar.xz.*"), recursive=True):
        if not (store / Path(found).name).exists():
            shutil.copy(found, store / Path(found).name)
    joined = []
    for digest in sorted(store.glob("*.tar.xz.sha256")):
        name = digest.name[: -len(".sha256")]
        parts = sorted(store.glob(name + ".*of*"))
        total = int(parts[0].name.rpartition("of")[2]) if parts else 0
        if not parts or len(parts) != total or (store / name).exists():
            continue
        sha = hashlib.sha256()
        with open(store / name, "wb") as out:
            for k in range(1, total + 1):
                data = (store / f"{name}.{k}of{total}").read_bytes()
                sha.update(data)
                out.write(data)
        if sha.hexdigest() != digest.read_text().split()[0]:
            (store / name).unlink()
            raise SystemExit(f"{name}: its parts joined do not match {digest.name}")
        joined.append(str(store / name))
    return joined


def prepare(site: Path) -> list[str]:
    """Unpack the carried numba-cuda-mlir (whole, or its parts once all have come) and
    install the carried wheels into ``site``."""
    notes = []
    site.mkdir(parents=True, exist_ok=True)
    tarballs = glob.glob(str(ROOT / ".whl-mlir" / "*.tar.xz")) + _parts(site)
    for tarball in sorted(tarballs):
        done = site / f".{Path(tarball).name}.done"
        if done.exists():
            continue
        t0 = time.time()
        subprocess.run(["tar", "-xJf", tarball, "-C", str(site)], check=True)
        done.touch()
        notes.append(f"unpacked {Path(tarball).name} in {time.time() - t0:.0f} s")
    parts = sorted(p.name for p in (site / ".parts").glob("*.tar.xz.*of*"))
    if parts:
        notes.append("parts here: " + ", ".join(parts))
    wheels = sorted(glob.glob(str(ROOT / ".whl-mlir" / "**" / "*.whl"), recursive=True) +
                    glob.glob(str(ROOT / ".whl" / "numpy-*.whl")))
    if not any(Path(w).name.startswith("numpy-") for w in wheels):
        notes.append("no .whl/numpy-*.whl carried: the machine's NumPy is used")
    todo = [w for w in wheels if not (site / f".{Path(w).name}.done").exists()]
    if todo:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                        "--no-compile", "--upgrade", "--target", str(site), *todo], check=True)
        for w in todo:
            (site / f".{Path(w).name}.done").touch()
        notes.append("installed " + ", ".join(Path(w).name for w in todo))
    return notes


#: The variables the checks set, each as its own check says.
SETTINGS = ("NUMBA_CUDA_MEMORY_MANAGER", "NUMBA_ENABLE_CUDASIM", "NUMBA_STREAMSAFE_TRANSPARENT",
            "NUMBA_STREAMSAFE_MODE", "NUMBA_STREAMSAFE_DRIVER", "NUMBA_STREAMSAFE_CHECK_REPORT")


def child_env(extra: dict[str, str], rounds: int) -> dict[str, str]:
    # The settings the checks choose are theirs alone (NUMBA_STREAMSAFE_PURE_PYTHON is kept).
    env = {k: v for k, v in os.environ.items() if k not in SETTINGS}
    env["PYTHONPATH"] = os.pathsep.join([str(SITE), str(ROOT)])
    env["MLIR_ROUNDS"] = str(rounds)
    env.update(extra)
    return env


def versions(rounds: int) -> str:
    code = textwrap.dedent('''
        from importlib.metadata import version
        out = []
        for d in ("numba-cuda-mlir", "numba-cuda", "numba", "cuda-bindings", "cuda-core", "numpy"):
            try:
                out.append(f"{d} {version(d)}")
            except Exception as exc:
                out.append(f"{d} missing ({type(exc).__name__})")
        try:
            import cuda.pathfinder as pf
            for lib in ("nvrtc", "nvJitLink", "nvvm"):
                try:
                    out.append(f"{lib} {pf.load_nvidia_dynamic_lib(lib).abs_path}")
                except Exception as exc:
                    out.append(f"{lib} NOT FOUND ({type(exc).__name__})")
        except Exception as exc:
            out.append(f"cuda.pathfinder: {exc}")
        try:
            import numba_streamsafe.compiled as c
            builds = sorted(set(c.engine_builds(load=True).values()))
            out.append(f"numba_streamsafe engine: {builds}")
        except Exception as exc:
            out.append(f"numba_streamsafe: {type(exc).__name__}: {exc}")
        print("\\n".join(out))
    ''')
    proc = subprocess.run([sys.executable, "-c", code], env=child_env({}, rounds),
                          capture_output=True, text=True, cwd=ROOT)
    return proc.stdout + proc.stderr


def run_check(name: str, rounds: int, out: Path) -> dict[str, object]:
    expect, extra, body = CHECKS[name]
    t0 = time.time()
    try:
        proc = subprocess.run([sys.executable, "-X", "faulthandler", "-c", PRELUDE + body],
                              env=child_env(extra, rounds), capture_output=True, text=True,
                              cwd=ROOT, timeout=300)
        text, rc = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        text, rc = f"{exc.stdout or ''}{exc.stderr or ''}\ntimed out", -1
    log = out / ("mlir_" + "".join(c if c.isalnum() else "_" for c in name) + ".log")
    log.write_text(text if isinstance(text, str) else str(text))
    lines = [line for line in text.splitlines() if line.startswith("RESULT ")]
    if lines:
        got = json.loads(lines[-1][len("RESULT "):])
    else:
        tail = [line for line in text.splitlines() if line.strip()][-1:] or [f"exit {rc}"]
        got = {"status": "error", "detail": f"exit {rc}: {tail[0]}"}
    got.update(check=name, expected=expect, seconds=round(time.time() - t0, 1),
               settings=" ".join(f"{k}={v}" for k, v in extra.items()) or "-",
               log=log.name)
    return got


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "gpu-out"))
    parser.add_argument("--rounds", type=int, default=20, help="rounds of the program")
    parser.add_argument("--prepare-only", action="store_true")
    parser.add_argument("--only", action="append", help="run the checks whose name has this")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for note in prepare(SITE):
        print("prepare:", note)
    if args.prepare_only:
        return 0
    if not (SITE / "numba_cuda_mlir").is_dir():
        print(f"numba-cuda-mlir is not in {SITE}: carry .whl-mlir/ (its tarball)")
        return 2
    if shutil.which("nvidia-smi"):
        subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"])
    print(versions(args.rounds))
    rows = []
    for name in CHECKS:
        if args.only and not any(part in name for part in args.only):
            continue
        row = run_check(name, args.rounds, out)
        rows.append(row)
        mark = "ok " if row["status"] == row["expected"] else "!! "
        print(f"{mark}{name:40} {row['status']:12} {row['seconds']:6.1f}s  {row['detail']}",
              flush=True)
    (out / "mlir_gpu_check.json").write_text(json.dumps(rows, indent=1))
    print()
    print(f"{'check':40} | {'settings':70} | {'expected':8} | result")
    for row in rows:
        print(f"{row['check']:40} | {row['settings']:70} | {row['expected']:8} | "
              f"{row['status']}: {row['detail']}")
    bad = [row["check"] for row in rows if row["status"] != row["expected"]]
    print(f"\n{len(rows) - len(bad)} of {len(rows)} as expected" +
          (f"; not: {', '.join(map(str, bad))}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
