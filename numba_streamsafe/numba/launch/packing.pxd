# C declarations of packing.py for its compiled build (see resources/tracking/marks.pxd).
from libc.string cimport memcpy

cpdef Py_ssize_t pack_into(bytes codes, tuple args, list fields, object buffer, size_t address,
                           Py_ssize_t capacity) except -2
