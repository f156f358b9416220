"""The collectors' cursors: the cumulative counts last seen per target, written with the
samples they produced, and loaded after a restart.

A target's counts are a log (schema.cursor_log): each write appends one row holding the
entries that changed, as packed arrays, so a write costs what changed, in one row per
target (an upsert per entry cost as much as writing the samples). Every COMPACT_EVERY
writes of a target, the writer folds its log into one row in the same transaction, so the
log stays short; loading replays each target's rows in order.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING

import sqlalchemy as sa

from collector.store import schema
from collector.store.packing import pack, unpack
from collector.store.rows import Batch, Cursor, PreparedCursor

if TYPE_CHECKING:
    from collector.store.store import Store

__all__ = ["COMPACT_EVERY", "load_cursors", "write_cursors"]

COMPACT_EVERY = 16  # log rows a target may have before the writer folds them into one
_CHUNK = 1000  # targets per IN (...) list

_APPEND = sa.text(
    "INSERT INTO cursor_log (target, seq, label_indexes, stack_ids, counts) "
    "SELECT :target, coalesce(max(seq), 0) + 1, :label_indexes, :stack_ids, :counts "
    "FROM cursor_log WHERE target = :target"
).bindparams(
    sa.bindparam("label_indexes", type_=sa.LargeBinary),
    sa.bindparam("stack_ids", type_=sa.LargeBinary),
    sa.bindparam("counts", type_=sa.LargeBinary),
)

Entries = dict[tuple[int, int], int]  # (label set index, stack id) -> cumulative count


def write_cursors(store: Store, conn: sa.Connection, batch: Batch) -> None:
    """Writes a batch's cursor updates: instances, label sets, and the changed counts."""
    if not batch.cursors:
        return
    replaced = sorted({c.target for c in batch.cursors if c.replaced})
    for table in (schema.cursor_log, schema.cursor_label_sets):
        for i in range(0, len(replaced), _CHUNK):
            conn.execute(sa.delete(table).where(table.c.target.in_(replaced[i : i + _CHUNK])))
    for target in replaced:
        store.cursor_rows[target] = 0
    targets = {c.target: c.instance for c in batch.cursors}
    store.engine.upsert(
        conn,
        schema.cursor_targets,
        [{"target": t, "instance": i} for t, i in sorted(targets.items())],
        ["instance"],
    )
    label_rows = {(c.target, index): lid for c in batch.cursors for index, lid in c.label_sets}
    store.engine.upsert(
        conn,
        schema.cursor_label_sets,
        [
            {"target": t, "label_index": i, "label_set_id": lid}
            for (t, i), lid in sorted(label_rows.items())
        ],
        ["label_set_id"],
    )
    changed = _changes(batch.cursors)
    # Targets whose log is long, or unknown to this writer (it just started, or another
    # collector wrote them before): read their log and fold it with the change.
    folded = sorted(t for t in changed if store.cursor_rows.get(t, COMPACT_EVERY) >= COMPACT_EVERY)
    logs = _read_logs(conn, folded)
    appended = []
    for target, (indexes, ids, counts) in sorted(changed.items()):
        if target in logs:
            entries = logs[target]
            entries.update(_entries(indexes, ids, counts))
            indexes, ids, counts = _columns(entries)
        elif not ids:
            continue
        appended.append(
            {
                "target": target,
                "label_indexes": pack(indexes, 4),
                "stack_ids": pack(ids),
                "counts": pack(counts, compress=True),
            }
        )
    for i in range(0, len(folded), _CHUNK):
        log = schema.cursor_log
        conn.execute(sa.delete(log).where(log.c.target.in_(folded[i : i + _CHUNK])))
    if appended:
        conn.execute(_APPEND, appended)
    for target in folded:
        store.cursor_rows[target] = 0
    for row in appended:
        store.cursor_rows[row["target"]] = store.cursor_rows.get(row["target"], 0) + 1


def _changes(updates: list[PreparedCursor]) -> dict[str, tuple[list[int], list[int], list[int]]]:
    """Returns the changed entries per target; a later update of a target wins."""
    changed: dict[str, tuple[list[int], list[int], list[int]]] = {}
    for update in updates:
        known = changed.get(update.target)
        if known is None or update.replaced:
            changed[update.target] = (update.label_indexes, update.stack_ids, update.counts)
        else:
            entries = _entries(*known)
            entries.update(_entries(update.label_indexes, update.stack_ids, update.counts))
            changed[update.target] = _columns(entries)
    return changed


def _entries(indexes: Iterable[int], ids: Iterable[int], counts: Iterable[int]) -> Entries:
    return dict(zip(zip(indexes, ids, strict=True), counts, strict=True))


def _columns(entries: Entries) -> tuple[list[int], list[int], list[int]]:
    keys = list(entries)
    return [k[0] for k in keys], [k[1] for k in keys], list(entries.values())


def _read_logs(conn: sa.Connection, targets: list[str]) -> dict[str, Entries]:
    """Returns the entries of these targets' logs, replayed (targets without one left out)."""
    log = schema.cursor_log
    entries: dict[str, Entries] = {}
    for i in range(0, len(targets), _CHUNK):
        stmt = (
            sa.select(log.c.target, log.c.label_indexes, log.c.stack_ids, log.c.counts)
            .where(log.c.target.in_(targets[i : i + _CHUNK]))
            .order_by(log.c.target, log.c.seq)
        )
        for target, indexes, ids, counts in conn.execute(stmt):
            found = entries.setdefault(target, {})
            found.update(_entries(unpack(indexes, 4), unpack(ids), unpack(counts, compressed=True)))
    return entries


def load_cursors(store: Store, conn: sa.Connection) -> dict[str, Cursor]:
    """Returns the stored cursor of every target, its counts by (label set, stack text)."""
    ls, cl, t = schema.label_sets, schema.cursor_label_sets, schema.cursor_targets
    cursors = {target: Cursor(instance) for target, instance in conn.execute(sa.select(t))}
    logs = _read_logs(conn, sorted(cursors))
    ids = sorted({sid for entries in logs.values() for _index, sid in entries})
    texts = dict(store.engine.stack_texts(conn, ids))
    for target, entries in logs.items():
        counts = cursors[target].counts
        for (index, sid), count in entries.items():
            if sid in texts:
                counts[(index, texts[sid])] = count
    for target, index, labels in conn.execute(
        sa.select(cl.c.target, cl.c.label_index, ls.c.labels).join(ls, ls.c.id == cl.c.label_set_id)
    ):
        if target in cursors:
            cursors[target].label_sets[index] = json.loads(labels)
    return cursors
