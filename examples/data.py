"""The examples' data: relations of random keys, pinned host batches, and the NumPy answers."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import target  # noqa: F401  (picks the GPU, or the simulator without one, before numba.cuda)
from kernels_join import ROW
from kernels_sort import KEY_BITS
from numba import cuda

#: The most keys a join example takes: row numbers are :data:`~kernels_join.ROW`.
MAX_JOIN_N = int(np.iinfo(ROW).max)


@lru_cache(maxsize=2)
def make_relations(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Unique build keys below 2**KEY_BITS and probe keys, half of them present."""
    if not 0 < n <= np.iinfo(ROW).max:
        raise ValueError(f"n must be from 1 to {np.iinfo(ROW).max} (row numbers are "
                         f"{ROW.__name__}), got {n}")
    rng = np.random.default_rng(seed)
    build = rng.choice(np.int64(1) << KEY_BITS, size=n, replace=False).astype(np.int64) \
        if n < (1 << 20) else _unique_keys(rng, n)
    present = rng.choice(build, size=n // 2)
    absent = rng.integers(0, np.int64(1) << KEY_BITS, size=n - n // 2, dtype=np.int64)
    probe = np.concatenate([present, absent])
    rng.shuffle(probe)
    return build, probe


def _unique_keys(rng: np.random.Generator, n: int) -> np.ndarray:
    keys = np.unique(rng.integers(0, np.int64(1) << KEY_BITS, size=int(n * 1.1), dtype=np.int64))
    while keys.size < n:
        more = rng.integers(0, np.int64(1) << KEY_BITS, size=n, dtype=np.int64)
        keys = np.unique(np.concatenate([keys, more]))
    rng.shuffle(keys)
    return keys[:n].copy()


def expected_probe(build: np.ndarray, probe: np.ndarray) -> np.ndarray:
    """Reference join: the build row of each probe key, or -1."""
    order = np.argsort(build, kind="stable")
    sorted_build = build[order]
    pos = np.searchsorted(sorted_build, probe)
    pos = np.minimum(pos, sorted_build.size - 1)
    hit = sorted_build[pos] == probe
    return np.where(hit, order[pos], -1)


def expected_rank(build: np.ndarray, probe: np.ndarray) -> np.ndarray:
    """Reference sort -> join: the rank of each probe key among the sorted build keys, or -1."""
    sorted_build = np.sort(build)
    pos = np.minimum(np.searchsorted(sorted_build, probe), sorted_build.size - 1)
    return np.where(sorted_build[pos] == probe, pos, -1)


@dataclass
class HostBatches:
    """The probe relation in batches of pinned host memory, with pinned result buffers.

    No batch is empty: fewer keys than batches give one batch per key.
    """

    keys: list[np.ndarray]
    results: list[np.ndarray]

    @classmethod
    def of(cls, probe: np.ndarray, nbatches: int) -> HostBatches:
        keys, results = [], []
        for part in np.array_split(probe, max(1, min(nbatches, probe.size))):
            keys.append(pinned_copy(part))
            results.append(cuda.pinned_array(part.shape, ROW))
        return cls(keys, results)


def pinned_copy(host: np.ndarray) -> np.ndarray:
    """``host`` copied into page-locked memory, from which uploads are asynchronous."""
    pinned = cuda.pinned_array(host.shape, host.dtype)
    pinned[...] = host
    return pinned
