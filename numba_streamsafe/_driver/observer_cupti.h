/* The driver observer's C part (numba_streamsafe/_driver/observer.py): a
 * CUPTI subscriber whose callback notes, per CUDA context, the calls that
 * order work or touch memory, whoever makes them (Numba, CuPy, PyTorch,
 * cuda.core, a C extension), into a buffer that the tracking resource drains
 * under its lock before each decision.
 *
 * The callback takes no Python lock unless its thread already holds the GIL:
 * a library that calls CUDA with the GIL released (CuPy and PyTorch do) may
 * hold its own mutexes meanwhile, and a thread that waited for the GIL there
 * could deadlock. With the GIL held (and only on Python 3.12 and newer, where
 * an allocation never runs the garbage collector inline) a copy, a fill or a
 * stream creation also keeps the Python stack of its caller.
 *
 * CUPTI's types are declared here as the few fields read; its callback ids
 * are found by name (cuptiGetCallbackName) when the observer starts, so no
 * CUDA or CUPTI header is needed to build. The Python side loads libcupti
 * (ctypes) and hands the addresses of the five functions used to nss_start:
 * nothing here links to the dynamic loader.
 */
#ifndef NSS_OBSERVER_CUPTI_H
#define NSS_OBSERVER_CUPTI_H

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* What a record is (the Python side's KIND_* constants mirror these). */
enum {
    NSS_K_NONE = 0,
    NSS_K_EVENT_RECORD = 1,   /* stream, event */
    NSS_K_STREAM_WAIT = 2,    /* stream, event */
    NSS_K_STREAM_SYNC = 3,    /* stream: the host saw it complete */
    NSS_K_EVENT_SYNC = 4,     /* event: the host saw it complete */
    NSS_K_EVENT_QUERY = 5,    /* event: a query that found it complete */
    NSS_K_CTX_SYNC = 6,       /* the context: the host saw every stream complete */
    NSS_K_EVENT_DESTROY = 7,  /* event */
    NSS_K_COPY = 8,           /* stream, dst, src, bytes, flags */
    NSS_K_MEMSET = 9,         /* stream, dst, bytes, flags */
    NSS_K_STREAM_CREATED = 10,
    NSS_K_STREAM_DESTROYED = 11
};

/* Record flags: the host waited for the default stream before the copy
 * (a synchronous copy from the host) or after it (to the host). */
#define NSS_F_SYNC_BEFORE 1
#define NSS_F_SYNC_AFTER 2

/* How a call's parameters are laid out (each mirrors the function's signature). */
enum {
    NSS_L_NONE = 0,
    NSS_L_EV_ST,      /* (CUevent, CUstream, ...) */
    NSS_L_ST_EV,      /* (CUstream, CUevent, flags) */
    NSS_L_ST,         /* (CUstream) */
    NSS_L_EV,         /* (CUevent) */
    NSS_L_CTX,        /* (CUcontext) or () */
    NSS_L_CPY,        /* (CUdeviceptr dst, CUdeviceptr src, size_t, [CUstream]) */
    NSS_L_CPY_HD,     /* (CUdeviceptr dst, const void *src, size_t, [CUstream]) */
    NSS_L_CPY_DH,     /* (void *dst, CUdeviceptr src, size_t, [CUstream]) */
    NSS_L_SET         /* (CUdeviceptr dst, value, size_t N, [CUstream]) */
};

typedef struct { void *event; void *stream; } nss_p_ev_st;
typedef struct { void *stream; void *event; unsigned int flags; } nss_p_st_ev;
typedef struct { void *stream; } nss_p_st;
typedef struct { void *event; } nss_p_ev;
typedef struct { void *ctx; } nss_p_ctx;
typedef struct { unsigned long long dst; unsigned long long src; size_t n; void *stream; } nss_p_cpy;
typedef struct { unsigned long long dst; unsigned char v; size_t n; void *stream; } nss_p_set8;
typedef struct { unsigned long long dst; unsigned short v; size_t n; void *stream; } nss_p_set16;
typedef struct { unsigned long long dst; unsigned int v; size_t n; void *stream; } nss_p_set32;

/* CUPTI's callback data, as far as it is read. */
typedef struct {
    int callbackSite;               /* 0: enter, 1: exit */
    const char *functionName;
    const void *functionParams;
    void *functionReturnValue;
    const char *symbolName;
    void *context;
    uint32_t contextUid;
    uint64_t *correlationData;
    uint32_t correlationId;
} nss_cb_data;

typedef struct { void *context; void *stream; void *descriptor; } nss_resource_data;

#define NSS_DOMAIN_DRIVER 1
#define NSS_DOMAIN_RESOURCE 3
#define NSS_RES_STREAM_CREATED 3
#define NSS_RES_STREAM_DESTROY 4
#define NSS_MAX_CBID 2048
#define NSS_MAX_SLOTS 64
#define NSS_MAX_FRAMES 64
/* Records one context may hold before further ones are dropped (and counted). */
#define NSS_MAX_RECORDS (1 << 22)

typedef struct {
    int kind;
    int cbid;
    int flags;
    unsigned long long stream, event, dst, src, bytes, thread;
    PyObject *stack;                /* ((code, line), ...) innermost first, or NULL */
} nss_record;

typedef struct {
    void *context;
    pthread_mutex_t lock;
    nss_record *records;
    Py_ssize_t count, cap;
    unsigned long long lost;
} nss_slot;

typedef int (*nss_subscribe_fn)(void **, void *, void *);
typedef int (*nss_enable_cb_fn)(uint32_t, void *, int, uint32_t);
typedef int (*nss_name_fn)(int, uint32_t, const char **);
typedef int (*nss_unsubscribe_fn)(void *);
typedef int (*nss_result_fn)(int, const char **);

static struct {
    nss_name_fn name_of;
    void *subscriber;
    nss_enable_cb_fn enable;
    nss_unsubscribe_fn unsubscribe;
    nss_result_fn result_string;
    unsigned char kind[NSS_MAX_CBID];
    unsigned char layout[NSS_MAX_CBID];
    unsigned char elem[NSS_MAX_CBID];      /* a fill's element size */
    unsigned char flags[NSS_MAX_CBID];
    unsigned char ptsz[NSS_MAX_CBID];      /* a NULL stream is the per-thread one */
    unsigned char sync[NSS_MAX_CBID];      /* a synchronous copy or fill: no stream */
    int running;
    int frames;                            /* Python frames kept per stack */
    nss_slot slots[NSS_MAX_SLOTS];
    volatile int nslots;
    unsigned long long calls, dropped;
} nss_obs = {0};

static __thread int nss_quiet = 0;
static pthread_mutex_t nss_slots_lock = PTHREAD_MUTEX_INITIALIZER;

static const struct { const char *name; int kind; int layout; int elem; int flags; } nss_table[] = {
    {"cuEventRecord", NSS_K_EVENT_RECORD, NSS_L_EV_ST, 0, 0},
    {"cuEventRecord_ptsz", NSS_K_EVENT_RECORD, NSS_L_EV_ST, 0, 0},
    {"cuEventRecordWithFlags", NSS_K_EVENT_RECORD, NSS_L_EV_ST, 0, 0},
    {"cuEventRecordWithFlags_ptsz", NSS_K_EVENT_RECORD, NSS_L_EV_ST, 0, 0},
    {"cuStreamWaitEvent", NSS_K_STREAM_WAIT, NSS_L_ST_EV, 0, 0},
    {"cuStreamWaitEvent_ptsz", NSS_K_STREAM_WAIT, NSS_L_ST_EV, 0, 0},
    {"cuStreamSynchronize", NSS_K_STREAM_SYNC, NSS_L_ST, 0, 0},
    {"cuStreamSynchronize_ptsz", NSS_K_STREAM_SYNC, NSS_L_ST, 0, 0},
    {"cuEventSynchronize", NSS_K_EVENT_SYNC, NSS_L_EV, 0, 0},
    {"cuEventQuery", NSS_K_EVENT_QUERY, NSS_L_EV, 0, 0},
    {"cuEventDestroy", NSS_K_EVENT_DESTROY, NSS_L_EV, 0, 0},
    {"cuEventDestroy_v2", NSS_K_EVENT_DESTROY, NSS_L_EV, 0, 0},
    {"cuCtxSynchronize", NSS_K_CTX_SYNC, NSS_L_NONE, 0, 0},
    {"cuCtxSynchronize_v2", NSS_K_CTX_SYNC, NSS_L_CTX, 0, 0},
    {"cuMemcpyAsync", NSS_K_COPY, NSS_L_CPY, 0, 0},
    {"cuMemcpyAsync_ptsz", NSS_K_COPY, NSS_L_CPY, 0, 0},
    {"cuMemcpyDtoDAsync_v2", NSS_K_COPY, NSS_L_CPY, 0, 0},
    {"cuMemcpyDtoDAsync_v2_ptsz", NSS_K_COPY, NSS_L_CPY, 0, 0},
    {"cuMemcpyHtoDAsync_v2", NSS_K_COPY, NSS_L_CPY_HD, 0, 0},
    {"cuMemcpyHtoDAsync_v2_ptsz", NSS_K_COPY, NSS_L_CPY_HD, 0, 0},
    {"cuMemcpyDtoHAsync_v2", NSS_K_COPY, NSS_L_CPY_DH, 0, 0},
    {"cuMemcpyDtoHAsync_v2_ptsz", NSS_K_COPY, NSS_L_CPY_DH, 0, 0},
    {"cuMemcpy", NSS_K_COPY, NSS_L_CPY, 0, NSS_F_SYNC_AFTER},
    {"cuMemcpy_ptds", NSS_K_COPY, NSS_L_CPY, 0, NSS_F_SYNC_AFTER},
    {"cuMemcpyDtoD_v2", NSS_K_COPY, NSS_L_CPY, 0, 0},
    {"cuMemcpyDtoD_v2_ptds", NSS_K_COPY, NSS_L_CPY, 0, 0},
    {"cuMemcpyHtoD_v2", NSS_K_COPY, NSS_L_CPY_HD, 0, NSS_F_SYNC_BEFORE},
    {"cuMemcpyHtoD_v2_ptds", NSS_K_COPY, NSS_L_CPY_HD, 0, NSS_F_SYNC_BEFORE},
    {"cuMemcpyDtoH_v2", NSS_K_COPY, NSS_L_CPY_DH, 0, NSS_F_SYNC_AFTER},
    {"cuMemcpyDtoH_v2_ptds", NSS_K_COPY, NSS_L_CPY_DH, 0, NSS_F_SYNC_AFTER},
    {"cuMemsetD8Async", NSS_K_MEMSET, NSS_L_SET, 1, 0},
    {"cuMemsetD8Async_ptsz", NSS_K_MEMSET, NSS_L_SET, 1, 0},
    {"cuMemsetD16Async", NSS_K_MEMSET, NSS_L_SET, 2, 0},
    {"cuMemsetD16Async_ptsz", NSS_K_MEMSET, NSS_L_SET, 2, 0},
    {"cuMemsetD32Async", NSS_K_MEMSET, NSS_L_SET, 4, 0},
    {"cuMemsetD32Async_ptsz", NSS_K_MEMSET, NSS_L_SET, 4, 0},
    {"cuMemsetD8_v2", NSS_K_MEMSET, NSS_L_SET, 1, 0},
    {"cuMemsetD8_v2_ptds", NSS_K_MEMSET, NSS_L_SET, 1, 0},
    {"cuMemsetD16_v2", NSS_K_MEMSET, NSS_L_SET, 2, 0},
    {"cuMemsetD16_v2_ptds", NSS_K_MEMSET, NSS_L_SET, 2, 0},
    {"cuMemsetD32_v2", NSS_K_MEMSET, NSS_L_SET, 4, 0},
    {"cuMemsetD32_v2_ptds", NSS_K_MEMSET, NSS_L_SET, 4, 0},
    {NULL, 0, 0, 0, 0}
};

static int nss_ends_with(const char *s, const char *tail) {
    size_t n = strlen(s), m = strlen(tail);
    return n >= m && strcmp(s + n - m, tail) == 0;
}

/* The slot of `context`, claimed on first sight (-1: none left). */
static int nss_slot_of(void *context) {
    int n = __atomic_load_n(&nss_obs.nslots, __ATOMIC_ACQUIRE);
    int i;
    for (i = 0; i < n; i++)
        if (nss_obs.slots[i].context == context) return i;
    pthread_mutex_lock(&nss_slots_lock);
    n = nss_obs.nslots;
    for (i = 0; i < n; i++)
        if (nss_obs.slots[i].context == context) break;
    if (i == n) {
        if (n == NSS_MAX_SLOTS) {
            i = -1;
        } else {
            nss_slot *slot = &nss_obs.slots[n];
            memset(slot, 0, sizeof(*slot));
            slot->context = context;
            pthread_mutex_init(&slot->lock, NULL);
            __atomic_store_n(&nss_obs.nslots, n + 1, __ATOMIC_RELEASE);
        }
    }
    pthread_mutex_unlock(&nss_slots_lock);
    return i;
}

/* The caller's Python stack, when this thread holds the GIL (3.12 and newer). */
static PyObject *nss_stack(void) {
#if PY_VERSION_HEX >= 0x030C0000
    PyFrameObject *frame, *back;
    PyObject *out, *item;
    int n = 0;
    if (nss_obs.frames <= 0 || !PyGILState_Check()) return NULL;
    out = PyList_New(0);
    if (out == NULL) { PyErr_Clear(); return NULL; }
    frame = PyEval_GetFrame();
    Py_XINCREF(frame);
    while (frame != NULL && n < nss_obs.frames) {
        PyCodeObject *code = PyFrame_GetCode(frame);
        item = Py_BuildValue("(Ni)", (PyObject *)code, PyFrame_GetLineNumber(frame));
        if (item == NULL || PyList_Append(out, item) < 0) {
            Py_XDECREF(item);
            Py_DECREF(frame);
            Py_DECREF(out);
            PyErr_Clear();
            return NULL;
        }
        Py_DECREF(item);
        n++;
        back = PyFrame_GetBack(frame);
        Py_DECREF(frame);
        frame = back;
    }
    Py_XDECREF(frame);
    return out;
#else
    return NULL;
#endif
}

static void nss_push(void *context, const nss_record *rec, int with_stack) {
    int i = nss_slot_of(context);
    nss_slot *slot;
    if (i < 0) { __atomic_add_fetch(&nss_obs.dropped, 1, __ATOMIC_RELAXED); return; }
    slot = &nss_obs.slots[i];
    PyObject *stack = with_stack ? nss_stack() : NULL;
    pthread_mutex_lock(&slot->lock);
    if (slot->count == slot->cap) {
        Py_ssize_t cap = slot->cap ? slot->cap * 2 : 256;
        nss_record *grown = NULL;
        if (cap <= NSS_MAX_RECORDS)
            grown = (nss_record *)realloc(slot->records, (size_t)cap * sizeof(nss_record));
        if (grown == NULL) {
            slot->lost++;
            pthread_mutex_unlock(&slot->lock);
            if (stack != NULL) { /* the GIL is held: stack is only made with it */
                Py_DECREF(stack);
            }
            return;
        }
        slot->records = grown;
        slot->cap = cap;
    }
    slot->records[slot->count] = *rec;
    slot->records[slot->count].stack = stack;
    slot->count++;
    pthread_mutex_unlock(&slot->lock);
}

static unsigned long long nss_stream(void *stream, int ptsz) {
    /* A NULL stream is the legacy default stream (0), or the per-thread one (2)
     * for the _ptsz / _ptds entry points. */
    if (stream == NULL) return ptsz ? 2ULL : 0ULL;
    return (unsigned long long)(uintptr_t)stream;
}

static void nss_callback(void *userdata, int domain, uint32_t cbid, const void *data) {
    nss_record rec;
    void *context;
    int kind, layout, ptsz, sync;
    (void)userdata;
    if (nss_quiet || data == NULL) return;
    memset(&rec, 0, sizeof(rec));
    if (domain == NSS_DOMAIN_RESOURCE) {
        const nss_resource_data *res = (const nss_resource_data *)data;
        if (cbid == NSS_RES_STREAM_CREATED) rec.kind = NSS_K_STREAM_CREATED;
        else if (cbid == NSS_RES_STREAM_DESTROY) rec.kind = NSS_K_STREAM_DESTROYED;
        else return;
        rec.stream = (unsigned long long)(uintptr_t)res->stream;
        rec.thread = (unsigned long long)pthread_self();
        nss_push(res->context, &rec, rec.kind == NSS_K_STREAM_CREATED);
        return;
    }
    if (domain != NSS_DOMAIN_DRIVER || cbid >= NSS_MAX_CBID) return;
    kind = nss_obs.kind[cbid];
    if (kind == NSS_K_NONE) return;
    {
        const nss_cb_data *cb = (const nss_cb_data *)data;
        const void *p = cb->functionParams;
        /* A destroy is noted as it starts; everything else once it returned CUDA_SUCCESS. */
        if (kind == NSS_K_EVENT_DESTROY) {
            if (cb->callbackSite != 0) return;
        } else {
            if (cb->callbackSite != 1) return;
            if (cb->functionReturnValue == NULL || *(const int *)cb->functionReturnValue != 0)
                return;
        }
        layout = nss_obs.layout[cbid];
        ptsz = nss_obs.ptsz[cbid];
        sync = nss_obs.sync[cbid];
        context = cb->context;
        rec.kind = kind;
        rec.cbid = (int)cbid;
        rec.flags = nss_obs.flags[cbid];
        rec.thread = (unsigned long long)pthread_self();
        switch (layout) {
        case NSS_L_EV_ST:
            rec.event = (unsigned long long)(uintptr_t)((const nss_p_ev_st *)p)->event;
            rec.stream = nss_stream(((const nss_p_ev_st *)p)->stream, ptsz);
            break;
        case NSS_L_ST_EV:
            rec.stream = nss_stream(((const nss_p_st_ev *)p)->stream, ptsz);
            rec.event = (unsigned long long)(uintptr_t)((const nss_p_st_ev *)p)->event;
            break;
        case NSS_L_ST:
            rec.stream = nss_stream(((const nss_p_st *)p)->stream, ptsz);
            break;
        case NSS_L_EV:
            rec.event = (unsigned long long)(uintptr_t)((const nss_p_ev *)p)->event;
            break;
        case NSS_L_CTX:
            if (p != NULL && ((const nss_p_ctx *)p)->ctx != NULL)
                context = ((const nss_p_ctx *)p)->ctx;
            break;
        case NSS_L_CPY: case NSS_L_CPY_HD: case NSS_L_CPY_DH: {
            const nss_p_cpy *c = (const nss_p_cpy *)p;
            rec.dst = layout == NSS_L_CPY_DH ? 0ULL : c->dst;
            rec.src = layout == NSS_L_CPY_HD ? 0ULL : c->src;
            rec.bytes = (unsigned long long)c->n;
            rec.stream = sync ? nss_stream(NULL, ptsz) : nss_stream(c->stream, ptsz);
            break;
        }
        case NSS_L_SET: {
            int elem = nss_obs.elem[cbid];
            const void *stream;
            rec.dst = ((const nss_p_set8 *)p)->dst;
            if (elem == 1) {
                rec.bytes = (unsigned long long)((const nss_p_set8 *)p)->n;
                stream = ((const nss_p_set8 *)p)->stream;
            } else if (elem == 2) {
                rec.bytes = 2ULL * ((const nss_p_set16 *)p)->n;
                stream = ((const nss_p_set16 *)p)->stream;
            } else {
                rec.bytes = 4ULL * ((const nss_p_set32 *)p)->n;
                stream = ((const nss_p_set32 *)p)->stream;
            }
            rec.stream = sync ? nss_stream(NULL, ptsz) : nss_stream((void *)stream, ptsz);
            break;
        }
        default:
            break;
        }
    }
    __atomic_add_fetch(&nss_obs.calls, 1, __ATOMIC_RELAXED);
    nss_push(context, &rec, kind == NSS_K_COPY || kind == NSS_K_MEMSET);
}

static const char *nss_why = NULL;

/* Why the last nss_start failed (NULL: it did not). */
static const char *nss_reason(void) { return nss_why; }

/* Subscribe through the CUPTI functions given, and enable the callbacks of nss_table.
 * Returns 0, or a CUPTI result code (39: another subscriber holds CUPTI), or
 * -1 when one of the functions is missing. */

static int nss_start(size_t subscribe_fn, size_t enable_fn, size_t name_fn,
                     size_t unsubscribe_fn, size_t result_fn, int frames) {
    nss_subscribe_fn subscribe = (nss_subscribe_fn)subscribe_fn;
    nss_name_fn name_of = (nss_name_fn)name_fn;
    const char **why = &nss_why;
    int rc;
    uint32_t cbid;
    *why = NULL;
    if (nss_obs.running) return 0;
    nss_obs.enable = (nss_enable_cb_fn)enable_fn;
    nss_obs.unsubscribe = (nss_unsubscribe_fn)unsubscribe_fn;
    nss_obs.result_string = (nss_result_fn)result_fn;
    nss_obs.name_of = name_of;
    if (!subscribe || !nss_obs.enable || !name_of || !nss_obs.unsubscribe) {
        *why = "libcupti lacks the callback API";
        return -1;
    }
    memset(nss_obs.kind, 0, sizeof(nss_obs.kind));
    for (cbid = 1; cbid < NSS_MAX_CBID; cbid++) {
        const char *name = NULL;
        int i;
        if (name_of(NSS_DOMAIN_DRIVER, cbid, &name) != 0 || name == NULL) continue;
        for (i = 0; nss_table[i].name != NULL; i++) {
            if (strcmp(nss_table[i].name, name) == 0) {
                nss_obs.kind[cbid] = (unsigned char)nss_table[i].kind;
                nss_obs.layout[cbid] = (unsigned char)nss_table[i].layout;
                nss_obs.elem[cbid] = (unsigned char)nss_table[i].elem;
                nss_obs.flags[cbid] = (unsigned char)nss_table[i].flags;
                nss_obs.ptsz[cbid] = nss_ends_with(name, "_ptsz") || nss_ends_with(name, "_ptds");
                nss_obs.sync[cbid] = strstr(name, "Async") == NULL
                    && (nss_table[i].kind == NSS_K_COPY || nss_table[i].kind == NSS_K_MEMSET);
                break;
            }
        }
    }
    nss_obs.frames = frames < 0 ? 0 : (frames > NSS_MAX_FRAMES ? NSS_MAX_FRAMES : frames);
    rc = subscribe(&nss_obs.subscriber, (void *)nss_callback, NULL);
    if (rc != 0) {
        if (nss_obs.result_string) nss_obs.result_string(rc, why);
        nss_obs.subscriber = NULL;
        return rc;
    }
    for (cbid = 1; cbid < NSS_MAX_CBID; cbid++) {
        if (nss_obs.kind[cbid] == NSS_K_NONE) continue;
        rc = nss_obs.enable(1, nss_obs.subscriber, NSS_DOMAIN_DRIVER, cbid);
        if (rc != 0) break;
    }
    if (rc == 0) rc = nss_obs.enable(1, nss_obs.subscriber, NSS_DOMAIN_RESOURCE,
                                     NSS_RES_STREAM_CREATED);
    if (rc == 0) rc = nss_obs.enable(1, nss_obs.subscriber, NSS_DOMAIN_RESOURCE,
                                     NSS_RES_STREAM_DESTROY);
    if (rc != 0) {
        if (nss_obs.result_string) nss_obs.result_string(rc, why);
        nss_obs.unsubscribe(nss_obs.subscriber);
        nss_obs.subscriber = NULL;
        return rc;
    }
    nss_obs.running = 1;
    return 0;
}

/* Unsubscribe (CUPTI is free for a profiler again); what was noted stays. */
static int nss_stop(void) {
    int rc = 0;
    if (!nss_obs.running) return 0;
    rc = nss_obs.unsubscribe(nss_obs.subscriber);
    nss_obs.subscriber = NULL;
    nss_obs.running = 0;
    return rc;
}


/* Whether `context`'s slot holds records (read without its lock: a record
 * being added now is seen at the next look). */
static int nss_pending(int slot) {
    if (slot < 0 || slot >= nss_obs.nslots) return 0;
    return __atomic_load_n(&nss_obs.slots[slot].count, __ATOMIC_RELAXED) != 0;
}

/* The records of `slot`, oldest first, as a list of tuples
 * (kind, cbid, stream, event, dst, src, bytes, flags, thread, stack), and
 * the slot emptied. Called with the GIL held. */
static PyObject *nss_drain(int slot, unsigned long long *lost) {
    nss_slot *s;
    nss_record *records;
    Py_ssize_t n, i;
    PyObject *out;
    *lost = 0;
    if (slot < 0 || slot >= nss_obs.nslots) return PyList_New(0);
    s = &nss_obs.slots[slot];
    pthread_mutex_lock(&s->lock);
    records = s->records;
    n = s->count;
    *lost = s->lost;
    s->records = NULL;
    s->count = s->cap = 0;
    s->lost = 0;
    pthread_mutex_unlock(&s->lock);
    out = PyList_New(n);
    if (out == NULL) {
        for (i = 0; i < n; i++) Py_XDECREF(records[i].stack);
        free(records);
        return NULL;
    }
    for (i = 0; i < n; i++) {
        nss_record *r = &records[i];
        PyObject *stack = r->stack != NULL ? r->stack : Py_None;
        if (r->stack == NULL) Py_INCREF(Py_None);
        PyObject *item = Py_BuildValue("(iiKKKKKiKN)", r->kind, r->cbid, r->stream, r->event,
                                       r->dst, r->src, r->bytes, r->flags, r->thread, stack);
        if (item == NULL) {
            Py_ssize_t k;
            for (k = i + 1; k < n; k++) Py_XDECREF(records[k].stack);
            free(records);
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, item);
    }
    free(records);
    return out;
}

static int nss_slot_for(unsigned long long context) {
    return nss_slot_of((void *)(uintptr_t)context);
}

static const char *nss_callback_name(int cbid) {
    const char *name = NULL;
    if (nss_obs.name_of == NULL || nss_obs.name_of(NSS_DOMAIN_DRIVER, (uint32_t)cbid, &name) != 0)
        return NULL;
    return name;
}

static void nss_quiet_enter(void) { nss_quiet++; }
static void nss_quiet_exit(void) { nss_quiet--; }

#endif /* NSS_OBSERVER_CUPTI_H */
