/* The record ring: many signal handlers write, one drain reads.
 *
 * A writer reserves space with a compare-and-swap on the head (lock-free, so a handler never
 * waits for a thread it interrupted), writes its record and publishes it by setting its state
 * last. A record that would cross the end of the buffer is preceded by a skip record filling
 * the end. The drain zeroes what it consumed before releasing it, so a reserved record reads
 * as still being written until its writer publishes it.
 */
#include "native.h"

#include <stdlib.h>
#include <string.h>

int ring_init(ring_t *ring, uint64_t capacity)
{
    ring->data = calloc(1, capacity);
    if (ring->data == NULL) {
        return -1;
    }
    ring->capacity = capacity;
    atomic_store(&ring->head, 0);
    atomic_store(&ring->tail, 0);
    return 0;
}

void ring_free(ring_t *ring)
{
    free(ring->data);
    ring->data = NULL;
    ring->capacity = 0;
}

void ring_reset(ring_t *ring)
{
    memset(ring->data, 0, ring->capacity);
    atomic_store(&ring->head, 0);
    atomic_store(&ring->tail, 0);
}

record_head *ring_reserve(ring_t *ring, uint32_t size)
{
    uint64_t mask = ring->capacity - 1;
    uint64_t head = atomic_load_explicit(&ring->head, memory_order_relaxed);
    for (;;) {
        uint64_t tail = atomic_load_explicit(&ring->tail, memory_order_acquire);
        uint64_t offset = head & mask;
        uint64_t pad = offset + size > ring->capacity ? ring->capacity - offset : 0;
        if (head + pad + size - tail > ring->capacity) {
            return NULL;
        }
        if (atomic_compare_exchange_weak_explicit(&ring->head, &head, head + pad + size,
                                                  memory_order_acq_rel, memory_order_relaxed)) {
            if (pad) {
                record_head *skip = (record_head *)(ring->data + offset);
                skip->size = (uint32_t)pad;
                atomic_store_explicit(&skip->state, REC_SKIP, memory_order_release);
            }
            record_head *record = (record_head *)(ring->data + ((head + pad) & mask));
            record->size = size;
            return record;
        }
    }
}

void ring_commit(record_head *record, uint32_t state)
{
    atomic_store_explicit(&record->state, state, memory_order_release);
}

Py_ssize_t ring_consume(ring_t *ring, int (*visit)(record_head *, void *), void *arg)
{
    uint64_t mask = ring->capacity - 1;
    uint64_t tail = atomic_load_explicit(&ring->tail, memory_order_relaxed);
    uint64_t head = atomic_load_explicit(&ring->head, memory_order_acquire);
    Py_ssize_t visited = 0;
    int failed = 0;
    while (tail < head) {
        record_head *record = (record_head *)(ring->data + (tail & mask));
        uint32_t state = atomic_load_explicit(&record->state, memory_order_acquire);
        if (state == REC_EMPTY) {
            break; /* reserved, still being written */
        }
        uint32_t size = record->size;
        if (state == REC_READY && !failed) {
            if (visit(record, arg) < 0) {
                failed = 1; /* keep releasing: the space must not leak */
            }
            visited++;
        }
        memset(record, 0, size);
        tail += size;
    }
    atomic_store_explicit(&ring->tail, tail, memory_order_release);
    return failed ? -1 : visited;
}
