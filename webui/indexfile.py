"""The stack and function indexes saved to files, so that a process started later begins
with them.

A new process's stack index is empty, and its first view of a window of many distinct stacks
reads and sorts all their text (a second or more for 200,000 stacks). Each process saves its
index (the stacks' sort keys in order, and their ids) in ``index_dir`` once warmed and then
whenever it has learned more, and a process starting later loads the file before warming
(~0.25 s for 200,000 stacks, against ~1 s to read and sort them from the store). Stack ids are
hashes of the stacks' text, so a saved key never goes stale: a file is only ever incomplete,
and warming and requests learn the rest.

The format, little-endian: the line ``fleetflame stack index 1``, the number of stacks
(8 bytes), then blocks of at most BLOCK stacks, each its count (4 bytes), their ids (8 bytes
each), the byte length of their keys (8 bytes), the keys as UTF-8 joined by newlines (a sort
key holds none), and a CRC-32 of the block; a block of count 0 ends the file. A file that is
anything else (truncated, damaged, of another version) is ignored whole.

The function index (webui.functable) is saved beside it the same way, in sections (a length,
the data, its CRC-32), its arrays as they are (see functable_saved.SavedFunctions): numbering the
functions of 200,000 stacks from their text takes seconds, loading them a fraction of one.
"""

from __future__ import annotations

import hashlib
import os
import struct
import sys
import tempfile
import time
import zlib
from array import array
from collections.abc import Callable, Sequence
from itertools import islice
from operator import le
from pathlib import Path

import sqlalchemy as sa

from sampler.profile import SORT_SEPARATOR
from webui.functable_saved import SavedFunctions

__all__ = [
    "BLOCK",
    "IndexFileError",
    "count_in",
    "load",
    "load_functions",
    "path_for",
    "remove_stale_temporaries",
    "save",
    "save_functions",
]

# The version, and the separator sort keys are made with: keys made otherwise are not loaded.
MAGIC = b"fleetflame stack index 1 " + SORT_SEPARATOR.encode() + b"\n"
FUNCTIONS_MAGIC = b"fleetflame function index 1\n"
STALE_TEMPORARY = 600.0  # seconds after which a temporary file left by a killed save is removed
BLOCK = 50_000
_COUNT = struct.Struct("<Q")
_BLOCK_COUNT = struct.Struct("<I")
_CRC = struct.Struct("<I")
_BIG_ENDIAN = sys.byteorder == "big"


class IndexFileError(Exception):
    """A saved index that cannot be read: it is ignored."""


def _go_on() -> None:
    """A save's pause that never waits."""


def path_for(directory: str | os.PathLike[str], url: str, kind: str = "stacks") -> Path:
    """Returns the file a database's stack index (or, with ``kind="functions"``, its
    function index) is saved in: one per database URL."""
    shown = sa.engine.make_url(url).render_as_string(hide_password=True)
    return Path(directory) / f"{kind}-{hashlib.sha256(shown.encode()).hexdigest()[:16]}.idx"


def save(
    path: Path, keys: Sequence[str], ids: Sequence[int], *, pause: Callable[[], None] = _go_on
) -> int:
    """Writes sort keys in order and their ids to ``path`` (replaced whole, atomically, so
    readers see the old file or the new one); returns the bytes written. ``pause()`` is
    called before each block (~0.15 s of work): it may wait, or raise to give up the save
    (the old file stays)."""

    def write(out) -> None:  # type: ignore[no-untyped-def]
        out.write(MAGIC + _COUNT.pack(len(keys)))
        for i in range(0, len(keys), BLOCK):
            pause()
            _write_block(out, keys[i : i + BLOCK], ids[i : i + BLOCK])
        _write_block(out, [], [])

    return _replace(path, write)


def save_functions(path: Path, saved: SavedFunctions, *, pause: Callable[[], None] = _go_on) -> int:
    """Writes a function index's saved form to ``path``, as save() does (``pause()`` before
    each section); returns the bytes written."""

    def write(out) -> None:  # type: ignore[no-untyped-def]
        out.write(FUNCTIONS_MAGIC)
        pause()
        _write_section(out, _packed("q", saved.ids))
        for values in saved[1:3]:
            pause()
            _write_section(out, _packed("i", values))
        pause()
        _write_section(out, "\n".join(saved.names).encode("utf-8", "surrogatepass"))
        for values in saved[4:]:
            pause()
            _write_section(out, _packed("i", values))

    return _replace(path, write)


def load_functions(path: Path) -> SavedFunctions:
    """Reads what save_functions() wrote. Raises FileNotFoundError when there is no file,
    IndexFileError when it cannot be read."""
    with path.open("rb") as f:
        if f.read(len(FUNCTIONS_MAGIC)) != FUNCTIONS_MAGIC:
            raise IndexFileError(f"{path}: not a function index of this version")
        ids = _unpacked("q", _read_section(f, path), path).tolist()
        lengths = _unpacked("i", _read_section(f, path), path)
        numbers = _unpacked("i", _read_section(f, path), path)
        text = _read_section(f, path)
        by_function = [_unpacked("i", _read_section(f, path), path) for _ in range(4)]
        if f.read(1):
            raise IndexFileError(f"{path}: more than it should hold")
    try:
        names = text.decode("utf-8", "surrogatepass").split("\n")
    except UnicodeDecodeError as exc:
        raise IndexFileError(f"{path}: {exc}") from None
    return SavedFunctions(ids, lengths, numbers, names, *by_function)


def _replace(path: Path, write) -> int:  # type: ignore[no-untyped-def]
    """Writes a new file at ``path`` with ``write(file)``, in place of the old one at once;
    returns its size."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    # Readable by the owner only (mkstemp's mode): frame names are the services' code.
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            write(out)
            written = out.tell()
            out.flush()
            os.fsync(out.fileno())  # on disk before it replaces the old file
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return written


def remove_stale_temporaries(path: Path, older_than: float = STALE_TEMPORARY) -> int:
    """Removes the temporary files of saves of ``path`` that were killed (a process stopped
    in the middle), once they are ``older_than`` seconds; returns how many."""
    removed = 0
    cutoff = time.time() - older_than
    try:
        for temporary in path.parent.glob(f"{path.name}*.tmp"):
            try:
                if temporary.stat().st_mtime < cutoff:
                    temporary.unlink()
                    removed += 1
            except FileNotFoundError:
                pass  # another process removed it, or finished its save
    except OSError:
        pass  # no directory yet, or not readable: nothing to remove
    return removed


def _packed(typecode: str, values: Sequence[int]) -> bytes:
    packed = values if isinstance(values, array) and values.typecode == typecode else None
    packed = array(typecode, values) if packed is None or _BIG_ENDIAN else packed
    if _BIG_ENDIAN:
        packed.byteswap()
    return packed.tobytes()


def _unpacked(typecode: str, data: bytes, path: Path) -> array[int]:
    values = array(typecode)
    if len(data) % values.itemsize:
        raise IndexFileError(f"{path}: a section of {len(data)} bytes")
    values.frombytes(data)
    if _BIG_ENDIAN:
        values.byteswap()
    return values


def _write_section(out, data: bytes) -> None:  # type: ignore[no-untyped-def]
    head = _COUNT.pack(len(data))
    out.write(head)
    out.write(data)
    out.write(_CRC.pack(zlib.crc32(data, zlib.crc32(head))))


def _read_section(f, path: Path) -> bytes:  # type: ignore[no-untyped-def]
    head = _read_exactly(f, _COUNT.size, path)
    data = _read_exactly(f, _COUNT.unpack(head)[0], path)
    (crc,) = _CRC.unpack(_read_exactly(f, _CRC.size, path))
    if crc != zlib.crc32(data, zlib.crc32(head)):
        raise IndexFileError(f"{path}: a section is damaged (CRC mismatch)")
    return data


def _write_block(out, keys: Sequence[str], ids: Sequence[int]) -> None:  # type: ignore[no-untyped-def]
    text = "\n".join(keys).encode("utf-8", "surrogatepass")  # frame names may hold any code point
    packed = array("q", ids)
    if _BIG_ENDIAN:
        packed.byteswap()
    block = b"".join(
        [
            _BLOCK_COUNT.pack(len(keys)),
            packed.tobytes(),
            _COUNT.pack(len(text)),
            text,
        ]
    )
    out.write(block)
    out.write(_CRC.pack(zlib.crc32(block)))


def count_in(path: Path) -> int | None:
    """Returns how many stacks a saved file (of either index) says it holds, or None if
    there is none to read."""
    try:
        with path.open("rb") as f:
            head = f.read(max(len(MAGIC), len(FUNCTIONS_MAGIC)) + _COUNT.size)
    except OSError:
        return None
    for magic, per_stack in ((MAGIC, 1), (FUNCTIONS_MAGIC, 8)):  # a count, or the ids' bytes
        if len(head) >= len(magic) + _COUNT.size and head.startswith(magic):
            return int(_COUNT.unpack_from(head, len(magic))[0]) // per_stack
    return None


def load(path: Path, max_chars: float = float("inf")) -> tuple[list[str], list[int]]:
    """Reads the sort keys and ids saved in ``path``, in order, block after block until the
    keys read hold ``max_chars`` characters. Raises FileNotFoundError when there is no file,
    IndexFileError when it cannot be read."""
    keys: list[str] = []
    ids: list[int] = []
    chars = 0
    with path.open("rb") as f:
        head = f.read(len(MAGIC) + _COUNT.size)
        if len(head) != len(MAGIC) + _COUNT.size or not head.startswith(MAGIC):
            raise IndexFileError(f"{path}: not a stack index of this version")
        total = _COUNT.unpack_from(head, len(MAGIC))[0]
        while chars < max_chars:  # as far as the bound holds: the rest is not read
            block_keys, block_ids, length = _read_block(f, path)
            if not block_ids:  # the end block
                if len(ids) != total:
                    raise IndexFileError(f"{path}: {len(ids)} stacks, its header says {total}")
                break
            keys += block_keys
            ids += block_ids
            chars += length  # bytes: at least as many as characters
    # What the index relies on, checked (~40 ms for 200,000 stacks).
    if not all(map(le, keys, islice(keys, 1, None))):
        raise IndexFileError(f"{path}: its keys are not in order")
    if len(set(ids)) != len(ids):
        raise IndexFileError(f"{path}: a stack twice")
    return keys, ids


def _read_block(f, path: Path) -> tuple[list[str], list[int], int]:  # type: ignore[no-untyped-def]
    """Reads one block: its keys, their ids and the keys' length in bytes."""
    head = _read_exactly(f, _BLOCK_COUNT.size, path)
    (count,) = _BLOCK_COUNT.unpack(head)
    if count > BLOCK:
        raise IndexFileError(f"{path}: a block of {count} stacks")
    raw_ids = _read_exactly(f, 8 * count, path)
    raw_length = _read_exactly(f, _COUNT.size, path)
    (length,) = _COUNT.unpack(raw_length)
    text = _read_exactly(f, length, path)
    (crc,) = _CRC.unpack(_read_exactly(f, _CRC.size, path))
    crc_now = zlib.crc32(text, zlib.crc32(raw_length, zlib.crc32(raw_ids, zlib.crc32(head))))
    if crc != crc_now:
        raise IndexFileError(f"{path}: a block is damaged (CRC mismatch)")
    ids = array("q")
    ids.frombytes(raw_ids)
    if _BIG_ENDIAN:
        ids.byteswap()
    try:
        keys = text.decode("utf-8", "surrogatepass").split("\n") if count else []
    except UnicodeDecodeError as exc:
        raise IndexFileError(f"{path}: {exc}") from None
    if len(keys) != count:
        raise IndexFileError(f"{path}: a block of {count} stacks holds {len(keys)} keys")
    return keys, ids.tolist(), length


def _read_exactly(f, size: int, path: Path) -> bytes:  # type: ignore[no-untyped-def]
    if size > os.fstat(f.fileno()).st_size - f.tell():  # a damaged length: allocate nothing
        raise IndexFileError(f"{path}: truncated")
    data = f.read(size)
    if len(data) != size:
        raise IndexFileError(f"{path}: truncated")
    return data
