/* The frame name cache: (code object, instruction) -> the id of its interned frame name.
 *
 * Used by the drain only, under the GIL. Each entry holds a reference to its code object, so
 * while it is cached its address cannot be reused by another. Bounded: past MAX_ENTRIES the
 * cache starts over (the names stay interned in the sampler's table).
 */
#include "native.h"

#include <stdlib.h>
#include <string.h>

#define MAX_ENTRIES 100000

static code_entry *entries;
static size_t capacity; /* a power of two, at least twice the entries */
static Py_ssize_t used;

static size_t slot_of(const void *code, int64_t lasti, size_t mask)
{
    uint64_t h = (uint64_t)(uintptr_t)code ^ ((uint64_t)lasti * 0x9e3779b97f4a7c15ull);
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    return (size_t)h & mask;
}

code_entry *codemap_get(const void *code, int64_t lasti)
{
    if (used == 0) {
        return NULL;
    }
    size_t mask = capacity - 1;
    for (size_t i = slot_of(code, lasti, mask); entries[i].code != NULL; i = (i + 1) & mask) {
        if (entries[i].code == code && entries[i].lasti == lasti) {
            return &entries[i];
        }
    }
    return NULL;
}

static int grow(void)
{
    size_t new_capacity = capacity ? 2 * capacity : 1024;
    code_entry *grown = calloc(new_capacity, sizeof(code_entry));
    if (grown == NULL) {
        return -1;
    }
    size_t mask = new_capacity - 1;
    for (size_t j = 0; j < capacity; j++) {
        if (entries[j].code != NULL) {
            size_t i = slot_of(entries[j].code, entries[j].lasti, mask);
            while (grown[i].code != NULL) {
                i = (i + 1) & mask;
            }
            grown[i] = entries[j];
        }
    }
    free(entries);
    entries = grown;
    capacity = new_capacity;
    return 0;
}

code_entry *codemap_put(const void *code, int64_t lasti, PyObject *ref, PyObject *name,
                        uint64_t learned)
{
    if (used >= MAX_ENTRIES) {
        codemap_clear();
    }
    if (2 * ((size_t)used + 1) > capacity && grow() != 0) {
        PyErr_NoMemory();
        return NULL;
    }
    size_t mask = capacity - 1;
    size_t i = slot_of(code, lasti, mask);
    while (entries[i].code != NULL) {
        i = (i + 1) & mask;
    }
    Py_INCREF(ref);
    Py_INCREF(name);
    entries[i] = (code_entry){code, lasti, ref, name, learned};
    used++;
    return &entries[i];
}

void codemap_clear(void)
{
    code_entry *old = entries;
    size_t old_capacity = capacity;
    entries = NULL;
    capacity = 0;
    used = 0;
    /* Releasing a code object can run arbitrary code (a weakref callback): drop the table
     * first, then the references. */
    for (size_t i = 0; i < old_capacity; i++) {
        if (old[i].code != NULL) {
            Py_DECREF(old[i].ref);
            Py_DECREF(old[i].name);
        }
    }
    free(old);
}

Py_ssize_t codemap_size(void)
{
    return used;
}
