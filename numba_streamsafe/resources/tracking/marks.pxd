cimport cython
# C declarations of marks.py for its compiled build (Cython's pure-Python mode
# reads them beside the module; other engine modules cimport them).

from numba_streamsafe._driver.libcuda cimport record_event, wait_event
from numba_streamsafe.resources.tracking.lock cimport Lock
from numba_streamsafe.core.tracehook cimport TraceLog, current_log



cdef class Mark:
    cdef readonly unsigned long long seq
    cdef public object stream
    cdef readonly object origin
    cdef public object handle
    cdef readonly Py_ssize_t refs
    cdef public object owner
    cdef readonly object waiter
    cdef readonly object waiter_owner
    cdef readonly bint has_waiter
    cdef public object waiters
    cdef public object seen
    cdef public object borrow


cdef bint waited(Mark mark, object stream, object owner) except -1
cdef int add_waiter(Mark mark, object stream, object owner) except -1
cpdef int drop_waiter(Mark mark, object stream) except -1
cdef int clear_waiters(Mark mark) except -1


cdef class ForeignMark(Mark):
    cdef public object pool
    cdef public object generation



cdef class EventPool:
    cdef readonly object driver
    cdef list _idle
    cdef Py_ssize_t _nidle
    cdef Lock _lock
    cdef readonly Py_ssize_t max_idle
    cdef public Py_ssize_t in_use
    cdef public Py_ssize_t recorded
    cdef public Py_ssize_t generation
    cdef readonly set owned
    cdef set _made

    cpdef object acquire(self)
    cpdef object release(self, object handle)
    cpdef object record(self, object stream, bint direct=*)
    cdef list _take_idle(self, bint all_handles)


@cython.final
cdef class MarkBook:
    cdef readonly object driver
    cdef readonly EventPool events
    cdef readonly dict open
    cdef public Py_ssize_t waits
    cdef public Py_ssize_t same_stream
    cdef public unsigned long long done_all
    cdef readonly long long completions
    cdef readonly dict done
    cdef readonly dict ordered
    cdef public Py_ssize_t skipped
    cdef readonly bint checking
    cdef public Py_ssize_t reporting
    cdef public unsigned long long report_from
    cdef public list races
    cdef public unsigned long long legacy_point
    cdef dict _flags
    cdef dict _legacy_ended
    cdef public object observed
    cdef dict _origins
    cdef Py_ssize_t _retired
    cdef dict _retired_keys
    cdef dict _borrowed

    cpdef object catch_up(self)
    cpdef Mark current(self, object stream, object owner=*)
    cpdef object seal(self, Mark mark, bint direct=*)
    cpdef object wait_all(self, object stream, list marks, object owner=*, bint free=*,
                          bint direct=*)
    cpdef object release(self, Mark mark)
    cpdef bint reportable(self, object stream, Mark mark) except? -1
    cdef bint ordered_already(self, object stream, Mark mark, object owner) except? -1
    cdef bint done_at_sync(self, Mark mark) except? -1
    cpdef bint complete(self, Mark mark) except? -1
    cpdef object origin(self, object stream)
    cdef bint _program_orders(self, object stream, Mark mark) except? -1
    cdef int _prune(self, dict clock) except -1
    cdef list _order_entry(self, object stream, object owner)
    cdef bint _blocking_mark(self, Mark mark) except? -1
    cpdef object program_point(self, object stream)
    cpdef tuple program_record(self, object stream, object borrow)
    cpdef object unborrow(self, Mark mark)
    cpdef dict program_clock(self, object stream)
    cpdef object program_waited(self, object stream, dict clock, object owner=*)
    cpdef object program_completed(self, dict clock, object stream=*)
    cpdef object retire(self, object stream, bint direct=*)
    cpdef object ending(self, object stream, bint query=*)
    cdef bint _covered(self, object stream, Mark mark) except? -1
    cdef bint _implied(self, object stream, Mark mark, object clock) except? -1
    cdef bint _after_legacy(self, Mark mark) except? -1
    cpdef object verify(self, object stream, Mark mark, object owner, tuple where,
                        object what=*, bint queued=*)
    cpdef object seal_event(self, Mark mark)
    cpdef object race(self, object stream, Mark mark, object owner, tuple where, object what)
    cpdef bint blocking(self, object stream) except? -1
    cpdef object legacy_use(self, object used)
    cdef void hold(self, Mark mark) noexcept
    cpdef bint hold_sealed(self, Mark mark) except? -1
    cpdef bint in_use(self, Mark mark)
    cpdef object let_go(self, Mark mark)
