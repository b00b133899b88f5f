"""Driver backends: the only code that talks to CUDA (or to its CPU model)."""

from numba_streamsafe._driver.base import (
    CUDA_ERROR_INVALID_HANDLE,
    CUDA_ERROR_OUT_OF_MEMORY,
    Driver,
)

__all__ = ["Driver", "CUDA_ERROR_OUT_OF_MEMORY", "CUDA_ERROR_INVALID_HANDLE"]
