# C declarations of launcher.py for its compiled build (see resources/tracking/marks.pxd).
from numba_streamsafe._driver.libcuda cimport launch_entry, launch_fn
from numba_streamsafe.numba.launch.packing cimport pack_into
from numba_streamsafe.numba.launch.policy cimport LaunchPolicy
from numba_streamsafe.resources.tracking.lock cimport Lock
from numba_streamsafe.resources.tracking.marks cimport MarkBook
from numba_streamsafe.resources.tracking.rules cimport Entry, commit_locked, preflight_locked
from numba_streamsafe.core.tracehook cimport TraceLog, current_log, launches_direct
from numba_streamsafe.core.sites cimport capture_stack
from numba_streamsafe.numba.program_order cimport stream_ref
from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC
from libc.string cimport memcpy



cdef class ArgFields:
    cdef readonly object block
    cdef readonly object ptr
    cdef readonly tuple key
    cdef public Entry entry
    cdef readonly object argtype
    cdef readonly bytes fields
    cdef readonly object lo
    cdef readonly object hi
    cdef readonly bint empty


cdef class Plan:
    cdef readonly tuple argtypes
    cdef readonly object function
    cdef readonly bytes codes
    cdef readonly object cache
    cdef readonly object cufunc
    cdef readonly object device


cdef class LaunchState:
    cdef readonly object rt
    cdef readonly object table
    cdef readonly dict live
    cdef readonly MarkBook book
    cdef readonly Lock lock
    cdef readonly LaunchPolicy policy
    cdef readonly object destroyed
    cdef readonly object deferred
    cdef readonly tuple accesses
    cdef readonly Py_ssize_t narrays
    cdef readonly list plans
    cdef readonly object warned
    cdef readonly bint no_warn
    cdef readonly bint eager
    cdef readonly str label
    cdef readonly tuple names
    cdef readonly object device
    cdef readonly str library
    cdef readonly object fields_of
    cdef readonly list recent
    cdef public Py_ssize_t turn
    cdef readonly list seen
    cdef public Py_ssize_t seen_turn


cdef class Kernel:
    cdef public LaunchState launch_state


cdef class Launcher:
    cdef readonly Kernel kernel
    cdef readonly tuple config
    cdef readonly object stream


cpdef bint launch(LaunchState state, tuple config, tuple args) except -1
