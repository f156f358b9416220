"""The bytes the endpoint serves of a stack table's counts: folded text, and the stack entries
of ``/profile.json``, joined from each stack's text built once and cached.
"""

from __future__ import annotations

from collections.abc import Iterable

from . import _labels

TYPE_CHECKING = False  # not typing's: importing typing costs ~3 ms (see sampler/__init__.py)
if TYPE_CHECKING:
    from ._stacks import StackKey, StackTable

# Bytes of folded text kept ready for serving (see StackText).
_MAX_QUOTED_BYTES = 16_000_000


def merged(counts: dict[StackKey, int]) -> Iterable[tuple[tuple[int, ...], int]]:
    """Yields (stack, whole count) merged over label sets, leaving out zero counts."""
    if any(label_set for label_set, _ in counts):
        summed: dict[tuple[int, ...], int] = {}
        for (_, stack), count in counts.items():
            summed[stack] = summed.get(stack, 0) + count
        pairs: Iterable[tuple[tuple[int, ...], int]] = summed.items()
    else:
        # No labels in use: one entry per stack already (hashing long tuples is slow).
        pairs = ((stack, count) for (_, stack), count in counts.items())
    return ((stack, int(count)) for stack, count in pairs if count > 0)


class StackText:
    """Each stack of a table as its folded text in a UTF-8 JSON string literal, built once:
    serving is then joining cached pieces. Capped so a huge profile cannot double the memory
    it takes."""

    def __init__(self, table: StackTable) -> None:
        self._table = table
        self._quoted: dict[tuple[int, ...], bytes] = {}
        self._quoted_bytes = 0

    def quote(self, stack: tuple[int, ...]) -> bytes:
        """Returns a stack's folded text as a JSON string literal."""
        quoted = self._quoted.get(stack)
        if quoted is None:
            # Frame names are escaped (sampler.profile.escape_frame): no character in them needs
            # JSON escaping, so the JSON string is the text in quotes.
            quoted = b'"' + self._table.folded((0, stack)).encode() + b'"'
            if self._quoted_bytes < _MAX_QUOTED_BYTES:
                self._quoted[stack] = quoted
                self._quoted_bytes += len(quoted)
        return quoted

    def raw(self, stack: tuple[int, ...]) -> bytes:
        """Returns a stack's folded text."""
        return self.quote(stack)[1:-1]

    def folded_text(self, counts: dict[StackKey, int]) -> bytes:
        """Returns folded-stack text (``stack count`` lines, in no particular order)."""
        cached, quote = self._quoted.get, self.quote
        parts: list[bytes | memoryview] = []
        append = parts.append
        for stack, count in merged(counts):
            append(memoryview(cached(stack) or quote(stack))[1:-1])  # no copy until the join
            append(b" %d\n" % count)
        return b"".join(parts)

    def document_stacks(
        self, counts: dict[StackKey, int], touched: dict[StackKey, int], since: int
    ) -> tuple[list[bytes], list[dict[str, str]], int]:
        """Returns a document's stacks as JSON pieces, its label sets and its total samples.

        The pieces are an opening ``[index,`` (with the separating comma), the cached stack,
        and ``,count]``, three per stack, so the cached bytes are copied once, by the final
        join. With ``since``, only the stacks counted after tick ``since`` (a generation a
        reader already has) are listed; the total counts them all."""
        set_index: dict[int, int] = {0: 0}
        label_sets: list[dict[str, str]] = [{}]
        stacks: list[bytes] = []
        append = stacks.append
        total = 0
        cached, quote = self._quoted.get, self.quote
        for key, count in counts.items():
            if count <= 0:
                continue
            total += count
            if since and touched.get(key, 0) <= since:
                continue
            label_set, stack = key
            index = set_index.get(label_set)
            if index is None:
                index = set_index[label_set] = len(label_sets)
                label_sets.append(_labels.label_set(label_set))
            append(b",[%d," % index)
            append(cached(stack) or quote(stack))
            append(b",%d]" % count)
        if stacks:
            stacks[0] = stacks[0][1:]  # no comma before the first
        return stacks, label_sets, total
