# C declarations of sites.py for its compiled build (see resources/tracking/marks.pxd).

cdef Py_ssize_t _depth
cdef int _USER
cdef int _SKIP
cdef int _STOP

cpdef tuple user_stack()
