"""From a target's cumulative /profile.json snapshots to the samples gained since the last one.

Pure: documents and cursor state in, parts (rows and the cursor update they go with) out; no
I/O, no clock, no threads. Counts from a worker only grow for a given ``instance.id``. A new id
(a restart or a fork) means every count is new; a count that goes down for the same id is a
reset of that counter, so its whole new value is new. A delta is never negative.

Stacks are held once for the whole fleet (``StackTable``): a target's state keys its counts
by stack id, and rows and cursor entries refer to the table's one copy of each stack's text,
so a thousand workers running the same code cost one copy of their stacks, not a thousand.
"""

from __future__ import annotations

from collections.abc import Mapping

from collector.states import SortedCounts, StackTable, TargetState
from collector.store import CursorUpdate, SampleRow
from sampler.profile import LIMITS, Document, DocumentError

__all__ = ["Delta", "Part", "compute_delta", "merge_cursor_updates"]

Labels = Mapping[str, str]


class _Group:
    """The changed entries of one document label set, in parallel lists."""

    __slots__ = ("label_set", "service", "host", "labels", "stacks", "counts", "gains")

    def __init__(self, label_set: int, service: str, host: str, labels: Labels) -> None:
        self.label_set = label_set  # the cursor's id of the label set
        self.service, self.host, self.labels = service, host, labels
        self.stacks: list[str] = []  # the table's copy of each stack's text
        self.counts: list[int] = []  # cumulative counts, for the cursor
        self.gains: list[int] | None = []  # samples gained, for the rows (None: dropped)


class Part:
    """One target's delta waiting to be written: its rows, compactly, and their cursor update.

    A part holds about a tenth of the memory of the same rows as ``SampleRow`` objects; they
    are made only when the part is written. Rows and cursor update always commit together.
    """

    __slots__ = (
        "target",
        "instance",
        "mode",
        "interval",
        "bucket",
        "replaced",
        "label_sets",
        "groups",
        "carried",
        "rows",
        "samples",
    )

    def __init__(
        self,
        target: str,
        instance: str,
        mode: str,
        interval: float,
        bucket: int,
        replaced: bool,
        label_sets: dict[int, Labels],
    ) -> None:
        self.target, self.instance, self.mode, self.bucket = target, instance, mode, bucket
        self.interval = interval  # seconds one sample stands for: the document's own
        self.replaced = replaced
        self.label_sets = label_sets  # label sets the cursor learns with this part
        self.groups: list[_Group] = []
        self.carried: CursorUpdate | None = None  # an older part's cursor, its rows dropped
        self.rows = 0
        self.samples = 0

    def sample_rows(self) -> list[SampleRow]:
        """Returns the rows to store; rows of label sets that became equal are summed."""
        merged: dict[tuple[str, str, tuple[tuple[str, str], ...], str], int] = {}
        labels_of: dict[tuple[str, str, tuple[tuple[str, str], ...]], Labels] = {}
        for group in self.groups:
            if group.gains is None:
                continue
            key = (group.service, group.host, tuple(sorted(group.labels.items())))
            labels_of.setdefault(key, group.labels)
            for stack, gain in zip(group.stacks, group.gains, strict=True):
                if gain:
                    row = (*key, stack)
                    merged[row] = merged.get(row, 0) + gain
        bucket, mode, instance, interval = self.bucket, self.mode, self.instance, self.interval
        return [
            SampleRow(
                bucket,
                mode,
                service,
                host,
                instance,
                labels_of[(service, host, canon)],
                stack,
                count,
                interval,
            )
            for (service, host, canon, stack), count in merged.items()
        ]

    def cursor_update(self) -> CursorUpdate:
        """Returns the cursor update that commits with these rows."""
        own = CursorUpdate(
            target=self.target,
            instance=self.instance,
            replaced=self.replaced,
            counts={
                (group.label_set, stack): count
                for group in self.groups
                for stack, count in zip(group.stacks, group.counts, strict=True)
            },
            label_sets=dict(self.label_sets),
        )
        return own if self.carried is None else merge_cursor_updates(self.carried, own)

    def drop_rows(self) -> tuple[int, int]:
        """Forgets the rows but keeps the cursor update; returns (rows, samples) dropped."""
        dropped = self.rows, self.samples
        for group in self.groups:
            group.gains = None
        self.rows = self.samples = 0
        return dropped

    def carry(self, older: Part) -> None:
        """Takes over the cursor update of an older part of the same target (rows dropped)."""
        update = older.cursor_update()
        self.carried = (
            update if self.carried is None else merge_cursor_updates(update, self.carried)
        )


class Delta:
    """The outcome of one snapshot: the part to write (None when nothing changed) and more."""

    __slots__ = ("part", "state", "new_instance", "resets", "samples")

    def __init__(
        self, part: Part | None, state: TargetState, new_instance: bool, resets: int, samples: int
    ) -> None:
        self.part = part
        self.state = state
        self.new_instance = new_instance
        self.resets = resets  # counters that went down (counted as new from zero)
        self.samples = samples  # sum of the rows' counts

    @property
    def rows(self) -> list[SampleRow]:
        """The rows to store, made now."""
        return self.part.sample_rows() if self.part is not None else []

    @property
    def cursor(self) -> CursorUpdate | None:
        """The cursor update, made now."""
        return self.part.cursor_update() if self.part is not None else None


def _canonical(labels: Labels) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


def _assign_ids(
    profile: Document, previous: TargetState | None
) -> tuple[list[int], dict[int, Labels]]:
    """Maps the document's label set indexes to cursor ids, reusing ids of known label sets."""
    if previous is None:
        return list(range(len(profile.label_sets))), dict(enumerate(profile.label_sets))
    known = {_canonical(labels): ident for ident, labels in previous.label_sets.items()}
    next_id = max(previous.label_sets, default=-1) + 1
    ids: list[int] = []
    added: dict[int, Labels] = {}
    for labels in profile.label_sets:
        ident = known.get(_canonical(labels))
        if ident is None:
            ident = known[_canonical(labels)] = next_id
            added[ident] = labels
            next_id += 1
        ids.append(ident)
    return ids, added


# Marks rows whose labels were cut to the store's limit (see _within_limit).
LABELS_CUT = ("fleetflame", "labels-over-limit")


def _row_labels(
    profile: Document, target: str, target_labels: Labels
) -> list[tuple[str, str, dict[str, str]]]:
    # The sample's label set, then process labels, then the target's (the operator wins).
    out = []
    for labels in profile.label_sets:
        merged = {**labels, **profile.labels, **target_labels}
        service = merged.pop("service", "") or "unknown"
        host = merged.pop("host", "") or profile.host or target.rsplit(":", 1)[0]
        if len(merged) > LIMITS.max_labels:
            merged = _within_limit(merged, (target_labels, profile.labels, labels))
        out.append((service, host, merged))
    return out


def _within_limit(merged: dict[str, str], sources: tuple[Labels, ...]) -> dict[str, str]:
    """Cuts labels that each fit the limit but together pass it (process labels and a tag's)
    to the limit, marked LABELS_CUT: the store would refuse the rows, every row of the
    target with them, poll after poll. The operator's labels are kept first, then the
    process's, then the label set's, each in key order."""
    kept: dict[str, str] = {}
    for source in sources:
        for key in sorted(source):
            if key in merged and len(kept) < LIMITS.max_labels - 1:
                kept[key] = merged[key]
    kept[LABELS_CUT[0]] = LABELS_CUT[1]
    return kept


def compute_delta(
    target: str,
    target_labels: Labels,
    previous: TargetState | None,
    profile: Document,
    *,
    bucket: int,
    table: StackTable,
    max_delta: int = 10**9,
) -> Delta:
    """Returns the samples ``profile`` gained over ``previous`` as a part in ``bucket``.

    ``previous`` is updated in place and returned as the delta's state (a new state for a new
    instance). Raises DocumentError, leaving ``previous`` as it was, when a count grew by more
    than ``max_delta`` (nothing is consumed, so the growth is not lost if the next snapshot is
    sane again) or when an incremental document answers another snapshot than the one held.
    """
    if profile.since and (
        previous is None
        or previous.instance != profile.instance_id
        or previous.generation != profile.since
    ):
        if previous is not None:
            previous.generation = 0  # ask for everything next time
        raise DocumentError(
            f"/profile.json lists what changed since tick {profile.since}, which is not the"
            " snapshot the collector holds; the next poll reads every stack"
        )
    new_instance = previous is None or previous.instance != profile.instance_id
    base = None if new_instance else previous
    ids, added_sets = _assign_ids(profile, base)
    old_counts = base.counts if base is not None else {}
    row_labels = _row_labels(profile, target, target_labels)
    groups: dict[int, _Group] = {}
    resets = samples = rows = 0
    intern, text_of = table.intern, table.stack
    for (index, stack), count in profile.stacks.items():
        sid = intern(stack)
        per_set = old_counts.get(ids[index])
        old = per_set.get(sid) if per_set is not None else 0
        if count == old:
            continue
        if count < old:
            resets += 1
            gain = count
        else:
            gain = count - old if old else count
        if gain > max_delta:
            raise DocumentError(
                f"/profile.json stack {stack[:60]!r} grew by {gain} samples since the last poll,"
                f" more than the limit of {max_delta}"
            )
        group = groups.get(index)
        if group is None:
            group = groups[index] = _Group(ids[index], *row_labels[index])
        group.stacks.append(text_of(sid))
        group.counts.append(count)
        group.gains.append(gain)  # type: ignore[union-attr]
        if gain:
            rows += 1
            samples += gain

    if base is None:
        state = TargetState(profile.instance_id, {}, dict(added_sets), profile.generation)
    else:
        state = base
        state.label_sets.update(added_sets)
        state.generation = profile.generation
    for group in groups.values():
        per_set = state.counts.get(group.label_set)
        if per_set is None:
            per_set = state.counts[group.label_set] = SortedCounts()
        per_set.update([intern(stack) for stack in group.stacks], group.counts)
    part = None
    if new_instance or groups or added_sets:
        part = Part(
            target,
            profile.instance_id,
            profile.mode,
            profile.interval,
            bucket,
            new_instance,
            added_sets,
        )
        part.groups = list(groups.values())
        part.rows, part.samples = rows, samples
    return Delta(part, state, new_instance, resets, samples)


def merge_cursor_updates(first: CursorUpdate, second: CursorUpdate) -> CursorUpdate:
    """Folds two consecutive cursor updates of one target into one with the same effect."""
    if second.replaced or first.instance != second.instance:
        return second
    return CursorUpdate(
        target=second.target,
        instance=second.instance,
        replaced=first.replaced,
        counts={**first.counts, **second.counts},
        label_sets={**first.label_sets, **second.label_sets},
    )
