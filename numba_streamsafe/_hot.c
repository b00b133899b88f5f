/* The compiled hot path of numba_streamsafe (optional; numba_streamsafe/hot.py
 * loads it, and the pure-Python code does the same work where it is absent).
 *
 * preflight(resource, uses, stream, owner), commit(resource, uses, stream, owner)
 *     AsyncResource.preflight and AsyncResource.commit, the same rules over the
 *     same Python objects (block table entries, marks, the mark book).
 * launch(state, config, args)
 *     A tracked kernel's launch when every argument is an array over a live
 *     block (with its launch fields cached on the array) or a Python scalar,
 *     and an overload plan for these argument types is known: preflight,
 *     cuLaunchKernel (called through libcuda itself, the GIL released), commit.
 *     Returns False, with nothing queued and no state changed, whenever any of
 *     that does not hold; the Python path then does the launch.
 * pack(codes, args)
 *     The parameter bytes launch() would pass (for tests).
 * Launcher(kernel, config)
 *     The base of a configured launch ``kernel[config]``: calling it runs
 *     launch(kernel._fast, config, args), and the subclass's ``_slow(*args)``
 *     when that returns False, so a launch the hot path takes runs no
 *     Python frame of the library.
 *
 * Built against the limited API (abi3), so one build serves every Python >= 3.10.
 */
#define Py_LIMITED_API 0x030A0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <dlfcn.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

typedef int (*launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                         unsigned, void *, void **, void **);

typedef int (*record_fn)(void *, void *);
typedef int (*wait_fn)(void *, void *, unsigned);

static launch_fn cu_launch_kernel = NULL;
static record_fn cu_event_record = NULL;
static wait_fn cu_stream_wait_event = NULL;
/* Launches launch() queued itself (tests read it through launches()). */
static unsigned long long fast_launches = 0;
static int cu_looked = 0;

#define MAX_USES 64
#define MAX_PARAMS 512
#define PARAM_BYTES (MAX_PARAMS * 8)

/* Interned attribute names. */
static PyObject *s_acquire, *s_release, *s_last_write, *s_reads, *s_block, *s_stream, *s_ptr,
    *s_refs, *s_owner, *s_wait_all, *s_current, *s_seal, *s_same_stream, *s_drain,
    *s_deferred_queue, *s_entry, *s_lock, *s_live, *s_open, *s_marks, *s_table, *s_eager,
    *s_active, *s_sole, *s_tracking, *s_direct_launch, *s_capture, *s_nss_fast, *s_nss_stream,
    *s_preflight, *s_commit, *s_waiters, *s_handle, *s_events, *s_idle, *s_in_use, *s_recorded,
    *s_waits, *s_max_idle, *s_pop, *s_append, *s_event_record, *s_stream_wait_event,
    *s_destroyed_streams, *s_driver, *s_pool_acquire, *s_book_open;

typedef struct {
    PyObject *entry; /* strong */
    long access;
} Use;

static void drop_uses(Use *u, int n) {
    for (int i = 0; i < n; i++) Py_CLEAR(u[i].entry);
}

static PyObject *get_attr_or_null(PyObject *o, PyObject *name) {
    /* The attribute, or NULL with no error set when it is missing. */
    PyObject *v = PyObject_GetAttr(o, name);
    if (v == NULL && PyErr_ExceptionMatches(PyExc_AttributeError)) PyErr_Clear();
    return v;
}

/* ------------------------------------------------------------ the lock */
/* Lock: a non-reentrant lock the C functions take without a Python call (the
 * resources' lock when this module is present); Python code uses it as
 * threading.Lock: acquire(blocking=True), release(), locked(), with. */
typedef struct {
    PyObject_HEAD
    PyThread_type_lock lock;
    int locked;
} LockObject;

static PyTypeObject *LockType = NULL;

static int raw_acquire(LockObject *l, int blocking) {
    if (PyThread_acquire_lock(l->lock, NOWAIT_LOCK)) { l->locked = 1; return 1; }
    if (!blocking) return 0;
    Py_BEGIN_ALLOW_THREADS
    PyThread_acquire_lock(l->lock, WAIT_LOCK);
    Py_END_ALLOW_THREADS
    l->locked = 1;
    return 1;
}

static int raw_release(LockObject *l) {
    if (!l->locked) {
        PyErr_SetString(PyExc_RuntimeError, "release unlocked lock");
        return -1;
    }
    l->locked = 0;
    PyThread_release_lock(l->lock);
    return 0;
}

static PyObject *lock_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if (!PyArg_ParseTuple(args, ":Lock")) return NULL;
    allocfunc alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
    LockObject *self = (LockObject *)alloc(type, 0);
    if (self == NULL) return NULL;
    self->lock = PyThread_allocate_lock();
    self->locked = 0;
    if (self->lock == NULL) {
        Py_DECREF(self);
        PyErr_SetString(PyExc_MemoryError, "cannot allocate a lock");
        return NULL;
    }
    return (PyObject *)self;
}

static void lock_dealloc(PyObject *o) {
    LockObject *self = (LockObject *)o;
    PyTypeObject *tp = Py_TYPE(o);
    if (self->lock != NULL) {
        if (self->locked) PyThread_release_lock(self->lock);
        PyThread_free_lock(self->lock);
    }
    freefunc tp_free = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    tp_free(o);
    Py_DECREF(tp);
}

static PyObject *lock_acquire_py(PyObject *o, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"blocking", "timeout", NULL};
    int blocking = 1;
    double timeout = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|pd:acquire", kwlist, &blocking, &timeout))
        return NULL;
    if (timeout != -1) {
        PyErr_SetString(PyExc_ValueError, "numba_streamsafe's Lock takes no timeout");
        return NULL;
    }
    return PyBool_FromLong(raw_acquire((LockObject *)o, blocking));
}

static PyObject *lock_enter_py(PyObject *o, PyObject *unused) {
    raw_acquire((LockObject *)o, 1);
    Py_RETURN_TRUE;
}

static PyObject *lock_release_py(PyObject *o, PyObject *unused) {
    if (raw_release((LockObject *)o) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *lock_exit_py(PyObject *o, PyObject *args) {
    if (raw_release((LockObject *)o) < 0) return NULL;
    Py_RETURN_FALSE;
}

static PyObject *lock_locked_py(PyObject *o, PyObject *unused) {
    return PyBool_FromLong(((LockObject *)o)->locked);
}

static PyMethodDef lock_methods[] = {
    {"acquire", (PyCFunction)(void (*)(void))lock_acquire_py, METH_VARARGS | METH_KEYWORDS,
     "acquire(blocking=True) -> bool"},
    {"release", lock_release_py, METH_NOARGS, "release()"},
    {"locked", lock_locked_py, METH_NOARGS, "locked() -> bool"},
    {"__enter__", lock_enter_py, METH_NOARGS, NULL},
    {"__exit__", lock_exit_py, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot lock_slots[] = {
    {Py_tp_new, lock_new},
    {Py_tp_dealloc, lock_dealloc},
    {Py_tp_methods, lock_methods},
    {Py_tp_doc, "A lock the compiled hot path takes without a Python call."},
    {0, NULL},
};

static PyType_Spec lock_spec = {
    "numba_streamsafe._hot.Lock", sizeof(LockObject), 0, Py_TPFLAGS_DEFAULT, lock_slots,
};

static int lock_acquire(PyObject *lock, int blocking) {
    /* 1 acquired, 0 not (non-blocking), -1 error. */
    if (Py_TYPE(lock) == LockType) return raw_acquire((LockObject *)lock, blocking);
    PyObject *r = blocking ? PyObject_CallMethodObjArgs(lock, s_acquire, NULL)
                           : PyObject_CallMethodObjArgs(lock, s_acquire, Py_False, NULL);
    if (r == NULL) return -1;
    int ok = PyObject_IsTrue(r);
    Py_DECREF(r);
    return ok;
}

static int lock_release(PyObject *lock) {
    if (Py_TYPE(lock) == LockType) return raw_release((LockObject *)lock);
    PyObject *r = PyObject_CallMethodObjArgs(lock, s_release, NULL);
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 0;
}

/* Release ``lock`` after the section it guarded, keeping the error that
 * section raised (if any): -1 when an error is pending afterwards. */
static int unlock_after(PyObject *lock) {
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    int rel = lock_release(lock);
    if (et != NULL) {
        PyErr_Clear();
        PyErr_Restore(et, ev, tb);
        return -1;
    }
    return rel;
}

/* ------------------------------------------------------------ marks */
static int add_refs(PyObject *mark, long delta) {
    PyObject *refs = PyObject_GetAttr(mark, s_refs);
    if (refs == NULL) return -1;
    long v = PyLong_AsLong(refs);
    Py_DECREF(refs);
    if (v == -1 && PyErr_Occurred()) return -1;
    PyObject *nv = PyLong_FromLong(v + delta);
    if (nv == NULL) return -1;
    int rc = PyObject_SetAttr(mark, s_refs, nv);
    Py_DECREF(nv);
    return rc;
}

/* The Mark class (numba_streamsafe.resources.marks.Mark), set by set_mark_type():
 * marks of exactly this class are handled here; others (ForeignMark) by the
 * mark book's Python methods. */
static PyObject *MarkClass = NULL;


static long attr_long(PyObject *o, PyObject *name, int *err) {
    PyObject *v = PyObject_GetAttr(o, name);
    if (v == NULL) { *err = 1; return 0; }
    long x = PyLong_AsLong(v);
    Py_DECREF(v);
    if (x == -1 && PyErr_Occurred()) *err = 1;
    return x;
}

static int set_long(PyObject *o, PyObject *name, long x) {
    PyObject *v = PyLong_FromLong(x);
    if (v == NULL) return -1;
    int rc = PyObject_SetAttr(o, name, v);
    Py_DECREF(v);
    return rc;
}

static int lock_acquire(PyObject *lock, int blocking);
static int lock_release(PyObject *lock);

/* EventPool.release(handle) for the common case (room in the idle deque);
 * otherwise the pool's method. */
static int pool_release(PyObject *events, PyObject *handle) {
    PyObject *lock = PyObject_GetAttr(events, s_lock);
    if (lock == NULL) return -1;
    if (lock_acquire(lock, 1) < 0) { Py_DECREF(lock); return -1; }
    int err = 0, done = 0;
    PyObject *idle = PyObject_GetAttr(events, s_idle);
    long in_use = attr_long(events, s_in_use, &err);
    long max_idle = err ? 0 : attr_long(events, s_max_idle, &err);
    if (idle != NULL && !err) {
        Py_ssize_t n = PyObject_Size(idle);
        if (n >= 0 && n < max_idle) {
            PyObject *r = PyObject_CallMethodObjArgs(idle, s_append, handle, NULL);
            if (r == NULL) err = 1; else { Py_DECREF(r); done = 1; }
            if (!err && set_long(events, s_in_use, in_use - 1) < 0) err = 1;
        } else if (n < 0) {
            err = 1;
        }
    } else {
        err = 1;
    }
    Py_XDECREF(idle);
    int failed = unlock_after(lock) < 0;
    Py_DECREF(lock);
    if (failed || err) return -1;
    if (!done) {
        PyObject *r = PyObject_CallMethodObjArgs(events, s_release, handle, NULL);
        if (r == NULL) return -1;
        Py_DECREF(r);
    }
    return 0;
}

/* MarkBook.release(mark): one use fewer; at none, the event goes back to the
 * pool and the mark keeps no stream object alive. */
static int book_release(PyObject *book, PyObject *mark) {
    if (MarkClass == NULL || (PyObject *)Py_TYPE(mark) != MarkClass) {
        PyObject *r = PyObject_CallMethodObjArgs(book, s_release, mark, NULL);
        if (r == NULL) return -1;
        Py_DECREF(r);
        return 0;
    }
    int err = 0;
    long refs = attr_long(mark, s_refs, &err) - 1;
    if (err || set_long(mark, s_refs, refs) < 0) return -1;
    if (refs != 0) return 0;
    PyObject *handle = PyObject_GetAttr(mark, s_handle);
    if (handle == NULL) return -1;
    if (handle != Py_None) {
        PyObject *events = PyObject_GetAttr(book, s_events);
        int rc = events == NULL ? -1 : pool_release(events, handle);
        Py_XDECREF(events);
        if (rc < 0 || PyObject_SetAttr(mark, s_handle, Py_None) < 0) {
            Py_DECREF(handle); return -1;
        }
    }
    Py_DECREF(handle);
    if (PyObject_SetAttr(mark, s_owner, Py_None) < 0) return -1;
    return PyObject_SetAttr(mark, s_waiters, Py_None);
}

/* A pooled event recorded on ``stream`` (EventPool.record) through libcuda:
 * an idle handle popped (else the pool's acquire), cuEventRecord; on a driver
 * error the driver layer's event_record retries in the right context or
 * raises (the handle then goes back to the pool). */
static PyObject *pool_record(PyObject *events, PyObject *driver, PyObject *stream, int direct) {
    PyObject *lock = PyObject_GetAttr(events, s_lock);
    if (lock == NULL) return NULL;
    if (lock_acquire(lock, 1) < 0) { Py_DECREF(lock); return NULL; }
    PyObject *handle = NULL;
    int err = 0;
    PyObject *idle = PyObject_GetAttr(events, s_idle);
    if (idle == NULL) {
        err = 1;
    } else {
        Py_ssize_t n = PyObject_Size(idle);
        if (n > 0) {
            long in_use = attr_long(events, s_in_use, &err);
            if (!err) handle = PyObject_CallMethodObjArgs(idle, s_pop, NULL);
            if (handle == NULL || set_long(events, s_in_use, in_use + 1) < 0) err = 1;
        } else if (n < 0) {
            err = 1;
        }
        Py_DECREF(idle);
    }
    int failed = unlock_after(lock) < 0;
    Py_DECREF(lock);
    if (failed || err) {
        Py_XDECREF(handle);
        return NULL;
    }
    if (handle == NULL) { /* none idle: the pool creates one */
        handle = PyObject_CallMethodObjArgs(events, s_pool_acquire, NULL);
        if (handle == NULL) return NULL;
    }
    int rc = -1; /* not recorded here: the driver layer records it */
    if (direct) {
        void *h = NULL, *sh = NULL;
        PyObject *hl = PyNumber_Long(handle);
        if (hl != NULL) { h = PyLong_AsVoidPtr(hl); Py_DECREF(hl); }
        if (!PyErr_Occurred()) sh = PyLong_AsVoidPtr(stream);
        rc = PyErr_Occurred() ? -1 : cu_event_record(h, sh);
    }
    if (rc != 0) {
        PyErr_Clear();
        PyObject *r = PyObject_CallMethodObjArgs(driver, s_event_record, handle, stream, NULL);
        if (r == NULL) {
            PyObject *t1, *v1, *b1;
            PyErr_Fetch(&t1, &v1, &b1);
            PyObject *r2 = PyObject_CallMethodObjArgs(events, s_release, handle, NULL);
            Py_XDECREF(r2);
            PyErr_Clear();
            PyErr_Restore(t1, v1, b1);
            Py_DECREF(handle);
            return NULL;
        }
        Py_DECREF(r);
    }
    int e2 = 0;
    long recorded = attr_long(events, s_recorded, &e2);
    if (e2 || set_long(events, s_recorded, recorded + 1) < 0) { Py_DECREF(handle); return NULL; }
    return handle;
}

/* MarkBook.seal(mark) for a Mark: its event, recorded now if it has none. */
static PyObject *seal_mark(PyObject *book, PyObject *open, PyObject *events, PyObject *driver,
                           PyObject *mark, int direct) {
    PyObject *handle = PyObject_GetAttr(mark, s_handle);
    if (handle == NULL || handle != Py_None) return handle;
    Py_DECREF(handle);
    PyObject *ms = PyObject_GetAttr(mark, s_stream);
    if (ms == NULL) return NULL;
    handle = pool_record(events, driver, ms, direct);
    if (handle == NULL || PyObject_SetAttr(mark, s_handle, handle) < 0) {
        Py_DECREF(ms); Py_XDECREF(handle); return NULL;
    }
    PyObject *cur = PyDict_GetItemWithError(open, ms);
    if (cur == NULL && PyErr_Occurred()) { Py_DECREF(ms); Py_DECREF(handle); return NULL; }
    if (cur == mark && PyDict_DelItem(open, ms) < 0) {
        Py_DECREF(ms); Py_DECREF(handle); return NULL;
    }
    Py_DECREF(ms);
    return handle;
}

/* MarkBook.wait_all(stream, marks, owner) here when every mark is a Mark, no
 * trace is recording and the driver has no destroyed streams, otherwise the
 * mark book's method. With ``direct`` the events are recorded and waited for
 * through libcuda, else through the driver layer (the simulated driver). */
static int wait_all(PyObject *book, PyObject *stream, PyObject *marks, PyObject *owner,
                    PyObject *tracehook_module, int direct) {
    Py_ssize_t n = PyList_Size(marks);
    if (direct && cu_stream_wait_event == NULL) direct = 0;
    int python = MarkClass == NULL;
    for (Py_ssize_t i = 0; i < n && !python; i++) {
        python = (PyObject *)Py_TYPE(PyList_GetItem(marks, i)) != MarkClass;
    }
    if (!python) {
        if (tracehook_module == NULL) {
            tracehook_module = PyImport_ImportModule("numba_streamsafe.tracehook");
            if (tracehook_module == NULL) return -1;
        } else {
            Py_INCREF(tracehook_module);
        }
        PyObject *active = PyObject_GetAttr(tracehook_module, s_active);
        Py_DECREF(tracehook_module);
        if (active == NULL) return -1;
        python = active != Py_None;
        Py_DECREF(active);
    }
    PyObject *driver = python ? NULL : PyObject_GetAttr(book, s_driver);
    if (!python) {
        if (driver == NULL) return -1;
        PyObject *destroyed = PyObject_GetAttr(driver, s_destroyed_streams);
        if (destroyed == NULL) { Py_DECREF(driver); return -1; }
        python = PyObject_IsTrue(destroyed) != 0; /* the driver layer checks them */
        Py_DECREF(destroyed);
        if (python) Py_CLEAR(driver);
    }
    if (python) {
        PyObject *r = PyObject_CallMethodObjArgs(book, s_wait_all, stream, marks, owner, NULL);
        if (r == NULL) return -1;
        Py_DECREF(r);
        return 0;
    }
    PyObject *events = PyObject_GetAttr(book, s_events);
    PyObject *open = events == NULL ? NULL : PyObject_GetAttr(book, s_book_open);
    if (open == NULL) { Py_XDECREF(events); Py_DECREF(driver); return -1; }
    int rc = 0;
    long queued = 0;
    void *sh = NULL;
    if (direct) {
        sh = PyLong_AsVoidPtr(stream);
        if (PyErr_Occurred()) rc = -1;
    }
    for (Py_ssize_t i = 0; i < n && rc == 0; i++) {
        PyObject *mark = PyList_GetItem(marks, i);
        PyObject *waiters = PyObject_GetAttr(mark, s_waiters);
        if (waiters == NULL) { rc = -1; break; }
        if (waiters == Py_None) {
            Py_DECREF(waiters);
            waiters = PyDict_New();
            if (waiters == NULL || PyObject_SetAttr(mark, s_waiters, waiters) < 0) {
                Py_XDECREF(waiters); rc = -1; break;
            }
        } else {
            PyObject *prev = PyDict_GetItemWithError(waiters, stream);
            if (prev == NULL && PyErr_Occurred()) { Py_DECREF(waiters); rc = -1; break; }
            if (prev != NULL) {
                if (owner != Py_None && prev == Py_None &&
                    PyDict_SetItem(waiters, stream, owner) < 0) rc = -1;
                Py_DECREF(waiters);
                continue;
            }
        }
        PyObject *handle = seal_mark(book, open, events, driver, mark, direct);
        if (handle == NULL) { Py_DECREF(waiters); rc = -1; break; }
        int err = -1; /* not queued here: the driver layer queues it */
        if (direct) {
            void *h = NULL;
            PyObject *hl = PyNumber_Long(handle);
            if (hl != NULL) { h = PyLong_AsVoidPtr(hl); Py_DECREF(hl); }
            err = PyErr_Occurred() ? -1 : cu_stream_wait_event(sh, h, 0);
        }
        if (err != 0) {
            PyErr_Clear();
            PyObject *r = PyObject_CallMethodObjArgs(driver, s_stream_wait_event, stream, handle,
                                                     NULL);
            if (r == NULL) { Py_DECREF(handle); Py_DECREF(waiters); rc = -1; break; }
            Py_DECREF(r);
        }
        Py_DECREF(handle);
        if (PyDict_SetItem(waiters, stream, owner) < 0) rc = -1;
        Py_DECREF(waiters);
        queued++;
    }
    if (queued) {
        int e = 0;
        long waits = attr_long(book, s_waits, &e);
        if (e || set_long(book, s_waits, waits + queued) < 0) rc = -1;
    }
    Py_DECREF(events);
    Py_DECREF(open);
    Py_DECREF(driver);
    return rc;
}

/* Preflight with the resource's lock held: the marks of other streams the uses
 * must wait for go to book.wait_all(stream, marks, owner). *same counts uses
 * whose last write is on ``stream``. */
static int preflight_locked(PyObject *book, Use *u, int n, PyObject *stream, PyObject *owner,
                            long *same, PyObject *tracehook_module, int direct) {
    PyObject *marks = NULL;
    long nsame = 0;
    for (int i = 0; i < n; i++) {
        PyObject *entry = u[i].entry;
        PyObject *lw = PyObject_GetAttr(entry, s_last_write);
        if (lw == NULL) goto fail;
        PyObject *ls = PyObject_GetAttr(lw, s_stream);
        if (ls == NULL) { Py_DECREF(lw); goto fail; }
        int ne = PyObject_RichCompareBool(ls, stream, Py_NE);
        Py_DECREF(ls);
        if (ne < 0) { Py_DECREF(lw); goto fail; }
        if (ne) {
            if (marks == NULL && (marks = PyList_New(0)) == NULL) { Py_DECREF(lw); goto fail; }
            if (PyList_Append(marks, lw) < 0) { Py_DECREF(lw); goto fail; }
        } else {
            nsame++;
        }
        Py_DECREF(lw);
        if (u[i].access & 2) {
            PyObject *reads = PyObject_GetAttr(entry, s_reads);
            if (reads == NULL) goto fail;
            if (PyDict_Size(reads) > 0) {
                Py_ssize_t pos = 0;
                PyObject *k, *v;
                while (PyDict_Next(reads, &pos, &k, &v)) {
                    int rne = PyObject_RichCompareBool(k, stream, Py_NE);
                    if (rne < 0) { Py_DECREF(reads); goto fail; }
                    if (rne) {
                        if (marks == NULL && (marks = PyList_New(0)) == NULL) {
                            Py_DECREF(reads); goto fail;
                        }
                        if (PyList_Append(marks, v) < 0) { Py_DECREF(reads); goto fail; }
                    }
                }
            }
            Py_DECREF(reads);
        }
    }
    *same = nsame;
    if (marks != NULL) {
        int rc = wait_all(book, stream, marks, owner, tracehook_module, direct);
        Py_DECREF(marks);
        return rc;
    }
    return 0;
fail:
    Py_XDECREF(marks);
    return -1;
}

/* Commit with the resource's lock held: record the uses against the stream's
 * open mark (book.current when it has none, or none with an owner). */
static int commit_locked(PyObject *book, PyObject *open, Use *u, int n, PyObject *stream,
                         PyObject *owner, int eager) {
    PyObject *mark = PyDict_GetItemWithError(open, stream); /* borrowed */
    if (mark == NULL && PyErr_Occurred()) return -1;
    int need = mark == NULL;
    if (!need && owner != Py_None) {
        PyObject *mo = PyObject_GetAttr(mark, s_owner);
        if (mo == NULL) return -1;
        need = mo == Py_None;
        Py_DECREF(mo);
    }
    if (need && mark == NULL && MarkClass != NULL) { /* MarkBook.current: a new open mark */
        mark = PyObject_CallFunctionObjArgs(MarkClass, stream, owner, NULL);
        if (mark == NULL) return -1;
        if (PyDict_SetItem(open, stream, mark) < 0) { Py_DECREF(mark); return -1; }
    } else if (need) {
        mark = PyObject_CallMethodObjArgs(book, s_current, stream, owner, NULL);
        if (mark == NULL) return -1;
    } else {
        Py_INCREF(mark);
    }
    for (int i = 0; i < n; i++) {
        PyObject *entry = u[i].entry;
        if (u[i].access & 2) {
            PyObject *lw = PyObject_GetAttr(entry, s_last_write);
            if (lw == NULL) goto fail;
            if (lw != mark) {
                /* The new reference first, so ``mark`` never drops to 0 here. */
                if (add_refs(mark, 1) < 0 || book_release(book, lw) < 0 ||
                    PyObject_SetAttr(entry, s_last_write, mark) < 0) {
                    Py_DECREF(lw); goto fail;
                }
            }
            Py_DECREF(lw);
            PyObject *reads = PyObject_GetAttr(entry, s_reads);
            if (reads == NULL) goto fail;
            if (PyDict_Size(reads) > 0) {
                PyObject *values = PyDict_Values(reads);
                Py_DECREF(reads);
                if (values == NULL) goto fail;
                Py_ssize_t nv = PyList_Size(values);
                for (Py_ssize_t j = 0; j < nv; j++) {
                    if (book_release(book, PyList_GetItem(values, j)) < 0) {
                        Py_DECREF(values); goto fail;
                    }
                }
                Py_DECREF(values);
                PyObject *fresh = PyDict_New();
                if (fresh == NULL) goto fail;
                int rc = PyObject_SetAttr(entry, s_reads, fresh);
                Py_DECREF(fresh);
                if (rc < 0) goto fail;
            } else {
                Py_DECREF(reads);
            }
        } else {
            PyObject *reads = PyObject_GetAttr(entry, s_reads);
            if (reads == NULL) goto fail;
            PyObject *prev = PyDict_GetItemWithError(reads, stream);
            if (prev == NULL && PyErr_Occurred()) { Py_DECREF(reads); goto fail; }
            if (prev != mark) {
                Py_XINCREF(prev);
                if (PyDict_SetItem(reads, stream, mark) < 0 || add_refs(mark, 1) < 0 ||
                    (prev != NULL && book_release(book, prev) < 0)) {
                    Py_XDECREF(prev); Py_DECREF(reads); goto fail;
                }
                Py_XDECREF(prev);
            }
            Py_DECREF(reads);
        }
    }
    if (eager) {
        PyObject *r = PyObject_CallMethodObjArgs(book, s_seal, mark, NULL);
        if (r == NULL) goto fail;
        Py_DECREF(r);
    }
    Py_DECREF(mark);
    return 0;
fail:
    Py_DECREF(mark);
    return -1;
}

static int bump_same(PyObject *resource, long same) {
    if (!same) return 0;
    PyObject *cur = PyObject_GetAttr(resource, s_same_stream);
    if (cur == NULL) return -1;
    long v = PyLong_AsLong(cur);
    Py_DECREF(cur);
    if (v == -1 && PyErr_Occurred()) return -1;
    PyObject *nv = PyLong_FromLong(v + same);
    if (nv == NULL) return -1;
    int rc = PyObject_SetAttr(resource, s_same_stream, nv);
    Py_DECREF(nv);
    return rc;
}

/* The entries of ``uses`` (a sequence of (block, access)), validated as
 * BlockTable.entries does (table.entry raises for a freed, stale or foreign
 * block). */
static int entries_of(PyObject *resource, PyObject *uses, PyObject *what, Use *u, int *n) {
    PyObject *seq = PySequence_Fast(uses, "uses must be a sequence");
    if (seq == NULL) return -1;
    Py_ssize_t m = PySequence_Size(seq);
    if (m > MAX_USES) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_OverflowError, "more than 64 buffers in one launch");
        return -1;
    }
    PyObject *live = NULL, *table = NULL;
    int k = 0;
    for (Py_ssize_t i = 0; i < m; i++) {
        PyObject *pair = PySequence_GetItem(seq, i);
        if (pair == NULL) goto fail;
        PyObject *block = PySequence_GetItem(pair, 0);
        PyObject *access = PySequence_GetItem(pair, 1);
        Py_DECREF(pair);
        if (block == NULL || access == NULL) { Py_XDECREF(block); Py_XDECREF(access); goto fail; }
        long acc = PyLong_AsLong(access);
        Py_DECREF(access);
        if (acc == -1 && PyErr_Occurred()) { Py_DECREF(block); goto fail; }
        if (live == NULL && (live = PyObject_GetAttr(resource, s_live)) == NULL) {
            Py_DECREF(block); goto fail;
        }
        PyObject *ptr = PyObject_GetAttr(block, s_ptr);
        if (ptr == NULL) { Py_DECREF(block); goto fail; }
        PyObject *entry = PyDict_GetItemWithError(live, ptr);
        Py_DECREF(ptr);
        if (entry == NULL && PyErr_Occurred()) { Py_DECREF(block); goto fail; }
        int same_block = 0;
        if (entry != NULL) {
            PyObject *eb = PyObject_GetAttr(entry, s_block);
            if (eb == NULL) { Py_DECREF(block); goto fail; }
            same_block = eb == block;
            Py_DECREF(eb);
        }
        if (same_block) {
            Py_INCREF(entry);
        } else {
            if (table == NULL && (table = PyObject_GetAttr(resource, s_table)) == NULL) {
                Py_DECREF(block); goto fail;
            }
            entry = PyObject_CallMethodObjArgs(table, s_entry, block, what, NULL);
            if (entry == NULL) { Py_DECREF(block); goto fail; }
        }
        Py_DECREF(block);
        u[k].entry = entry;
        u[k].access = acc;
        k++;
    }
    Py_DECREF(seq);
    Py_XDECREF(live);
    Py_XDECREF(table);
    *n = k;
    return 0;
fail:
    drop_uses(u, k);
    Py_DECREF(seq);
    Py_XDECREF(live);
    Py_XDECREF(table);
    return -1;
}

static int drain_if_needed(PyObject *resource) {
    PyObject *q = PyObject_GetAttr(resource, s_deferred_queue);
    if (q == NULL) return -1;
    int full = PyObject_IsTrue(q);
    Py_DECREF(q);
    if (full < 0) return -1;
    if (full) {
        PyObject *r = PyObject_CallMethodObjArgs(resource, s_drain, NULL);
        if (r == NULL) return -1;
        Py_DECREF(r);
    }
    return 0;
}

static PyObject *hot_preflight(PyObject *self, PyObject *args) {
    PyObject *resource, *uses, *stream, *owner = Py_None;
    if (!PyArg_ParseTuple(args, "OOO|O", &resource, &uses, &stream, &owner)) return NULL;
    if (drain_if_needed(resource) < 0) return NULL;
    PyObject *lock = PyObject_GetAttr(resource, s_lock);
    if (lock == NULL) return NULL;
    if (lock_acquire(lock, 1) < 0) { Py_DECREF(lock); return NULL; }
    Use u[MAX_USES];
    int n = 0;
    long same = 0;
    int rc = entries_of(resource, uses, s_preflight, u, &n);
    if (rc == 0) {
        PyObject *book = PyObject_GetAttr(resource, s_marks);
        rc = book == NULL ? -1 : preflight_locked(book, u, n, stream, owner, &same, NULL, 0);
        Py_XDECREF(book);
        if (rc == 0) rc = bump_same(resource, same);
        drop_uses(u, n);
    }
    int failed = unlock_after(lock) < 0;
    Py_DECREF(lock);
    if (failed) return NULL;
    Py_RETURN_NONE;
}

static int is_true_attr(PyObject *o, PyObject *name) {
    PyObject *v = PyObject_GetAttr(o, name);
    if (v == NULL) return -1;
    int t = PyObject_IsTrue(v);
    Py_DECREF(v);
    return t;
}

static PyObject *hot_commit(PyObject *self, PyObject *args) {
    PyObject *resource, *uses, *stream, *owner = Py_None;
    if (!PyArg_ParseTuple(args, "OOO|O", &resource, &uses, &stream, &owner)) return NULL;
    PyObject *lock = PyObject_GetAttr(resource, s_lock);
    if (lock == NULL) return NULL;
    if (lock_acquire(lock, 1) < 0) { Py_DECREF(lock); return NULL; }
    Use u[MAX_USES];
    int n = 0;
    int rc = entries_of(resource, uses, s_commit, u, &n);
    if (rc == 0) {
        if (n > 0) {
            PyObject *book = PyObject_GetAttr(resource, s_marks);
            PyObject *open = book == NULL ? NULL : PyObject_GetAttr(resource, s_open);
            int eager = open == NULL ? -1 : is_true_attr(resource, s_eager);
            rc = eager < 0 ? -1 : commit_locked(book, open, u, n, stream, owner, eager);
            Py_XDECREF(book);
            Py_XDECREF(open);
        }
        drop_uses(u, n);
    }
    int failed = unlock_after(lock) < 0;
    Py_DECREF(lock);
    if (failed) return NULL;
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------ packing */
/* One scalar into an 8-byte slot as struct's code would pack it; 1 packed,
 * 0 not covered here (the Python path decides), -1 error. */
static int pack_scalar(char code, PyObject *v, unsigned char *slot) {
    memset(slot, 0, 8);
    if (code == 'f' || code == 'd') {
        double x;
        if (PyFloat_CheckExact(v)) {
            x = PyFloat_AsDouble(v);
        } else if (PyLong_CheckExact(v)) {
            x = PyLong_AsDouble(v);
            if (x == -1.0 && PyErr_Occurred()) { PyErr_Clear(); return 0; }
        } else {
            return 0;
        }
        if (code == 'd') { memcpy(slot, &x, 8); return 1; }
        if (isfinite(x) && fabs(x) > FLT_MAX) return 0; /* struct refuses: Python path */
        float f = (float)x;
        memcpy(slot, &f, 4);
        return 1;
    }
    if (code == '?') {
        if (!PyBool_Check(v)) return 0;
        slot[0] = v == Py_True;
        return 1;
    }
    if (!PyLong_Check(v) || !(PyLong_CheckExact(v) || PyBool_Check(v))) return 0;
    if (code == 'Q') {
        unsigned long long x = PyLong_AsUnsignedLongLong(v);
        if (x == (unsigned long long)-1 && PyErr_Occurred()) { PyErr_Clear(); return 0; }
        memcpy(slot, &x, 8);
        return 1;
    }
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow || (x == -1 && PyErr_Occurred())) { PyErr_Clear(); return 0; }
    switch (code) {
    case 'q': memcpy(slot, &x, 8); return 1;
    case 'i': if (x < INT32_MIN || x > INT32_MAX) return 0; { int32_t y = (int32_t)x; memcpy(slot, &y, 4); } return 1;
    case 'I': if (x < 0 || x > UINT32_MAX) return 0; { uint32_t y = (uint32_t)x; memcpy(slot, &y, 4); } return 1;
    case 'h': if (x < INT16_MIN || x > INT16_MAX) return 0; { int16_t y = (int16_t)x; memcpy(slot, &y, 2); } return 1;
    case 'H': if (x < 0 || x > UINT16_MAX) return 0; { uint16_t y = (uint16_t)x; memcpy(slot, &y, 2); } return 1;
    case 'b': if (x < INT8_MIN || x > INT8_MAX) return 0; { int8_t y = (int8_t)x; memcpy(slot, &y, 1); } return 1;
    case 'B': if (x < 0 || x > UINT8_MAX) return 0; { uint8_t y = (uint8_t)x; memcpy(slot, &y, 1); } return 1;
    default: return 0;
    }
}

/* Pack ``args`` by ``codes`` (one code per flattened parameter; 'A' starts an
 * array, whose cached field bytes fill as many slots as they hold). Array
 * arguments are given by their cached tuple (block, ptr, argtype, fields).
 * Returns the number of parameters, 0 when not covered, -1 on error. */
static int pack_params(const char *codes, Py_ssize_t ncodes, PyObject *const *items, Py_ssize_t nargs,
                       const int *is_array, PyObject *const *cached, unsigned char *buf) {
    Py_ssize_t c = 0;
    int slot = 0;
    for (Py_ssize_t i = 0; i < nargs; i++) {
        if (c >= ncodes) return 0;
        if (is_array[i]) {
            if (codes[c] != 'A') return 0;
            c++;
            PyObject *fields = PyTuple_GetItem(cached[i], 3);
            if (fields == NULL) return -1;
            char *data;
            Py_ssize_t len;
            if (PyBytes_AsStringAndSize(fields, &data, &len) < 0) return -1;
            if (len % 8 || slot + len / 8 > MAX_PARAMS) return 0;
            memcpy(buf + 8 * slot, data, (size_t)len);
            slot += (int)(len / 8);
        } else if (codes[c] == 'C' || codes[c] == 'Z') { /* complex64 / complex128 */
            char code = codes[c] == 'C' ? 'f' : 'd';
            c++;
            PyObject *v = items[i];
            if (!PyComplex_CheckExact(v) || slot + 2 > MAX_PARAMS) return 0;
            PyObject *re = PyFloat_FromDouble(PyComplex_RealAsDouble(v));
            PyObject *im = PyFloat_FromDouble(PyComplex_ImagAsDouble(v));
            if (re == NULL || im == NULL) { Py_XDECREF(re); Py_XDECREF(im); return -1; }
            int a = pack_scalar(code, re, buf + 8 * slot);
            int b = a == 1 ? pack_scalar(code, im, buf + 8 * (slot + 1)) : a;
            Py_DECREF(re); Py_DECREF(im);
            if (a != 1 || b != 1) return a < 0 || b < 0 ? -1 : 0;
            slot += 2;
        } else {
            if (codes[c] == 'A' || slot + 1 > MAX_PARAMS) return 0;
            int r = pack_scalar(codes[c], items[i], buf + 8 * slot);
            c++;
            if (r != 1) return r;
            slot += 1;
        }
    }
    return c == ncodes ? slot : 0;
}

static PyObject *hot_pack(PyObject *self, PyObject *args) {
    /* pack(codes: bytes, args: tuple, arrays: tuple of cached tuples or None) -> bytes | None */
    PyObject *codes, *items, *arrays;
    if (!PyArg_ParseTuple(args, "SO!O!", &codes, &PyTuple_Type, &items, &PyTuple_Type, &arrays))
        return NULL;
    Py_ssize_t n = PyTuple_Size(items);
    if (n > MAX_USES || PyTuple_Size(arrays) != n) {
        PyErr_SetString(PyExc_ValueError, "args and arrays differ in length (or over 64)");
        return NULL;
    }
    PyObject *it[MAX_USES], *cached[MAX_USES];
    int is_array[MAX_USES];
    for (Py_ssize_t i = 0; i < n; i++) {
        it[i] = PyTuple_GetItem(items, i);
        cached[i] = PyTuple_GetItem(arrays, i);
        is_array[i] = cached[i] != Py_None;
    }
    char *cs;
    Py_ssize_t nc;
    if (PyBytes_AsStringAndSize(codes, &cs, &nc) < 0) return NULL;
    unsigned char buf[PARAM_BYTES];
    int np = pack_params(cs, nc, it, n, is_array, cached, buf);
    if (np < 0) return NULL;
    if (np == 0 && nc > 0) Py_RETURN_NONE;
    return PyBytes_FromStringAndSize((const char *)buf, 8 * (Py_ssize_t)np);
}

/* ------------------------------------------------------------ the launch */
static int dim3(PyObject *d, unsigned *out) {
    /* 1 normalised, 0 not plainly valid (the Python path reports it). */
    out[0] = out[1] = out[2] = 1;
    if (PyLong_CheckExact(d)) {
        long v = PyLong_AsLong(d);
        if (v == -1 && PyErr_Occurred()) { PyErr_Clear(); return 0; }
        if (v <= 0 || v > 0x7fffffffL) return 0;
        out[0] = (unsigned)v;
        return 1;
    }
    if (!PyTuple_CheckExact(d)) return 0;
    Py_ssize_t n = PyTuple_Size(d);
    if (n < 1 || n > 3) return 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = PyTuple_GetItem(d, i);
        if (!PyLong_CheckExact(x)) return 0;
        long v = PyLong_AsLong(x);
        if (v == -1 && PyErr_Occurred()) { PyErr_Clear(); return 0; }
        if (v <= 0 || v > 0x7fffffffL) return 0;
        out[i] = (unsigned)v;
    }
    return 1;
}

static void find_launch(void) {
    cu_looked = 1;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (lib == NULL) return;
    record_fn rec = (record_fn)dlsym(lib, "cuEventRecord");
    wait_fn wait = (wait_fn)dlsym(lib, "cuStreamWaitEvent");
    launch_fn launch = (launch_fn)dlsym(lib, "cuLaunchKernel");
    if (rec != NULL && wait != NULL && launch != NULL) {
        cu_event_record = rec;
        cu_stream_wait_event = wait;
        cu_launch_kernel = launch;
    }
}

enum {
    ST_RT, ST_RESOURCE, ST_LOCK, ST_LIVE, ST_OPEN, ST_BOOK, ST_POLICY, ST_TRACEHOOK, ST_RUNTIME,
    ST_DESTROYED, ST_DEFERRED, ST_ACCESSES, ST_PLANS, ST_SCALARS, ST_WARNED, ST_NO_WARN,
    ST_DRIVER_LAUNCH, ST_EAGER, ST_SIZE
};

#define SLOW(label) do { goto label; } while (0)

static PyObject *hot_launch(PyObject *self, PyObject *const *fargs, Py_ssize_t nfargs);

static PyObject *hot_launch_tuple(PyObject *self, PyObject *args) {
    PyObject *state, *config, *cargs;
    if (!PyArg_ParseTuple(args, "O!O!O!", &PyTuple_Type, &state, &PyTuple_Type, &config,
                          &PyTuple_Type, &cargs))
        return NULL;
    PyObject *a[3] = {state, config, cargs};
    return hot_launch(self, a, 3);
}

static PyObject *hot_launch(PyObject *self, PyObject *const *fargs, Py_ssize_t nfargs) {
    PyObject *state = fargs[0], *config = fargs[1], *args = fargs[2];
    if (PyTuple_Size(state) != ST_SIZE) {
        PyErr_SetString(PyExc_ValueError, "launch state of the wrong size");
        return NULL;
    }
#define ST(i) PyTuple_GetItem(state, (i))
    if (!cu_looked) find_launch();
    if (cu_launch_kernel == NULL) Py_RETURN_FALSE;
    PyObject *rt = ST(ST_RT);
    /* The conditions the state was built under still hold. */
    {
        PyObject *v = PyObject_GetAttr(ST(ST_TRACEHOOK), s_active);
        if (v == NULL) return NULL;
        int off = v != Py_None;
        Py_DECREF(v);
        if (off) Py_RETURN_FALSE;
        v = PyObject_GetAttr(ST(ST_RUNTIME), s_sole);
        if (v == NULL) return NULL;
        off = v != rt;
        Py_DECREF(v);
        if (off) Py_RETURN_FALSE;
        int t = is_true_attr(ST(ST_POLICY), s_tracking);
        if (t <= 0) { if (t < 0) return NULL; Py_RETURN_FALSE; }
        t = is_true_attr(ST(ST_POLICY), s_direct_launch);
        if (t <= 0) { if (t < 0) return NULL; Py_RETURN_FALSE; }
        v = PyObject_GetAttr(rt, s_capture);
        if (v == NULL) return NULL;
        off = v != Py_None;
        Py_DECREF(v);
        if (off) Py_RETURN_FALSE;
        t = PyObject_IsTrue(ST(ST_DEFERRED));
        if (t) { if (t < 0) return NULL; Py_RETURN_FALSE; }
    }
    /* Configuration. */
    Py_ssize_t nconf = PyTuple_Size(config);
    if (nconf < 2 || nconf > 4) Py_RETURN_FALSE;
    unsigned grid[3], block[3];
    if (!dim3(PyTuple_GetItem(config, 0), grid) || !dim3(PyTuple_GetItem(config, 1), block))
        Py_RETURN_FALSE;
    unsigned long shmem = 0;
    if (nconf > 3) {
        PyObject *sm = PyTuple_GetItem(config, 3);
        if (!PyLong_CheckExact(sm)) Py_RETURN_FALSE;
        long v = PyLong_AsLong(sm);
        if (v < 0 || v > 0x7fffffffL) { PyErr_Clear(); Py_RETURN_FALSE; }
        shmem = (unsigned long)v;
    }
    if ((unsigned long long)grid[0] * grid[1] * grid[2] < 128 &&
        !PyObject_IsTrue(ST(ST_NO_WARN))) {
        PyObject *g = Py_BuildValue("(III)", grid[0], grid[1], grid[2]);
        if (g == NULL) return NULL;
        int in = PySet_Contains(ST(ST_WARNED), g);
        Py_DECREF(g);
        if (in <= 0) { if (in < 0) return NULL; Py_RETURN_FALSE; }
    }

    /* The stream: an int handle, or an object with its handle cached for this runtime. */
    PyObject *stream = nconf > 2 ? PyTuple_GetItem(config, 2) : NULL;
    PyObject *handle, *owner;
    if (stream == NULL) {
        handle = PyLong_FromLong(0);
        owner = Py_None;
        Py_INCREF(owner);
    } else if (PyLong_CheckExact(stream)) {
        if (PyLong_AsLongLong(stream) < 0) { PyErr_Clear(); Py_RETURN_FALSE; }
        handle = stream;
        Py_INCREF(handle);
        owner = Py_None;
        Py_INCREF(owner);
    } else {
        PyObject *c = get_attr_or_null(stream, s_nss_stream);
        if (c == NULL) { if (PyErr_Occurred()) return NULL; Py_RETURN_FALSE; }
        if (!PyTuple_Check(c) || PyTuple_Size(c) != 2 || PyTuple_GetItem(c, 0) != rt) {
            Py_DECREF(c); Py_RETURN_FALSE;
        }
        handle = PyTuple_GetItem(c, 1);
        Py_INCREF(handle);
        Py_DECREF(c);
        owner = stream;
        Py_INCREF(owner);
    }
    if (handle == NULL) { Py_DECREF(owner); return NULL; }
    PyObject *result = NULL;
    Use u[MAX_USES];
    int nu = 0;
    PyObject *cached[MAX_USES];
    PyObject *items[MAX_USES];
    int is_array[MAX_USES];
    Py_ssize_t nargs = PyTuple_Size(args);
    int ncached = 0;
    PyObject *lock = ST(ST_LOCK);
    {
        PyObject *destroyed = ST(ST_DESTROYED);
        if (PySet_Size(destroyed) > 0) {
            int in = PySet_Contains(destroyed, handle);
            if (in) { if (in < 0) goto error; goto slow; }
        }
    }
    unsigned long long hv = PyLong_AsUnsignedLongLong(handle);
    if (hv == (unsigned long long)-1 && PyErr_Occurred()) { PyErr_Clear(); goto slow; }

    /* Arguments. */
    PyObject *accesses = ST(ST_ACCESSES);
    if (nargs != PyTuple_Size(accesses) || nargs > MAX_USES) goto slow;
    PyObject *types[MAX_USES];
    PyObject *scalars = ST(ST_SCALARS);
    PyObject *live = ST(ST_LIVE);
    for (Py_ssize_t i = 0; i < nargs; i++) {
        PyObject *arg = PyTuple_GetItem(args, i);
        items[i] = arg;
        long acc = PyLong_AsLong(PyTuple_GetItem(accesses, i));
        if (acc > 0) {
            PyObject *c = get_attr_or_null(arg, s_nss_fast);
            if (c == NULL) { if (PyErr_Occurred()) goto error; goto slow; }
            cached[ncached++] = c;
            if (!PyTuple_Check(c) || PyTuple_Size(c) != 4) goto slow;
            is_array[i] = 1;
            types[i] = PyTuple_GetItem(c, 2);
            PyObject *entry = PyDict_GetItemWithError(live, PyTuple_GetItem(c, 1));
            if (entry == NULL) { if (PyErr_Occurred()) goto error; goto slow; }
            PyObject *eb = PyObject_GetAttr(entry, s_block);
            if (eb == NULL) goto error;
            int same = eb == PyTuple_GetItem(c, 0);
            Py_DECREF(eb);
            if (!same) goto slow; /* freed, or another handle: the Python path decides */
            int merged = 0;
            for (int j = 0; j < nu; j++) {
                if (u[j].entry == entry) { u[j].access |= acc; merged = 1; break; }
            }
            if (!merged) {
                Py_INCREF(entry);
                u[nu].entry = entry;
                u[nu].access = acc;
                nu++;
            }
        } else {
            is_array[i] = 0;
            cached[ncached++] = NULL;
            if (PyLong_CheckExact(arg)) types[i] = PyTuple_GetItem(scalars, 0);
            else if (PyFloat_CheckExact(arg)) types[i] = PyTuple_GetItem(scalars, 1);
            else if (PyBool_Check(arg)) types[i] = PyTuple_GetItem(scalars, 2);
            else if (PyComplex_CheckExact(arg)) types[i] = PyTuple_GetItem(scalars, 3);
            else goto slow;
        }
    }
    /* The plan of these argument types (identity: Numba's types are interned). */
    PyObject *plans = ST(ST_PLANS), *plan = NULL;
    Py_ssize_t nplans = PyList_Size(plans);
    for (Py_ssize_t p = 0; p < nplans && plan == NULL; p++) {
        PyObject *cand = PyList_GetItem(plans, p);
        PyObject *key = PyTuple_GetItem(cand, 0);
        if (PyTuple_Size(key) != nargs) continue;
        int match = 1;
        for (Py_ssize_t i = 0; i < nargs && match; i++) match = PyTuple_GetItem(key, i) == types[i];
        if (match) plan = cand;
    }
    if (plan == NULL) goto slow;
    /* plan: (argtypes, function, codes, cufunc_cache, cufunc, device) */
    {
        PyObject *cur = PyDict_GetItemWithError(PyTuple_GetItem(plan, 3), PyTuple_GetItem(plan, 5));
        if (cur == NULL && PyErr_Occurred()) goto error;
        if (cur != PyTuple_GetItem(plan, 4)) goto slow; /* unloaded: the Python path rebuilds */
    }
    void *function = PyLong_AsVoidPtr(PyTuple_GetItem(plan, 1));
    if (function == NULL && PyErr_Occurred()) goto error;
    char *codes;
    Py_ssize_t ncodes;
    if (PyBytes_AsStringAndSize(PyTuple_GetItem(plan, 2), &codes, &ncodes) < 0) goto error;
    unsigned char buf[PARAM_BYTES];
    {
        PyObject *cache_for[MAX_USES];
        for (Py_ssize_t i = 0; i < nargs; i++) cache_for[i] = cached[i];
        int np = pack_params(codes, ncodes, items, nargs, is_array, cache_for, buf);
        if (np < 0) goto error;
        if (np == 0 && ncodes > 0) goto slow;
        void *ptrs[MAX_PARAMS];
        for (int i = 0; i < np; i++) ptrs[i] = buf + 8 * i;

        /* Preflight. */
        if (lock_acquire(lock, 1) < 0) goto error; /* waits with the GIL released */
        long same = 0;
        PyObject *resource = ST(ST_RESOURCE);
        int rc = preflight_locked(ST(ST_BOOK), u, nu, handle, owner, &same, ST(ST_TRACEHOOK), 1);
        if (rc == 0) rc = bump_same(resource, same);
        if (unlock_after(lock) < 0) goto error;
        /* The launch. */
        int err;
        Py_BEGIN_ALLOW_THREADS
        err = cu_launch_kernel(function, grid[0], grid[1], grid[2], block[0], block[1], block[2],
                               (unsigned)shmem, (void *)(uintptr_t)hv, ptrs, NULL);
        Py_END_ALLOW_THREADS
        if (err) {
            /* The driver layer retries in the right context, or raises its error. */
            PyObject *r = PyObject_CallFunction(
                ST(ST_DRIVER_LAUNCH), "O(III)(III)kOK", PyTuple_GetItem(plan, 1), grid[0],
                grid[1], grid[2], block[0], block[1], block[2], shmem, handle,
                (unsigned long long)(uintptr_t)ptrs);
            if (r == NULL) goto error;
            Py_DECREF(r);
        }
        /* Commit. */
        if (lock_acquire(lock, 1) < 0) goto error;
        int eager = PyObject_IsTrue(ST(ST_EAGER));
        rc = commit_locked(ST(ST_BOOK), ST(ST_OPEN), u, nu, handle, owner, eager);
        if (unlock_after(lock) < 0) goto error;
    }
    fast_launches++;
    result = Py_True;
    Py_INCREF(result);
    goto done;
slow:
    result = Py_False;
    Py_INCREF(result);
    goto done;
error:
    result = NULL;
done:
    drop_uses(u, nu);
    for (int i = 0; i < ncached; i++) Py_XDECREF(cached[i]);
    Py_DECREF(handle);
    Py_DECREF(owner);
    return result;
#undef ST
}

/* ------------------------------------------------------------ Launcher */
static PyObject *s_fast_attr, *s_slow;

typedef struct {
    PyObject_HEAD
    PyObject *kernel;
    PyObject *config;
    PyObject *stream;
} LauncherObject;

static PyObject *launcher_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *kernel, *config;
    if (kwds != NULL && PyDict_Size(kwds) > 0) {
        PyErr_SetString(PyExc_TypeError, "Launcher(kernel, config) takes no keywords");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OO!:Launcher", &kernel, &PyTuple_Type, &config)) return NULL;
    allocfunc alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
    LauncherObject *self = (LauncherObject *)alloc(type, 0);
    if (self == NULL) return NULL;
    Py_INCREF(kernel);
    self->kernel = kernel;
    Py_INCREF(config);
    self->config = config;
    if (PyTuple_Size(config) > 2) {
        self->stream = PyTuple_GetItem(config, 2);
        Py_INCREF(self->stream);
    } else {
        self->stream = PyLong_FromLong(0);
        if (self->stream == NULL) { Py_DECREF(self); return NULL; }
    }
    return (PyObject *)self;
}

static int launcher_traverse(PyObject *o, visitproc visit, void *arg) {
    LauncherObject *self = (LauncherObject *)o;
    Py_VISIT(self->kernel);
    Py_VISIT(self->config);
    Py_VISIT(self->stream);
    Py_VISIT(Py_TYPE(o));
    return 0;
}

static int launcher_clear(PyObject *o) {
    LauncherObject *self = (LauncherObject *)o;
    Py_CLEAR(self->kernel);
    Py_CLEAR(self->config);
    Py_CLEAR(self->stream);
    return 0;
}

static void launcher_dealloc(PyObject *o) {
    PyTypeObject *tp = Py_TYPE(o);
    PyObject_GC_UnTrack(o);
    launcher_clear(o);
    freefunc tp_free = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    tp_free(o);
    Py_DECREF(tp);
}

static PyObject *launcher_call(PyObject *o, PyObject *args, PyObject *kwds) {
    LauncherObject *self = (LauncherObject *)o;
    if (kwds == NULL || PyDict_Size(kwds) == 0) {
        PyObject *fast = PyObject_GetAttr(self->kernel, s_fast_attr);
        if (fast == NULL) return NULL;
        if (PyTuple_Check(fast)) {
            PyObject *a[3] = {fast, self->config, args};
            PyObject *done = hot_launch(NULL, a, 3);
            Py_DECREF(fast);
            if (done == NULL) return NULL;
            int ok = PyObject_IsTrue(done);
            Py_DECREF(done);
            if (ok < 0) return NULL;
            if (ok) Py_RETURN_NONE;
        } else {
            Py_DECREF(fast);
        }
    }
    PyObject *slow = PyObject_GetAttr(o, s_slow);
    if (slow == NULL) return NULL;
    PyObject *r = PyObject_Call(slow, args, kwds);
    Py_DECREF(slow);
    return r;
}

static PyMemberDef launcher_members[] = {
    {"kernel", T_OBJECT_EX, offsetof(LauncherObject, kernel), READONLY, "The tracked kernel."},
    {"config", T_OBJECT_EX, offsetof(LauncherObject, config), READONLY,
     "(grid, block[, stream[, shmem]])"},
    {"stream", T_OBJECT_EX, offsetof(LauncherObject, stream), READONLY,
     "The configuration's stream (0 when it names none)."},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot launcher_slots[] = {
    {Py_tp_new, launcher_new},
    {Py_tp_dealloc, launcher_dealloc},
    {Py_tp_traverse, launcher_traverse},
    {Py_tp_clear, launcher_clear},
    {Py_tp_call, launcher_call},
    {Py_tp_members, launcher_members},
    {Py_tp_doc, "Launcher(kernel, config): a configured launch; calling it takes the "
                "compiled hot path, else the subclass's _slow(*args)."},
    {0, NULL},
};

static PyType_Spec launcher_spec = {
    "numba_streamsafe._hot.Launcher", sizeof(LauncherObject), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC, launcher_slots,
};

static PyObject *hot_available(PyObject *self, PyObject *unused) {
    /* Whether launch() can reach the driver (libcuda loaded in this process). */
    if (!cu_looked) find_launch();
    return PyBool_FromLong(cu_launch_kernel != NULL);
}

static PyObject *hot_set_mark_type(PyObject *self, PyObject *cls) {
    Py_XDECREF(MarkClass);
    Py_INCREF(cls);
    MarkClass = cls;
    Py_RETURN_NONE;
}

static PyObject *hot_launches(PyObject *self, PyObject *unused) {
    return PyLong_FromUnsignedLongLong(fast_launches);
}

static PyMethodDef methods[] = {
    {"set_mark_type", hot_set_mark_type, METH_O,
     "set_mark_type(cls): the mark class handled in C (numba_streamsafe's Mark)."},
    {"launches", hot_launches, METH_NOARGS,
     "launches() -> int: kernels launch() has queued in this process."},
    {"preflight", hot_preflight, METH_VARARGS,
     "preflight(resource, uses, stream, owner=None): AsyncResource.preflight."},
    {"commit", hot_commit, METH_VARARGS,
     "commit(resource, uses, stream, owner=None): AsyncResource.commit."},
    {"launch", hot_launch_tuple, METH_VARARGS,
     "launch(state, config, args) -> bool: a tracked kernel's launch, or False."},
    {"pack", hot_pack, METH_VARARGS,
     "pack(codes, args, arrays) -> bytes | None: the parameter bytes of a launch."},
    {"available", hot_available, METH_NOARGS,
     "available() -> bool: whether launch() finds libcuda in this process."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_hot", NULL, -1, methods};

#define INTERN(var, text) \
    do { if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL; } while (0)

PyMODINIT_FUNC PyInit__hot(void) {
    INTERN(s_acquire, "acquire");
    INTERN(s_release, "release");
    INTERN(s_last_write, "last_write");
    INTERN(s_reads, "reads");
    INTERN(s_block, "block");
    INTERN(s_stream, "stream");
    INTERN(s_ptr, "ptr");
    INTERN(s_refs, "refs");
    INTERN(s_owner, "owner");
    INTERN(s_wait_all, "wait_all");
    INTERN(s_current, "current");
    INTERN(s_seal, "seal");
    INTERN(s_same_stream, "_same_stream");
    INTERN(s_drain, "_drain");
    INTERN(s_deferred_queue, "_deferred_queue");
    INTERN(s_entry, "entry");
    INTERN(s_lock, "_lock");
    INTERN(s_live, "_live");
    INTERN(s_open, "_open");
    INTERN(s_marks, "marks");
    INTERN(s_table, "_table");
    INTERN(s_eager, "_eager");
    INTERN(s_active, "active");
    INTERN(s_sole, "_sole");
    INTERN(s_tracking, "tracking");
    INTERN(s_direct_launch, "direct_launch");
    INTERN(s_capture, "capture");
    INTERN(s_nss_fast, "_nss_fast");
    INTERN(s_nss_stream, "_nss_stream");
    INTERN(s_preflight, "preflight");
    INTERN(s_commit, "commit");
    INTERN(s_waiters, "waiters");
    INTERN(s_handle, "handle");
    INTERN(s_events, "events");
    INTERN(s_idle, "_idle");
    INTERN(s_in_use, "in_use");
    INTERN(s_recorded, "recorded");
    INTERN(s_waits, "waits");
    INTERN(s_max_idle, "_max_idle");
    INTERN(s_pop, "pop");
    INTERN(s_append, "append");
    INTERN(s_event_record, "event_record");
    INTERN(s_stream_wait_event, "stream_wait_event");
    INTERN(s_destroyed_streams, "destroyed_streams");
    INTERN(s_driver, "driver");
    INTERN(s_pool_acquire, "acquire");
    INTERN(s_book_open, "open");
    INTERN(s_fast_attr, "_fast");
    INTERN(s_slow, "_slow");
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    LockType = (PyTypeObject *)PyType_FromSpec(&lock_spec);
    if (LockType == NULL) { Py_DECREF(m); return NULL; }
    Py_INCREF(LockType);
    if (PyModule_AddObject(m, "Lock", (PyObject *)LockType) < 0) {
        Py_DECREF(LockType); Py_DECREF(m); return NULL;
    }
    PyObject *launcher = PyType_FromSpec(&launcher_spec);
    if (launcher == NULL) { Py_DECREF(m); return NULL; }
    if (PyModule_AddObject(m, "Launcher", launcher) < 0) {
        Py_DECREF(launcher); Py_DECREF(m); return NULL;
    }
    return m;
}
