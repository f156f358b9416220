/* The request recorder's counting, in C: a run of one route's finished requests into its
 * latency, queueing and total sketches, its error count, and which may be among its slowest.
 *
 * sampler/_request_routes.py (Route.add_batch) holds the same in Python, the fallback where
 * this extension is not built; its tests hold the two to the same counts. A value counts in
 * bin ceil(log(value) * scale) as Sketch.add does. Anything but the common forms (a status
 * line of three digits, a request-start header of digits and a dot after an optional "t=") is
 * handed to the Python functions given, so both paths read every input alike.
 */
#include "native.h"
#include "module.h"

#include <math.h>

/* Distinct bins a run holds before it adds them to the sketch's dict. */
#define RUN_BINS 128

typedef struct {
    PyObject *bins; /* Sketch.bins: index -> count */
    double min_value, scale;
    long long zero;
    double sum, max;
    int distinct; /* the run's bins, in the order first seen */
    long long index[RUN_BINS], count[RUN_BINS];
} sketch_run;

/* Adds the run's bins to the sketch's dict. */
static int sketch_flush(sketch_run *sketch)
{
    for (int i = 0; i < sketch->distinct; i++) {
        PyObject *index = PyLong_FromLongLong(sketch->index[i]);
        if (index == NULL) {
            return -1;
        }
        PyObject *count = PyDict_GetItemWithError(sketch->bins, index);
        long long before = count != NULL ? PyLong_AsLongLong(count) : 0;
        PyObject *after = (count == NULL && PyErr_Occurred()) || (before == -1 && PyErr_Occurred())
                              ? NULL
                              : PyLong_FromLongLong(before + sketch->count[i]);
        int failed = after == NULL || PyDict_SetItem(sketch->bins, index, after) < 0;
        Py_XDECREF(after);
        Py_DECREF(index);
        if (failed) {
            return -1;
        }
    }
    sketch->distinct = 0;
    return 0;
}

static int sketch_add(sketch_run *sketch, double value)
{
    if (value < sketch->min_value) {
        sketch->zero++;
        return 0;
    }
    sketch->sum += value;
    if (value > sketch->max) {
        sketch->max = value;
    }
    double bin = ceil(log(value) * sketch->scale);
    if (!(fabs(bin) < 1e15)) {
        PyErr_SetString(PyExc_ValueError, "a value with no sketch bin");
        return -1;
    }
    long long index = (long long)bin;
    for (int i = sketch->distinct - 1; i >= 0; i--) {
        if (sketch->index[i] == index) {
            sketch->count[i]++;
            return 0;
        }
    }
    if (sketch->distinct == RUN_BINS && sketch_flush(sketch) < 0) {
        return -1;
    }
    sketch->index[sketch->distinct] = index;
    sketch->count[sketch->distinct++] = 1;
    return 0;
}

/* The HTTP status of a WSGI status line or an ASGI number; -1 when it is neither common form. */
static long common_status(PyObject *status)
{
    if (PyLong_CheckExact(status)) {
        long code = PyLong_AsLong(status);
        if (code == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            return -1;
        }
        return code;
    }
    if (!PyUnicode_Check(status) || PyUnicode_KIND(status) != PyUnicode_1BYTE_KIND ||
        PyUnicode_GET_LENGTH(status) < 3) {
        return -1;
    }
    const Py_UCS1 *text = PyUnicode_1BYTE_DATA(status);
    if (text[0] < '0' || text[0] > '9' || text[1] < '0' || text[1] > '9' || text[2] < '0' ||
        text[2] > '9') {
        return -1;
    }
    return (text[0] - '0') * 100 + (text[1] - '0') * 10 + (text[2] - '0');
}

/* A request-start header's number when it is "t=" and digits with at most one dot (or just
 * those digits): 1 and *value set, 0 when it is some other form. */
/* Integers up to 2**53 and powers of ten up to 1e22 are exact in a double. */
#define EXACT_MANTISSA (1ull << 53)
#define POWERS 23
static const double powers_of_ten[POWERS] = {
    1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
    1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
};

static int common_header(PyObject *header, double *value)
{
    if (!PyUnicode_Check(header) || PyUnicode_KIND(header) != PyUnicode_1BYTE_KIND) {
        return 0;
    }
    Py_ssize_t length = PyUnicode_GET_LENGTH(header);
    const char *text = (const char *)PyUnicode_1BYTE_DATA(header);
    if (length >= 2 && text[0] == 't' && text[1] == '=') {
        text += 2;
        length -= 2;
    }
    char digits[40];
    int dots = 0, seen = 0, after_dot = 0;
    uint64_t mantissa = 0; /* the digits as one integer, while it is exact in a double */
    int exact = 1;
    if (length == 0 || length >= (Py_ssize_t)sizeof(digits)) {
        return 0;
    }
    for (Py_ssize_t i = 0; i < length; i++) {
        if (text[i] == '.') {
            dots++;
        } else if (text[i] >= '0' && text[i] <= '9') {
            seen = 1;
            after_dot += dots;
            mantissa = mantissa * 10 + (uint64_t)(text[i] - '0');
            exact = exact && mantissa <= EXACT_MANTISSA;
        } else {
            return 0;
        }
    }
    if (dots > 1 || !seen) {
        return 0;
    }
    if (exact && after_dot < POWERS) {
        /* Both exact in a double, so one division rounds as float() does (strtod's exact
         * reading cost ~1,800 instructions a header, a third of the recorder's work). */
        *value = (double)mantissa / powers_of_ten[after_dot];
        return 1;
    }
    memcpy(digits, text, (size_t)length);
    digits[length] = '\0';
    *value = PyOS_string_to_double(digits, NULL, NULL); /* as float() reads it */
    if (*value == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

/* queue_delay's arithmetic on a number read from a header: NAN when it is not a delay. */
static double delay_of(double value, double now, double max_queue)
{
    if (!(value > 0)) {
        return NAN;
    }
    double delay;
    if (value < 1e11) {
        delay = now - value;
    } else if (value < 1e11 * 1e3) {
        delay = now - value / 1e3;
    } else if (value < 1e11 * 1e6) {
        delay = now - value / 1e6;
    } else if (value < 1e11 * 1e9) {
        delay = now - value / 1e9;
    } else {
        return NAN;
    }
    if (!(-max_queue < delay && delay < max_queue)) {
        return NAN;
    }
    return delay > 0 ? delay : 0.0; /* a proxy's clock ahead of ours: nothing queued */
}

static PyObject *sketch_result(const sketch_run *sketch)
{
    return Py_BuildValue("(Ldd)", sketch->zero, sketch->sum, sketch->max);
}

PyObject *native_count_requests(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *chunk, *latency_bins, *queue_bins, *total_bins, *queue_delay, *status_code;
    double threshold, scale, min_value, max_queue;
    if (!PyArg_ParseTuple(args, "O!dO!O!O!ddOOd:count_requests", &PyList_Type, &chunk,
                          &threshold, &PyDict_Type, &latency_bins, &PyDict_Type, &queue_bins,
                          &PyDict_Type, &total_bins, &scale, &min_value, &queue_delay,
                          &status_code, &max_queue)) {
        return NULL;
    }
    sketch_run latency = {.bins = latency_bins, .min_value = min_value, .scale = scale};
    sketch_run queue = {.bins = queue_bins, .min_value = min_value, .scale = scale};
    sketch_run total = {.bins = total_bins, .min_value = min_value, .scale = scale};
    long long errors = 0, queued = 0;
    PyObject *candidates = PyList_New(0);
    if (candidates == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(chunk); i++) {
        PyObject *request = PyList_GET_ITEM(chunk, i);
        if (!PyTuple_Check(request) || PyTuple_GET_SIZE(request) < 8) {
            PyErr_SetString(PyExc_TypeError, "a finished request is a tuple of 9");
            goto failed;
        }
        double elapsed = PyFloat_AsDouble(PyTuple_GET_ITEM(request, 2));
        if (elapsed == -1.0 && PyErr_Occurred()) {
            goto failed;
        }
        if (elapsed > threshold) {
            PyObject *at = PyLong_FromSsize_t(i);
            int appended = at != NULL && PyList_Append(candidates, at) == 0;
            Py_XDECREF(at);
            if (!appended) {
                goto failed;
            }
        }
        if (sketch_add(&latency, elapsed) < 0) {
            goto failed;
        }
        PyObject *status = PyTuple_GET_ITEM(request, 7);
        long code = common_status(status);
        if (code < 0) {
            PyObject *read = PyObject_CallOneArg(status_code, status);
            int overflow = 0;
            code = read != NULL ? PyLong_AsLongAndOverflow(read, &overflow) : -1;
            Py_XDECREF(read);
            if (code == -1 && PyErr_Occurred()) {
                goto failed;
            }
            if (overflow) {
                code = overflow > 0 ? 999 : -1; /* as Python compares: an error, or not one */
            }
        }
        errors += code == 0 || code >= 500;
        PyObject *header = PyTuple_GET_ITEM(request, 3);
        int present = PyObject_IsTrue(header);
        if (present < 0) {
            goto failed;
        }
        if (!present) {
            continue;
        }
        double now = PyFloat_AsDouble(PyTuple_GET_ITEM(request, 4)), value, delay;
        if (now == -1.0 && PyErr_Occurred()) {
            goto failed;
        }
        if (common_header(header, &value)) {
            delay = delay_of(value, now, max_queue);
        } else {
            PyObject *read = PyObject_CallFunctionObjArgs(queue_delay, header,
                                                          PyTuple_GET_ITEM(request, 4), NULL);
            if (read == NULL) {
                goto failed;
            }
            delay = read == Py_None ? NAN : PyFloat_AsDouble(read);
            Py_DECREF(read);
            if (delay == -1.0 && PyErr_Occurred()) {
                goto failed;
            }
        }
        if (isnan(delay)) {
            continue;
        }
        queued++;
        if (sketch_add(&queue, delay) < 0 || sketch_add(&total, delay + elapsed) < 0) {
            goto failed;
        }
    }
    if (sketch_flush(&latency) < 0 || sketch_flush(&queue) < 0 || sketch_flush(&total) < 0) {
        goto failed;
    }
    PyObject *latency_figures = sketch_result(&latency), *queue_figures = sketch_result(&queue);
    PyObject *total_figures = sketch_result(&total);
    PyObject *result = NULL;
    if (latency_figures != NULL && queue_figures != NULL && total_figures != NULL) {
        result = Py_BuildValue("(LLOOOO)", errors, queued, latency_figures, queue_figures,
                               total_figures, candidates);
    }
    Py_XDECREF(latency_figures);
    Py_XDECREF(queue_figures);
    Py_XDECREF(total_figures);
    Py_DECREF(candidates);
    return result;
failed:
    Py_DECREF(candidates);
    return NULL;
}
