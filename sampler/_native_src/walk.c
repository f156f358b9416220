/* The SIGPROF handler and the frame walk.
 *
 * The handler runs on the thread the signal was sent to: the one whose CPU timer expired (cpu
 * mode) or one the wall thread found running (wall mode). It walks that thread's own frames,
 * which cannot change under it, and writes them to the ring: pointers only, no allocation,
 * no lock, no Python API beyond reading the thread's state. The engine only starts where
 * SIGPROF had no handler, and once installed its handler stays for the life of the process,
 * idle when the engine stops: a signal already generated must never meet the default action,
 * which kills the process.
 */
#include "native.h"

#include "internal/pycore_frame.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <time.h>
#include <ucontext.h>

engine_stats stats;
ring_t ring;
/* Code objects whose frames are never recorded (the sampler's own wrappers of the host's
 * functions, a launcher's frames): appended to, never removed, each held for good. */
PyObject *hidden_codes[MAX_HIDDEN_CODES];
_Atomic int hidden_count;
_Atomic int engine_active;
_Atomic int handlers_running;
int engine_wall;
uint32_t engine_max_depth = 128;

static PyInterpreterState *main_interpreter;

#define COUNT(field, n) atomic_fetch_add_explicit(&stats.field, (n), memory_order_relaxed)

uint64_t monotonic_ns(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
}

/* 1: a frame to record; 0: one still in its prologue (Python's own tracebacks skip those);
 * -1: not a frame at all. */
static inline int frame_kind(_PyInterpreterFrame *frame)
{
    PyCodeObject *code = frame->f_code;
    if (((uintptr_t)frame & 7) != 0 || code == NULL || Py_TYPE(code) != &PyCode_Type) {
        return -1;
    }
    if (frame->owner != FRAME_OWNED_BY_GENERATOR &&
        frame->prev_instr < _PyCode_CODE(code) + code->_co_firsttraceable) {
        return 0;
    }
    return 1;
}

/* Follows a thread's frames and checks each is one of its live frames before trusting it.
 *
 * CPython 3.11 does not link a frame in an order a signal handler on the same thread can rely
 * on: on entering the eval loop the thread's current frame is read from the C stack before it
 * is written, and a call publishes a new frame before its link to the caller. So no pointer is
 * taken on trust. The data stack is strictly last in, first out: a frame the thread owns ends
 * exactly where the next newer one it owns begins (the newest may end below the stack's top,
 * while a frame is being pushed above it), and the newest frame of an older chunk ends at that
 * chunk's saved top. A generator's frame lies inside a generator, coroutine or async generator
 * that is executing. A stale or torn pointer cannot line up with all of that by accident: the
 * walk then gives up and the sample is dropped (and counted). */
typedef struct {
    _PyInterpreterFrame *frame;
    _PyStackChunk *chunk; /* where the next frame the thread owns must lie */
    PyObject **end;       /* where it must end (exact), or end at or below (the newest) */
    int exact;
    uint32_t steps;
} walker;

static void walker_start(walker *w, PyThreadState *tstate)
{
    _PyCFrame *cframe = tstate->cframe;
    w->frame = cframe != NULL ? cframe->current_frame : NULL;
    w->chunk = tstate->datastack_chunk;
    w->end = tstate->datastack_top;
    w->exact = 0;
    w->steps = 0;
}

static int is_live(walker *w, _PyInterpreterFrame *frame)
{
    if (frame->owner == FRAME_OWNED_BY_GENERATOR) {
        PyGenObject *gen = (PyGenObject *)((char *)frame - offsetof(PyGenObject, gi_iframe));
        PyTypeObject *type = Py_TYPE(gen);
        return (type == &PyGen_Type || type == &PyCoro_Type || type == &PyAsyncGen_Type) &&
               gen->gi_frame_state == FRAME_EXECUTING;
    }
    if (frame->owner != FRAME_OWNED_BY_THREAD) {
        return 0;
    }
    PyObject **start = (PyObject **)frame;
    while (w->chunk != NULL && !(start >= w->chunk->data && start < w->end)) {
        w->chunk = w->chunk->previous;
        if (w->chunk != NULL) {
            w->end = &w->chunk->data[w->chunk->top];
            w->exact = 1;
        }
    }
    if (w->chunk == NULL) {
        return 0;
    }
    PyCodeObject *code = frame->f_code;
    PyObject **end = start + FRAME_SPECIALS_SIZE + code->co_nlocalsplus + code->co_stacksize;
    if (w->exact ? end != w->end : end > w->end) {
        return 0;
    }
    w->end = start;
    w->exact = 1;
    return 1;
}

static int is_hidden(PyObject *code)
{
    int count = atomic_load(&hidden_count);
    for (int i = 0; i < count; i++) {
        if (hidden_codes[i] == code) {
            return 1;
        }
    }
    return 0;
}

/* The next frame to record, or NULL at the end of the chain; *torn set if it did not hold.
 * With ``check`` 0 it follows a chain a first walk proved (nothing moved since). */
static _PyInterpreterFrame *walker_next(walker *w, int *torn, int check)
{
    uint32_t limit = 4 * engine_max_depth + 64;
    while (w->frame != NULL) {
        _PyInterpreterFrame *frame = w->frame;
        int kind = ++w->steps > limit ? -1 : frame_kind(frame);
        if (kind < 0 || (check && !is_live(w, frame))) {
            *torn = 1;
            return NULL;
        }
        w->frame = frame->previous;
        if (kind > 0 && !is_hidden((PyObject *)frame->f_code)) {
            return frame;
        }
    }
    return NULL;
}

int record_stack(PyThreadState *tstate, uint64_t weight, uint32_t flags, uint64_t ident)
{
    sigjmp_buf jump;
    sigjmp_buf *outer = guard_jump; /* a walk this one interrupted, on this thread */
    record_head *volatile record = NULL;
    uint64_t code_seq = freed_code_count(); /* before any pointer is read */
    uint64_t function_seq = freed_function_count();
    if (sigsetjmp(jump, 0) != 0) {
        guard_jump = outer;
        guard_recovered();
        if (record != NULL) {
            ring_commit(record, REC_SKIP);
        }
        COUNT(faults, 1);
        COUNT(torn, weight);
        return -1;
    }
    guard_jump = &jump;
    atomic_signal_fence(memory_order_seq_cst);

    walker w;
    int torn = 0;
    uint32_t depth = 0, truncated = 0;
    walker_start(&w, tstate);
    while (walker_next(&w, &torn, 1) != NULL) {
        if (depth == engine_max_depth) {
            truncated = 1;
            break;
        }
        depth++;
    }
    if (torn || depth == 0) {
        atomic_signal_fence(memory_order_seq_cst);
        guard_jump = outer;
        if (torn) {
            COUNT(torn, weight);
        } else {
            COUNT(no_python, weight);
        }
        return -1;
    }
    record = ring_reserve(&ring, (uint32_t)(sizeof(record_head) + depth * sizeof(record_frame)));
    if (record == NULL) {
        atomic_signal_fence(memory_order_seq_cst);
        guard_jump = outer;
        COUNT(dropped, weight);
        return -1;
    }
    record_frame *out = (record_frame *)(record + 1);
    uint32_t written = 0, label = 0;
    const void *tags = tags_now();
    walker_start(&w, tstate);
    for (_PyInterpreterFrame *frame; written < depth && (frame = walker_next(&w, &torn, 0));) {
        out[written].code = frame->f_code;
        out[written].func = frame->f_func;
        if (tags != NULL && label == 0 && frame->frame_obj != NULL) {
            label = tags_find(tags, frame->frame_obj); /* the innermost tag */
        }
        out[written].lasti = frame->prev_instr - _PyCode_CODE(frame->f_code);
        written++;
    }
    atomic_signal_fence(memory_order_seq_cst);
    guard_jump = outer;

    record->depth = written;
    record->flags = flags | (truncated ? FLAG_TRUNCATED : 0);
    record->weight = weight;
    record->code_seq = code_seq;
    record->function_seq = function_seq;
    record->ident = ident;
    record->label = label;
    record->time_ns = monotonic_ns();
    ring_commit(record, REC_READY);
    if (weight) {
        COUNT(samples, 1);
        COUNT(weight, weight);
    }
    return 0;
}

static int record_marker(uint64_t weight, uint64_t ident, uint32_t flags)
{
    record_head *record = ring_reserve(&ring, sizeof(record_head));
    if (record == NULL) {
        COUNT(dropped, weight);
        return -1;
    }
    record->depth = 0;
    record->flags = flags;
    record->weight = weight;
    record->code_seq = freed_code_count();
    record->function_seq = freed_function_count();
    record->ident = ident;
    record->label = 0;
    record->time_ns = monotonic_ns();
    ring_commit(record, REC_READY);
    COUNT(weight, weight);
    return 0;
}

int record_repeat(uint64_t weight, uint64_t ident)
{
    return record_marker(weight, ident, FLAG_REPEAT | FLAG_WAITING);
}

int record_exit(uint64_t weight, uint64_t ident)
{
    return record_marker(weight, ident, FLAG_EXIT);
}

/* Whether the interrupted thread was blocked in a system call: the kernel either rewound it
 * onto the syscall instruction (to restart it) or made it return EINTR. */
static int in_system_call(void *context)
{
#if defined(__x86_64__)
    ucontext_t *uc = context;
    const unsigned char *ip = (const unsigned char *)uc->uc_mcontext.gregs[REG_RIP];
    long ax = (long)uc->uc_mcontext.gregs[REG_RAX];
    sigjmp_buf jump;
    sigjmp_buf *outer = guard_jump;
    if (sigsetjmp(jump, 0) != 0) {
        guard_jump = outer;
        guard_recovered();
        return 0;
    }
    guard_jump = &jump;
    atomic_signal_fence(memory_order_seq_cst);
    int blocked = (ip[0] == 0x0f && ip[1] == 0x05) ||
                  (ax == -EINTR && ip[-2] == 0x0f && ip[-1] == 0x05);
    atomic_signal_fence(memory_order_seq_cst);
    guard_jump = outer;
    return blocked;
#else
    (void)context;
    return 0;
#endif
}

static void on_sigprof(int signum, siginfo_t *info, void *context)
{
    (void)signum;
    int saved_errno = errno;
    uint64_t weight;
    uint32_t flags = 0;
    if (info->si_code == SI_TIMER) {
        weight = threads_count_fired(info->si_value.sival_ptr,
                                     1 + (info->si_overrun > 0 ? (uint64_t)info->si_overrun : 0),
                                     (unsigned long)pthread_self());
        if (weight == 0) {
            return; /* a timer that is not the engine's */
        }
    } else if (info->si_code == SI_QUEUE && IS_WALL_VALUE(info->si_value.sival_ptr)) {
        weight = WALL_WEIGHT(info->si_value.sival_ptr);
        flags |= WALL_REASON(info->si_value.sival_ptr) << FLAG_REASON_SHIFT;
        if (in_system_call(context)) {
            flags |= FLAG_WAITING;
        } else {
            flags |= WALL_ON_CPU(info->si_value.sival_ptr) << FLAG_ON_CPU_SHIFT;
        }
    } else {
        return; /* not ours: SIGPROF had no handler before the engine's (see handler_install) */
    }
    atomic_fetch_add(&handlers_running, 1); /* seq_cst: see tags_find */
    if (atomic_load_explicit(&engine_active, memory_order_acquire) && !_Py_IsFinalizing()) {
        uint64_t started = monotonic_ns();
        COUNT(signals, 1);
        PyThreadState *tstate = PyGILState_GetThisThreadState();
        if (tstate != NULL && tstate->interp == main_interpreter) {
            record_stack(tstate, weight, flags, (uint64_t)pthread_self());
            gil_alarm_tick(tstate);
        } else {
            COUNT(no_python, weight);
        }
        COUNT(handler_ns, monotonic_ns() - started);
    }
    atomic_fetch_sub_explicit(&handlers_running, 1, memory_order_acq_rel);
    errno = saved_errno;
}

int handler_install(void)
{
    main_interpreter = PyInterpreterState_Main();
    struct sigaction current;
    if (sigaction(SIGPROF, NULL, &current) != 0) {
        return -1;
    }
    if (current.sa_sigaction == on_sigprof) {
        return 0; /* installed by an earlier start, and kept */
    }
    int theirs = (current.sa_flags & SA_SIGINFO) ? current.sa_sigaction != NULL
                                                 : (current.sa_handler != SIG_DFL &&
                                                    current.sa_handler != SIG_IGN);
    if (theirs) {
        errno = EBUSY;
        return -1;
    }
    struct sigaction action;
    memset(&action, 0, sizeof(action));
    action.sa_sigaction = on_sigprof;
    action.sa_flags = SA_SIGINFO | SA_RESTART;
    /* Nothing asynchronous interrupts a walk: a host handler that never returns (one that
     * jumps away) would leave a reserved record uncommitted and stall the ring. */
    sigfillset(&action.sa_mask);
    sigdelset(&action.sa_mask, SIGSEGV);
    sigdelset(&action.sa_mask, SIGBUS);
    sigdelset(&action.sa_mask, SIGFPE);
    sigdelset(&action.sa_mask, SIGILL);
    sigdelset(&action.sa_mask, SIGTRAP);
    return sigaction(SIGPROF, &action, NULL);
}

int handler_is_ours(void)
{
    struct sigaction current;
    return sigaction(SIGPROF, NULL, &current) == 0 && (current.sa_flags & SA_SIGINFO) &&
           current.sa_sigaction == on_sigprof;
}
