"""The pytest plugin on a GPU: the small suite of ``tests/helpers/plugin_suite.py``
(one racy test, one ordered, one racy through a helper, plain Numba with the
plugin selected) in a child pytest with two pytest-xdist workers, in check
mode and in ordering mode (the race check of each test phase): exactly the
racy tests fail, each named with its full report, and the report file's
JSON lines name the tests."""

from __future__ import annotations

import pytest

from numba_streamsafe.pytest_plugin import NAME
from tests.helpers.plugin_suite import check_failures, run_suite

pytestmark = pytest.mark.gpu

MODES = {
    "check": {"NUMBA_STREAMSAFE_MODE": "check", "NUMBA_STREAMSAFE_CHECK_REPORT": "exit"},
    "order": {},
}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_with_the_plugin_exactly_the_racy_tests_fail_and_are_named(gpu, tmp_path, child_env,
                                                                   mode):
    env = child_env(NUMBA_CUDA_MEMORY_MANAGER="numba_streamsafe", **MODES[mode])
    check_failures(*run_suite(tmp_path, env, "-p", NAME))
