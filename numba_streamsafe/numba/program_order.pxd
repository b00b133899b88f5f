# C declarations of program_order.py for its compiled build (see resources/tracking/marks.pxd).
from numba_streamsafe._driver.libcuda cimport record_event, wait_event
from numba_streamsafe.resources.tracking.lock cimport Lock
from numba_streamsafe.resources.tracking.marks cimport Mark, MarkBook


cdef class EventState:
    cdef readonly object handle
    cdef readonly Lock lock
    cdef readonly object point_rt
    cdef readonly object point_clock
    cdef readonly object point_mark


cdef EventState _state(object event)
cpdef bint noting(object rt) except? -1
cdef tuple _tracking(object rt)
cdef tuple _noted(object rt)
cdef Lock _caught_up(tuple noted)
cdef object _runtime()
cpdef tuple stream_ref(object rt, object stream)
cpdef object cache_stream(object rt, object owner, object handle)
cpdef object event_handle(object event)
cdef object _handle(EventState st, object event)
cdef object _still_borrowing(object rt, object known, object held)
cpdef object record(object rt, object event, object stream, object handle, bint direct,
                    object fallback, tuple args)
cdef object _record(object rt, EventState st, object event, object stream, object handle,
                    bint direct, object fallback, tuple args)
cpdef object wait(object rt, object event, object stream, object owner, object handle,
                  bint direct, object fallback, tuple args)
cdef object _wait(object rt, EventState st, object stream, object owner, object handle,
                  bint direct, object fallback, tuple args)
cpdef object completed(object event, object synchronize, tuple args=*)
cpdef object synchronised(object rt, object stream, object synchronize, tuple args=*)
