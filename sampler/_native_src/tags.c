/* Open tags: the label set each tagged frame object carries, read by the walk.
 *
 * sampler.tag() labels a frame object; a sample takes the set of its innermost tagged frame as
 * it stands when the sample is taken. Tags open and close under the GIL; the table is read by
 * signal handlers on any thread at any moment, so each slot is one 64-bit word (the frame's
 * address and its set: a reader never sees half a slot), found by open addressing. Growing,
 * or shedding deleted slots, builds a new table; the old one is freed once no handler can
 * still be reading it (handlers_running seen at zero after the new one was published).
 */
#include "native.h"
#include "module.h"

#include <stdlib.h>

#define MIN_SLOTS 1024
#define MAX_SLOTS (1u << 21) /* 16 MiB */
/* At most 3/8 of the slots live (786,432 tags open at once): room left for deleted slots, so
 * a full table is not rebuilt again every few hundred tags. */
#define MAX_LIVE (MAX_SLOTS / 8 * 3)
#define EMPTY 0u
#define DELETED 1u
#define SET_BITS 16
#define MAX_SET ((1u << SET_BITS) - 2) /* a word's low bits hold set + 1 */
#define MAX_ADDRESS (1ull << (64 - SET_BITS))

typedef struct tag_table {
    uint64_t mask;                  /* slots - 1 */
    uint64_t used;                  /* slots live or deleted */
    uint64_t live;
    struct tag_table *next_retired; /* replaced, waiting to be freed */
    _Atomic uint64_t slots[];
} tag_table;

static _Atomic(tag_table *) current;
static tag_table *retired;
static uint64_t lost; /* tags not kept: the table at its largest, or out of range */

static uint64_t slot_of(uint64_t address, uint64_t mask)
{
    return ((address >> 4) * 0x9e3779b97f4a7c15ull >> 20) & mask;
}

static tag_table *table_new(uint64_t slots)
{
    tag_table *table = calloc(1, sizeof(tag_table) + slots * sizeof(uint64_t));
    if (table != NULL) {
        table->mask = slots - 1;
    }
    return table;
}

/* Writes a live word into a table with room (no deleted slots: a new one). */
static void table_put_new(tag_table *table, uint64_t word)
{
    uint64_t at = slot_of(word >> SET_BITS, table->mask);
    while (atomic_load_explicit(&table->slots[at], memory_order_relaxed) != EMPTY) {
        at = (at + 1) & table->mask;
    }
    atomic_store_explicit(&table->slots[at], word, memory_order_relaxed);
    table->used++;
    table->live++;
}

static void free_retired(void)
{
    while (retired != NULL) {
        tag_table *next = retired->next_retired;
        free(retired);
        retired = next;
    }
}

/* Replaces the table with one sized for its live slots and ``more``; 0 when there is none
 * larger to be had (or no memory). */
static int rebuild(tag_table *table, uint64_t more)
{
    uint64_t live = table != NULL ? table->live : 0;
    uint64_t slots = MIN_SLOTS;
    while (slots < 4 * (live + more) && slots < MAX_SLOTS) {
        slots *= 2;
    }
    if (live + more > MAX_LIVE) {
        return 0;
    }
    tag_table *fresh = table_new(slots);
    if (fresh == NULL) {
        return 0;
    }
    if (table != NULL) {
        for (uint64_t i = 0; i <= table->mask; i++) {
            uint64_t word = atomic_load_explicit(&table->slots[i], memory_order_relaxed);
            if (word > DELETED) {
                table_put_new(fresh, word);
            }
        }
        table->next_retired = retired;
        retired = table;
    }
    atomic_store(&current, fresh); /* seq_cst, as the count read next */
    tags_collect();
    return 1;
}

void tags_collect(void)
{
    /* Seen at zero after the tables were replaced: a handler starting now reads the new one. */
    if (retired != NULL && atomic_load(&handlers_running) == 0) {
        free_retired();
    }
}

int tags_set(const void *frame, long set)
{
    uint64_t address = (uint64_t)(uintptr_t)frame;
    if (address == 0 || address >= MAX_ADDRESS || set > (long)MAX_SET) {
        lost += set >= 0; /* counted when it opens, not again when it closes */
        return -1;
    }
    tag_table *table = atomic_load_explicit(&current, memory_order_relaxed);
    if (table == NULL) {
        if (set < 0) {
            return 0;
        }
        if (!rebuild(NULL, 1)) {
            lost++;
            return -1;
        }
        table = atomic_load_explicit(&current, memory_order_relaxed);
    }
    uint64_t at = slot_of(address, table->mask), free_at = UINT64_MAX;
    for (;;) {
        uint64_t word = atomic_load_explicit(&table->slots[at], memory_order_relaxed);
        if (word >> SET_BITS == address) {
            atomic_store_explicit(&table->slots[at],
                                  set < 0 ? DELETED : (address << SET_BITS) | (uint64_t)(set + 1),
                                  memory_order_release);
            table->live -= set < 0;
            return 0;
        }
        if (word == DELETED && free_at == UINT64_MAX) {
            free_at = at;
        }
        if (word == EMPTY) {
            break;
        }
        at = (at + 1) & table->mask;
    }
    if (set < 0) {
        return 0;
    }
    if (free_at == UINT64_MAX && 2 * (table->used + 1) > table->mask + 1) {
        if (!rebuild(table, 1)) {
            lost++;
            return -1;
        }
        return tags_set(frame, set); /* once: the new table has room */
    }
    if (free_at == UINT64_MAX) {
        free_at = at;
        table->used++;
    }
    table->live++;
    atomic_store_explicit(&table->slots[free_at], (address << SET_BITS) | (uint64_t)(set + 1),
                          memory_order_release);
    return 0;
}

const void *tags_now(void)
{
    /* seq_cst, as the handler's count before it: a writer that saw the count at zero after
     * replacing the table means this load reads the new one. */
    return atomic_load(&current);
}

uint32_t tags_find(const void *tags, const void *frame)
{
    const tag_table *table = tags;
    uint64_t address = (uint64_t)(uintptr_t)frame;
    uint64_t at = slot_of(address, table->mask);
    for (uint64_t probes = 0; probes <= table->mask; probes++) {
        uint64_t word = atomic_load_explicit(&table->slots[at], memory_order_acquire);
        if (word == EMPTY) {
            return 0;
        }
        if (word >> SET_BITS == address) {
            return (uint32_t)(word & ((1u << SET_BITS) - 1));
        }
        at = (at + 1) & table->mask;
    }
    return 0;
}

void tags_clear(void)
{
    tag_table *table = atomic_exchange(&current, NULL);
    if (table != NULL) {
        table->next_retired = retired;
        retired = table;
    }
    tags_collect();
}

void tags_after_fork(void)
{
    /* The child's only thread runs no handler: every table can go. */
    tag_table *table = atomic_exchange(&current, NULL);
    free(table);
    free_retired();
}

uint64_t tags_open(void)
{
    tag_table *table = atomic_load_explicit(&current, memory_order_relaxed);
    return table != NULL ? table->live : 0;
}

uint64_t tags_lost(void)
{
    return lost;
}

/* The table from Python (sampler/_labels.py): one tag, all of them at once, none. */
PyObject *native_tag_set(PyObject *module, PyObject *const *args, Py_ssize_t count)
{
    (void)module;
    if (count != 2) {
        PyErr_SetString(PyExc_TypeError, "tag_set(frame_id, label_set) takes 2 arguments");
        return NULL;
    }
    void *frame = PyLong_AsVoidPtr(args[0]);
    long set = PyLong_AsLong(args[1]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    return PyBool_FromLong(tags_set(frame, set) == 0);
}

PyObject *native_tags_load(PyObject *module, PyObject *tags)
{
    (void)module;
    if (!PyDict_Check(tags)) {
        PyErr_SetString(PyExc_TypeError, "tags_load takes a dict");
        return NULL;
    }
    tags_clear();
    middleware_tags_kept(1);
    Py_ssize_t at = 0;
    PyObject *key, *value;
    while (PyDict_Next(tags, &at, &key, &value)) {
        void *frame = PyLong_AsVoidPtr(key);
        long set = PyLong_AsLong(value);
        if (PyErr_Occurred()) {
            return NULL;
        }
        tags_set(frame, set);
    }
    Py_RETURN_NONE;
}

PyObject *native_tags_clear(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    middleware_tags_kept(0);
    tags_clear();
    Py_RETURN_NONE;
}
