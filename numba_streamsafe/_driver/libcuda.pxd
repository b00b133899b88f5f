# C declarations of libcuda.py for its compiled build (see
# numba_streamsafe/resources/tracking/marks.pxd).

ctypedef int (*record_fn)(void *, void *) noexcept nogil
ctypedef int (*wait_fn)(void *, void *, unsigned int) noexcept nogil
ctypedef int (*launch_fn)(void *, unsigned int, unsigned int, unsigned int, unsigned int,
                          unsigned int, unsigned int, unsigned int, void *, void **,
                          void **) noexcept nogil

cdef bint _looked
cdef size_t _cu_record
cdef size_t _cu_wait
cdef size_t _cu_launch

cdef bint _handles(object event, object stream, size_t *out) noexcept
cpdef int record_event(object event, object stream) noexcept
cpdef int wait_event(object stream, object event) noexcept
cpdef size_t launch_entry() noexcept
