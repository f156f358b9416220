/* sampler._native: the module, its method table and its constants. Each function lives
 * beside what it serves; module.h lists them by file.
 */
#include "module.h"

static PyMethodDef methods[] = {
    {"start", (PyCFunction)(void (*)(void))native_start, METH_VARARGS | METH_KEYWORDS,
     "start(mode, interval, max_depth, lineno, markers, ring_bytes=1MiB): starts the engine. "
     "markers: the frame ids of [truncated], [waiting], [unknown], and a tuple naming each "
     "wait reason (None for unknown)."},
    {"stop", native_stop, METH_NOARGS, "Stops sampling; records taken stay for a last drain."},
    {"release", native_release, METH_NOARGS,
     "After stop and a last drain: unwatches deallocs and forgets the cached names."},
    {"after_fork_child", native_after_fork_child, METH_NOARGS,
     "In a forked child: forgets the parent's threads, timers and records, and stops."},
    {"register_current_thread", native_register_current_thread, METH_NOARGS,
     "Samples the calling thread from now on."},
    {"sync_threads", native_sync_threads, METH_O,
     "Samples every Python thread but the given set of idents; returns the live threads' idents."},
    {"pause_thread", native_pause_thread, METH_VARARGS,
     "pause_thread(ident, paused): stops or resumes sampling one thread."},
    {"set_interval", native_set_interval, METH_O, "Sets the sampling interval in seconds."},
    {"pause_all", native_pause_all, METH_O,
     "pause_all(paused): stops or restarts sampling every thread (while a tracer is attached)."},
    {"drain", native_drain, METH_VARARGS,
     "drain(resolve, target) -> (records, samples added, samples dropped, CPU nanoseconds "
     "spent freeing the host's code objects kept for the drain)"},
    {"tracer_pid", native_tracer_pid, METH_NOARGS,
     "The pid of the process tracing this one's main thread, or 0."},
    {"handler_ns", native_handler_ns, METH_NOARGS, "Nanoseconds spent in handlers so far."},
    {"hide_code", native_hide_code, METH_O,
     "hide_code(code): frames of this code object are left out of every walk (False: too many)."},
    {"wait_reason", native_wait_reason, METH_O,
     "wait_reason(tid): what thread tid is blocked in, an index of sampler._waits.REASONS."},
    {"gil_wait", native_gil_wait, METH_VARARGS,
     "gil_wait(seconds, threshold, own=None): sleeps without the GIL; returns how long taking "
     "it back took, the ident of the thread that held it, past threshold its seconds on a CPU "
     "meanwhile, and how many times the GIL passed to another thread. A thread of the set own "
     "(the sampler's) is let pass the GIL on before it is asked for."},
    {"watch_wake", native_watch_wake, METH_NOARGS,
     "watch_wake(): ends the stall watcher's sleep now (it is stopping, or a stall waits)."},
    {"watch_wait", (PyCFunction)(void (*)(void))native_watch_wait, METH_FASTCALL,
     "watch_wait(watcher, active, modules): gil_wait again and again until the stall watcher "
     "has work, or a second has passed; returns (threads, waited, holder, on_cpu, handoffs, "
     "now)."},
    {"handlers_are_ours", native_handlers_are_ours, METH_NOARGS,
     "Whether SIGPROF, SIGSEGV and SIGBUS are still handled by the engine."},
    {"tag_set", (PyCFunction)(void (*)(void))native_tag_set, METH_FASTCALL,
     "tag_set(frame_id, label_set): samples in that frame object carry the set from now on "
     "(-1: no tag); False when it could not be kept (counted as tags_lost)."},
    {"tags_load", native_tags_load, METH_O,
     "tags_load({frame_id: label_set}): the open tags are these, and no others."},
    {"tags_clear", native_tags_clear, METH_NOARGS, "Forgets every open tag."},
    {"stats", native_stats, METH_NOARGS, "The engine's counters."},
    {"count_requests", native_count_requests, METH_VARARGS,
     "count_requests(chunk, threshold, latency_bins, queue_bins, total_bins, scale, min_value, "
     "queue_delay, status_code, max_queue) -> (errors, queued, latency, queue, total, over): "
     "a route's finished requests into its sketches' bins (each sketch's zero, sum and max "
     "returned), and the indices of those slower than threshold."},
    {"number_functions", native_number_functions, METH_VARARGS,
     "number_functions(texts, separator, numbers, names) -> list of bytes: each folded stack's "
     "distinct frames, leaf first, as the numbers of ``numbers`` (name -> number; a name it "
     "lacks is numbered next and appended to ``names``), packed as array('i') holds them."},
    {"file_functions", native_file_functions, METH_VARARGS,
     "file_functions(stacks, first, functions) -> (holding, ending): for arrays('i') of "
     "function numbers, the ordinals (first, first + 1, ...) of the stacks holding each "
     "function, and of those whose first number it is, as {number: packed ordinals}."},
    {"sort_lines", native_sort_lines, METH_VARARGS,
     "sort_lines(lines, ids) -> (keys, ids) or None: folded stacks, one a line, as sort keys "
     "(';' replaced by \\x01) in order, with their ids along; None when the text is not one "
     "byte a character or holds \\x01 or \\x02 (which sort keys escape)."},
    {"merge_sorted", native_merge_sorted, METH_VARARGS,
     "merge_sorted(keys, ids, new_keys, new_ids) -> (keys, ids): two sorted runs of str merged, "
     "their ids along; equal keys keep the first run's first."},
    {"spread_counts", native_spread_counts, METH_VARARGS,
     "spread_counts(rank, counts, size) -> list or None: ``size`` zeros with each count of "
     "``counts`` (stack id -> count) at its id's rank (stack id -> position); None when an id "
     "has no rank."},
    {"asgi_request_start", native_asgi_request_start, METH_O,
     "asgi_request_start(headers): the value of an ASGI scope's first X-Request-Start or "
     "X-Queue-Start header, decoded as Latin-1, or None."},
    {"asgi_answered", native_asgi_answered, METH_O,
     "asgi_answered(function): what StatusSend hands the answer's last message's send to, "
     "function(sending, state), to note when the request ended."},
    {"asgi_request", (PyCFunction)(void (*)(void))native_asgi_request, METH_FASTCALL,
     "asgi_request(app, scope, receive, send): an HTTP request through a routed ASGI app, "
     "awaited as the app's coroutine; handed to the recorder when it ends (asgi_bind first)."},
    {"asgi_bind", native_asgi_bind, METH_VARARGS,
     "asgi_bind(recorder, unmatched, key, max_pending): what asgi_request records requests "
     "to, the route of those no route named, the scope's key of a request's state, and the "
     "recorder's queue bound."},
    {"asgi_mark", native_asgi_mark, METH_O,
     "asgi_mark(marks): sets each name of the dict marks on StatusSend (asyncio's and "
     "inspect's markers of a callable that returns an awaitable)."},
    {"labels_bind", native_labels_bind, METH_VARARGS,
     "labels_bind(labels_var, frame_tags, route_sets, route_set_new): sampler._labels' "
     "state, for RouteTag and WSGIWrapper."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "sampler._native",
    "fleetflame's native sampling engine (CPython 3.11, Linux).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void)
{
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL) {
        return NULL;
    }
    if (PyModule_AddIntConstant(module, "FLAG_TRUNCATED", FLAG_TRUNCATED) < 0 ||
        PyModule_AddIntConstant(module, "FLAG_WAITING", FLAG_WAITING) < 0 ||
        PyModule_AddIntConstant(module, "FLAG_REPEAT", FLAG_REPEAT) < 0 ||
        PyModule_AddIntConstant(module, "FLAG_ENTRY", FLAG_ENTRY) < 0 ||
        PyModule_AddIntConstant(module, "FLAG_EXIT", FLAG_EXIT) < 0 ||
        middleware_add_types(module) < 0 || asgi_add_types(module) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
