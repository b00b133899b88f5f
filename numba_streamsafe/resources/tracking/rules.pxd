# C declarations of rules.py for its compiled build (see marks.pxd).

from numba_streamsafe.resources.tracking.marks cimport Mark, MarkBook, drop_waiter


cdef class Span:
    cdef readonly Py_ssize_t lo
    cdef readonly Py_ssize_t hi
    cdef readonly dict writes
    cdef readonly dict reads
    cdef long long scanned


cdef class Entry:
    cdef readonly object block
    cdef readonly object size
    cdef readonly Py_ssize_t nbytes
    cdef readonly Mark last_write
    cdef readonly dict reads
    cdef long long scanned
    cdef readonly list spans
    cdef public bint gone


cpdef list resolve(object table, object uses, str what)
cpdef list needed_locked(list entries, object stream)
cpdef Py_ssize_t preflight_locked(MarkBook book, list entries, object stream, object owner,
                                  bint direct=*, object what=*, bint queued=*) except -1
cpdef object commit_locked(MarkBook book, list entries, object stream, object owner,
                           bint eager, bint direct=*, Mark into=*, object what=*)
