/* The request middleware's parts in C (middleware.c says what they do), shared by its files:
 * route_tag.c, wsgi_wrapper.c, wsgi_request.c, wsgi_recorder.c and flask_routing.c.
 */
#ifndef FLEETFLAME_MIDDLEWARE_H
#define FLEETFLAME_MIDDLEWARE_H

#include "native.h"

/* -- RouteTag (route_tag.c) ---------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *frame_key; /* id(frame): an int */
    PyObject *outer;     /* the labels in force when made */
    PyObject *previous;  /* frame_tags' value for the frame before this tag opened, or NULL */
    int open;
} RouteTag;

extern PyTypeObject RouteTagType;

/* Whether labels_bind() was called: else 0, a RuntimeError set. */
int labels_bound(void);
/* Readies ``tag`` for the frame at ``frame`` (not opened yet). */
int tag_ready(RouteTag *tag, const void *frame);
/* Labels the frame's samples ``route`` (merged with the labels in force) from now on; returns
 * a new reference to the label set id. */
PyObject *tag_route(RouteTag *tag, PyObject *route);
/* Closes the tag: the frame's label set and the labels in force are what they were. */
int tag_close(RouteTag *tag);
void tag_forget(RouteTag *tag);

/* -- the WSGI wrapper (wsgi_wrapper.c) and its requests (wsgi_request.c, wsgi_recorder.c) -- */

typedef struct {
    PyObject_HEAD
    PyObject *app;
    PyObject *recorder;      /* sampler._requests.recorder */
    PyObject *fallback;      /* the pure-Python __call__, for a call with no Python caller */
    PyObject *unmatched;     /* the route of a routed app's request until routed */
    PyObject *dict;
    Py_ssize_t max_pending;  /* the recorder's queue bound: past it recorder.finish drops */
    int routed;              /* routing happens in the app: a hook calls request.routed() */
    int unrouted_told;       /* a request ended unrouted in a routed app: told once */
} WSGIWrapper;

typedef struct {
    PyObject_HEAD
    WSGIWrapper *wrapper;
    PyObject *environ;
    PyObject *start_response;
    PyObject *body;
    PyObject *iterator; /* the body's, once the server asked for it */
    PyObject *header; /* the request-start header, or None */
    PyObject *status; /* what the app passed to start_response; 0 until then or if it raised */
    PyObject *route;  /* once routed (or from the path), else NULL */
    double started, wall;
    vectorcallfunc vectorcall; /* request_vectorcall */
    RouteTag tag;     /* embedded: its PyObject_HEAD unused */
    int finished;
    int green;        /* served on a greenlet (on_greenlet): found by its route, body tagged */
} WSGIRequest;

extern PyTypeObject WSGIWrapperType, WSGIRequestType;

WSGIRequest *request_new(WSGIWrapper *wrapper, PyObject *environ, PyObject *start_response,
                         const void *frame);
/* The routing hook's call: the request is named after its route template from now on. */
PyObject *request_routed(WSGIRequest *request, PyObject *template);
/* The route a template (or, with ``raw``, a path) counts under: recorder.route_name's. */
PyObject *route_name(PyObject *recorder, PyObject *seen, int raw);
/* Hands the finished request to the recorder (once; later calls do nothing). */
int request_finish(WSGIRequest *request);
/* The Finished tuple of sampler/_requests.py (ident: the calling thread's). */
/* 1 when the caller runs on a greenlet other than its thread's main one, else 0; never fails. */
int on_greenlet(void);
PyObject *finished_new(PyObject *route, double started, double duration, PyObject *header,
                       double wall, int asgi, PyObject *status, PyObject *path);
/* Hands a Finished tuple (sampler/_requests.py) to the recorder, as its finish() does. */
int recorder_hand_over(PyObject *recorder, PyObject *finished, Py_ssize_t max_pending);

/* -- Flask's routing (flask_routing.c) ------------------------------------------------------ */

extern PyTypeObject RoutedAttributeType;

/* -- the stall watcher's timing of a call (timed.c) and the calls running (running_calls.c) */

extern PyTypeObject TimedCallType, RunningCallsType;

enum { KIND_EVENT_LOOP, KIND_REQUEST, KINDS };

typedef struct {
    unsigned long ident; /* the thread's, or 0: a free slot */
    double started;      /* the monotonic clock as the call began */
    int kind;
    int interleaved;     /* a call it ran in ended first: greenlets taking turns (gevent) */
} running_call;

typedef struct {
    PyObject_HEAD
    running_call *slots;
    Py_ssize_t used, capacity; /* slots from ``used`` on are free */
    double limits[KINDS];      /* seconds: a call running longer is a stall */
    /* The watcher's idle spells (watch.c): calls begun so far, the count as the watcher last
     * saw it change and when, and whether it sleeps long now (the next call wakes it). */
    uint64_t begun, watcher_seen;
    double watcher_seen_at;
    int watcher_idle;
} RunningCalls;

/* The kind a name stands for, or -1 with a ValueError set. */
int running_kind(PyObject *name);
/* The slot of the thread ``ident``: its own if it has one, else a free one (its ident 0);
 * -1 with MemoryError set. Slots are named by index: the table may move as it grows. */
Py_ssize_t running_slot(RunningCalls *running, unsigned long ident);
/* Gives the slot at ``at`` back (its thread's outermost call ended). */
void running_free(RunningCalls *running, Py_ssize_t at);
int running_check(PyObject *object);
/* As PyDict_Next over the calls running: 1 and the next one's thread, kind and start, or 0. */
int running_next(PyObject *running, Py_ssize_t *pos, unsigned long *ident, int *kind,
                 double *started);

/* -- what they share (middleware.c) --------------------------------------------------------- */

extern PyObject *str_pending, *str_finish, *str_route_name, *str_close;
extern PyObject *str_path_info, *str_request_start, *str_queue_start, *str_file_wrapper;
extern PyObject *str_slash, *str_append, *str_key, *zero;
extern PyObject *str_environ, *str_rule, *str_route, *str_routed;
extern PyObject *str_unrouted, *str_names;

/* A borrowed reference, or NULL (an error set only if the look-up failed). */
PyObject *environ_get(PyObject *environ, PyObject *key);
double monotonic_now(void);

#endif
