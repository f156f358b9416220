"""The stack and function indexes saved to files by one process and loaded by the next
(webui.indexfile)."""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import time
from pathlib import Path

import pytest
from test_web_functable import Reader, by_text, fleet
from test_web_model_stackindex import Names, catalogue
from webhelpers import T0

from collector.functions import FunctionSamples
from sampler.profile.frames import escape_frame
from webui import indexfile, warmup
from webui.db import Database
from webui.functable import FunctionIndex
from webui.model import StackIndex, top_functions
from webui.params import Selection
from webui.warmup import Warmer, save_wait

HOSTILE = Path(__file__).parents[1] / "data" / "hostile_frames.json"
HOUR = Selection(T0, T0 + 3600)


def learned_index(names: dict[int, str]) -> StackIndex:
    """An index that has read every stack of ``names``."""
    index = StackIndex(Names(names))
    index.arrange([dict.fromkeys(names, 1)])
    return index


def hostile_names() -> dict[int, str]:
    """Stacks of every hostile frame name of the shared fixture, escaped as the sampler does."""
    frames = [escape_frame(case["name"]) for case in json.loads(HOSTILE.read_text())["frames"]]
    rng = random.Random(7)
    stacks = {";".join(rng.sample(frames, rng.randint(1, 6))) for _ in range(500)}
    return {rng.getrandbits(63): stack for stack in sorted(stacks)}


def test_a_saved_index_loads_as_it_was(tmp_path, monkeypatch):
    monkeypatch.setattr(indexfile, "BLOCK", 97)  # several blocks, the last one short
    names = catalogue(random.Random(3), 400) | hostile_names()
    index = learned_index(names)
    keys, ids = index.known()
    path = tmp_path / "index" / "stacks.idx"
    assert indexfile.save(path, keys, ids) == path.stat().st_size
    assert path.stat().st_mode & 0o777 == 0o600
    assert indexfile.count_in(path) == len(ids)
    assert indexfile.load(path) == (keys, ids)

    # A new process's index, loaded from it, reads no text and sorts as the first did.
    reader = Names(names)
    loaded = StackIndex(reader)
    assert loaded.load(*indexfile.load(path)) == len(names)
    window = {sid: i + 1 for i, sid in enumerate(names) if i % 3}
    arranged, expected = loaded.arrange([window]), index.arrange([window])
    assert (arranged.keys, arranged.values) == (expected.keys, expected.values)
    assert loaded.folded(window) == index.folded(window) and reader.asked == []


class GivenUp(Exception):
    pass


def test_a_save_pauses_before_each_block_and_can_be_given_up(tmp_path, monkeypatch):
    monkeypatch.setattr(indexfile, "BLOCK", 10)
    keys, ids = learned_index(catalogue(random.Random(5), 100)).known()
    path = tmp_path / "stacks.idx"
    pauses: list[int] = []
    indexfile.save(path, keys[:50], ids[:50], pause=lambda: pauses.append(1))
    assert len(pauses) == 5

    def give_up_at_the_third() -> None:
        pauses.append(1)
        if len(pauses) == 8:
            raise GivenUp

    with pytest.raises(GivenUp):
        indexfile.save(path, keys, ids, pause=give_up_at_the_third)
    # The old file whole, and no temporary file left.
    assert indexfile.load(path) == (keys[:50], ids[:50])
    assert [p.name for p in tmp_path.iterdir()] == ["stacks.idx"]


def test_a_save_waits_between_blocks_while_a_request_is_served(fleet_url, tmp_path, monkeypatch):
    monkeypatch.setattr(indexfile, "BLOCK", 1)
    database = Database(fleet_url, warm_hours=0, index_dir=str(tmp_path), save_every=0.05)
    blocks: list[tuple[int, bool, float]] = []  # its stacks, idle then, when written
    ended: list[float] = []
    real = indexfile._write_block

    def end_request() -> None:
        ended.append(time.monotonic())
        database.serving(-1)

    def write_block(out, keys, ids) -> None:  # type: ignore[no-untyped-def]
        if not blocks:  # a request comes as the first block is written, served for 0.3 s
            database.serving(1)
            threading.Timer(0.3, end_request).start()
        blocks.append((len(keys), database.idle(), time.monotonic()))
        real(out, keys, ids)

    monkeypatch.setattr(indexfile, "_write_block", write_block)
    try:
        database.profile(HOUR)  # stacks learned after warming (none): saved later
        warmer = database.warmer
        assert warmer is not None and eventually(lambda: warmer.saves) == 1
    finally:
        database.close()
    (path,) = tmp_path.glob("stacks-*.idx")
    assert indexfile.count_in(path) == sum(count for count, _, _ in blocks) >= 3
    # Not one block more while the request was served: the rest waited for its end.
    assert all(idle and at >= ended[0] for _, idle, at in blocks[1:])


def test_a_save_waiting_for_a_request_is_given_up_when_the_server_stops(
    fleet_url, tmp_path, monkeypatch
):
    monkeypatch.setattr(indexfile, "BLOCK", 1)
    database = Database(fleet_url, warm_hours=0, index_dir=str(tmp_path), save_every=0.05)
    begun = threading.Event()
    real = indexfile._write_block

    def write_block(out, keys, ids) -> None:  # type: ignore[no-untyped-def]
        if not begun.is_set():  # a request still served when the server stops
            database.serving(1)
            begun.set()
        real(out, keys, ids)

    monkeypatch.setattr(indexfile, "_write_block", write_block)
    try:
        database.profile(HOUR)
        warmer = database.warmer
        assert warmer is not None and begun.wait(30)
    finally:
        began = time.monotonic()
        database.close()
    assert time.monotonic() - began < 5 and warmer.saves == 0
    assert list(tmp_path.iterdir()) == []  # nothing saved, no temporary file left


def test_a_save_waits_for_requests_only_so_long(fleet_url, tmp_path, monkeypatch):
    monkeypatch.setattr(indexfile, "BLOCK", 1)
    monkeypatch.setattr(warmup, "SAVE_PATIENCE", 0.3)
    database = Database(fleet_url, warm_hours=0, index_dir=str(tmp_path), save_every=0.05)
    database.serving(1)  # a request served all along: a server that is never idle
    try:
        began = time.monotonic()
        database.profile(HOUR)
        warmer = database.warmer
        assert warmer is not None and eventually(lambda: warmer.saves) == 1
        # It waited (once for the whole save), then saved beside the request.
        assert 0.3 <= time.monotonic() - began < 10
    finally:
        database.close()
    (path,) = tmp_path.glob("stacks-*.idx")
    assert indexfile.count_in(path) >= 3


def test_loading_stops_at_the_share_of_the_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(indexfile, "BLOCK", 50)
    names = catalogue(random.Random(4), 600)
    keys, ids = learned_index(names).known()
    path = tmp_path / "stacks.idx"
    indexfile.save(path, keys, ids)
    some_keys, some_ids = indexfile.load(path, max_chars=sum(map(len, keys[:120])))
    assert 120 <= len(some_ids) <= 170 and (some_keys, some_ids) == (keys[:150], ids[:150])

    index = StackIndex(Names(names), max_bytes=200_000)
    loaded = index.load(keys, ids, share=0.5)
    assert 0 < loaded < len(keys) and index.known() == (keys[:loaded], ids[:loaded])
    assert index._bytes <= 100_000  # the share of the bound, the order's overhead counted


@pytest.mark.parametrize(
    "damage",
    ["empty", "other version", "flipped bit", "truncated", "no end block", "count"],
)
def test_a_damaged_file_is_refused_whole(tmp_path, damage):
    names = catalogue(random.Random(5), 300)
    keys, ids = learned_index(names).known()
    path = tmp_path / "stacks.idx"
    indexfile.save(path, keys, ids)
    data = bytearray(path.read_bytes())
    head = len(indexfile.MAGIC)
    if damage == "empty":
        data = bytearray()
    elif damage == "other version":
        data[head - 2] = ord("2")
    elif damage == "flipped bit":
        data[len(data) // 2] ^= 0x10  # in the keys' text: the CRC tells
    elif damage == "truncated":
        data = data[: len(data) * 2 // 3]
    elif damage == "no end block":
        data = data[: -(4 + 8 + 8 + 4)]  # the end block: count, length, CRC (no ids, no text)
    else:
        data[head] += 1  # the header's count of stacks
    path.write_bytes(bytes(data))
    with pytest.raises(indexfile.IndexFileError):
        indexfile.load(path)


def test_the_file_is_named_by_the_database_without_its_password(tmp_path):
    first = indexfile.path_for(tmp_path, "postgresql+psycopg://app:secret@db:5432/prof")
    second = indexfile.path_for(tmp_path, "postgresql+psycopg://app:other@db:5432/prof")
    third = indexfile.path_for(tmp_path, "postgresql+psycopg://app:secret@db:5432/staging")
    assert first == second != third and "secret" not in str(first)


def eventually(value, timeout: float = 30):  # type: ignore[no-untyped-def]
    """Returns ``value()`` once it is true, or its last value after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not (found := value()) and time.monotonic() < deadline:
        time.sleep(0.02)
    return found


def reads_of(index: StackIndex) -> list[list[int]]:
    reads: list[list[int]] = []
    real = index.read_lines
    index.read_lines = lambda ids: reads.append(ids) or real(ids)  # type: ignore[method-assign]
    return reads


def saved_database(url: str, index_dir: Path) -> None:
    """Opens a database over ``url``, views its hour and waits until it has saved its index."""
    database = Database(url, warm_hours=0, index_dir=str(index_dir), save_every=0.05)
    try:
        database.profile(HOUR)  # its stacks are learned after warming (none): saved later
        warmer = database.warmer
        assert warmer is not None and eventually(lambda: warmer.saves) == 1
    finally:
        database.close()


def test_a_restarted_database_begins_with_the_saved_index(fleet_url, tmp_path, caplog):
    saved_database(fleet_url, tmp_path)
    (path,) = tmp_path.glob("*.idx")
    expected = Database(fleet_url, warm_hours=0)
    database = Database(fleet_url, warm_hours=0, index_dir=str(tmp_path), save_every=0.05)
    try:
        with caplog.at_level(logging.INFO, logger="webui.warmup"):
            database.open()
            reads = reads_of(database.index)
            assert database.profile(HOUR) == expected.profile(HOUR)
            assert database.warmer is not None and database.warmer.wait(30)
        assert reads == [] and database.warmer.loaded == indexfile.count_in(path) > 0
        assert "stack index loaded with" in caplog.text
        # It learned nothing the file lacks: it does not write the same file again.
        mtime = path.stat().st_mtime_ns
        time.sleep(0.3)
        assert database.warmer.saves == 0 and path.stat().st_mtime_ns == mtime
    finally:
        database.close()
        expected.close()


def test_a_request_during_the_load_waits_for_it(fleet_url, tmp_path, monkeypatch):
    saved_database(fleet_url, tmp_path)
    real = indexfile.load

    def slow_load(path, max_chars=float("inf")):  # type: ignore[no-untyped-def]
        time.sleep(0.5)
        return real(path, max_chars)

    monkeypatch.setattr(indexfile, "load", slow_load)
    database = Database(fleet_url, warm_hours=0, index_dir=str(tmp_path))
    try:
        reads = reads_of(database.index)  # opens it: the load begins
        began = time.monotonic()
        assert sum(database.profile(HOUR).values()) > 0
        assert reads == [] and time.monotonic() - began >= 0.3
    finally:
        database.close()


def test_stacks_the_store_lacks_are_not_saved(tmp_path):
    names = catalogue(random.Random(6), 50)
    index = StackIndex(Names(names))
    missing = 4242
    index.arrange([dict.fromkeys([*names, missing], 1)])
    warmer = Warmer(
        None,  # type: ignore[arg-type]  # it only saves here
        index,
        hours=0,
        bucket_seconds=60,
        index_file=tmp_path / "stacks.idx",
    )
    assert warmer._save(tmp_path / "stacks.idx")
    keys, ids = indexfile.load(tmp_path / "stacks.idx")
    assert missing not in ids and len(ids) == len(names)
    assert not any(key.startswith("[unknown stack") for key in keys)


def test_a_damaged_file_is_logged_and_the_views_read_the_store(fleet_url, tmp_path, caplog):
    saved_database(fleet_url, tmp_path)
    (path,) = tmp_path.glob("*.idx")
    data = bytearray(path.read_bytes())
    data[-30] ^= 0xFF
    path.write_bytes(bytes(data))
    expected = Database(fleet_url, warm_hours=0)
    database = Database(fleet_url, warm_hours=0, index_dir=str(tmp_path))
    try:
        with caplog.at_level(logging.WARNING, logger="webui.warmup"):
            assert database.profile(HOUR) == expected.profile(HOUR)
            assert database.warmer is not None and database.warmer.wait(30)
        assert database.warmer.loaded == 0
        assert "could not load the saved stack index" in caplog.text
    finally:
        database.close()
        expected.close()


def test_a_directory_it_cannot_write_is_warned_of_once_and_tried_until_it_can(
    fleet_url, tmp_path, caplog
):
    folder = tmp_path / "index"
    folder.write_text("not a directory yet")
    database = Database(fleet_url, warm_hours=0, index_dir=str(folder), save_every=0.02)
    try:
        with caplog.at_level(logging.DEBUG, logger="webui.warmup"):
            assert sum(database.profile(HOUR).values()) > 0
            assert eventually(lambda: caplog.text.count("could not save the stack index") >= 3)
            database.profile(Selection(T0 + 60, T0 + 120))
            failed = [r.levelno for r in caplog.records if "could not save" in r.getMessage()]
            assert failed == [logging.WARNING] + [logging.DEBUG] * (len(failed) - 1)
            assert folder.read_text() == "not a directory yet"
            assert os.listdir(tmp_path) == ["index"]  # no temporary file left behind
            assert sum(database.profile(HOUR).values()) > 0  # the views go on meanwhile
            folder.unlink()
            folder.mkdir()
            warmer = database.warmer
            assert warmer is not None and eventually(lambda: warmer.saves == 1, timeout=10)
        assert list(folder.glob("stacks-*.idx"))
    finally:
        database.close()


def test_the_wait_after_failed_saves_doubles_up_to_an_hour():
    waits = [save_wait(300, failures) for failures in range(6)]
    assert waits == [300, 600, 1200, 2400, 3600, 3600]
    assert save_wait(0.02, 2) == pytest.approx(0.08)
    assert save_wait(7200, 3) == 7200  # a period longer than the ceiling stays the period


def functions_of(texts: dict[int, str]) -> FunctionIndex:
    """A function index that has numbered the functions of every stack of ``texts``."""
    index = FunctionIndex(Reader(texts))
    index.table(dict.fromkeys(texts, 1))
    return index


def same_tables(loaded: FunctionIndex, texts: dict[int, str], seed: int) -> None:
    rng = random.Random(seed)
    for size in (len(texts), len(texts) // 2, 30, 3):  # by function, then stack by stack
        counts = {sid: rng.randint(1, 9) for sid in rng.sample(sorted(texts), size)}
        expected = FunctionSamples.of(by_text(texts, counts))
        assert loaded.table(counts) == expected, size
        assert top_functions(loaded.table(counts, limit=3), limit=3) == top_functions(
            expected, limit=3
        )


def test_a_saved_function_index_loads_as_it_was(tmp_path):
    texts = fleet(400) | {7: "h:%3Bx;é;\ud800 lone", 8: ""}
    path = tmp_path / "functions.idx"
    indexfile.save_functions(path, functions_of(texts).saved_form())
    assert path.stat().st_mode & 0o777 == 0o600 and indexfile.count_in(path) == len(texts)
    reader = Reader(texts)
    loaded = FunctionIndex(reader)
    assert loaded.load(indexfile.load_functions(path)) == len(texts)
    same_tables(loaded, texts, seed=1)
    assert reader.reads == []  # nothing numbered anew


def test_saved_functions_without_the_stacks_the_store_lacked(tmp_path):
    texts = fleet(200)
    index = FunctionIndex(Reader(texts))
    index.table(dict.fromkeys([*texts, 4242], 1))  # 4242: not in the store, a placeholder
    saved = index.saved_form()
    assert 4242 not in saved.ids and len(saved.ids) == len(texts)
    assert len(saved.stack_counts) == 0  # the lists by function are rebuilt at load
    loaded = FunctionIndex(Reader(texts))
    assert loaded.load(saved) == len(texts)
    same_tables(loaded, texts, seed=2)


def test_saved_functions_load_as_far_as_the_bound_holds(tmp_path):
    texts = fleet(400)
    saved = functions_of(texts).saved_form()
    reader = Reader(texts)
    loaded = FunctionIndex(reader, max_bytes=40_000)
    assert 0 < loaded.load(saved, share=0.5) < len(texts)
    same_tables(loaded, texts, seed=3)  # what it lacks, it numbers from the text
    assert reader.reads


@pytest.mark.parametrize("damage", ["flipped bit", "truncated", "a length", "other version"])
def test_a_damaged_function_file_is_refused_whole(tmp_path, damage):
    path = tmp_path / "functions.idx"
    indexfile.save_functions(path, functions_of(fleet(300)).saved_form())
    data = bytearray(path.read_bytes())
    head = len(indexfile.FUNCTIONS_MAGIC)
    if damage == "flipped bit":
        data[len(data) // 2] ^= 0x04
    elif damage == "truncated":
        data = data[:-5]
    elif damage == "a length":
        data[head + 7] = 0x7F  # the ids' length: far past the end of the file
    else:
        data[head - 2] = ord("9")
    path.write_bytes(bytes(data))
    with pytest.raises(indexfile.IndexFileError):
        indexfile.load_functions(path)


def test_saved_functions_that_do_not_hold_together_are_numbered_anew(caplog):
    texts = fleet(100)
    saved = functions_of(texts).saved_form()
    broken = saved._replace(lengths=saved.lengths[:-1])
    reader = Reader(texts)
    loaded = FunctionIndex(reader)
    loaded.defer_load(lambda: broken, 0.8)
    with caplog.at_level(logging.WARNING, logger="webui.functable"):
        same_tables(loaded, texts, seed=4)
    assert "could not load the saved function index" in caplog.text and reader.reads


def test_a_restarted_database_tables_its_functions_without_reading_stacks(fleet_url, tmp_path):
    first = Database(fleet_url, warm_hours=0, index_dir=str(tmp_path), save_every=0.05)
    try:
        expected, _interval = first.function_samples(HOUR)
        warmer = first.warmer
        assert warmer is not None and eventually(lambda: warmer.function_saves) == 1
    finally:
        first.close()
    database = Database(fleet_url, warm_hours=0, index_dir=str(tmp_path))
    try:
        reads: list[list[int]] = []
        functions = database.functions
        functions.read_lines = lambda ids: reads.append(ids) or ([], "")  # type: ignore[method-assign]
        samples, _interval = database.function_samples(HOUR)
        assert samples == expected and reads == [] and functions.loaded > 0
    finally:
        database.close()


def warmed_database(url: str, index_dir: Path) -> Database:
    """A database over ``url`` that warms the stacks and functions of its fleet's hours."""
    database = Database(url, warm_hours=2, index_dir=str(index_dir), save_every=0.05)
    database.clock = lambda: T0 + 5400
    return database


def test_a_restart_that_learned_nothing_copies_no_index_to_save(fleet_url, tmp_path):
    first = warmed_database(fleet_url, tmp_path)
    try:
        first.open()
        warmer = first.warmer
        assert warmer is not None and eventually(lambda: warmer.function_saves) == 1
    finally:
        first.close()
    database = warmed_database(fleet_url, tmp_path)
    functions = database.functions
    copies: list[int] = []
    real = functions.saved_form
    functions.saved_form = lambda: copies.append(1) or real()  # type: ignore[method-assign]
    try:
        database.open()
        warmer = database.warmer
        assert warmer is not None and warmer.wait(30)
        assert warmer.loaded > 0 and len(functions) > 0  # both files taken in
        time.sleep(0.3)  # the saver looks every 0.05 s
        # Its functions as the file holds them: not copied out to be found already saved
        # (~0.7 s for 200,000 stacks, just as the first requests come).
        assert copies == [] and warmer.function_saves == 0 and warmer.saves == 0
    finally:
        database.close()


@pytest.mark.parametrize("flaw", ["out of order", "a stack twice"])
def test_a_file_the_index_could_not_rely_on_is_refused(tmp_path, flaw):
    keys, ids = learned_index(catalogue(random.Random(8), 100)).known()
    if flaw == "out of order":
        keys = [keys[1], keys[0], *keys[2:]]
    else:
        ids = [ids[1], *ids[1:]]
    path = tmp_path / "stacks.idx"
    indexfile.save(path, keys, ids)  # written whole, its CRCs right: refused for what it says
    with pytest.raises(indexfile.IndexFileError, match=flaw.split()[-1]):
        indexfile.load(path)


def test_temporary_files_of_killed_saves_are_removed_once_old(tmp_path):
    path = tmp_path / "stacks-1.idx"
    old, fresh, other = (
        tmp_path / name for name in ("stacks-1.idxab.tmp", "stacks-1.idxcd.tmp", "x.tmp")
    )
    for temporary in (old, fresh, other):
        temporary.write_bytes(b"half a save")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    os.utime(other, (time.time() - 3600, time.time() - 3600))
    assert indexfile.remove_stale_temporaries(path) == 1
    assert not old.exists() and fresh.exists() and other.exists()
    assert indexfile.remove_stale_temporaries(tmp_path / "nowhere" / "stacks-1.idx") == 0


def test_an_unreadable_file_is_replaced_at_the_next_save(fleet_url, tmp_path, caplog):
    saved_database(fleet_url, tmp_path)
    (path,) = tmp_path.glob("stacks-*.idx")
    # A header that claims more stacks than any index will hold, over a body that is damaged.
    data = bytearray(path.read_bytes())
    data[len(indexfile.MAGIC)] = 0xFF
    data[-30] ^= 0xFF
    path.write_bytes(bytes(data))
    database = Database(fleet_url, warm_hours=2, index_dir=str(tmp_path), save_every=0.05)
    database.clock = lambda: T0 + 5400
    try:
        with caplog.at_level(logging.WARNING, logger="webui.warmup"):
            database.open()
            warmer = database.warmer
            assert warmer is not None and warmer.wait(30) and warmer.learned > 0
            assert eventually(lambda: warmer.saves) == 1
        assert "could not load the saved stack index" in caplog.text
        assert indexfile.load(path)[1] == database.index.known()[1]
    finally:
        database.close()


@pytest.mark.parametrize("flaw", ["function number", "stack ordinal", "negative"])
def test_saved_functions_pointing_past_the_end_are_numbered_anew(flaw, caplog):
    texts = fleet(200)
    saved = functions_of(texts).saved_form()
    if flaw == "function number":
        numbers = saved.numbers[:]
        numbers[5] = len(saved.names) + 3
        saved = saved._replace(numbers=numbers)
    elif flaw == "stack ordinal":
        stacks = saved.stacks[:]
        stacks[-1] = len(saved.ids) + 7
        saved = saved._replace(stacks=stacks)
    else:
        stacks = saved.stacks[:]
        stacks[0] = -1
        saved = saved._replace(stacks=stacks)
    loaded = FunctionIndex(Reader(texts))
    loaded.defer_load(lambda: saved, 0.8)
    with caplog.at_level(logging.WARNING, logger="webui.functable"):
        same_tables(loaded, texts, seed=5)
        for sid, text in texts.items():  # each stack alone: counted stack by stack
            assert loaded.table({sid: 2}) == FunctionSamples.of({text: 2})
    assert "numbering anew" in caplog.text


def test_a_url_that_is_not_one_leaves_the_index_unsaved(tmp_path):
    database = Database("not a url", index_dir=str(tmp_path))
    assert database.index_file is None and database.functions_file is None
