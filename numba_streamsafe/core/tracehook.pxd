# C declarations of tracehook.py for its compiled build (see
# numba_streamsafe/resources/tracking/marks.pxd).

cdef class TraceLog:
    cdef readonly long long t0
    cdef readonly long long seq
    cdef readonly list waits
    cdef readonly list seals
    cdef readonly list launches

    cpdef long long next_id(self)
    cpdef long long now(self)
    cpdef waited(self, object stream, object on_stream, bint free)
    cpdef sealed(self, object device, object stream)
    cpdef launched(self, long long op_id, long long t0, Py_ssize_t w0, Py_ssize_t e0,
                   str label, object device, object stream, tuple uses)


cdef bint _sim_names
cdef TraceLog _log
cdef bint _direct

cpdef TraceLog current_log()
cpdef bint launches_direct() except -1
