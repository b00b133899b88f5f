# C declarations of block_table.py for its compiled build (see marks.pxd).

from numba_streamsafe.resources.tracking.marks cimport Mark, MarkBook
from numba_streamsafe.resources.tracking.rules cimport Entry


cdef class BlockTable:
    cdef readonly object device
    cdef readonly dict live
    cdef public long long epoch
    cdef readonly long long live_bytes
    cdef readonly Py_ssize_t borrowed
    cdef public object index
