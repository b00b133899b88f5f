"""The examples' tracked kernels compile to PTX for Hopper (cc 9.0) with no GPU.

The kernels live in ``examples/kernels_sort.py`` and ``examples/kernels_join.py``;
each carries a ``ptx_signature``. Compilation runs in a child interpreter without
Numba's CUDA simulator, through ``test_ptx.py``'s helpers.
"""

from __future__ import annotations

import pytest
from test_ptx import assert_compiled, compile_kernels

KERNELS = {
    "kernels_sort": ["fill", "histogram", "gather_bucket", "bitonic_step", "bitonic_step2",
                     "bitonic_local", "copy_into", "merge_runs"],
    "kernels_join": ["hash_build", "hash_probe", "count_matches"],
}


@pytest.mark.slow  # a compiler run per module, as test_ptx.py's
@pytest.mark.parametrize("module", sorted(KERNELS))
def test_example_kernels_compile(child_env, repo_root, module):
    results = compile_kernels(child_env, repo_root, f"sys.path:{repo_root / 'examples'}:{module}")
    if module == "kernels_join":
        del results["fill"]  # imported from kernels_sort, and compiled with it there
    assert_compiled(results, KERNELS[module])
