"""Ranges: a use orders the bytes it may touch, not the whole allocation.

On Numba's CUDA simulator over the simulated driver. Disjoint views of one
array on several streams insert no wait and the checker reports no race
between them; views that share a byte (of their spans: a strided view's
whole extent) are ordered, and with ordering off the checker reports them,
naming the bytes. Arrays inside tuples are ordered like top-level arrays.
"""

from __future__ import annotations

import collections
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from numba import cuda

import numba_streamsafe as nss
from numba_streamsafe import ReadWrite, Write, tracked_kernel
from numba_streamsafe.numba import emm, sim_plugin, transparent  # noqa: F401 - emm: companion
from numba_streamsafe.resources.tracking.rules import MAX_SPANS
from tests.helpers.sim_kernels import copy, fill

K = 4
C = 16


@cuda.jit
def add_one(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] += 1


@cuda.jit
def fill2(out, value):
    i, j = cuda.grid(2)
    if i < out.shape[0] and j < out.shape[1]:
        out[i, j] = value


@cuda.jit
def copy2(src, dst):
    i, j = cuda.grid(2)
    if i < src.shape[0] and j < src.shape[1]:
        dst[i, j] = src[i, j]


@cuda.jit
def pair_sum(pair, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = pair[0][i] + pair[1][i]


@cuda.jit
def nested_sum(nest, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = nest[0][0][i] + nest[1][i]


@cuda.jit
def pair_write(pair, value):
    i = cuda.grid(1)
    if i < pair[0].size:
        pair[0][i] = value
        pair[1][i] = value


@cuda.jit
def star_sum(out, *arrays):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = arrays[0][i] + arrays[1][i]


@tracked_kernel
def t_add_one(x: ReadWrite):
    i = cuda.grid(1)
    if i < x.size:
        x[i] += 1


@tracked_kernel
def t_fill(out: Write, value):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = value


@tracked_kernel(access={"pair": "r", "out": "w"})
def t_pair_sum(pair, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = pair[0][i] + pair[1][i]


@tracked_kernel(access={"pair": "w"})
def t_pair_write(pair, value):
    i = cuda.grid(1)
    if i < pair[0].size:
        pair[0][i] = value
        pair[1][i] = value


Pair = collections.namedtuple("Pair", "left right")


@pytest.fixture
def plain(rt):
    """The plugin selected on the simulator: Numba's arrays are the library's
    and plain launches and copies are ordered (transparent mode)."""
    sim_plugin.install()
    assert transparent.installed()
    try:
        yield rt
    finally:
        sim_plugin.uninstall()


def _waits(rt) -> int:
    return rt.resource.marks.waits


def _hazards(rt) -> list:
    out = list(rt.driver.hazards)
    rt.driver.hazards.clear()
    return out


def _ordered_then_not(rt, program) -> str:
    """Run ``program()`` in transparent mode (it must leave no hazard), then
    with the mode off (the negative control); the text of the hazards then."""
    program()
    assert _hazards(rt) == []
    with nss.transparent(False):
        program()
    return "\n".join(str(h) for h in _hazards(rt))


# ------------------------------------------------------------ disjoint views
@pytest.mark.parametrize("kernel", ["plain", "tracked"])
def test_disjoint_views_on_k_streams_insert_no_wait(plain, kernel):
    streams = [cuda.stream() for _ in range(K)]
    x = cuda.to_device(np.zeros(K * C, dtype=np.int64))
    y = [cuda.to_device(np.zeros(C, dtype=np.int64)) for _ in range(K)]  # separate arrays
    cuda.synchronize()
    step = add_one if kernel == "plain" else t_add_one
    views = [x[i * C:(i + 1) * C] for i in range(K)]
    for i in range(K):  # the first round waits for the upload (on the default stream)
        step[1, C, streams[i]](views[i])
        step[1, C, streams[i]](y[i])
    before = _waits(plain)
    for _ in range(3):
        for i in range(K):
            step[1, C, streams[i]](views[i])
    views_waits = _waits(plain) - before
    before = _waits(plain)
    for _ in range(3):
        for i in range(K):
            step[1, C, streams[i]](y[i])
    separate_waits = _waits(plain) - before
    assert views_waits == separate_waits == 0
    cuda.synchronize()
    np.testing.assert_array_equal(x.copy_to_host(), np.full(K * C, 4))
    assert _hazards(plain) == []


def test_disjoint_views_are_no_race_for_the_checker(plain):
    a, b = cuda.stream(), cuda.stream()
    x = cuda.to_device(np.zeros(2 * C, dtype=np.float64))
    cuda.synchronize()
    with nss.transparent(False):
        fill[1, C, a](x[:C], 1.0)
        fill[1, C, b](x[C:], 2.0)
        x[:C].copy_to_host(stream=a)
        x[C:].copy_to_host(stream=b)
        cuda.synchronize()
    assert _hazards(plain) == [], "disjoint views share no byte"
    with nss.transparent(False):
        fill[1, C, a](x[:C + 1], 1.0)
        fill[1, C, b](x[C:], 2.0)           # shares x[C]
        cuda.synchronize()
    found = _hazards(plain)
    assert len(found) == 1 and found[0].kind == "write-after-write"
    assert found[0].nbytes == 8, "the report names the one element both touch"
    assert f"+{8} B" in str(found[0])


def test_copies_of_disjoint_halves_are_no_race(plain):
    a, b = cuda.stream(), cuda.stream()
    x = cuda.device_array(2 * C, dtype=np.int64)
    cuda.synchronize()
    host = np.arange(C, dtype=np.int64)
    with nss.transparent(False):
        x[:C].copy_to_device(host, stream=a)
        x[C:].copy_to_device(host, stream=b)
        cuda.synchronize()
    assert _hazards(plain) == []
    x[:C].copy_to_device(host, stream=a)   # these wait for the allocation
    x[C:].copy_to_device(host, stream=b)
    before = _waits(plain)
    x[:C].copy_to_device(host, stream=a)
    x[C:].copy_to_device(host, stream=b)
    assert _waits(plain) == before, "copies of disjoint halves wait for each other never"
    cuda.synchronize()
    np.testing.assert_array_equal(x.copy_to_host(), np.concatenate([host, host]))


# ----------------------------------------------------------- overlapping views
def _overlap_cases():
    # (first view, its access, second view, its access, hazard kind)
    return [
        (slice(0, C), "w", slice(C // 2, C + C // 2), "r", "read-after-write"),
        (slice(0, C), "r", slice(C // 2, C + C // 2), "w", "write-after-read"),
        (slice(0, C), "w", slice(C // 2, C + C // 2), "w", "write-after-write"),
        (slice(0, C + 1), "w", slice(C, 2 * C), "r", "read-after-write"),   # one element
        (slice(0, 2 * C, 2), "w", slice(C + 1, C + 2), "r", "read-after-write"),  # strided
        (slice(2 * C - 1, None, -1), "w", slice(3, 4), "r", "read-after-write"),  # reversed
    ]


@pytest.mark.parametrize("first,fa,second,sa,kind", _overlap_cases())
def test_overlapping_views_on_two_streams_are_ordered(plain, first, fa, second, sa, kind):
    a, b = cuda.stream(), cuda.stream()
    x = cuda.to_device(np.zeros(2 * C, dtype=np.int64))
    sink = cuda.device_array(2 * C, dtype=np.int64)
    fill[1, 2 * C, b](x, 0)             # both last written on b: only a's use is waited for
    fill[1, 2 * C, b](sink, 0)
    cuda.synchronize()

    def use(view, access, stream):
        if access == "w":
            fill[1, 2 * C, stream](view, 5)
        else:
            copy[1, 2 * C, stream](view, sink[:view.size])

    def program():
        use(x[first], fa, a)
        before = _waits(plain)
        use(x[second], sa, b)
        waited = _waits(plain) - before
        cuda.synchronize()
        return waited

    assert program() == 1, "the overlapping pair waits once"
    assert _hazards(plain) == []
    with nss.transparent(False):
        assert program() == 0
    found = _hazards(plain)
    assert [h.kind for h in found if h.kind == kind], found
    assert all(h.nbytes > 0 for h in found)


def test_a_free_of_the_whole_array_waits_for_a_view_read_elsewhere(plain):
    a, b = cuda.stream(), cuda.stream()

    def program():
        with nss.stream_scope(a):
            x = cuda.device_array(2 * C, dtype=np.int64)
        fill[1, 2 * C, a](x, 1)
        y = cuda.device_array(C, dtype=np.int64)
        copy[1, C, b](x[C:], y)           # a read of half of x on b
        del x
        with nss.stream_scope(a):
            z = cuda.device_array(2 * C, dtype=np.int64)  # x's memory again, on a
        fill[1, 2 * C, a](z, -1)
        cuda.synchronize()

    program()
    assert _hazards(plain) == []
    with nss.transparent(False):
        program()
    assert any("argument 'src'" in str(h) for h in _hazards(plain)), "negative control"


# -------------------------------------------------------------------- tuples
@pytest.mark.parametrize("shape", ["tuple", "namedtuple", "varargs"])
def test_arrays_inside_a_tuple_are_ordered(plain, shape):
    """A tuple's arrays, a namedtuple's, and those Numba packs into a kernel's
    ``*arrays`` tuple are ordered as top-level arrays are."""
    a, b = cuda.stream(), cuda.stream()
    x = cuda.device_array(C, dtype=np.int64)
    z = cuda.to_device(np.ones(C, dtype=np.int64))
    y = cuda.device_array(C, dtype=np.int64)
    cuda.synchronize()

    def program():
        fill[1, C, a](x, 7)
        if shape == "varargs":
            star_sum[1, C, b](y, x, z)    # reads x through *arrays
        else:
            pair_sum[1, C, b]((x, z) if shape == "tuple" else Pair(x, z), y)
        out = y.copy_to_host(stream=b)
        b.synchronize()
        assert (out == 8).all()

    text = _ordered_then_not(plain, program)
    name = "'star_sum' argument 'arrays[0]'" if shape == "varargs" else \
        "'pair_sum' argument 'pair[0]'"
    assert name in text, text


def test_a_nested_tuple_and_a_written_tuple_are_ordered(plain):
    a, b = cuda.stream(), cuda.stream()
    x = cuda.device_array(C, dtype=np.int64)
    z = cuda.device_array(C, dtype=np.int64)
    y = cuda.device_array(C, dtype=np.int64)
    cuda.synchronize()

    def program():
        pair_write[1, C, a]((x, z), 3)             # writes both through the tuple
        nested_sum[1, C, b](((x,), z), y)          # reads them through a nested one
        out = y.copy_to_host(stream=b)
        b.synchronize()
        assert (out == 6).all()

    text = _ordered_then_not(plain, program)
    assert "argument 'nest[0][0]'" in text and "argument 'nest[1]'" in text, text


def test_a_tracked_kernel_orders_the_arrays_of_a_declared_tuple(rt):
    a, b = cuda.stream(), cuda.stream()
    x = nss.device_array(C, np.int64, stream=a)
    z = nss.device_array(C, np.int64, stream=a)
    y = nss.device_array(C, np.int64, stream=b)
    t_pair_write[1, C, a]((x, z), 2)               # declared Write: both arrays written
    before = _waits(rt)
    t_pair_sum[1, C, b](Pair(x, z), y)             # declared Read: both wait for a
    assert _waits(rt) - before >= 1
    np.testing.assert_array_equal(nss.copy_to_host(y, stream=b), np.full(C, 4))
    assert _hazards(rt) == []
    with nss.tracking(False):
        t_pair_write[1, C, a]((x, z), 2)
        t_pair_sum[1, C, b]((x, z), y)
    assert _hazards(rt), "negative control: unordered, the checker reports it"


def test_an_undeclared_tuple_of_arrays_is_refused_in_strict_mode(rt):
    @tracked_kernel(access={"out": "w"})
    def k(pair, out):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = pair[0][i]

    x = nss.device_array(C, np.int64)
    y = nss.device_array(C, np.int64)
    with pytest.raises(nss.StreamMisuse, match=r"'pair\[0\]\[0\]'.*annotate 'pair'"):
        k[1, C](((x,),), y)


# ----------------------------------------------------------------- the bound
def test_a_block_used_as_many_chunks_keeps_bounded_state(rt):
    streams = [cuda.stream() for _ in range(8)]
    n = 1000
    x = nss.device_array(n, np.int64, stream=streams[0])
    t_fill[1, n, streams[0]](x, 0)
    block = nss.block_of(x)
    resource = rt.resource
    chunks = [x[i:i + 1] for i in range(n)]

    def one_round():
        for i in range(n):
            t_add_one[1, 1, streams[i % 8]](chunks[i])

    # The process's CPU time, not the wall clock: other processes on the machine (a
    # parallel test run) stretch the wall time of one round and not the other.
    start = time.process_time()
    one_round()
    first = time.process_time() - start
    assert len(resource.block_ranges(block)) <= MAX_SPANS
    start = time.process_time()
    one_round()
    second = time.process_time() - start
    assert len(resource.block_ranges(block)) <= MAX_SPANS
    assert second < 3 * first + 0.5, "later uses do not slow down as chunks accumulate"
    # A merged range over-approximates: its uses wait for more, never fewer.
    out = nss.copy_to_host(x, stream=streams[0])
    np.testing.assert_array_equal(out, np.full(n, 2))
    assert _hazards(rt) == []
    t_fill[1, n, streams[1]](x, 0)       # a write of the whole block: one range again
    assert len(resource.block_ranges(block)) == 1


# ------------------------------------------------- random programs with views
_ROWS, _COLS = 4, 8
_N = _ROWS * _COLS

_windows = st.tuples(st.integers(0, _N - 1), st.integers(1, 12),
                     st.sampled_from([1, 2])).map(lambda t: slice(t[0], t[0] + t[1], t[2]))
_slices = _windows | st.builds(slice, st.integers(-_N, _N) | st.none(),
                               st.integers(-_N, _N) | st.none(),
                               st.sampled_from([None, 1, 2, 3, -1, -2]))
_views = st.one_of(
    st.tuples(st.just("1d"), _slices),
    st.tuples(st.just("2d"), st.tuples(st.integers(0, _ROWS - 1), st.integers(1, _ROWS),
                                        st.integers(0, _COLS - 1), st.integers(1, _COLS),
                                        st.sampled_from([1, 2, -1]))),
    st.tuples(st.just("view of view"), st.tuples(_slices, _slices)),
)
_ops = st.lists(st.tuples(st.integers(0, 2), st.sampled_from(["r", "w"]), _views),
                min_size=1, max_size=6)


def _view(base, spec):
    kind, arg = spec
    if kind == "1d":
        return base[arg]
    if kind == "2d":
        r0, r1, c0, c1, step = arg
        return base.reshape(_ROWS, _COLS)[r0:max(r0 + 1, r1), c0:max(c0 + 1, c1):step]
    return base[arg[0]][arg[1]]


def _span(host, view):
    """The bytes of ``view`` (a view of ``host``) as a half-open range of offsets."""
    if view.size == 0:
        return 0, 0
    lo, hi = np.lib.array_utils.byte_bounds(view)
    base = host.__array_interface__["data"][0]
    return lo - base, hi - base


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(ops=_ops)
def test_random_programs_with_views(plain, ops):
    streams = [cuda.stream() for _ in range(3)]
    host = np.arange(_N, dtype=np.int64)
    spans, writes = [], []
    model = host.copy()
    expected_reads = []
    for n, (_, access, spec) in enumerate(ops):
        v = _view(model, spec)
        spans.append(_span(model, v))
        writes.append(access == "w")
        if access == "w":
            v[...] = 100 + n
        else:
            expected_reads.append(v.copy())
    conflict = any(
        ops[i][0] != ops[j][0] and (writes[i] or writes[j])
        and spans[i][0] < spans[j][1] and spans[j][0] < spans[i][1]
        and spans[i][0] < spans[i][1] and spans[j][0] < spans[j][1]
        for i in range(len(ops)) for j in range(i))

    def run():
        x = cuda.to_device(host)
        sinks = [cuda.device_array(_view(host, spec).shape, np.int64)
                 for _, access, spec in ops if access == "r"]
        cuda.synchronize()
        k = 0
        for n, (s, access, spec) in enumerate(ops):
            v = _view(x, spec)
            sink = None
            if access == "r":
                sink = sinks[k]
                k += 1
            if v.size == 0:
                continue
            two = v.ndim == 2
            grid = (1, 1) if two else 1
            block = (_ROWS, _COLS) if two else _N
            if access == "w":
                (fill2 if two else fill)[grid, block, streams[s]](v, 100 + n)
            else:
                (copy2 if two else copy)[grid, block, streams[s]](v, sink)
        cuda.synchronize()
        return x.copy_to_host(), [sink.copy_to_host() for sink in sinks]

    final, reads = run()
    assert _hazards(plain) == [], "ordered: no hazard"
    np.testing.assert_array_equal(final, model)
    for got, want in zip(reads, expected_reads, strict=True):
        np.testing.assert_array_equal(got, want)
    with nss.transparent(False):
        run()
    found = _hazards(plain)
    assert bool(found) == conflict, (found, spans, ops)
