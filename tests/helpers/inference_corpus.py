"""Kernels with the true access of each parameter, for the access inference.

``CORPUS`` lists ``(kernel, truth)``; ``truth`` maps each parameter to ``"r"``,
``"w"``, ``"rw"``, ``"-"`` (an array the kernel does not touch, or touches
only its metadata) or ``"s"`` (a scalar: not scored, accesses are for arrays). The kernels cover
the constructs the inference follows: slices and views, local aliases and
tuples, loops and branches, atomics, device functions, attributes only,
2-D rows, iteration, in-place operators, and calls it cannot see into.
"""

from __future__ import annotations

import math

from numba import cuda

# ------------------------------------------------------------ device functions


@cuda.jit(device=True)
def dev_store(x, i, v):
    x[i] = v


@cuda.jit(device=True)
def dev_load(x, i):
    return x[i]


@cuda.jit(device=True)
def dev_bump(x, i):
    x[i] += 1


@cuda.jit(device=True)
def dev_shape(x):
    return x.shape[0]


@cuda.jit(device=True)
def dev_nested_store(x, i, v):
    dev_store(x, i, v)


@cuda.jit(device=True)
def dev_copy(src, dst, i):
    dst[i] = src[i]


# --------------------------------------------------------------------- kernels


def k_copy(src, dst):
    i = cuda.grid(1)
    if i < src.size:
        dst[i] = src[i]


def k_fill(out, value):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = value


def k_inc(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] += 1


def k_add3(a, b, c):
    i = cuda.grid(1)
    if i < c.size:
        c[i] = a[i] + b[i]


def k_shape_only(a, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a.shape[0] + a.size + a.ndim


def k_len_only(a, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = len(a)


def k_slice_write(a, b):
    i = cuda.grid(1)
    tail = a[1:]
    if i < tail.size:
        tail[i] = b[i]


def k_slice_read(a, b):
    i = cuda.grid(1)
    head = a[:4]
    if i < head.size:
        b[i] = head[i]


def k_alias_local(a, b):
    i = cuda.grid(1)
    x = a
    y = x
    if i < b.size:
        y[i] = b[i]


def k_tuple_alias(a, b, c):
    i = cuda.grid(1)
    pair = (a, b)
    first, second = pair
    if i < c.size:
        first[i] = c[i]
        c[i] = second[i]


def k_tuple_index(a, b):
    i = cuda.grid(1)
    t = (a, b)
    if i < b.size:
        t[0][i] = 1


def k_loop_write(a, n):
    i = cuda.grid(1)
    for j in range(n):
        if i < a.size:
            a[i] = j


def k_loop_read(a, out):
    i = cuda.grid(1)
    s = 0
    for j in range(a.size):
        s += a[j]
    if i < out.size:
        out[i] = s


def k_branch_write(a, b, flag):
    i = cuda.grid(1)
    if flag:
        if i < a.size:
            a[i] = 0
    elif i < b.size:
        b[i] = 0


def k_atomic_add(counts, keys):
    i = cuda.grid(1)
    if i < keys.size:
        cuda.atomic.add(counts, keys[i], 1)


def k_atomic_max(best, vals):
    i = cuda.grid(1)
    if i < vals.size:
        cuda.atomic.max(best, 0, vals[i])


def k_atomic_cas(table, keys):
    i = cuda.grid(1)
    if i < keys.size:
        cuda.atomic.compare_and_swap(table[0:1], 0, keys[i])


def k_device_store(a, b):
    i = cuda.grid(1)
    if i < b.size:
        dev_store(a, i, b[i])


def k_device_load(a, b):
    i = cuda.grid(1)
    if i < b.size:
        b[i] = dev_load(a, i)


def k_device_bump(a):
    i = cuda.grid(1)
    if i < a.size:
        dev_bump(a, i)


def k_device_shape(a, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = dev_shape(a)


def k_device_nested(a, v):
    i = cuda.grid(1)
    if i < a.size:
        dev_nested_store(a, i, v)


def k_device_copy(a, b):
    i = cuda.grid(1)
    if i < a.size:
        dev_copy(a, b, i)


def k_device_kw(a, b):
    i = cuda.grid(1)
    if i < a.size:
        dev_copy(dst=a, src=b, i=i)


def k_2d_row_write(m, v):
    i = cuda.grid(1)
    if i < m.shape[0]:
        row = m[i]
        row[0] = v[i]


def k_2d_index(m, out):
    i, j = cuda.grid(2)
    if i < m.shape[0] and j < m.shape[1]:
        out[i, j] = m[i, j] * 2


def k_2d_inplace(m):
    i, j = cuda.grid(2)
    if i < m.shape[0] and j < m.shape[1]:
        m[i, j] *= 2


def k_transpose_write(m, v):
    i = cuda.grid(1)
    t = m.T
    if i < t.shape[0]:
        t[i, 0] = v


def k_reshape_read(a, out):
    i = cuda.grid(1)
    r = a.reshape(a.size)
    if i < out.size:
        out[i] = r[i]


def k_unused(a, b):
    i = cuda.grid(1)
    if i < b.size:
        b[i] = i


def k_scalar_local_inc(a, out):
    i = cuda.grid(1)
    if i < a.size:
        v = a[i]
        v += 1
        out[i] = v


def k_math(a, out):
    i = cuda.grid(1)
    if i < a.size:
        out[i] = math.sqrt(a[i]) + max(a[i], 0.0)


def k_swap(a, b):
    i = cuda.grid(1)
    if i < a.size:
        a[i], b[i] = b[i], a[i]


def k_iterate(a, out):
    i = cuda.grid(1)
    s = 0.0
    for x in a:
        s += x
    if i < out.size:
        out[i] = s


def k_shared_stage(a, out):
    tile = cuda.shared.array(32, dtype=a.dtype)
    i = cuda.grid(1)
    t = cuda.threadIdx.x
    if i < a.size:
        tile[t] = a[i]
    cuda.syncthreads()
    if i < out.size:
        out[i] = tile[31 - t]


def k_local_array(a, out):
    buf = cuda.local.array(4, dtype=a.dtype)
    i = cuda.grid(1)
    for j in range(4):
        buf[j] = a[j]
    if i < out.size:
        out[i] = buf[0] + buf[3]


def k_write_then_read(a):
    i = cuda.grid(1)
    if i < a.size:
        a[i] = 1
        cuda.syncthreads()
        a[i] = a[(i + 1) % a.size] + 1


def k_histogram(keys, bins, nbins):
    i = cuda.grid(1)
    if i < keys.size:
        cuda.atomic.add(bins, keys[i] % nbins, 1)


def k_gather(src, idx, out):
    i = cuda.grid(1)
    if i < idx.size:
        out[i] = src[idx[i]]


def k_scatter(vals, idx, out):
    i = cuda.grid(1)
    if i < idx.size:
        out[idx[i]] = vals[i]


def k_conditional_alias(a, b, out, flag):
    i = cuda.grid(1)
    x = a if flag else b
    if i < out.size:
        out[i] = x[i]


def k_conditional_alias_write(a, b, flag):
    i = cuda.grid(1)
    x = a if flag else b
    if i < x.size:
        x[i] = 0


def k_while(a, n):
    i = cuda.grid(1)
    j = 0
    while j < n:
        if i < a.size:
            a[i] = a[i] + j
        j += 1


def k_nested_slice(a, v):
    i = cuda.grid(1)
    s = a[2:][1:]
    if i < s.size:
        s[i] = v


def k_three_reads(a, b, c, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a[i] * b[i] - c[i]


def k_attrs_and_write(a, b):
    i = cuda.grid(1)
    if i < a.shape[0] and b.dtype.itemsize > 0:
        a[i] = 7


#: (kernel, truth per parameter).
CORPUS = [
    (k_copy, {"src": "r", "dst": "w"}),
    (k_fill, {"out": "w", "value": "s"}),
    (k_inc, {"x": "rw"}),
    (k_add3, {"a": "r", "b": "r", "c": "w"}),
    (k_shape_only, {"a": "-", "out": "w"}),
    (k_len_only, {"a": "-", "out": "w"}),
    (k_slice_write, {"a": "w", "b": "r"}),
    (k_slice_read, {"a": "r", "b": "w"}),
    (k_alias_local, {"a": "w", "b": "r"}),
    (k_tuple_alias, {"a": "w", "b": "r", "c": "rw"}),
    (k_tuple_index, {"a": "w", "b": "-"}),
    (k_loop_write, {"a": "w", "n": "s"}),
    (k_loop_read, {"a": "r", "out": "w"}),
    (k_branch_write, {"a": "w", "b": "w", "flag": "s"}),
    (k_atomic_add, {"counts": "rw", "keys": "r"}),
    (k_atomic_max, {"best": "rw", "vals": "r"}),
    (k_atomic_cas, {"table": "rw", "keys": "r"}),
    (k_device_store, {"a": "w", "b": "r"}),
    (k_device_load, {"a": "r", "b": "w"}),
    (k_device_bump, {"a": "rw"}),
    (k_device_shape, {"a": "-", "out": "w"}),
    (k_device_nested, {"a": "w", "v": "s"}),
    (k_device_copy, {"a": "r", "b": "w"}),
    (k_device_kw, {"a": "w", "b": "r"}),
    (k_2d_row_write, {"m": "w", "v": "r"}),
    (k_2d_index, {"m": "r", "out": "w"}),
    (k_2d_inplace, {"m": "rw"}),
    (k_transpose_write, {"m": "w", "v": "s"}),
    (k_reshape_read, {"a": "r", "out": "w"}),
    (k_unused, {"a": "-", "b": "w"}),
    (k_scalar_local_inc, {"a": "r", "out": "w"}),
    (k_math, {"a": "r", "out": "w"}),
    (k_swap, {"a": "rw", "b": "rw"}),
    (k_iterate, {"a": "r", "out": "w"}),
    (k_shared_stage, {"a": "r", "out": "w"}),
    (k_local_array, {"a": "r", "out": "w"}),
    (k_write_then_read, {"a": "rw"}),
    (k_histogram, {"keys": "r", "bins": "rw", "nbins": "s"}),
    (k_gather, {"src": "r", "idx": "r", "out": "w"}),
    (k_scatter, {"vals": "r", "idx": "r", "out": "w"}),
    (k_conditional_alias, {"a": "r", "b": "r", "out": "w", "flag": "s"}),
    (k_conditional_alias_write, {"a": "w", "b": "w", "flag": "s"}),
    (k_while, {"a": "rw", "n": "s"}),
    (k_nested_slice, {"a": "w", "v": "s"}),
    (k_three_reads, {"a": "r", "b": "r", "c": "r", "out": "w"}),
    (k_attrs_and_write, {"a": "w", "b": "-"}),
]


_NAMES = {None: "-", 1: "r", 2: "w", 3: "rw"}


def score() -> list[tuple[str, str, str, str, str]]:
    """Each array parameter of the corpus: ``(kernel, parameter, truth,
    inferred, verdict)``, verdict ``"exact"``, ``"over"`` (the inferred
    access includes the true one and more) or ``"under"`` (it misses some)."""
    from numba_streamsafe.numba.accesses.inference import infer_params

    rows = []
    for kernel, truth in CORPUS:
        got = {u.name: u.access for u in infer_params(kernel)}
        assert set(got) == set(truth), (kernel.__name__, sorted(got), sorted(truth))
        for param, want in truth.items():
            if want == "s":
                continue
            access = got[param]
            have = _NAMES[int(access) if access is not None else None]
            if have == want:
                verdict = "exact"
            elif set(want.replace("-", "")) <= set(have.replace("-", "")):
                verdict = "over"
            else:
                verdict = "under"
            rows.append((kernel.__name__, param, want, have, verdict))
    return rows
