"""Access inference, the check of declared accesses at the first launch, and
inferred mode, on Numba's CUDA simulator over the simulated driver."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from numba import cuda

import numba_streamsafe as nss
from numba_streamsafe import (
    AccessMismatch,
    AccessWarning,
    Read,
    ReadWrite,
    StreamSafeError,
    Write,
    tracked_kernel,
)
from numba_streamsafe.core.settings import reload_settings
from numba_streamsafe.numba.accesses.inference import infer_access
from tests.helpers.inference_corpus import CORPUS, score

N = 64
GRID, BLOCK = 2, 32


# --------------------------------------------------------------- the corpus
def test_inference_never_under_approximates_and_is_exact_on_most():
    rows = score()
    assert len(CORPUS) >= 40
    under = [r for r in rows if r[4] == "under"]
    assert under == [], under
    exact = sum(r[4] == "exact" for r in rows)
    assert exact / len(rows) >= 0.9, (exact, len(rows), [r for r in rows if r[4] != "exact"])


def test_an_unknown_call_counts_as_read_and_write():
    def opaque(x):  # a plain Python function: not a device function the analysis reads
        return x

    def k(a, b):
        i = cuda.grid(1)
        if i < b.size:
            b[i] = opaque(a)[i]

    inferred = infer_access(k)
    assert inferred["a"] == nss.Access.READ_WRITE  # over-approximated, never missed


# ---------------------------------------------------------------- the check
def _racy_writer():
    """A kernel that writes ``src``, declared Read (the mistake the check catches)."""

    def writes_src(src, dst):
        i = cuda.grid(1)
        if i < src.size:
            dst[i] = src[i]
            src[i] = 0  # <- the undeclared write

    return writes_src


def test_a_read_parameter_that_is_written_raises_at_the_first_launch(rt, streams):
    a, _ = streams
    k = tracked_kernel(_racy_writer(), access={"src": Read, "dst": Write})
    x = nss.device_array(N, np.int64, stream=a)
    y = nss.device_array(N, np.int64, stream=a)
    calls = sum(rt.driver.calls.values())
    with pytest.raises(AccessMismatch) as info:
        k[GRID, BLOCK, a](x, y)
    err = info.value
    assert isinstance(err, StreamSafeError) and isinstance(err, ValueError)
    assert (err.kernel, err.param) == ("writes_src", "src")
    assert err.where is not None and err.where.endswith(f":{_line_of('src[i] = 0')}")
    assert "src" in str(err) and err.where in str(err) and "ReadWrite" in str(err)
    assert sum(rt.driver.calls.values()) == calls, "nothing was queued"


def test_the_same_kernel_declared_read_write_runs(rt, streams):
    a, b = streams
    k = tracked_kernel(_racy_writer(), access={"src": ReadWrite, "dst": Write})
    x = nss.to_device(np.arange(N, dtype=np.int64), stream=a)
    y = nss.device_array(N, np.int64, stream=b)
    with warnings.catch_warnings():
        warnings.simplefilter("error", AccessWarning)
        k[GRID, BLOCK, b](x, y)
    np.testing.assert_array_equal(nss.copy_to_host(y, stream=b), np.arange(N))
    np.testing.assert_array_equal(nss.copy_to_host(x, stream=b), np.zeros(N))
    assert not rt.driver.hazards


def test_without_the_check_the_wrong_declaration_races(rt, streams):
    """The negative control: unchecked, the write declared Read is not ordered."""
    a, b = streams
    k = tracked_kernel(_racy_writer(), access={"src": Read, "dst": Write}, check_access=False)
    x = nss.to_device(np.arange(N, dtype=np.int64), stream=a)
    y = nss.device_array(N, np.int64, stream=b)
    z = nss.device_array(N, np.int64, stream=a)
    k[GRID, BLOCK, b](x, y)             # writes x on b, recorded as a read
    fill_from[GRID, BLOCK, a](x, z)     # reads x on a: not ordered after b's write
    assert rt.driver.hazards


@tracked_kernel
def fill_from(src: Read, dst: Write):
    i = cuda.grid(1)
    if i < src.size:
        dst[i] = src[i]


def test_the_setting_turns_the_check_off(rt, streams, monkeypatch):
    a, _ = streams
    monkeypatch.setenv("NUMBA_STREAMSAFE_CHECK_ACCESS", "0")
    reload_settings()
    try:
        k = tracked_kernel(_racy_writer(), access={"src": Read, "dst": Write})
        x = nss.device_array(N, np.int64, stream=a)
        k[GRID, BLOCK, a](x, nss.device_array(N, np.int64, stream=a))  # no error
    finally:
        monkeypatch.undo()
        reload_settings()


def test_a_written_declaration_never_written_warns(rt, streams):
    a, _ = streams

    def reads_only(src, dst):
        i = cuda.grid(1)
        if i < src.size:
            dst[i] = src[i]

    k = tracked_kernel(reads_only, access={"src": ReadWrite, "dst": Write})
    x = nss.device_array(N, np.int64, stream=a)
    y = nss.device_array(N, np.int64, stream=a)
    with pytest.warns(AccessWarning, match="never writes parameter 'src'.*declare it Read"):
        k[GRID, BLOCK, a](x, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error", AccessWarning)
        k[GRID, BLOCK, a](x, y)  # once: the check ran at the first launch only


def test_bad_access_options_are_refused():
    with pytest.raises(nss.InvalidArgument, match="'infer'"):
        tracked_kernel(_racy_writer(), access="guess")
    with pytest.raises(nss.InvalidArgument, match="check_access"):
        tracked_kernel(_racy_writer(), check_access="yes")


# ------------------------------------------------------------ inferred mode
def test_inferred_mode_orders_without_annotations(rt, streams):
    a, b = streams

    @tracked_kernel(access="infer")
    def fill(out, value):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = value

    @tracked_kernel(access="infer")
    def add(src, dst, k):
        i = cuda.grid(1)
        if i < src.size:
            dst[i] = src[i] + k

    x = nss.device_array(N, np.int64, stream=a)
    y = nss.device_array(N, np.int64, stream=b)
    fill[GRID, BLOCK, a](x, 5)
    add[GRID, BLOCK, b](x, y, 1)
    np.testing.assert_array_equal(nss.copy_to_host(y, stream=b), np.full(N, 6))
    assert not rt.driver.hazards
    assert add.accesses == {"src": nss.Access.READ, "dst": nss.Access.WRITE, "k": None}
    assert fill.accesses == {"out": nss.Access.WRITE, "value": None}


def test_inferred_mode_negative_control_races_untracked(rt, streams):
    a, b = streams

    @tracked_kernel(access="infer")
    def fill(out, value):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = value

    x = nss.device_array(N, np.int64, stream=a)
    y = nss.device_array(N, np.int64, stream=b)
    fill[GRID, BLOCK, a](x, 5)
    with nss.tracking(False):
        fill_from[GRID, BLOCK, b](x, y)
    assert rt.driver.hazards


def _line_of(text: str) -> int:
    import inspect

    lines, start = inspect.getsourcelines(_racy_writer)
    return start + next(i for i, line in enumerate(lines) if text in line)


@pytest.mark.slow  # end to end (CI runs it); the default run stays under a minute
# ------------------------------------------- the examples, inferred vs declared
@pytest.mark.parametrize(("example", "n"), [("multistream_sort", 200), ("hash_join", 200),
                                            ("sort_join_pipeline", 300)])
def test_examples_queue_the_same_work_with_inferred_accesses(example, n):
    """Every driver call (waits and events included) of the example with its
    declared accesses, and with every access inferred
    (``NUMBA_STREAMSAFE_ACCESS=infer``), on the simulated driver: the same."""
    from test_examples_match_benchmarks import _child, _first_difference

    declared = _ordering(_child("example", example, n))
    inferred = _ordering(_child("example", example, n, NUMBA_STREAMSAFE_ACCESS="infer"))
    assert sum(e[0] == "stream_wait_event" for e in declared) >= 3, declared[:20]
    assert declared == inferred, _first_difference(declared, inferred)


def _ordering(log):
    """The record with each access the checker is told reduced to what orders
    it: written (Write and ReadWrite wait for the same) or only read."""
    out = []
    for entry in log:
        if entry[0] == "trace_access":
            entry = [*entry[:2], [[b, n, "w" if a & 2 else "r"] for b, n, a in entry[2]],
                     *entry[3:]]
        out.append(entry)
    return out
