"""/dump's pure part: frames and thread facts in, text or JSON out."""

import json
import sys
import threading

import pytest

from sampler._dump import ThreadInfo, render_json, render_text, threads_of

# Pure rendering, no clock: runs beside other tests (tests/conftest.py).
pytestmark = pytest.mark.parallel


def inner(here):
    here.append(sys._getframe())
    return here


def outer():
    return inner([])[0]


def test_frames_are_leaf_first_with_module_qualname_file_and_line():
    frame = outer()
    info = {1: ThreadInfo("worker", 4243, True, "idle")}
    (stack,) = threads_of({1: frame}, info)
    names = [f.name for f in stack.frames]
    assert names[:2] == ["test_dump:inner", "test_dump:outer"]
    assert stack.frames[0].file == __file__ and stack.frames[0].line == frame.f_lineno
    text = render_text([stack], pid=4242)
    lines = text.splitlines()
    assert lines[0] == "Process 4242: 1 thread (the sampler's own left out)"
    assert lines[2] == 'Thread 1 "worker" (native 4243, daemon, idle)'
    assert lines[3] == f"    test_dump:inner ({__file__}:{frame.f_lineno})"
    assert lines[4].startswith("    test_dump:outer (")


def test_threads_come_oldest_first_and_unknown_ones_say_so():
    frame = outer()
    info = {
        7: ThreadInfo("late", 300, False, "active"),
        5: ThreadInfo("MainThread", 100, False, "idle"),
    }
    stacks = threads_of({7: frame, 9: frame, 5: frame}, info)
    assert [s.id for s in stacks] == [5, 7, 9]
    text = render_text(stacks, pid=1)
    assert 'Thread 9 "?" (native ?, unknown)' in text
    assert 'Thread 7 "late" (native 300, active)' in text


def hostile():
    return sys._getframe()


def test_hostile_names_cannot_add_lines_or_fake_threads():
    evil = 'x\n\nThread 1 "MainThread" (native 1, idle)\n    fake (f.py:1)'
    code = hostile.__code__.replace(co_qualname=evil, co_filename="a.py:1)\nThread 2")
    frame = type(hostile)(code, {"__name__": "mod;ule", "sys": sys})()
    info = {3: ThreadInfo('t"\nThread 4', 5, False, "idle")}
    stacks = threads_of({3: frame}, info)
    text = render_text(stacks, pid=1)
    lines = text.splitlines()
    assert sum(line.startswith("Thread ") for line in lines) == 1
    assert all(line.startswith("    ") for line in lines[3:])  # frame lines only
    assert lines[2] == 'Thread 3 "t%22%0AThread 4" (native 5, idle)'
    assert lines[3].startswith("    mod%3Bule:x%0A%0AThread 1 %22MainThread%22")
    assert "(a.py:1)%0AThread 2:" in lines[3]
    doc = json.loads(render_json(stacks, pid=1, now=0.0))
    (thread,) = doc["threads"]
    assert thread["name"] == 't"\nThread 4'  # JSON carries names as they are
    assert thread["frames"][0]["name"].startswith("mod%3Bule:x%0A")  # a wire-format frame
    assert thread["frames"][0]["file"] == "a.py:1)\nThread 2"


def test_json_has_every_field():
    frame = outer()
    stacks = threads_of({1: frame}, {1: ThreadInfo("w", None, None, "unknown")})
    doc = json.loads(render_json(stacks, pid=42, now=1795423200.12345))
    assert doc["format"] == "fleetflame.dump/1"
    assert doc["pid"] == 42 and doc["time"] == 1795423200.123
    (thread,) = doc["threads"]
    assert set(thread) == {"id", "name", "native_id", "daemon", "state", "frames"}
    assert thread["native_id"] is None and thread["daemon"] is None
    assert thread["frames"][0] == {
        "name": "test_dump:inner",
        "file": __file__,
        "line": frame.f_lineno,
    }


def test_a_live_thread_is_read_from_its_frames():
    ready, done = threading.Event(), threading.Event()

    def parked_here():
        ready.set()
        done.wait()

    t = threading.Thread(target=parked_here, name="parked")
    t.start()
    ready.wait()
    try:
        frames = sys._current_frames()
        info = {t.ident: ThreadInfo(t.name, t.native_id, t.daemon, "idle")}
        stacks = {s.id: s for s in threads_of({t.ident: frames[t.ident]}, info)}
    finally:
        done.set()
        t.join()
    names = [f.name for f in stacks[t.ident].frames]
    assert "test_dump:test_a_live_thread_is_read_from_its_frames.<locals>.parked_here" in names
    assert names[-1] == "threading:Thread._bootstrap"
