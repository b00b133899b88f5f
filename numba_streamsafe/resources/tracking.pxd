# C declarations for the compiled build of tracking.py (Cython's pure-Python
# mode reads them beside the module): libcuda's entry points the launch path
# calls directly.
ctypedef int (*record_fn)(void *, void *) noexcept nogil
ctypedef int (*wait_fn)(void *, void *, unsigned int) noexcept nogil
