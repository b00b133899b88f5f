# C declarations of rules.py for its compiled build (see marks.pxd).

from numba_streamsafe.resources.marks cimport Mark, MarkBook


cdef class Entry:
    cdef public object block
    cdef public Mark last_write
    cdef public dict reads
    cdef public bint gone


cpdef list resolve(object table, object uses, str what)
cpdef Py_ssize_t preflight_locked(MarkBook book, list entries, object stream, object owner,
                                  bint direct=*) except -1
cpdef object commit_locked(MarkBook book, list entries, object stream, object owner,
                           bint eager, bint direct=*, Mark into=*)
