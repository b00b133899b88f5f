"""What CUDA refuses gives the error the simulator gives
(``tests/numba/test_refusals.py``), on both launch paths of a tracked kernel."""

from __future__ import annotations

import numpy as np
import pytest

import numba_streamsafe as nss
from numba_streamsafe import InvalidArgument, InvalidLaunchConfig, StreamMisuse

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("config, words", [
    ((1, 4096), ("1024 threads", "4096")),
    ((2, 0), ("positive", "0")),
    ((-1, 32), ("positive", "-1")),
    ((1, 32, 0, 1 << 20), ("49152",)),
])
def test_a_configuration_cuda_refuses_raises_invalid_launch_config(gpu, kernels, fresh_runtime,
                                                                   config, words):
    s = gpu.stream()
    x = nss.device_array(64, np.int32, stream=s)
    y = nss.device_array(64, np.int32, stream=s)
    kernels.copy[1, 64, s](x, y)  # a first launch: later ones may take the compiled path
    kernels.copy[1, 64, s](x, y)
    grid, block, *rest = config
    for _ in range(2):
        with pytest.raises(InvalidLaunchConfig) as info:
            kernels.copy[(grid, block, s, *rest[1:])](x, y)
        assert all(w in str(info.value) for w in words), str(info.value)
    s.synchronize()


def test_a_stream_never_created_and_a_missing_device_are_refused(gpu, kernels, fresh_runtime):
    s = gpu.stream()
    x = nss.device_array(64, np.int32, stream=s)
    y = nss.device_array(64, np.int32, stream=s)
    with pytest.raises(StreamMisuse, match=r"cuda\.stream\(\)"):
        kernels.copy[1, 64, 5](x, y)
    with pytest.raises(StreamMisuse):
        with nss.stream_scope(42):
            pass
    with pytest.raises(InvalidArgument, match="no device 64"):
        with nss.use_device(64):
            pass
