"""The tracer at its edges: programs that end while the file is written, traces one after
another, odd targets and exits, profilers of the program's own, exceptions in the recorder.

Each runs a small program in a real process (``python -m sampler trace`` or
``sampler.trace()``) and reads what it wrote back.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from samplerhelpers import env
from test_trace import PYTHONS

pytestmark = pytest.mark.parallel  # none of these measures time

# Calls a function in a loop until the trace's temporary file appears beside OUT, that is until
# the file is being written (by the --seconds timer thread), then returns at once (or once it
# is written, should the write be missed).
UNTIL_WRITING = """
import glob, os, sys
def f(): pass
def until_writing(out):
    folder = os.path.dirname(out)
    while True:
        for _ in range(1000): f()
        if glob.glob(os.path.join(folder, ".fleetflame-trace-*")) or os.path.exists(out):
            return
"""


def python(tmp_path, source, *args, timeout=60, interpreter=sys.executable):
    """Runs ``source`` as a script in a fresh process; returns the completed process."""
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(source))
    return subprocess.run(
        [interpreter, str(script), *args],
        env=env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tmp_path,
    )


def trace(tmp_path, *args, output="run.json", timeout=60, interpreter=sys.executable):
    """Runs ``python -m sampler trace --output OUT args`` in ``tmp_path``."""
    return subprocess.run(
        [interpreter, "-m", "sampler", "trace", "--output", str(tmp_path / output), *args],
        env=env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tmp_path,
    )


def read(path):
    document = json.loads(path.read_text())
    return document["traceEvents"], document["otherData"]


def called(events):
    return {e["name"] for e in events if e["ph"] == "B"}


def test_a_program_exiting_while_seconds_writes_the_file_waits_for_it(tmp_path):
    out = tmp_path / "run.json"
    script = tmp_path / "prog.py"
    script.write_text(UNTIL_WRITING + "until_writing(sys.argv[1])\nprint('exits')\n")
    result = trace(tmp_path, "--seconds", "0.1", str(script), str(out))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "exits\n"
    assert result.stderr.count("written to") == 1
    events, meta = read(out)
    assert meta["stopped_by"] == "seconds" and "__main__:f" in called(events)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prog.py", "run.json"]


def test_a_block_ending_while_seconds_writes_the_file_waits_and_the_next_trace_starts(tmp_path):
    result = python(
        tmp_path,
        UNTIL_WRITING
        + """
        import sampler
        first, second = sys.argv[1], sys.argv[2]
        with sampler.trace(first, seconds=0.1) as t:
            until_writing(first)
        print(os.path.exists(first), t.metadata["stopped_by"], "write_seconds" in t.metadata)
        with sampler.trace(second) as t:  # the first stopped: one trace at a time allows it
            f()
        print(t.metadata["stopped_by"])
        """.replace("\n        ", "\n"),
        str(tmp_path / "first.json"),
        str(tmp_path / "second.json"),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["True seconds True", "end"]
    assert "__main__:f" in called(read(tmp_path / "first.json")[0])
    assert "__main__:f" in called(read(tmp_path / "second.json")[0])


def test_seconds_shorter_than_the_start_up_count_from_the_start_of_recording(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(
        "import time\ndef f(): pass\nend = time.time() + 0.3\nwhile time.time() < end: f()\n"
    )
    result = trace(tmp_path, "--seconds", "0.001", str(script))
    assert result.returncode == 0, result.stderr
    events, meta = read(tmp_path / "run.json")
    assert meta["stopped_by"] == "seconds"
    assert 0.001 <= meta["traced_seconds"] < 0.25  # not the time since the machine booted
    assert meta["events"] > 0 and called(events)  # runpy's, in a millisecond


def test_the_message_of_sys_exit_is_printed_as_python_prints_it(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text("import sys\nsys.exit('fatal: bad config')\n")
    result = trace(tmp_path, str(script))
    assert result.returncode == 1
    assert "fatal: bad config\n" in result.stderr
    assert "written to" in result.stderr


def test_a_missing_script_or_module_is_refused_before_anything_is_written(tmp_path):
    (tmp_path / "run.json").write_text("precious")
    for target in (["nosuch.py"], ["-m", "nosuchmodule"]):
        result = trace(tmp_path, *target)
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith("python -m sampler trace: no such file: 'nosuch.py'") or (
            "no module named 'nosuchmodule'" in result.stderr
        ), result.stderr
        assert "Traceback" not in result.stderr and "written to" not in result.stderr
        assert (tmp_path / "run.json").read_text() == "precious"


def test_a_directory_or_zip_target_is_named_main_as_run_names_it(tmp_path):
    import zipfile

    source = "def work():\n    return sum(range(10))\n\nwork()\n"
    (tmp_path / "appdir").mkdir()
    (tmp_path / "appdir" / "__main__.py").write_text(source)
    with zipfile.ZipFile(tmp_path / "app.zip", "w") as archive:
        archive.writestr("__main__.py", source)
    for target in ("appdir", "app.zip", str(tmp_path / "appdir")):
        result = trace(tmp_path, target)
        assert result.returncode == 0, result.stderr
        names = called(read(tmp_path / "run.json")[0])
        assert {"__main__:<module>", "__main__:work"} <= names, (target, sorted(names))


@pytest.mark.parametrize("interpreter", PYTHONS)
def test_c_methods_of_classes_keep_no_object_per_call(tmp_path, interpreter):
    # A class's C method (datetime.now, dict.fromkeys) is a new bound method at every call:
    # the trace must keep a key naming it, not each one (16 bytes an event, as documented).
    result = python(
        tmp_path,
        """
        import datetime, sys, sampler
        from sampler import _trace
        with sampler.trace(sys.argv[1]):
            for _ in range(20_000):
                datetime.datetime.now()
                dict.fromkeys(())
            objs = _trace._active._recorder.buffers[0].objs  # this thread's
            kept = len(set(map(id, objs)))  # C calling C: not recorded
        print(kept)
        """,
        str(tmp_path / "run.json"),
        interpreter=interpreter,
    )
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) < 500  # one per function called, not 40,000
    names = called(read(tmp_path / "run.json")[0])
    assert {"datetime:datetime.now", "builtins:dict.fromkeys"} <= names, sorted(names)


@pytest.mark.parametrize("interpreter", PYTHONS)
def test_a_trace_inside_cprofile_refuses_before_3_12_and_leaves_cprofile_working(
    tmp_path, interpreter
):
    result = python(
        tmp_path,
        """
        import cProfile, pstats, sys, sampler
        def inside(): pass
        def after(): pass
        profile = cProfile.Profile()
        profile.enable()
        try:
            with sampler.trace(sys.argv[1]):
                inside()
        except RuntimeError as exc:  # TraceError
            print("refused:", exc)
        after()
        profile.disable()
        counted = {f[2]: s[0] for f, s in pstats.Stats(profile).stats.items()}
        print(counted.get("inside", 0), counted.get("after", 0))
        """,
        str(tmp_path / "run.json"),
        interpreter=interpreter,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    if interpreter == sys.executable and sys.version_info < (3, 12):
        assert "refused: a profiler written in C holds this thread's profile function" in lines[0]
        assert "cProfile.Profile" in lines[0] and lines[1] == "0 1"
    else:  # cProfile on sys.monitoring's PROFILER_ID: the trace takes another tool id
        assert lines == ["1 1"]
        assert read(tmp_path / "run.json")[1]["backend"] == "sys.monitoring"
        assert "__main__:inside" in called(read(tmp_path / "run.json")[0])


def test_trace_run_under_cprofile_refuses_with_status_2(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text("pass\n")
    result = subprocess.run(
        [sys.executable, "-m", "cProfile", "-m", "sampler", "trace", str(script)],
        env=env(),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    if sys.version_info < (3, 12):
        assert "python -m sampler trace: a profiler written in C" in result.stderr
        assert "Traceback" not in result.stderr and not (tmp_path / "trace.json").exists()
    else:
        assert (tmp_path / "trace.json").exists(), result.stderr


NEWER = [p for p in PYTHONS if p != sys.executable or sys.version_info >= (3, 12)]


@pytest.mark.skipif(not NEWER, reason="no Python 3.12+ on this machine")
@pytest.mark.parametrize("interpreter", NEWER)
def test_a_traced_program_can_enable_cprofile_and_coverage_on_3_12(tmp_path, interpreter):
    script = tmp_path / "prog.py"
    script.write_text(
        textwrap.dedent(
            """
            import cProfile, pstats, sys
            def step(): pass
            profile = cProfile.Profile()  # sys.monitoring's PROFILER_ID
            profile.enable(); step(); profile.disable()
            counted = {f[2]: s[0] for f, s in pstats.Stats(profile).stats.items()}
            m = sys.monitoring  # as coverage.py takes COVERAGE_ID
            m.use_tool_id(m.COVERAGE_ID, "coverage"); m.free_tool_id(m.COVERAGE_ID)
            print(counted["step"])
            """
        )
    )
    result = trace(tmp_path, str(script), interpreter=interpreter)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "1\n"
    events, meta = read(tmp_path / "run.json")
    assert meta["backend"] == "sys.monitoring" and not meta["notes"]
    assert "__main__:step" in called(events)


@pytest.mark.parametrize("interpreter", PYTHONS)
def test_short_lived_threads_are_named(tmp_path, interpreter):
    script = tmp_path / "prog.py"
    script.write_text(
        "import threading\n"
        "def tiny(i): return i + 1\n"
        "for i in range(20):\n"
        "    t = threading.Thread(target=tiny, args=(i,), name=f'tiny-{i}'); t.start(); t.join()\n"
    )
    result = trace(tmp_path, str(script), interpreter=interpreter)
    assert result.returncode == 0, result.stderr
    events, meta = read(tmp_path / "run.json")
    names = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert names == {"MainThread", *(f"tiny-{i}" for i in range(20))}
    assert not meta["notes"]  # threads that ended were not taken as stopped early


@pytest.mark.parametrize("interpreter", PYTHONS)
def test_code_made_by_exec_is_named_by_its_globals_as_the_sampler_names_it(tmp_path, interpreter):
    script = tmp_path / "prog.py"
    script.write_text(
        textwrap.dedent(
            """
            import collections, dataclasses
            @dataclasses.dataclass
            class Point:
                x: int
            P = collections.namedtuple("P", "a b")
            exec("def made(): return [i for i in range(2)]", globals())
            for i in range(3):
                Point(i); P(i, i); made()
            """
        )
    )
    result = trace(tmp_path, str(script), interpreter=interpreter)
    assert result.returncode == 0, result.stderr
    names = called(read(tmp_path / "run.json")[0])
    expected = {
        "__main__:__create_fn__",  # dataclasses' exec'd maker, gone by the end
        "__main__:__create_fn__.<locals>.__init__",
        "namedtuple_P:<lambda>",  # namedtuple's __new__, eval'd in a namespace of that name
        "__main__:made",
    }
    assert expected <= names, sorted(names)
    assert not [n for n in names if n.startswith("<string>:") and ("made" in n or "__" in n)]


@pytest.mark.parametrize("interpreter", PYTHONS)
def test_an_exception_inside_the_recorder_is_told_with_what_was_lost(tmp_path, interpreter):
    # Before 3.12 CPython removes a profile function that raises: at the recursion limit the
    # call of the recorder itself raises, and a signal handler runs inside it. A thread and
    # the main thread each lose their recording so; sys.monitoring (3.12+) keeps recording.
    script = tmp_path / "prog.py"
    script.write_text(
        textwrap.dedent(
            """
            import signal, threading
            def deep(n): return deep(n + 1)
            def recurse():
                try: deep(0)
                except RecursionError: pass
            worker = threading.Thread(target=recurse, name="recurser"); worker.start(); worker.join()
            class Timeout(Exception): pass
            tries = []
            def handler(signum, frame):
                tries.append(1)  # in the loop, not the recorder: again (2 s at most)
                if frame.f_code.co_name == "spin" and len(tries) < 400:
                    signal.setitimer(signal.ITIMER_REAL, 0.005)
                    return
                raise Timeout()
            signal.signal(signal.SIGALRM, handler)
            def spin():
                while True: len("x")
            signal.setitimer(signal.ITIMER_REAL, 0.05)
            try: spin()
            except Timeout: pass
            def after(): pass
            for _ in range(10): after()
            """
        )
    )
    result = trace(tmp_path, str(script), interpreter=interpreter)
    assert result.returncode == 0, result.stderr
    events, meta = read(tmp_path / "run.json")
    after = sum(1 for e in events if e.get("name") == "__main__:after")
    if meta["backend"] == "sys.monitoring":
        assert after == 10 and not meta["notes"]
        return
    assert after == 0
    lost = [n for n in meta["notes"] if n.startswith("recording stopped early in thread")]
    assert len(lost) == 2, meta["notes"]
    assert "'recurser'" in lost[1] and "RecursionError" in lost[1]
    assert "'MainThread'" in lost[0] and "signal handler" in lost[0]
    assert result.stderr.count("recording stopped early") == 2
    # The calls open when recording stopped end at its last event, not at the end of the trace.
    when = float(lost[0].split(" at ")[1].split(" s,")[0]) * 1e6
    main = next(e["tid"] for e in events if e.get("args", {}).get("name") == "MainThread")
    assert max(e["ts"] for e in events if e["tid"] == main and "ts" in e) <= when + 1  # us
