# C declarations of observer.py for its compiled build. The C part
# (observer_cupti.h) is included by this module alone: no other engine module
# cimports this file, so the observer's state exists once in the process.

cdef extern from "observer_cupti.h":
    int nss_start(size_t subscribe_fn, size_t enable_fn, size_t name_fn,
                  size_t unsubscribe_fn, size_t result_fn, int frames)
    const char *nss_reason()
    int nss_stop()
    int nss_enabled_kinds()
    int nss_pending(int slot) nogil
    object nss_drain(int slot, unsigned long long *lost)
    int nss_slot_for(unsigned long long context)
    const char *nss_callback_name(int cbid)
    void nss_quiet_enter() nogil
    void nss_quiet_exit() nogil


cdef class Slot:
    cdef readonly int index
    cdef readonly unsigned long long context
    cdef readonly unsigned long long lost

    cpdef bint pending(self)
    cpdef list drain(self)
