# C declarations for the compiled build of launcher.py (Cython's pure-Python
# mode reads them beside the module).
from libc.string cimport memcpy

ctypedef int (*launch_fn)(void *, unsigned int, unsigned int, unsigned int, unsigned int,
                          unsigned int, unsigned int, unsigned int, void *, void **,
                          void **) noexcept nogil
