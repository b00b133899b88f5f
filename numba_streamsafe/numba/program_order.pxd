# C declarations of program_order.py for its compiled build (see resources/tracking/marks.pxd).
from numba_streamsafe._driver.libcuda cimport record_event, wait_event


cdef object _event_lock(object event)
cpdef bint noting(object rt) except? -1
