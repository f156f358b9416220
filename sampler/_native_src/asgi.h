/* The ASGI middleware's parts in C (sampler/middleware/_asgi.py), shared by their files:
 * asgi.c (the header search, StatusSend), asgi_await.c (Awaiting, what stands in for the
 * Python path's coroutines), asgi_request.c (a request through a routed app) and
 * asgi_route.c (a route's handler, named).
 */
#ifndef FLEETFLAME_ASGI_H
#define FLEETFLAME_ASGI_H

#include "middleware.h"

typedef struct Awaiting Awaiting;
/* What an Awaiting does when it first steps (0, or -1 with an exception set), and when what
 * it awaits has ended, once: returned (``failed`` 0), raised, or closed after it began. */
typedef int (*awaiting_hook)(Awaiting *self);
typedef int (*awaiting_end)(Awaiting *self, int failed);

/* An awaitable with a coroutine's four methods (__await__, send, throw, close) awaiting
 * ``inner``, so servers and asyncio (create_task, cancellations) take it for the coroutine
 * the Python path's would be; its hooks do what that coroutine's body and ``finally`` did.
 * Dropped after it began and before it ended, it is closed, as a coroutine is. */
struct Awaiting {
    PyObject_HEAD
    PyObject *inner;    /* the coroutine (or an awaitable's iterator) awaited, once begun */
    awaiting_hook start;
    awaiting_end end;
    PyObject *callee;   /* what ``start`` calls for ``inner``: the app, or the route's handler */
    PyObject *scope;    /* the request's scope, receive and send, for the callee */
    PyObject *receive;
    PyObject *send;
    PyObject *state;    /* the request's [route, status, answered] */
    PyObject *header;   /* a request's start header, or None */
    PyObject *route;    /* a route's name (asgi_route.c) */
    PyObject *frame;    /* the frame a route's tag labels: its handler coroutine's */
    RouteTag tag;       /* a route's tag, embedded: its PyObject_HEAD unused */
    double started, wall;
    char begun, ended, running;
    char gives_result;  /* its awaiting gives what ``inner`` returned (else None) */
};

/* A new Awaiting with these hooks (start may be NULL, then ``inner`` is set by the maker),
 * its other fields NULL or 0: the maker sets what its hooks read. */
Awaiting *awaiting_new(awaiting_hook start, awaiting_end end);
/* Its end, once (the end hook), keeping the exception in flight. */
void awaiting_finish(Awaiting *self, int failed);
/* What awaiting ``awaitable`` iterates: a coroutine or generator itself, else what its
 * __await__ gives; NULL with a TypeError if it cannot be awaited. */
PyObject *awaited_iterator(PyObject *awaitable);
/* scope.get(key): a new reference, or NULL (an error set only if the look-up failed). */
PyObject *mapping_get(PyObject *mapping, PyObject *key);
/* StatusSend(send, state) (asgi.c). */
PyObject *asgi_status_send(PyObject *send, PyObject *state);

/* What asgi_bind() bound (asgi_request.c): the recorder (NULL with a RuntimeError before),
 * and the scope's key of a request's state. */
PyObject *asgi_recorder(void);
PyObject *asgi_state_key(void);

int asgi_await_ready(void);
int asgi_request_ready(void);
int asgi_route_add_type(PyObject *module);

#endif
