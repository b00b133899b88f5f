# C declarations of sites.py for its compiled build (see resources/tracking/marks.pxd).

cdef extern from *:
    """
    #include "frameobject.h"

    /* The byte offset of a frame's last instruction (frame.f_lasti). */
    static CYTHON_INLINE int nss_frame_lasti(PyFrameObject *frame) {
    #if PY_VERSION_HEX >= 0x030B0000
        return PyFrame_GetLasti(frame);
    #else
        return frame->f_lasti * (int)sizeof(_Py_CODEUNIT);
    #endif
    }

    /* The calling thread's user frames, innermost first, at most `depth`, as one
       flat tuple (code, lasti, code, lasti, ...): the walk of sites.capture_stack.
       `kinds` maps a file name to 0 (the user's: kept), 1 (skipped) or 2 (a test
       runner's: the walk stops); `kind_of(name)` gives a name's kind the first
       time, kept in `kinds`. NULL with an exception set on failure. */
    static PyObject *nss_capture_stack(PyObject *kinds, Py_ssize_t depth,
                                       PyObject *kind_of) {
        PyObject *items[512];
        Py_ssize_t n = 0, i;
        PyObject *out = NULL;
        PyFrameObject *frame = PyEval_GetFrame();  /* borrowed */
        if (depth > 256) depth = 256;
        Py_XINCREF(frame);
        while (frame != NULL && n < 2 * depth) {
            PyCodeObject *code = PyFrame_GetCode(frame);  /* new */
            PyObject *kind = PyDict_GetItemWithError(kinds, code->co_filename);
            long k;
            PyFrameObject *back;
            if (kind != NULL) {
                k = PyLong_AsLong(kind);
            } else if (PyErr_Occurred()) {
                Py_DECREF(code);
                goto error;
            } else {
                kind = PyObject_CallOneArg(kind_of, code->co_filename);
                if (kind == NULL || PyDict_SetItem(kinds, code->co_filename, kind) < 0) {
                    Py_XDECREF(kind);
                    Py_DECREF(code);
                    goto error;
                }
                k = PyLong_AsLong(kind);
                Py_DECREF(kind);
            }
            if (k == 2) {
                Py_DECREF(code);
                break;
            }
            if (k == 0) {
                PyObject *lasti = PyLong_FromLong(nss_frame_lasti(frame));
                if (lasti == NULL) {
                    Py_DECREF(code);
                    goto error;
                }
                items[n++] = (PyObject *)code;  /* the tuple takes both references */
                items[n++] = lasti;
            } else {
                Py_DECREF(code);
            }
            back = PyFrame_GetBack(frame);  /* new */
            Py_DECREF(frame);
            frame = back;
        }
        Py_XDECREF(frame);
        frame = NULL;
        out = PyTuple_New(n);
        if (out == NULL) goto error;
        for (i = 0; i < n; i++) PyTuple_SET_ITEM(out, i, items[i]);
        return out;
    error:
        Py_XDECREF(frame);
        for (i = 0; i < n; i++) Py_DECREF(items[i]);
        return NULL;
    }
    """
    object nss_capture_stack(dict kinds, Py_ssize_t depth, object kind_of)

cdef Py_ssize_t _depth
cdef int _USER
cdef int _SKIP
cdef int _STOP

cpdef tuple capture_stack()
