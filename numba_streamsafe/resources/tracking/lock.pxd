# C declarations of lock.py for its compiled build (see marks.pxd).

from cpython.pythread cimport (
    PyThread_acquire_lock,
    PyThread_allocate_lock,
    PyThread_free_lock,
    PyThread_release_lock,
    PyThread_type_lock,
)


cdef extern from "Python.h":
    int PyThread_acquire_lock_timed(PyThread_type_lock lock, long long microseconds,
                                    int intr_flag) nogil


cdef class Lock:
    cdef PyThread_type_lock _wake
    cdef object _py
    cdef bint _held
    cdef Py_ssize_t _waiters

    cdef int take(self) except -1
    cdef void give(self) noexcept
    cdef bint _wait(self, long long micros) except -1
