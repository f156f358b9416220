/* Flask's routing, seen as it happens, for the WSGI middleware (middleware.c). Everything
 * below runs under the GIL.
 */
#include "middleware.h"

/* An attribute of Flask's request class that Flask sets when it has matched the URL:
 * ``url_rule`` (a rule: the request is named after its template) or ``routing_exception``
 * (no rule: [unmatched]). Stored in the instance's dict as a plain attribute would be (Flask's
 * request has its dict made by the time it routes); setting it names the request in flight,
 * with no before_request hook for Flask to call. */
typedef struct {
    PyObject_HEAD
    PyObject *name;
    PyObject *unmatched;
    PyObject *templates; /* id(rule) -> (rule, rule.rule): reading the attribute cost ~640 */
    int is_rule;
} RoutedAttribute;

#define MAX_RULES 4096 /* templates kept: past it the table starts over */

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
        attribute->templates = is_rule ? PyDict_New() : NULL; /* routing_exception: none */
        if (is_rule && attribute->templates == NULL) {
            Py_CLEAR(attribute);
        }
    }
    return (PyObject *)attribute;
}

static int routed_traverse(RoutedAttribute *attribute, visitproc visit, void *arg)
{
    Py_VISIT(attribute->templates);
    return 0;
}

static int routed_clear(RoutedAttribute *attribute)
{
    Py_CLEAR(attribute->templates);
    return 0;
}

static void routed_dealloc(RoutedAttribute *attribute)
{
    PyObject_GC_UnTrack(attribute);
    Py_CLEAR(attribute->name);
    Py_CLEAR(attribute->unmatched);
    Py_CLEAR(attribute->templates);
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

/* The template of a URL rule: rule.rule, kept by the rule's identity (a rule, unhashable, lives
 * as long as its app's URL map; the table holds it, so its id is not taken by another). */
static PyObject *rule_template(RoutedAttribute *attribute, PyObject *rule)
{
    if (attribute->templates == NULL) { /* cleared by the collector */
        return PyObject_GetAttr(rule, str_rule);
    }
    PyObject *key = PyLong_FromVoidPtr(rule);
    if (key == NULL) {
        return NULL;
    }
    PyObject *kept = PyDict_GetItemWithError(attribute->templates, key);
    if (kept != NULL) {
        Py_DECREF(key);
        return Py_NewRef(PyTuple_GET_ITEM(kept, 1));
    }
    PyObject *template = PyErr_Occurred() ? NULL : PyObject_GetAttr(rule, str_rule);
    if (template != NULL && PyUnicode_Check(template)) {
        if (PyDict_GET_SIZE(attribute->templates) >= MAX_RULES) {
            PyDict_Clear(attribute->templates);
        }
        kept = PyTuple_Pack(2, rule, template);
        if (kept == NULL || PyDict_SetItem(attribute->templates, key, kept) < 0) {
            Py_CLEAR(template);
        }
        Py_XDECREF(kept);
    }
    Py_DECREF(key);
    return template;
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
    PyObject *template = attribute->is_rule ? rule_template(attribute, value)
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
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "RoutedAttribute(name, is_rule, unmatched): a Flask request attribute that names "
              "the request in flight when Flask sets it.",
    .tp_new = routed_new,
    .tp_dealloc = (destructor)routed_dealloc,
    .tp_traverse = (traverseproc)routed_traverse,
    .tp_clear = (inquiry)routed_clear,
    .tp_descr_get = (descrgetfunc)routed_get,
    .tp_descr_set = (descrsetfunc)routed_set,
};
