"""Sampling accuracy on real third-party code: fleetflame against py-spy, same process, same window.

    python bench/accuracy.py                        # every workload, engines python and native
    python bench/accuracy.py --workload black --workload threads --engine python
    python bench/accuracy.py --seconds 40 --json accuracy.json --keep /tmp/accuracy
    python bench/accuracy.py --quick                # 3 s windows, shorter warm-up

Each workload (bench/accuracy_workloads/) is a real process running a library: black (the
mypyc-compiled wheel), Jinja2, PyYAML's pure-Python loader, SQLAlchemy's ORM on SQLite, Flask
under gunicorn's sync and gthread workers, an asyncio server, and threads that mostly wait. The
sampler runs inside it (``FLEETFLAME_*`` variables, ``mode=cpu``, 100 Hz, the engine asked for
with ``FLEETFLAME_ENGINE``); servers get a load generator. After a warm-up, two threads start
at the same moment and cover the same window D (24 s) at the same rate: fleetflame's own
profile of it (two consecutive ``GET /stacks?seconds=D/2``) and ``py-spy record -p PID -r 100
-d D -f raw`` on the same PID.

py-spy is the reference: where the two disagree, fleetflame is wrong until shown otherwise.
For the top 20 functions of either tool it compares each function's self share (percentage of
samples where the function is the leaf) and total share (percentage of samples whose stack
holds it), and prints per run the worst differences in percentage points, the samples per
second of each tool and a table of the top functions. The goal is 3 points at most, self and
total. Sampling has noise: a share near 50% from 2,400 samples (24 s at 100 Hz) has a standard
error of 1 point, the difference of two such shares 1.4 points, so the worst of 20 often
exceeds 3 points for a perfect sampler. Each difference is printed with its binomial standard
error, and fleetflame's two halves of the window are compared with each other for the noise
the samples really have (A/A; bench/accuracy_stats.py has the formulas). A run PASSes when every
compared function's self and total differences are within 3 points, within 2.5 standard
errors, or within the A/A noise floor (the table says which), and, for the threads workload,
each waiting function has under 0.5 % of fleetflame's samples; else it is a MISS, naming the
functions that really differ. ``/info`` says which engine really ran, so a fallback shows.

What can show either tool wrong: the CPU clocks of the process and of each of its threads over
the window (``/proc/PID/task/TID/stat``; py-spy's ``--threads`` roots give each thread's OS
id, fleetflame's ``[thread:NAME]`` roots its samples), and facts a workload measures itself
(the gunicorn app's CPU inside ``Flask.wsgi_app``, each waiting thread's CPU). Where a workload
measures a function's CPU over the window itself (the Flask app's ``Flask.wsgi_app``, ``report``
and ``gunicorn.util.write``, read from ``/_accuracy/truth`` before and after), that is the truth
column, and fleetflame's total share is judged against it rather than against py-spy; its self
share too when both tools saw the function only as a leaf. In cpu mode a
thread's samples per second should match its clock: a run prints a per-thread table and a
``check:`` line when py-spy strays from the process's clock. py-spy's default mode counts a
thread as running by its OS state, read just before it stops the process (benfred/py-spy#92):
runnable threads waiting for a core, and threads it woke, count too. In a single-threaded
process that only adds samples where the thread was anyway; in a multi-threaded one it dilutes
every share (under gthread it gives ``wsgi_app`` ~40% where the app's own clock says ~89%).
So the multi-threaded workloads run py-spy with ``--gil`` (the thread holding the GIL: exact
for Python code, blind to CPU spent without it, such as system calls); ``--pyspy-mode`` picks
one mode for all.

Names: fleetflame writes ``module:qualname``; py-spy writes ``qualname (file)``. Each workload
writes a map of source file to module name from ``sys.modules``, which names py-spy's frames
the same way; a function the tools name differently (code compiled from a string: dataclass
methods, templates) takes py-spy's name when the last part of its qualname matches one
unambiguously. Left out, and said so in the output: fleetflame's synthetic frames
(``[thread:...]``, ``[truncated]``, any ``[...]``), py-spy's thread and process root frames,
py-spy's samples on fleetflame's own threads and endpoint (fleetflame never samples them), and
fleetflame's signal handler frames in py-spy's stacks (the sample stays with the frame it
interrupted, as fleetflame counts it).

Exit status 0 when every run measured (PASS or MISS), 1 when one could not run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accuracy_compare import (
    GOAL_POINTS,
    ModuleMap,
    ThreadRate,
    compare_profiles,
    fleetflame_part,
    fleetflame_thread_samples,
    parse_folded,
    pyspy_thread_samples,
    thread_rates,
)
from accuracy_processes import Background, Processes, free_port, http_get, py_spy
from accuracy_report import report_lines, result_document, summary_lines
from accuracy_stats import Z_LIMIT, judge_comparison, truth_shares
from accuracy_suite import BY_NAME, WORKLOADS, Load, Workload

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS_DIR = Path(__file__).resolve().parent / "accuracy_workloads"

PYSPY_FLAGS = {
    "default": (),
    "gil": ("--gil",),
    "nonblocking": ("--nonblocking",),
    "gil-nonblocking": ("--gil", "--nonblocking"),
}
ENGINES = ("python", "native")


class RunError(RuntimeError):
    """A run could not measure; the message says what went wrong."""


class WindowError(RunError):
    """The window could not be recorded: py-spy hung, or the workload died while traced."""


@dataclass(frozen=True)
class Options:
    """How long to warm up and to measure, and where to keep the raw files."""

    seconds: float
    warmup: float
    keep: Path | None
    pyspy_mode: str = "auto"


def run_workload(workload: Workload, engine: str, options: Options) -> dict[str, Any]:
    """Runs one workload on one engine and returns its result (``error`` set if it failed);
    a run whose window failed runs again once: py-spy can hang with the process's threads
    stopped (benfred/py-spy#565, seen with the native engine), and gunicorn's arbiter then
    kills a worker that stopped answering it."""
    result = _run_workload_once(workload, engine, options)
    if result.get("window_failed"):
        print(f"   {result['error'][:300]}; running {workload.name} again", flush=True)
        result = _run_workload_once(workload, engine, options)
        result["attempts"] = 2
    return result


def _run_workload_once(workload: Workload, engine: str, options: Options) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix=f"accuracy-{workload.name}-{engine}-"))
    result: dict[str, Any] = {"workload": workload.name, "engine_requested": engine}
    try:
        with Processes() as processes:
            result.update(_measure(workload, engine, options, processes, folder))
    except RunError as exc:
        result["error"] = str(exc)
        result["window_failed"] = isinstance(exc, WindowError)
    except (OSError, ValueError, subprocess.TimeoutExpired) as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        if options.keep is not None:
            shutil.copytree(folder, options.keep / f"{workload.name}-{engine}", dirs_exist_ok=True)
        shutil.rmtree(folder, ignore_errors=True)
    return result


def _measure(
    workload: Workload, engine: str, options: Options, processes: Processes, folder: Path
) -> dict[str, Any]:
    sampler_port, app_port = free_port(), free_port()
    lifetime = options.warmup + options.seconds + 120  # the workload stops by itself after it
    env = _child_env(engine, workload.name, sampler_port, app_port, folder, lifetime)
    command = [sys.executable, *(_fill(part, app_port) for part in workload.command)]
    target = processes.start(command, env, folder / "workload.log")
    info = _wait_for_info(sampler_port, target, folder / "workload.log")
    pid = info["instance"]["pid"]
    loadgen = None
    if workload.load is not None:
        _wait_for_port(app_port, target, folder / "workload.log")
        loadgen = _start_load(workload.load, app_port, lifetime, processes, env, folder)
    time.sleep(options.warmup)
    pyspy_mode = workload.pyspy_mode if options.pyspy_mode == "auto" else options.pyspy_mode
    truth_url = None
    if workload.truth_path is not None:
        truth_url = f"http://127.0.0.1:{app_port}{workload.truth_path}"
    window = _record_both(sampler_port, pid, options, pyspy_mode, processes, folder, truth_url)
    info = _json_object(http_get(f"http://127.0.0.1:{sampler_port}/info", timeout=10))
    load = None
    if loadgen is not None:
        processes.stop(loadgen)
        load = _last_json_line(folder / "loadgen.log")
    processes.stop(target)
    document = _module_map(folder, pid)
    modules = ModuleMap.from_document(document)
    comparison = compare_profiles(
        window.fleetflame_text,
        window.pyspy_text,
        modules,
        focus=workload.focus,
        ceilings=workload.ceilings,
    )
    halves = [
        fleetflame_part(text, modules, comparison.renaming) for text in window.fleetflame_parts
    ]
    truths = truth_shares(*window.truth) if window.truth else {}
    judgements, noise = judge_comparison(comparison, halves, truths)
    extra = document.get("extra", {})
    result = result_document(comparison, judgements, noise, info, options.seconds, extra, load)
    result["process_cpus"] = window.process_cpu / window.wall
    result["threads"] = [vars(rate) for rate in _thread_rates(window, options.seconds)]
    result["pyspy"]["mode"] = pyspy_mode
    ticks = window.ticks
    result["fleetflame"]["ticks_per_second"] = None if ticks is None else ticks / window.wall
    return result


def _thread_rates(window: Window, seconds: float) -> list[ThreadRate]:
    ours = fleetflame_thread_samples(parse_folded(window.fleetflame_text))
    reference, names = pyspy_thread_samples(parse_folded(window.pyspy_text))
    return thread_rates(window.thread_cpu, names, ours, reference, seconds, window.wall)


def _child_env(
    engine: str, service: str, sampler_port: int, app_port: int, folder: Path, lifetime: float
) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETFLAME_")}
    env.update(
        PYTHONPATH=str(ROOT),
        FLEETFLAME_PORT=str(sampler_port),
        FLEETFLAME_MODE="cpu",
        FLEETFLAME_INTERVAL="0.01",
        FLEETFLAME_ENGINE=engine,
        FLEETFLAME_SERVICE=service,
        FLEETFLAME_THREAD_FRAMES="1",  # [thread:NAME] roots, for the per-thread check
        # py-spy traces the process; the native engine would pause while it does (it is the
        # reference here, so a hung py-spy, benfred/py-spy#565, is run again instead).
        FLEETFLAME_PAUSE_WHEN_TRACED="0",
        ACCURACY_OUT=str(folder),
        ACCURACY_SECONDS=str(lifetime),
        ACCURACY_APP_PORT=str(app_port),
    )
    return env


def _fill(part: str, app_port: int) -> str:
    return part.format(app_port=app_port, workloads=WORKLOADS_DIR, root=ROOT)


def _wait_for_info(port: int, target: subprocess.Popen[bytes], log: Path) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if target.poll() is not None:
            raise RunError(f"the workload exited ({target.returncode}): {_tail(log)}")
        try:
            return _json_object(http_get(f"http://127.0.0.1:{port}/info", timeout=2))
        except OSError:
            time.sleep(0.2)
    raise RunError(f"no sampler endpoint on port {port} after 60 s: {_tail(log)}")


def _wait_for_port(port: int, target: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if target.poll() is not None:
            raise RunError(f"the server exited ({target.returncode}): {_tail(log)}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise RunError(f"the server does not listen on port {port} after 60 s: {_tail(log)}")


def _start_load(
    load: Load,
    port: int,
    lifetime: float,
    processes: Processes,
    env: Mapping[str, str],
    folder: Path,
) -> subprocess.Popen[bytes]:
    command = [
        sys.executable,
        str(WORKLOADS_DIR / "loadgen.py"),
        "--port",
        str(port),
        "--path",
        load.path,
        "--concurrency",
        str(load.concurrency),
        "--seconds",
        str(lifetime),
    ]
    if load.keep_alive:
        command.append("--keep-alive")
    clean = {k: v for k, v in env.items() if not k.startswith(("FLEETFLAME_", "ACCURACY_"))}
    return processes.start(command, clean, folder / "loadgen.log")


@dataclass(frozen=True)
class Window:
    """One recorded window: both tools' output (fleetflame's as consecutive parts), the
    process's CPU clocks around it, and the workload's own clocks where it has them."""

    fleetflame_parts: tuple[str, ...]
    pyspy_text: str
    wall: float
    process_cpu: float
    thread_cpu: dict[int, float]
    ticks: int | None
    truth: tuple[dict[str, Any], dict[str, Any]] | None = None

    @property
    def fleetflame_text(self) -> str:
        """Fleetflame's whole window (folded text adds up repeated stacks)."""
        return "".join(
            part if part.endswith("\n") else part + "\n" for part in self.fleetflame_parts
        )


def _record_both(
    sampler_port: int,
    pid: int,
    options: Options,
    pyspy_mode: str,
    processes: Processes,
    folder: Path,
    truth_url: str | None = None,
) -> Window:
    """Records the same window with both tools, started at the same moment, and reads the CPU
    clocks of the process and its threads before and after (the ground truth in cpu mode), and
    the workload's own clocks at ``truth_url``. Fleetflame's side is two consecutive reads of
    half the window each, for the A/A noise (bench/accuracy_stats.py)."""
    seconds = options.seconds
    parts = 2 if seconds >= 2 else 1  # a read is 1 s at least
    url = f"http://127.0.0.1:{sampler_port}/stacks?seconds={seconds / parts:g}"
    output = folder / "py-spy.txt"
    command = [
        py_spy(),
        "record",
        "--pid",
        str(pid),
        "--rate",
        "100",
        "--duration",
        f"{seconds:g}",
        "--format",
        "raw",
        "--nolineno",
        "--full-filenames",
        "--threads",
        "--output",
        str(output),
        *PYSPY_FLAGS[pyspy_mode],
    ]

    def spy() -> str:
        child = processes.start(command, os.environ, folder / "py-spy.log")
        if child.wait(timeout=seconds + 20) != 0 or not output.exists():
            raise RunError(f"py-spy failed ({child.returncode}): {_tail(folder / 'py-spy.log')}")
        return output.read_text()

    def read_parts() -> tuple[str, ...]:
        return tuple(http_get(url, timeout=seconds + 60).decode() for _ in range(parts))

    def read_truth() -> dict[str, Any] | None:
        return None if truth_url is None else _json_object(http_get(truth_url, timeout=10))

    ours = Background(read_parts)
    reference = Background(spy)
    ticks_before = _ticks(sampler_port)
    truth_before = read_truth()
    threads_before, process_before = thread_cpu_seconds(pid), process_cpu_seconds(pid)
    started = time.monotonic()
    ours.start()
    reference.start()
    try:
        # py-spy first: when it hangs, the process is stopped and fleetflame's reads wait too.
        pyspy_text = reference.result()
        fleetflame_parts = ours.result()
    except (OSError, RunError, subprocess.TimeoutExpired) as exc:
        raise WindowError(
            f"the window failed ({type(exc).__name__}: {exc}); py-spy:"
            f" {_tail(folder / 'py-spy.log', 2)}; workload: {_tail(folder / 'workload.log', 2)}"
        ) from exc
    for number, text in enumerate(fleetflame_parts, 1):
        (folder / f"fleetflame-{number}.folded").write_text(text)
    wall = time.monotonic() - started
    threads_after, process_after = thread_cpu_seconds(pid), process_cpu_seconds(pid)
    truth_after = read_truth()
    ticks_after = _ticks(sampler_port)
    return Window(
        fleetflame_parts,
        pyspy_text,
        wall,
        process_after - process_before,
        {tid: used - threads_before.get(tid, 0.0) for tid, used in threads_after.items()},
        None if ticks_before is None or ticks_after is None else ticks_after - ticks_before,
        None if truth_before is None or truth_after is None else (truth_before, truth_after),
    )


def _ticks(sampler_port: int) -> int | None:
    """The sampler's tick counter from /info (None where an engine does not report it)."""
    info = _json_object(http_get(f"http://127.0.0.1:{sampler_port}/info", timeout=10))
    ticks = info.get("ticks")
    return ticks if isinstance(ticks, int) else None


def process_cpu_seconds(pid: int) -> float:
    """User and system CPU seconds the process used so far, all threads (/proc/PID/stat)."""
    return _cpu_from_stat(Path(f"/proc/{pid}/stat").read_text())


def thread_cpu_seconds(pid: int) -> dict[int, float]:
    """User and system CPU seconds each live thread of the process used so far."""
    seconds = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            seconds[int(task.name)] = _cpu_from_stat((task / "stat").read_text())
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended meanwhile
    return seconds


def _cpu_from_stat(stat: str) -> float:
    fields = stat[stat.rindex(")") + 2 :].split()  # the command name may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _module_map(folder: Path, pid: int) -> dict[str, Any]:
    path = folder / f"modules-{pid}.json"
    if not path.exists():
        raise RunError(f"the workload (pid {pid}) wrote no module map {path.name}")
    return _json_object(path.read_text())


def _last_json_line(path: Path) -> dict[str, Any] | None:
    for line in reversed(path.read_text(errors="replace").splitlines()):
        if line.startswith("{"):
            return _json_object(line)
    return None


def _json_object(text: str | bytes) -> dict[str, Any]:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, got {str(text)[:80]!r}")
    return value


def _tail(path: Path, lines: int = 5) -> str:
    """The last lines of a log, those naming fleetflame or an error first."""
    text = path.read_text(errors="replace") if path.exists() else ""
    every = [line.strip() for line in text.splitlines() if line.strip()]
    telling = [line for line in every if "fleetflame" in line.lower() or "error" in line.lower()]
    return " | ".join((telling or every)[-lines:]) or "(no output)"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--workload",
        action="append",
        choices=list(BY_NAME),
        help="run only this workload (repeatable; default: all)",
    )
    parser.add_argument(
        "--engine",
        action="append",
        choices=["auto", *ENGINES],
        help="FLEETFLAME_ENGINE for the runs (repeatable; default: python and native)",
    )
    parser.add_argument("--seconds", type=float, help="the compared window D (default 24, quick 3)")
    parser.add_argument(
        "--warmup", type=float, help="seconds before the window (default 3, quick 2)"
    )
    parser.add_argument("--json", type=Path, help="write every result here as JSON")
    parser.add_argument("--keep", type=Path, help="keep each run's raw profiles and logs here")
    parser.add_argument("--quick", action="store_true", help="shorter windows and warm-up")
    parser.add_argument(
        "--pyspy-mode",
        default="auto",
        choices=["auto", *PYSPY_FLAGS],
        help="how py-spy tells running threads: each workload's choice (auto), its default "
        "(OS thread state), --gil or --nonblocking",
    )
    return parser


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM cleans up like Ctrl-C


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    options = Options(
        seconds=args.seconds or (3.0 if args.quick else 24.0),
        warmup=args.warmup if args.warmup is not None else (2.0 if args.quick else 3.0),
        keep=args.keep,
        pyspy_mode=args.pyspy_mode,
    )
    if options.keep is not None:
        options.keep.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, _interrupt)
    workloads = [BY_NAME[name] for name in args.workload] if args.workload else list(WORKLOADS)
    engines = args.engine or list(ENGINES)
    print(
        f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; window {options.seconds:g} s"
        f" after {options.warmup:g} s of warm-up; goal: within {GOAL_POINTS:g} points of py-spy"
        f" (or of the workload's own truth), else within {Z_LIMIT:g} standard errors or the A/A"
        " noise floor"
    )
    results = []
    try:
        for workload in workloads:
            for engine in engines:
                result = run_workload(workload, engine, options)
                results.append(result)
                print("\n".join(report_lines(workload, result)), flush=True)
    except KeyboardInterrupt:
        print("interrupted: every process this run started has been stopped", file=sys.stderr)
        return 130
    print(
        "\nSummary (worst differences, fleetflame minus py-spy or the truth, in percentage points;"
        " A/A: the noise floor of two whole windows, from fleetflame's halves; disp: A/A variance"
        " over binomial; samples per second of each tool and of the process's CPU clock, the"
        f" ground truth in cpu mode); load average now {os.getloadavg()[0]:.2f}:"
    )
    print("\n".join(summary_lines(results)))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, sort_keys=True))
    return 1 if any(r.get("error") for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
