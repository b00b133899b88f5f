# C declarations of policy.py for its compiled build (see resources/tracking/marks.pxd).

cdef class LaunchPolicy:
    cdef public bint tracking
    cdef public bint direct_launch
    cdef object __weakref__
