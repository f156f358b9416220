/* sampler._native's functions and the types it adds, by the file that defines them: what
 * module.c's method table and PyInit__native list.
 */
#ifndef FLEETFLAME_MODULE_H
#define FLEETFLAME_MODULE_H

#include "native.h"

/* -- the engine: start, stop, threads (engine.c), what the sampler reads of it
 * (engine_status.c), the drain (drain.c) ------------------------------------------------- */

PyObject *native_start(PyObject *module, PyObject *args, PyObject *kwargs);
PyObject *native_stop(PyObject *module, PyObject *unused);
PyObject *native_release(PyObject *module, PyObject *unused);
PyObject *native_after_fork_child(PyObject *module, PyObject *unused);
PyObject *native_register_current_thread(PyObject *module, PyObject *unused);
PyObject *native_sync_threads(PyObject *module, PyObject *excluded);
PyObject *native_pause_thread(PyObject *module, PyObject *args);
PyObject *native_pause_all(PyObject *module, PyObject *arg);
PyObject *native_set_interval(PyObject *module, PyObject *arg);
PyObject *native_hide_code(PyObject *module, PyObject *code);
PyObject *native_tracer_pid(PyObject *module, PyObject *unused);
PyObject *native_handler_ns(PyObject *module, PyObject *unused);
PyObject *native_handlers_are_ours(PyObject *module, PyObject *unused);
PyObject *native_stats(PyObject *module, PyObject *unused);
PyObject *native_drain(PyObject *module, PyObject *args);

/* -- open tags (tags.c) --------------------------------------------------------------------- */

PyObject *native_tag_set(PyObject *module, PyObject *const *args, Py_ssize_t count);
PyObject *native_tags_load(PyObject *module, PyObject *tags);
PyObject *native_tags_clear(PyObject *module, PyObject *unused);

/* -- waits (waits.c) and the stall watcher (gil.c, watch.c) ------------------------------------ */

PyObject *native_wait_reason(PyObject *module, PyObject *arg);
PyObject *native_watch_wake(PyObject *module, PyObject *unused);
PyObject *native_gil_wait(PyObject *module, PyObject *args);
PyObject *native_watch_wait(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* -- the request middleware (middleware.c, route_tag.c) --------------------------------------- */

PyObject *native_labels_bind(PyObject *module, PyObject *args);
/* Adds RouteTag and WSGIWrapper to the module; -1 with an exception set on failure. */
int middleware_add_types(PyObject *module);

/* -- the request recorder's counting (counting.c) ---------------------------------------------- */

PyObject *native_count_requests(PyObject *module, PyObject *args);

/* -- the web UI's function index (function_numbers.c, function_files.c) ---------------- */

PyObject *native_number_functions(PyObject *module, PyObject *args);
PyObject *native_file_functions(PyObject *module, PyObject *args);

/* -- the web UI's stack index (line_sort.c) ----------------------------------------------- */

PyObject *native_sort_lines(PyObject *module, PyObject *args);
PyObject *native_merge_sorted(PyObject *module, PyObject *args);
PyObject *native_spread_counts(PyObject *module, PyObject *args);

/* -- the ASGI middleware's parts (asgi.c) ------------------------------------------------- */

PyObject *native_asgi_request_start(PyObject *module, PyObject *headers);
PyObject *native_asgi_mark(PyObject *module, PyObject *marks);
PyObject *native_asgi_answered(PyObject *module, PyObject *function);
int asgi_add_types(PyObject *module);

/* -- an ASGI request through a routed app (asgi_request.c; the rest in asgi.h) ----------- */

PyObject *native_asgi_request(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *native_asgi_bind(PyObject *module, PyObject *args);

#endif
