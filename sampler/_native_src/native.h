/* fleetflame's native sampling engine: declarations shared by its parts.
 *
 * A signal on the thread that spent the time (a per-thread CPU timer in cpu mode, a signal
 * from the wall thread in wall mode) walks that thread's Python frames into a preallocated
 * ring of records: code objects, functions and frame objects as raw pointers, no allocation,
 * no lock. The drain, under the GIL, turns records into stacks of interned frame names. A
 * pointer read in a handler may belong to an object freed before the drain sees it: the
 * dealloc watch (freed.c) says which, so the drain never touches a freed object.
 *
 * The frame layout is CPython 3.11's (internal/pycore_frame.h); the extension is built for
 * that version only.
 */
#ifndef FLEETFLAME_NATIVE_H
#define FLEETFLAME_NATIVE_H

#define PY_SSIZE_T_CLEAN
#define Py_BUILD_CORE_MODULE 1
#include <Python.h>

#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

/* -- records (ring.c) ------------------------------------------------------------------- */

enum { REC_EMPTY = 0, REC_READY = 1, REC_SKIP = 2 };
enum { FLAG_TRUNCATED = 1, FLAG_WAITING = 2, FLAG_REPEAT = 4, FLAG_ENTRY = 8, FLAG_EXIT = 16 };
/* Wall mode: the share of the interval the thread spent on a CPU, in thousandths, in the
 * flags' upper half (the rest of its wall time it waited, for a core or otherwise). */
#define FLAG_ON_CPU_SHIFT 16
/* Wall mode: what a thread read waiting waits on (wait_reason), in the flags' second byte. */
#define FLAG_REASON_SHIFT 8
#define FLAG_REASON(flags) (((flags) >> FLAG_REASON_SHIFT) & 0xffu)

typedef struct {
    _Atomic uint32_t state; /* written last by the producer, read first by the drain */
    uint32_t size;          /* bytes, this head included; a multiple of 8 */
    uint32_t depth;         /* frames that follow, leaf first */
    uint32_t flags;
    uint64_t weight;        /* in sampling intervals */
    uint64_t code_seq;      /* the dealloc watch's counts when the walk began */
    uint64_t function_seq;
    uint64_t ident;         /* the sampled thread's pthread_t */
    uint64_t label;         /* the label set of its innermost tagged frame, plus 1; 0: none */
    uint64_t time_ns;       /* CLOCK_MONOTONIC when it was taken */
} record_head;

typedef struct {
    void *code;      /* PyCodeObject * */
    void *func;      /* PyFunctionObject *: its globals name the module */
    int64_t lasti;   /* code units into the bytecode, for line numbers */
} record_frame;

typedef struct {
    _Atomic uint64_t head; /* bytes reserved, ever */
    _Atomic uint64_t tail; /* bytes released by the drain, ever */
    uint64_t capacity;     /* a power of two */
    unsigned char *data;
} ring_t;

int ring_init(ring_t *ring, uint64_t capacity);
void ring_free(ring_t *ring);
void ring_reset(ring_t *ring);
record_head *ring_reserve(ring_t *ring, uint32_t size);
void ring_commit(record_head *record, uint32_t state);
/* Calls visit on every ready record in order, up to the first one still being written, and
 * releases their space; returns how many it visited, or -1 when visit failed. */
Py_ssize_t ring_consume(ring_t *ring, int (*visit)(record_head *, void *), void *arg);

/* -- fault guard (guard.c) --------------------------------------------------------------- */

/* The jump buffer of the walk running on this thread, if any: a SIGSEGV or SIGBUS raised
 * while it is set jumps back to the walk instead of killing the host. Initial-exec TLS: no
 * allocation on first use, so it is safe in a signal handler. */
extern __thread sigjmp_buf *guard_jump __attribute__((tls_model("initial-exec")));

int guard_install(void);
/* Whether SIGSEGV and SIGBUS are still the guard's (someone may have replaced it). */
int guard_is_ours(void);
/* Called after a fault jumped out of a walk: unblocks the fault signals. */
void guard_recovered(void);

/* -- freed objects (freed.c) --------------------------------------------------------------- */

int freed_watch(void);
void freed_unwatch(void);
/* After a drain: frees the code objects that died before the previous one (``last``: all);
 * returns the CPU nanoseconds that took (the host's work, deferred: see freed.c). */
uint64_t freed_drained(int last);
uint64_t freed_code_count(void);
uint64_t freed_function_count(void);
/* Whether the object at ``ptr`` was freed at or after count ``since`` of its log; freed too
 * long ago to be remembered counts as freed. */
int freed_code_since(const void *ptr, uint64_t since);
int freed_function_since(const void *ptr, uint64_t since);
/* Notes where the logs stand as a drain begins (a later drain collects the frees since the
 * last one that began at least 0.1 s before it). */
void freed_drain_begins(void);
/* Forgets the lookups built for one drain (the next one builds them again if it needs them). */
void freed_release(void);

/* -- the walk and the signal handler (walk.c) ---------------------------------------------- */

typedef struct {
    _Atomic uint64_t samples;    /* records written */
    _Atomic uint64_t weight;     /* intervals they stand for */
    _Atomic uint64_t dropped;    /* intervals lost: the ring was full */
    _Atomic uint64_t faults;     /* walks a fault cut short */
    _Atomic uint64_t torn;       /* intervals whose walk met a frame that did not hold */
    _Atomic uint64_t no_python;  /* intervals on a thread with no Python state */
    _Atomic uint64_t handler_ns; /* time spent in handlers and walks */
    _Atomic uint64_t signals;    /* signals handled */
} engine_stats;

extern engine_stats stats;
extern ring_t ring;
extern _Atomic int engine_active;
extern _Atomic int handlers_running; /* handlers past their first check, now */
#define MAX_HIDDEN_CODES 32
extern PyObject *hidden_codes[MAX_HIDDEN_CODES]; /* code objects whose frames walks leave out */
extern _Atomic int hidden_count;
extern int engine_wall;
extern uint32_t engine_max_depth;

/* The wall thread's signal carries, in si_value: this magic, the weight in intervals, what
 * the thread was blocked in when it was signalled (wait_reason, read only for a thread that
 * waited part of its interval) and the thousandths of the interval it spent on a CPU. */
#define WALL_MAGIC 0x5f1aUL
#define WALL_VALUE(weight, reason, on_cpu)                                                   \
    ((void *)(uintptr_t)((WALL_MAGIC << 48) | ((uint64_t)(weight) << 16) |                   \
                         ((uint64_t)(reason) << 10) | (on_cpu)))
#define WALL_WEIGHT(value) (((uintptr_t)(value) >> 16) & 0xffffffffu)
#define WALL_REASON(value) ((uint32_t)((uintptr_t)(value) >> 10) & 0x3fu)
#define WALL_ON_CPU(value) ((uint32_t)((uintptr_t)(value) & 0x3ffu))
#define IS_WALL_VALUE(value) (((uintptr_t)(value) >> 48) == WALL_MAGIC)

int handler_install(void);
/* Whether SIGPROF is still handled by the engine (someone may have replaced it). */
int handler_is_ours(void);
/* Records the stack of ``tstate`` (stable: the caller is its thread, or holds the GIL). */
int record_stack(PyThreadState *tstate, uint64_t weight, uint32_t flags, uint64_t ident);
/* A thread waited on where it was last read waiting (wall mode). */
int record_repeat(uint64_t weight, uint64_t ident);
/* A thread ended with ``weight`` intervals of CPU not yet counted. */
int record_exit(uint64_t weight, uint64_t ident);
uint64_t monotonic_ns(void);

/* -- open tags (tags.c) ---------------------------------------------------------------------- */

/* Under the GIL: frame object ``frame`` carries label set ``set`` from now on (< 0: none);
 * -1 when it cannot be kept (counted by tags_lost). */
int tags_set(const void *frame, long set);
/* In a walk (any thread, any time): the table of open tags, or NULL when none ever opened. */
const void *tags_now(void);
/* The set of ``frame`` in ``tags`` (from tags_now) plus 1, or 0 if it has no tag. */
uint32_t tags_find(const void *tags, const void *frame);
/* Under the GIL: forgets every tag. */
void tags_clear(void);
/* Under the GIL: frees the tables replaced, once no handler can be reading them. */
void tags_collect(void);
/* In a forked child (no handler running): forgets every tag and frees every table. */
void tags_after_fork(void);
uint64_t tags_open(void);
uint64_t tags_lost(void);

/* -- the request middleware's tags (route_tag.c) ------------------------------------------------ */

/* Whether tags opened in C go to the table above too (while the engine keeps it). */
void middleware_tags_kept(int kept);

/* -- threads (thread_slots.c, thread_timers.c, wall.c, known_threads.c) ------------------- */

int threads_init(void);
void threads_after_fork(void);
int threads_add(unsigned long ident, pid_t tid);
/* Registers the calling thread, which also counts its last expiries when it ends. */
int threads_add_current(void);
/* From the handler: a timer of slot ``slot_address`` expired; returns 0 if it is no slot. */
uint64_t threads_count_fired(void *slot_address, uint64_t expiries, unsigned long self);
uint64_t threads_interval_ns(void);
void threads_remove(unsigned long ident);
int threads_pause(unsigned long ident, int paused);
/* Keeps one slot per live Python thread of the main interpreter, except ``excluded``; returns
 * the set of their idents (a new reference), or NULL with an exception set. */
PyObject *threads_sync(PyObject *excluded);
/* A thread as the interpreter lists it: its state (an address to compare), ident and kernel id. */
typedef struct {
    void *state;
    unsigned long ident;
    pid_t tid;
} known_thread;

/* Every thread of the main interpreter (or of every one), read under the runtime's head lock
 * (the list changes as threads start and end, with or without the GIL); malloc'd, or NULL. */
known_thread *known_threads(Py_ssize_t *count, int every_interpreter);
/* The kernel's id of thread ``tid``'s CPU clock. */
clockid_t thread_cpu_clock(pid_t tid);
int threads_set_interval(uint64_t interval_ns);
/* Stops (or restarts) every timer and the wall thread's signals: while a tracer such as py-spy
 * pauses threads, a signal arriving at that moment makes it lose track (benfred/py-spy#565). */
int threads_pause_all(int paused);
/* wall mode: writes the waiting intervals kept back, so a reader sees them now. */
void threads_flush_repeats(void);
void threads_clear(void);
Py_ssize_t threads_count(void);
uint64_t threads_timer_failures(void);
int wall_start(void);
void wall_stop(void);
unsigned long wall_ident(void);

/* -- the stall watcher's wait for the GIL (gil.c) -------------------------------------- */

#define GIL_WATCH_OWN 64
typedef struct {
    void *self; /* the watcher's own state */
    known_thread *threads;
    Py_ssize_t count;
    known_thread *holder; /* holding the GIL as the watcher asked for it back, or NULL */
    unsigned long own[GIL_WATCH_OWN]; /* the sampler's own threads' idents: not named holders */
    int own_count;                    /* while another thread waits to take the GIL from them */
    unsigned long switches;
    long handoffs; /* times the GIL passed to another thread before the watcher had it */
    int cpu_known;
    uint64_t cpu_before, cpu_ns; /* the holder's CPU clock then, and its time on a CPU since */
} gil_watch;

/* Lists every live thread and the idents in ``own`` (a set of the sampler's threads, or
 * NULL), holding the GIL, before it lets it go. */
void gil_watch_begin(gil_watch *watch, PyObject *own);
/* Reads who holds the GIL and its CPU clock (without the GIL, as the caller asks for it). */
void gil_watch_woke(gil_watch *watch);
/* If one of the sampler's own threads holds the GIL, waits (a switch interval or two at
 * most, without asking for the GIL) for it to pass it on, and reads the holder again.
 * Returns the moment the watcher's wait counts from: ``woke``, or when another thread was
 * seen holding the GIL, or the end of the waiting (the sampler's own hold is not a stall). */
uint64_t gil_watch_pass_own(gil_watch *watch, uint64_t woke);
/* Counts the handoffs, confirms the holder and, if ``long_enough``, reads its CPU again
 * (holding the GIL again). */
void gil_watch_end(gil_watch *watch, int long_enough);
void gil_watch_release(gil_watch *watch);
/* A tick's look at the GIL (the SIGPROF handler, on the thread it interrupted): if that thread
 * holds the GIL while another has asked for it a switch interval ago, and the watcher sleeps,
 * wakes the watcher. */
void gil_alarm_tick(PyThreadState *tstate);
/* What a tick saw: when (monotonic ns; 0: nothing), the GIL's holder, its switch count, and
 * the holder's CPU clock (0: not read). */
typedef struct {
    uint64_t at;
    void *holder;
    unsigned long switches;
    uint64_t cpu;
} gil_alarm;
/* Sleeps up to ``seconds`` (without the GIL); a tick that sees a hold, or gil_alarm_wake,
 * ends it. ``seen`` is what that tick saw, if one did during this sleep. */
void gil_alarm_sleep(double seconds, gil_alarm *seen);
/* Ends the watcher's sleep now (its stopping, a stall reported). */
void gil_alarm_wake(void);
/* Sleeps ``seconds`` without the GIL and takes it back, watching who held it; returns how long
 * taking it back took (watch.c). The caller releases ``watch``. */
double gil_wait_once(double seconds, double threshold, gil_watch *watch, PyObject *own);
/* gil_wait's result: (waited, holder's ident or None, its CPU seconds or None, handoffs). */
PyObject *gil_wait_result(double waited, gil_watch *watch);

/* -- what a waiting thread waits on (waits.c) ------------------------------------------- */

/* In the order of sampler/_waits.py's REASONS. */
enum {
    REASON_UNKNOWN = 0,
    REASON_LOCK,
    REASON_GIL,
    REASON_SLEEP,
    REASON_POLL,
    REASON_SOCKET,
    REASON_PIPE,
    REASON_FILE,
    REASON_ACCEPT,
    REASON_CONNECT,
    REASON_CHILD,
    REASON_OTHER,
    REASON_COUNT
};
/* What thread ``tid`` of this process is blocked in, from the system call it is in. */
int wait_reason(pid_t tid);

/* -- counting into the sampler's table (count.c) ------------------------------------------ */

typedef struct {
    PyObject *counts, *touched, *residues; /* dicts of the table, keyed by (label, stack) */
    PyObject *generation;                  /* the table's generation, an int */
    PyObject *other;                       /* the [other] stack, a tuple */
    Py_ssize_t max_stacks;
    uint64_t random;
} count_sink;

/* Adds ``weight`` intervals to the count of ``key``; returns the whole samples added, or -1
 * with an exception set. */
long long count_add(count_sink *sink, PyObject *key, double weight);

/* -- frame names (codemap.c) ---------------------------------------------------------------- */

typedef struct {
    const void *code; /* the key: code object and instruction (-1 without line numbers) */
    int64_t lasti;
    PyObject *ref;    /* a strong reference to the code object: its address stays its own */
    PyObject *name;   /* the interned frame name's id, an int */
    uint64_t learned; /* the dealloc watch's count when it was learned */
} code_entry;

code_entry *codemap_get(const void *code, int64_t lasti);
code_entry *codemap_put(const void *code, int64_t lasti, PyObject *ref, PyObject *name,
                        uint64_t learned);
void codemap_clear(void);
Py_ssize_t codemap_size(void);

/* -- the drain (drain.c) and its stacks (drain_stacks.c) ----------------------------------- */

/* Between start() and stop() (engine.c). */
extern int engine_started;
/* Set by start(): whether frames are named with their line, and the frame name ids of
 * [truncated], [waiting] and [unknown]. */
extern int with_lineno;
extern PyObject *truncated_id, *waiting_id, *unknown_id;
extern PyObject *reason_ids; /* a tuple: the frame naming each wait_reason, None for unknown */

typedef struct {
    PyObject *resolve;    /* resolve(code, function or None, line or -1) -> frame name id */
    count_sink sink;      /* the table counted into */
    PyObject *thread_root; /* thread_root(ident) -> a [thread:NAME] name id, or None */
    /* thread ident -> the key of its last sample, of its entry stack, of its last waiting one */
    PyObject *last_key, *entry_key, *last_waiting;
    PyObject *recent; /* appended (seconds, ident, key, weight) for every sample, or None */
    Py_ssize_t records;
    long long added, dropped;
} drain_state;

/* The record's stack of frame name ids, leaf first (a new reference), or NULL with an
 * exception set. */
PyObject *stack_of(drain_state *state, record_head *record, record_frame *frames);
/* ``stack`` under [waiting] and what it waits on (leaf first: ...;[waiting];[socket]). */
PyObject *waiting_stack(PyObject *stack, uint32_t reason);
/* The label set of the record's innermost tagged frame when it was taken (0: none). */
PyObject *label_of(record_head *record);
/* ``tuple``, untracked by the garbage collector when none of its items is tracked. */
PyObject *untracked(PyObject *tuple);

#endif
