# C declarations of freed.py for its compiled build (see marks.pxd).

cdef class PendingFrees:
    cdef readonly dict slots
    cdef public Py_ssize_t nbytes


cdef class KeptBlocks:
    cdef public object limit
    cdef readonly dict blocks
    cdef readonly dict owners
    cdef public Py_ssize_t nbytes
    cdef readonly set idle
