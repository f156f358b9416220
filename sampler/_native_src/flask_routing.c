/* Flask's routing, seen as it happens, for the WSGI middleware (middleware.c). Everything
 * below runs under the GIL.
 */
#include "middleware.h"

/* An attribute of Flask's request class that Flask sets when it has matched the URL:
 * ``url_rule`` (a rule: the request is named after its template) or ``routing_exception``
 * (no rule: [unmatched]). Stored in the instance's dict as a plain attribute would be; setting
 * it names the request in flight, with no before_request hook for Flask to call. */
typedef struct {
    PyObject_HEAD
    PyObject *name;
    PyObject *unmatched;
    int is_rule;
} RoutedAttribute;

static PyObject *routed_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"name", "is_rule", "unmatched", NULL};
    PyObject *name, *unmatched;
    int is_rule;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "UpU:RoutedAttribute", keywords, &name,
                                     &is_rule, &unmatched)) {
        return NULL;
    }
    RoutedAttribute *attribute = (RoutedAttribute *)type->tp_alloc(type, 0);
    if (attribute != NULL) {
        attribute->name = Py_NewRef(name);
        attribute->unmatched = Py_NewRef(unmatched);
        attribute->is_rule = is_rule;
    }
    return (PyObject *)attribute;
}

static void routed_dealloc(RoutedAttribute *attribute)
{
    Py_CLEAR(attribute->name);
    Py_CLEAR(attribute->unmatched);
    Py_TYPE(attribute)->tp_free((PyObject *)attribute);
}

static PyObject *routed_get(RoutedAttribute *attribute, PyObject *instance, PyObject *type)
{
    (void)type;
    if (instance == NULL) {
        return Py_NewRef((PyObject *)attribute);
    }
    PyObject *dict = PyObject_GenericGetDict(instance, NULL);
    if (dict == NULL) {
        return NULL;
    }
    PyObject *value = PyDict_GetItemWithError(dict, attribute->name);
    Py_XINCREF(value);
    Py_DECREF(dict);
    if (value == NULL && !PyErr_Occurred()) {
        value = Py_NewRef(Py_None); /* Flask's class default */
    }
    return value;
}

/* Names the request in flight whose environ this Flask request has; quietly nothing when
 * there is none (a test request context) or it is named already. */
static void routed_notify(RoutedAttribute *attribute, PyObject *dict, PyObject *value)
{
    PyObject *environ = PyDict_GetItemWithError(dict, str_environ);
    PyObject *request = environ != NULL ? environ_get(environ, str_key) : NULL;
    if (request == NULL) {
        PyErr_Clear();
        return;
    }
    Py_INCREF(request);
    PyObject *template = attribute->is_rule ? PyObject_GetAttr(value, str_rule)
                                            : Py_NewRef(attribute->unmatched);
    PyObject *done = NULL;
    if (template != NULL) {
        if (Py_IS_TYPE(request, &WSGIRequestType)) {
            done = ((WSGIRequest *)request)->route == NULL
                       ? request_routed((WSGIRequest *)request, template)
                       : Py_NewRef(Py_None);
        } else {
            PyObject *route = NULL;
            if (_PyObject_LookupAttr(request, str_route, &route) >= 0) {
                done = route == NULL || route == Py_None
                           ? PyObject_CallMethodOneArg(request, str_routed, template)
                           : Py_NewRef(Py_None);
            }
            Py_XDECREF(route);
        }
    }
    if (done == NULL) {
        /* Never fail the app's routing for the profiler: the request stays unmatched. */
        PyErr_WriteUnraisable((PyObject *)attribute);
    }
    Py_XDECREF(done);
    Py_XDECREF(template);
    Py_DECREF(request);
}

static int routed_set(RoutedAttribute *attribute, PyObject *instance, PyObject *value)
{
    PyObject *dict = PyObject_GenericGetDict(instance, NULL);
    if (dict == NULL) {
        return -1;
    }
    int failed;
    if (value == NULL) {
        failed = PyDict_DelItem(dict, attribute->name) < 0;
        if (failed && PyErr_ExceptionMatches(PyExc_KeyError)) {
            PyErr_Clear();
            PyErr_SetObject(PyExc_AttributeError, attribute->name);
        }
    } else {
        failed = PyDict_SetItem(dict, attribute->name, value) < 0;
        if (!failed && value != Py_None) {
            routed_notify(attribute, dict, value);
        }
    }
    Py_DECREF(dict);
    return failed ? -1 : 0;
}

PyTypeObject RoutedAttributeType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sampler._native.RoutedAttribute",
    .tp_basicsize = sizeof(RoutedAttribute),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "RoutedAttribute(name, is_rule, unmatched): a Flask request attribute that names "
              "the request in flight when Flask sets it.",
    .tp_new = routed_new,
    .tp_dealloc = (destructor)routed_dealloc,
    .tp_descr_get = (descrgetfunc)routed_get,
    .tp_descr_set = (descrsetfunc)routed_set,
};
