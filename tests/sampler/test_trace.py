"""``python -m sampler trace`` and ``sampler.trace()``: an exact call timeline of real programs.

Each test runs workloads/traced.py, a program of known call structure (nested calls, a thread,
an exception unwinding through frames, a generator, asyncio), in a real process, reads the
Trace Event file back, checks that every thread's "B"/"E" events nest, and finds the call
tree it must hold, with the planted 50 ms sleep's duration.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

import pytest
from samplerhelpers import ROOT, WORKLOADS, env

from sampler._trace_format import thread_lines

PROGRAM = WORKLOADS / "traced.py"
PLANTED_US = 50_000


@dataclass
class Call:
    name: str
    start: float
    end: float = -1.0
    args: dict = field(default_factory=dict)
    children: list[Call] = field(default_factory=list)

    @property
    def duration(self) -> float:
        return self.end - self.start

    def walk(self):
        yield self
        for child in self.children:
            yield from child.walk()

    def find(self, name):
        return [call for call in self.walk() if call.name == name]


def read_trace(path):
    """Parses a trace, checks each thread's events nest, and returns (threads, metadata):
    thread name -> a root Call holding that thread's top-level calls."""
    document = json.loads(path.read_text())
    assert document["displayTimeUnit"] == "ms"
    names = {}
    stacks = {}
    roots = {}
    last_ts = {}
    for event in document["traceEvents"]:
        tid = event["tid"]
        assert event["pid"] == document["traceEvents"][0]["pid"]
        if event["ph"] == "M":
            if event["name"] == "thread_name":
                names[tid] = event["args"]["name"]
            continue
        assert event["ph"] in ("B", "E"), event
        # In time order within a thread, so a viewer's sort by time cannot reorder them.
        assert event["ts"] >= last_ts.get(tid, 0.0), event
        last_ts[tid] = event["ts"]
        stack = stacks.setdefault(tid, [roots.setdefault(tid, Call("<thread>", 0.0))])
        if event["ph"] == "B":
            call = Call(event["name"], event["ts"], args=event.get("args", {}))
            stack[-1].children.append(call)
            stack.append(call)
        else:
            assert len(stack) > 1, f"an E with no open B on thread {tid}"
            stack.pop().end = event["ts"]
    for tid, stack in stacks.items():
        assert len(stack) == 1, f"thread {tid} ends with {len(stack) - 1} calls open"
    assert set(roots) <= set(names), "every thread with events is named"
    return {names[tid]: root for tid, root in roots.items()}, document["otherData"]


@pytest.mark.parallel
def test_each_thread_is_written_well_nested():
    # A return from before the trace, a call of the tracer (hidden with what it calls), and a
    # call still open at the end, in one thread's events.
    times = [1000, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000]
    objs = [None, "a", "b", None, "tracer", "c", None, None, "d"]

    def fragment(obj):
        return None if obj == "tracer" else f'"name":"{obj}"'

    def events(end):
        lines = thread_lines(times, objs, 0, end, 7, 8, fragment)
        return [(e["ph"], e["ts"], e.get("name")) for e in map(json.loads, lines)]

    assert events(10_000) == [
        ("B", 2.0, "a"),
        ("B", 3.0, "b"),
        ("E", 4.0, None),
        ("B", 9.0, "d"),
        ("E", 10.0, None),
        ("E", 10.0, None),
    ]
    # Stopped inside the tracer's call: what came after is cut, what is open ends then.
    assert events(6500) == [("B", 2.0, "a"), ("B", 3.0, "b"), ("E", 4.0, None), ("E", 6.5, None)]


def newer_pythons():
    """Interpreters with sys.monitoring (3.12+) on this machine, one per version."""
    candidates = glob.glob("/root/.pyenv/versions/3.1[2-9]*/bin/python3")
    candidates += glob.glob("/usr/bin/python3.1[2-9]")
    candidates += [shutil.which(f"python3.{minor}") or "" for minor in range(12, 16)]
    found = {}
    for path in filter(None, candidates):
        try:
            version = subprocess.run(
                [path, "-c", "import sys; print(*sys.version_info[:2])"],
                capture_output=True,
                text=True,
                timeout=30,
            ).stdout.split()
        except (OSError, subprocess.TimeoutExpired):
            continue
        if len(version) == 2 and (int(version[0]), int(version[1])) >= (3, 12):
            found.setdefault(".".join(version), path)
    return [found[v] for v in sorted(found)]


# This interpreter (sys.setprofile on 3.11), and each 3.12+ one found (sys.monitoring); where
# none is installed, the monitoring path goes untested.
PYTHONS = [
    sys.executable,
    *(p for p in newer_pythons() if os.path.realpath(p) != os.path.realpath(sys.executable)),
]


def backend_of(python):
    return (
        "sys.setprofile"
        if python == sys.executable and sys.version_info < (3, 12)
        else "sys.monitoring"
    )


def trace(tmp_path, *args, python=sys.executable, output="run.json", **extra_env):
    out = tmp_path / output
    result = subprocess.run(
        [python, "-m", "sampler", "trace", "--output", str(out), *args],
        env=env(**extra_env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return out, result


def only(calls):
    assert len(calls) == 1, [c.name for c in calls]
    return calls[0]


def check_structure(threads, main_name="MainThread", module="__main__"):
    """Asserts the call tree workloads/traced.py's main() must leave."""
    main = only(threads[main_name].find(f"{module}:main"))
    top = [c.name for c in main.children]
    assert f"{module}:middle" in top and f"{module}:catcher" in top, top
    assert top.index(f"{module}:middle") < top.index(f"{module}:catcher")
    assert top.index(f"{module}:catcher") < top.index(f"{module}:consume")
    assert "asyncio.runners:run" in top

    middle = only([c for c in main.children if c.name == f"{module}:middle"])
    assert [c.name for c in middle.children] == [
        f"{module}:leaf",
        f"{module}:planted_sleep",
        f"{module}:leaf",
    ]
    sleep = only(middle.find(f"{module}:planted_sleep"))
    assert only(sleep.children).name == "time:sleep"
    assert PLANTED_US <= sleep.children[0].duration <= sleep.duration <= middle.duration
    assert middle.duration < 20 * PLANTED_US  # plausible: not the whole program
    line = next(
        i for i, text in enumerate(PROGRAM.read_text().splitlines(), 1) if text == "def middle():"
    )
    assert middle.args["file"].endswith(f"traced.py:{line}"), middle.args

    # The exception leaves raiser and unwinder; each is closed where it was left.
    catcher = only([c for c in main.children if c.name == f"{module}:catcher"])
    unwinder = only(catcher.find(f"{module}:unwinder"))
    raiser = only(unwinder.find(f"{module}:raiser"))
    assert catcher.start <= unwinder.start <= raiser.start <= raiser.end <= unwinder.end

    # A generator is a call each time it is resumed: three yields and the end.
    consume = only([c for c in main.children if c.name == f"{module}:consume"])
    assert len(consume.find(f"{module}:numbers")) == 4

    # A coroutine is a call each time it resumes; the time it waits is in none of them.
    run = only([c for c in main.children if c.name == "asyncio.runners:run"])
    steps = run.find(f"{module}:napper")
    assert len(steps) == 4  # two coroutines, each before and after its sleep
    assert all(step.duration < 20_000 for step in steps), [s.duration for s in steps]
    assert all(len(step.find(f"{module}:leaf")) == 1 for step in steps)

    worker = only(threads["planted-worker"].find(f"{module}:worker"))
    assert only(worker.find(f"{module}:planted_sleep")).duration >= PLANTED_US

    for root in threads.values():
        assert not [c.name for c in root.walk() if c.name.startswith("sampler._trace")]


@pytest.mark.parametrize("python", PYTHONS)
def test_the_call_tree_of_a_program_with_threads_exceptions_generators_and_asyncio(
    tmp_path, python
):
    out, result = trace(tmp_path, str(PROGRAM), python=python)
    assert result.stdout == "main done\n"
    threads, meta = read_trace(out)
    assert meta["backend"] == backend_of(python)
    check_structure(threads)
    assert set(threads) == {"MainThread", "planted-worker"}
    assert meta["stopped_by"] == "end" and not meta["buffer_full"]
    assert meta["events"] >= 2 * meta["calls"] > 0
    assert meta["calls"] == sum(1 for root in threads.values() for _ in root.walk()) - len(threads)
    assert meta["threads"] == 2
    assert meta["traced_seconds"] >= 2 * PLANTED_US / 1e6
    assert meta["per_event_ns"] > 0 and meta["bytecode_factor"] >= 1.0
    assert 0 < meta["estimated_overhead_cpu_seconds"] <= meta["cpu_seconds"]
    assert f"{meta['events']:,} events" in result.stderr
    assert "CPU seconds used while tracing were the tracer's" in result.stderr


def test_a_module_run_with_dash_m_is_named_main(tmp_path):
    path = os.pathsep.join((str(ROOT), str(WORKLOADS)))
    out, _ = trace(tmp_path, "-m", "traced", PYTHONPATH=path)
    threads, _ = read_trace(out)
    check_structure(threads)


@pytest.mark.parametrize("python", PYTHONS)
@pytest.mark.parallel
def test_the_buffer_bound_is_respected_and_the_drop_reported(tmp_path, python):
    out, result = trace(tmp_path, "--max-events", "3000", str(PROGRAM), python=python)
    assert result.stdout == "main done\n"  # the program ran on, untraced once the buffer filled
    threads, meta = read_trace(out)
    assert meta["buffer_full"] and meta["stopped_by"] == "max_events"
    assert 2500 < meta["events"] <= 3000
    assert meta["calls"] <= 3000
    assert meta["events_dropped"]
    assert "buffer full" in result.stderr and "raise max_events" in result.stderr
    assert "buffer full" in " ".join(meta["notes"])
    assert "MainThread" in threads


@pytest.mark.parametrize("python", PYTHONS)
def test_seconds_stops_recording_and_writes_while_the_program_goes_on(tmp_path, python):
    out = tmp_path / "run.json"
    _, result = trace(tmp_path, "--seconds", "0.5", str(PROGRAM), "late", str(out), python=python)
    assert json.loads(result.stdout.splitlines()[-1]) == {"written_while_running": True}
    threads, meta = read_trace(out)
    names = {c.name for c in threads["MainThread"].walk()}
    assert "__main__:early" in names and "__main__:late" not in names
    assert meta["stopped_by"] == "seconds"
    assert 0.5 <= meta["traced_seconds"] < 3.0
    # One file, written once: at the deadline, not again at exit.
    assert result.stderr.count("written to") == 1


@pytest.mark.parallel
def test_a_forked_child_neither_writes_nor_goes_on_recording(tmp_path):
    out, result = trace(tmp_path, str(PROGRAM), "fork")
    assert result.stderr.count("written to") == 1  # by the parent alone
    threads, _ = read_trace(out)
    names = {c.name for c in threads["MainThread"].walk()}
    assert "__main__:late" in names and "__main__:early" not in names
    assert "posix:fork" in names


CONTEXTS = [(sys.executable, None)] + [
    (python, backend) for python in PYTHONS[1:] for backend in (None, "sys.setprofile")
]


@pytest.mark.parametrize(("python", "backend"), CONTEXTS)
def test_the_context_manager_records_threads_started_before_and_restores_profiles(
    tmp_path, python, backend
):
    out = tmp_path / "run.json"
    result = subprocess.run(
        [python, str(PROGRAM), "context", str(out), *([backend] if backend else [])],
        env=env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["profile_restored"] and report["threading_profile_restored"]
    threads, meta = read_trace(out)
    assert meta["backend"] == (backend or backend_of(python))
    check_structure(threads)
    before = only(threads["started-before"].find("__main__:middle"))
    assert only(before.find("__main__:planted_sleep")).duration >= PLANTED_US
    assert report["calls"] == meta["calls"]


def test_gzip_output(tmp_path):
    import gzip

    out, _ = trace(tmp_path, str(PROGRAM), output="run.json.gz")
    plain = tmp_path / "plain.json"
    plain.write_bytes(gzip.decompress(out.read_bytes()))
    check_structure(read_trace(plain)[0])


@pytest.mark.parallel
def test_bad_options_say_what_is_wrong(tmp_path):
    for option, value in (("--seconds", "0"), ("--max-events", "0")):
        result = subprocess.run(
            [sys.executable, "-m", "sampler", "trace", option, value, str(PROGRAM)],
            env=env(),
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 2
        assert option.lstrip("-").replace("-", "_") in result.stderr
    assert not list(tmp_path.iterdir())
