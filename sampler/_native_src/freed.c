/* The dealloc watch: which code objects and functions were freed, and when.
 *
 * A record holds raw pointers read in a signal handler from live frames; by the time the drain
 * reads the record, one may have been freed and its address reused. The drain only
 * dereferences a pointer it holds a reference to (the frame name cache), or one this watch
 * shows was not freed since the walk began. The watch wraps the tp_dealloc of the code and
 * function types (CPython 3.12 has code watchers for this; 3.11 does not): every dealloc runs
 * under the GIL, so each log has one writer. Code objects and functions have logs of their
 * own: functions are freed all the time (a closure per call), code objects rarely, and a
 * function log that wraps must not make code objects look freed. A code object that dies
 * while the engine samples is kept until the drain has read its records (bury).
 */
#include "native.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A log's count as a drain began, and the monotonic clock then. */
typedef struct {
    uint64_t at_ns, total;
} drain_mark;
#define DRAIN_MARKS 8
/* A record's walk began less than this before the drain that reads it, but for a walk whose
 * thread the scheduler kept off its CPU that long (its pointers then count as freed). */
#define WALK_MARGIN_NS 100000000ull

/* Pointer -> the latest count at which it was freed, built from a log when a drain needs it. */
typedef struct {
    const void *ptr;
    uint64_t seq;
} freed_slot;

typedef struct {
    void **ring;
    uint64_t capacity; /* a power of two */
    _Atomic uint64_t total;
    freed_slot *lookup;
    size_t lookup_capacity;
    size_t lookup_mask;      /* the slots in use, less one: a power of two, at most the capacity */
    uint64_t collected_from; /* the log held nothing older when it was collected */
    uint64_t collected_to;   /* frees from here on are read from the log itself */
    int collected;
    /* The count as each of the last drains began, and when (see collect). */
    drain_mark marks[DRAIN_MARKS];
    unsigned next_mark;
    uint64_t drain_ns; /* when the drain at hand began */
} free_log;

static void *code_ring[16384];
static void *function_ring[65536];
static free_log code_log = {.ring = code_ring, .capacity = 16384};
static free_log function_log = {.ring = function_ring, .capacity = 65536};
static destructor code_dealloc, function_dealloc;
static int watching;

static void note_freed(free_log *log, PyObject *object)
{
    uint64_t seq = atomic_load_explicit(&log->total, memory_order_relaxed);
    log->ring[seq & (log->capacity - 1)] = object;
    atomic_store_explicit(&log->total, seq + 1, memory_order_release);
}

/* Code objects that died while sampling: kept (resurrected, invisible to the program, which
 * dropped its last reference) until two drains have read every record that can name them. A
 * template compiled per request lives a few milliseconds, less than a drain period. */
typedef struct {
    PyObject **objects;
    size_t count, capacity;
} code_list;

static code_list buried_recently, buried_before;
static int releasing;

static int bury(PyObject *object)
{
    code_list *list = &buried_recently;
    if (list->count == list->capacity) {
        size_t capacity = list->capacity ? 2 * list->capacity : 64;
        PyObject **grown = realloc(list->objects, capacity * sizeof(PyObject *));
        if (grown == NULL) {
            return 0;
        }
        list->objects = grown;
        list->capacity = capacity;
    }
    Py_SET_REFCNT(object, 1);
    list->objects[list->count++] = object;
    return 1;
}

static uint64_t thread_cpu_ns(void)
{
    struct timespec now;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now) != 0) {
        return 0;
    }
    return (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
}

/* Returns the CPU nanoseconds freeing them took this thread. */
static uint64_t release_list(code_list *list)
{
    if (list->count == 0) {
        return 0;
    }
    uint64_t started = thread_cpu_ns();
    releasing = 1;
    for (size_t i = 0; i < list->count; i++) {
        Py_DECREF(list->objects[i]);
    }
    releasing = 0;
    list->count = 0;
    uint64_t ended = thread_cpu_ns();
    return ended > started ? ended - started : 0;
}

uint64_t freed_drained(int last)
{
    uint64_t spent = release_list(&buried_before);
    code_list swap = buried_before;
    buried_before = buried_recently;
    buried_recently = swap;
    if (last) {
        spent += release_list(&buried_before);
    }
    return spent;
}

static void watched_code_dealloc(PyObject *object)
{
    if (watching) {
        /* One with weak references is freed as usual: their callbacks must run now. */
        if (!releasing && atomic_load_explicit(&engine_active, memory_order_relaxed) &&
            ((PyCodeObject *)object)->co_weakreflist == NULL && bury(object)) {
            return;
        }
        note_freed(&code_log, object);
    }
    code_dealloc(object);
}

static void watched_function_dealloc(PyObject *object)
{
    if (watching) {
        note_freed(&function_log, object);
    }
    function_dealloc(object);
}

int freed_watch(void)
{
    if (code_dealloc == NULL) {
        code_dealloc = PyCode_Type.tp_dealloc;
        function_dealloc = PyFunction_Type.tp_dealloc;
        PyCode_Type.tp_dealloc = watched_code_dealloc;
        PyFunction_Type.tp_dealloc = watched_function_dealloc;
    }
    watching = 1;
    return 0;
}

void freed_unwatch(void)
{
    watching = 0;
    if (code_dealloc == NULL) {
        return;
    }
    /* Put the originals back only if nobody wrapped ours since: a wrapper of ours still calls
     * ours, which must go on calling the originals (it does, watching nothing). */
    if (PyCode_Type.tp_dealloc == watched_code_dealloc &&
        PyFunction_Type.tp_dealloc == watched_function_dealloc) {
        PyCode_Type.tp_dealloc = code_dealloc;
        PyFunction_Type.tp_dealloc = function_dealloc;
        code_dealloc = function_dealloc = NULL;
    }
}

uint64_t freed_code_count(void)
{
    return atomic_load_explicit(&code_log.total, memory_order_acquire);
}

uint64_t freed_function_count(void)
{
    return atomic_load_explicit(&function_log.total, memory_order_acquire);
}

static size_t slot_of(const void *ptr, size_t mask)
{
    uintptr_t h = (uintptr_t)ptr >> 4;
    h ^= h >> 17;
    h *= 0x9e3779b97f4a7c15ull;
    return (size_t)(h >> 20) & mask;
}

static void collect(free_log *log)
{
    log->collected = 0;
    uint64_t now = atomic_load_explicit(&log->total, memory_order_acquire);
    uint64_t since = now > log->capacity ? now - log->capacity : 0;
    /* Only the frees since a drain that began at least a walk's margin ago (drains come every
     * 0.1 s, and back to back when the endpoint or the stall watcher asks): a busy host frees
     * a function per call, and building the whole log's lookup at every drain (65,536 frees,
     * 2 MB cleared) cost most of the drain's time under a template engine compiling code per
     * request. */
    /* Counted from when the drain began, not from this first lookup: a drain kept waiting
     * for the GIL must not take its own mark (its records' walks are older still). */
    uint64_t began_ns = log->drain_ns != 0 ? log->drain_ns : monotonic_ns(), latest = 0;
    uint64_t before = began_ns > WALK_MARGIN_NS ? began_ns - WALK_MARGIN_NS : 0;
    for (int i = 0; i < DRAIN_MARKS; i++) {
        const drain_mark *mark = &log->marks[i];
        if (mark->at_ns != 0 && mark->at_ns <= before && mark->total > latest) {
            latest = mark->total;
        }
    }
    if (latest > since) {
        since = latest;
    }
    size_t needed = 64;
    while (needed < 2 * (now - since)) {
        needed <<= 1;
    }
    if (needed > log->lookup_capacity) {
        free(log->lookup);
        log->lookup = calloc(needed, sizeof(freed_slot));
        log->lookup_capacity = log->lookup == NULL ? 0 : needed;
        if (log->lookup == NULL) {
            return;
        }
    } else {
        memset(log->lookup, 0, needed * sizeof(freed_slot));
    }
    size_t mask = log->lookup_mask = needed - 1;
    for (uint64_t seq = since; seq < now; seq++) {
        const void *ptr = log->ring[seq & (log->capacity - 1)];
        size_t i = slot_of(ptr, mask);
        while (log->lookup[i].ptr != NULL && log->lookup[i].ptr != ptr) {
            i = (i + 1) & mask;
        }
        log->lookup[i].ptr = ptr;
        log->lookup[i].seq = seq; /* ascending: the last write is the latest free */
    }
    log->collected_from = since;
    log->collected_to = now;
    log->collected = 1;
}

/* Whether ``ptr`` was freed at or after count ``since``: the collected lookup, then the frees
 * since it was collected (Python code may have run and freed objects). Freed too long ago to
 * be remembered, or nothing collected: counted as freed. */
static int freed_since(free_log *log, const void *ptr, uint64_t since)
{
    if (!log->collected) {
        collect(log);
    }
    if (!log->collected || since < log->collected_from) {
        return 1;
    }
    uint64_t now = atomic_load_explicit(&log->total, memory_order_acquire);
    if (now - log->collected_to > log->capacity) {
        return 1;
    }
    for (uint64_t seq = log->collected_to; seq < now; seq++) {
        if (log->ring[seq & (log->capacity - 1)] == ptr) {
            return 1;
        }
    }
    size_t mask = log->lookup_mask;
    for (size_t i = slot_of(ptr, mask); log->lookup[i].ptr != NULL; i = (i + 1) & mask) {
        if (log->lookup[i].ptr == ptr) {
            return log->lookup[i].seq >= since;
        }
    }
    return 0;
}

int freed_code_since(const void *ptr, uint64_t since)
{
    return freed_since(&code_log, ptr, since);
}

int freed_function_since(const void *ptr, uint64_t since)
{
    return freed_since(&function_log, ptr, since);
}

static void drain_begins(free_log *log, uint64_t now_ns)
{
    drain_mark *mark = &log->marks[log->next_mark++ % DRAIN_MARKS];
    mark->at_ns = log->drain_ns = now_ns;
    mark->total = atomic_load_explicit(&log->total, memory_order_acquire);
}

void freed_drain_begins(void)
{
    uint64_t now_ns = monotonic_ns();
    drain_begins(&code_log, now_ns);
    drain_begins(&function_log, now_ns);
}

void freed_release(void)
{
    code_log.collected = 0;
    function_log.collected = 0;
}
