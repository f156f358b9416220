/* The request middleware's per-request work, in C: a route's tag and the WSGI wrapper.
 *
 * sampler/middleware/_wsgi.py and sampler/_labels.py hold the same logic in Python, the
 * fallback where this extension is not built, and say what each step is for. Here a request
 * costs no Python frame of ours: the wrapper is a type whose call does the work
 * (wsgi_wrapper.c), the request object is the start_response the app is given and the body the
 * server iterates (wsgi_request.c), and the finished request is appended to the recorder's
 * queue as the same tuple the Python path builds (wsgi_recorder.c). A route's tag is
 * route_tag.c's, Flask's routing seen as it happens flask_routing.c's. Everything in these
 * files runs under the GIL; here is what they share, and the types they add to the module.
 */
#include "middleware.h"
#include "module.h"

#include <time.h>

PyObject *str_pending, *str_finish, *str_route_name, *str_close;
PyObject *str_path_info, *str_request_start, *str_queue_start, *str_file_wrapper;
PyObject *str_slash, *str_append, *str_key, *zero;
PyObject *str_environ, *str_rule, *str_route, *str_routed;
PyObject *str_unrouted, *str_names;

double monotonic_now(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + now.tv_nsec * 1e-9;
}

/* A borrowed reference, or NULL (an error set only if the look-up failed). */
PyObject *environ_get(PyObject *environ, PyObject *key)
{
    return PyDict_Check(environ) ? PyDict_GetItemWithError(environ, key) : NULL;
}

int middleware_add_types(PyObject *module)
{
    struct {
        PyObject **at;
        const char *text;
    } names[] = {
        {&str_pending, "pending"},
        {&str_finish, "finish"},             {&str_route_name, "route_name"},
        {&str_close, "close"},               {&str_path_info, "PATH_INFO"},
        {&str_request_start, "HTTP_X_REQUEST_START"},
        {&str_queue_start, "HTTP_X_QUEUE_START"},
        {&str_file_wrapper, "wsgi.file_wrapper"},
        {&str_slash, "/"},                   {&str_append, "append"},
        {&str_key, "fleetflame.request"},
        {&str_environ, "environ"},           {&str_rule, "rule"},
        {&str_route, "route"},               {&str_routed, "routed"},
        {&str_unrouted, "_unrouted"},        {&str_names, "names"},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        *names[i].at = PyUnicode_InternFromString(names[i].text);
        if (*names[i].at == NULL) {
            return -1;
        }
    }
    zero = PyLong_FromLong(0);
    if (zero == NULL || PyType_Ready(&RouteTagType) < 0 || PyType_Ready(&WSGIRequestType) < 0 ||
        PyType_Ready(&WSGIWrapperType) < 0 || PyType_Ready(&RoutedAttributeType) < 0 ||
        PyType_Ready(&TimedCallType) < 0 || PyType_Ready(&RunningCallsType) < 0 ||
        PyModule_AddObjectRef(module, "TimedCall", (PyObject *)&TimedCallType) < 0 ||
        PyModule_AddObjectRef(module, "RunningCalls", (PyObject *)&RunningCallsType) < 0 ||
        PyModule_AddObjectRef(module, "RoutedAttribute", (PyObject *)&RoutedAttributeType) < 0 ||
        PyModule_AddObjectRef(module, "RouteTag", (PyObject *)&RouteTagType) < 0 ||
        PyModule_AddObjectRef(module, "WSGIWrapper", (PyObject *)&WSGIWrapperType) < 0) {
        return -1;
    }
    return 0;
}
