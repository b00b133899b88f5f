# C declarations of program_order.py for its compiled build (see resources/tracking/marks.pxd).
from numba_streamsafe._driver.libcuda cimport record_event, wait_event
from numba_streamsafe.resources.tracking.lock cimport Lock
from numba_streamsafe.resources.tracking.marks cimport Mark, MarkBook


cdef Lock _event_lock(object event)
cpdef bint noting(object rt) except? -1
cdef tuple _tracking(object rt)
cdef tuple _noted(object rt)
cdef Lock _caught_up(tuple noted)
cdef object _runtime()
cpdef tuple stream_ref(object rt, object stream)
cpdef object cache_stream(object rt, object owner, object handle)
cpdef object event_handle(object event)
cdef object _weak(object rt)
cdef object _still_borrowing(object rt, object point)
cpdef object record(object rt, object event, object stream, object handle, bint direct,
                    object fallback, tuple args)
cpdef object wait(object rt, object event, object stream, object owner, object handle,
                  bint direct, object fallback, tuple args)
cpdef object completed(object event, object synchronize, tuple args=*)
cpdef object synchronised(object rt, object stream, object synchronize, tuple args=*)
