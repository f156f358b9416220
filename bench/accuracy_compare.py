"""The pure half of bench/accuracy.py: both tools' output parsed, named alike, shared and compared.

Data in, data out: no I/O, no clocks. Fleetflame's ``/stacks`` text and py-spy's raw output
become ``Profile``s of function names (``module:qualname``), each function's self and total
share, and ``Row``s side by side for the top functions of either tool.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sampler.profile import NO_FRAMES, FoldedFormatError, split_frames, unescape_frame
from sampler.profile import parse_folded as parse_folded_text

GOAL_POINTS = 3.0
TOP = 20

Stack = tuple[str, ...]

_SYNTHETIC = re.compile(r"^\[.*\]$")
_THREAD_ROOT = re.compile(r"^thread \((?:0x)?[0-9a-fA-F]+\)(?:: (?P<name>.*))?$")
_PROCESS_ROOT = re.compile(r"^process \d+")
_FROZEN = re.compile(r"^<frozen (?P<module>[\w.]+)>$")
_LINENO = re.compile(r"^(?P<file>.*):\d+$")
SAMPLER_THREADS = "fleetflame-"


@dataclass
class Profile:
    """Samples per stack of function names (root first), and what was left out, with why."""

    stacks: dict[Stack, int]
    left_out: dict[str, int] = field(default_factory=dict)

    @property
    def samples(self) -> int:
        """All samples kept, including those whose stack was left with no function."""
        return sum(self.stacks.values())


@dataclass(frozen=True)
class Share:
    """A function's self and total share of a profile's samples, in percent."""

    self: float
    total: float


NO_SHARE = Share(0.0, 0.0)


@dataclass(frozen=True)
class Row:
    """One function's shares in both tools."""

    function: str
    fleetflame: Share
    pyspy: Share

    @property
    def self_diff(self) -> float:
        """Absolute difference of the self shares, in percentage points."""
        return abs(self.fleetflame.self - self.pyspy.self)

    @property
    def total_diff(self) -> float:
        """Absolute difference of the total shares, in percentage points."""
        return abs(self.fleetflame.total - self.pyspy.total)


@dataclass(frozen=True)
class ModuleMap:
    """Which module each source file is, from a workload's ``sys.modules``, and its sys.path."""

    modules: Mapping[str, str]
    sys_path: Sequence[str] = ()

    @classmethod
    def from_document(cls, document: Mapping[str, Any]) -> ModuleMap:
        """Reads the JSON document a workload writes (bench/accuracy_workloads/_common.py)."""
        return cls(dict(document.get("modules", {})), list(document.get("sys_path", [])))

    def module_for(self, filename: str) -> str:
        """Returns the module of ``filename``, or the file name itself when it is no module's
        (as fleetflame does for code whose globals have no ``__name__``)."""
        if filename in self.modules:
            return self.modules[filename]
        frozen = _FROZEN.match(filename)
        if frozen:
            return frozen.group("module")
        return _module_below(filename, self.sys_path) or filename


def _module_below(filename: str, sys_path: Sequence[str]) -> str | None:
    if not filename.endswith(".py"):
        return None
    for folder in sorted(sys_path, key=len, reverse=True):
        prefix = folder.rstrip("/") + "/"
        if folder and filename.startswith(prefix):
            dotted = filename[len(prefix) : -len(".py")].replace("/", ".")
            return dotted.removesuffix(".__init__")
    return None


def parse_folded(text: str) -> dict[Stack, int]:
    """Parses folded-stack text (fleetflame's /stacks, py-spy's raw format) into samples per
    stack of frames, root first (the profile core's parsing; a sample with no frame has the
    empty stack)."""
    try:
        counts = parse_folded_text(text)
    except FoldedFormatError as exc:
        raise ValueError(f"not folded-stack text: {exc}") from None
    return {
        () if stack == NO_FRAMES else tuple(split_frames(stack)): count
        for stack, count in counts.items()
    }


NAMED_BY_FILE = "fleetflame frames named by their file, given their module's name (samples)"


def fleetflame_profile(stacks: Mapping[Stack, int], modules: ModuleMap | None = None) -> Profile:
    """Fleetflame's stacks as function names, its synthetic ``[...]`` frames left out; a frame
    named by its source file (a fallback for code whose globals have no module name) gets the
    module the map gives that file."""
    kept: dict[Stack, int] = {}
    left_out: Counter[str] = Counter()
    for stack, count in stacks.items():
        names = []
        for frame in stack:
            if _SYNTHETIC.match(frame):
                left_out[f"fleetflame {_marker(frame)} frames removed (samples)"] += count
                continue
            name = unescape_frame(frame)
            module, _, qualname = name.rpartition(":")
            if modules is not None and module.startswith("/"):
                named = f"{modules.module_for(module)}:{qualname}"
                if named != name:
                    left_out[NAMED_BY_FILE] += count
                    name = named
            names.append(name)
        _add(kept, tuple(names), count)
    return Profile(kept, dict(left_out))


def _marker(frame: str) -> str:
    return re.sub(r":.*\]$", ":...]", frame)


def pyspy_function(frame: str, modules: ModuleMap) -> str:
    """Names a py-spy frame, ``qualname (file)``, as fleetflame does: ``module:qualname``."""
    qualname, sep, rest = frame.rpartition(" (")
    if not sep or not rest.endswith(")"):
        return f"?:{frame}"
    filename = rest[:-1]
    numbered = _LINENO.match(filename)
    if numbered and filename not in modules.modules:
        filename = numbered.group("file")
    return f"{modules.module_for(filename)}:{qualname}"


ROOTS_REMOVED = "py-spy thread/process root frames removed (samples)"
ON_SAMPLER_THREADS = "py-spy samples on fleetflame's own threads, dropped"
IN_ENDPOINT = "py-spy samples in fleetflame's endpoint, dropped"
IN_HANDLER = "py-spy samples cut at fleetflame's signal handler (kept where it interrupted)"
WRAPPERS = "py-spy samples through the stall watcher's timing wrappers (hidden by fleetflame)"


def pyspy_profile(stacks: Mapping[Stack, int], modules: ModuleMap) -> Profile:
    """py-spy's stacks as function names, without what fleetflame cannot or does not see."""
    kept: dict[Stack, int] = {}
    left_out: Counter[str] = Counter()
    for stack, count in stacks.items():
        frames, thread = _without_roots(stack)
        if len(frames) < len(stack):
            left_out[ROOTS_REMOVED] += count
        if thread is not None and thread.startswith(SAMPLER_THREADS):
            left_out[ON_SAMPLER_THREADS] += count
            continue
        names = [pyspy_function(frame, modules) for frame in frames]
        if any(module_of(name) == "sampler._server" for name in names):
            left_out[IN_ENDPOINT] += count
            continue
        unwrapped = [name for name in names if not _is_hidden_wrapper(name)]
        if len(unwrapped) < len(names):
            left_out[WRAPPERS] += count
            names = unwrapped
        cut = _sampler_frames_start(names)
        if cut is not None:
            left_out[IN_HANDLER] += count
            names = names[:cut]
        _add(kept, tuple(names), count)
    return Profile(kept, dict(left_out))


def _without_roots(stack: Stack) -> tuple[Stack, str | None]:
    """Strips py-spy's ``process ...`` and ``thread (ID): NAME`` roots; returns the thread name."""
    thread = None
    start = 0
    while start < len(stack):
        match = _THREAD_ROOT.match(stack[start])
        if match:
            thread = match.group("name")
        elif not _PROCESS_ROOT.match(stack[start]):
            break
        start += 1
    return stack[start:], thread


def _sampler_frames_start(names: Sequence[str]) -> int | None:
    """Index of the first sampler frame above a frame of the host (a signal handler), if any."""
    seen_host = False
    for index, name in enumerate(names):
        if _is_sampler(module_of(name)):
            if seen_host:
                return index
        else:
            seen_host = True
    return None


def _is_sampler(module: str) -> bool:
    # The middleware is a layer of the host's own call tree, shown by fleetflame too.
    return (module == "sampler" or module.startswith("sampler.")) and not module.startswith(
        "sampler.middleware"
    )


def _is_hidden_wrapper(name: str) -> bool:
    """The stall watcher's wrapper around a request or event-loop callback (sampler._stalls'
    ``timed``): every engine leaves it out of its walks, so it sits between host frames in
    py-spy's stacks only. Read as a signal handler, it once cut off whole requests, leaving
    py-spy's samples on gunicorn's SyncWorker.handle and asyncio's _run_once."""
    return module_of(name) == "sampler._stalls" and qualname_of(name).split(".")[-1] == "timed"


def module_of(name: str) -> str:
    """The module part of ``module:qualname``."""
    return name.rpartition(":")[0]


def qualname_of(name: str) -> str:
    """The qualname part of ``module:qualname``."""
    return name.rpartition(":")[2]


def short_name(name: str) -> str:
    """The last component of the qualname: ``Class.method`` gives ``method``."""
    return name.rpartition(":")[2].rpartition(".")[2]


def _vague(module: str) -> bool:
    # A file name standing in for a module: <string>, <template>, a path outside sys.path.
    return module.startswith("<") or "/" in module or module == "?"


def reconcile(reference: Iterable[str], other: Iterable[str]) -> dict[str, str]:
    """Returns new names for ``other``'s functions that the reference names differently.

    Code compiled from a string (dataclass methods, namedtuples, templates) has a file such as
    ``<string>``: py-spy names all of it ``<string>:qualname``, fleetflame names the module whose
    globals it runs with, so fleetflame's names merge into the reference's. Then a function that
    only ``other`` has takes the name of one that only the reference has, with the same last
    qualname component (not an anonymous one such as ``<lambda>``) and the same module (or a
    vague one on either side), where that is unambiguous or the reference's name is vague (it
    may stand for several).
    """
    reference, other = set(reference), set(other)
    renaming = _merged_into_vague(reference, other - reference)
    lonely_other = _by_short_name(other - reference - set(renaming))
    for short, references in _by_short_name(reference - other).items():
        if short.startswith("<"):
            continue  # <lambda>, <genexpr>, <listcomp>: the short name tells nothing apart
        candidates = [
            o for o in lonely_other.get(short, []) if any(_may_be_same(r, o) for r in references)
        ]
        matches = [r for r in references if any(_may_be_same(r, o) for o in candidates)]
        if len(matches) == 1 and (len(candidates) == 1 or _vague(module_of(matches[0]))):
            renaming.update(dict.fromkeys(candidates, matches[0]))
    return renaming


def _merged_into_vague(reference: set[str], lonely_other: set[str]) -> dict[str, str]:
    vague: dict[str, list[str]] = {}
    for name in sorted(reference):
        if _vague(module_of(name)):
            vague.setdefault(qualname_of(name), []).append(name)
    renaming = {}
    for name in lonely_other:
        candidates = vague.get(qualname_of(name), [])
        if len(candidates) == 1:
            renaming[name] = candidates[0]
    return renaming


def _by_short_name(names: Iterable[str]) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for name in sorted(names):
        groups.setdefault(short_name(name), []).append(name)
    return groups


def _may_be_same(a: str, b: str) -> bool:
    ma, mb = module_of(a), module_of(b)
    return ma == mb or _vague(ma) or _vague(mb)


def renamed(profile: Profile, renaming: Mapping[str, str]) -> Profile:
    """The same profile with functions renamed."""
    stacks: dict[Stack, int] = {}
    for stack, count in profile.stacks.items():
        _add(stacks, tuple(renaming.get(name, name) for name in stack), count)
    return Profile(stacks, dict(profile.left_out))


def shares(profile: Profile) -> dict[str, Share]:
    """Each function's self and total share of the profile's samples, in percent."""
    total = profile.samples
    if not total:
        return {}
    leaf: Counter[str] = Counter()
    anywhere: Counter[str] = Counter()
    for stack, count in profile.stacks.items():
        if stack:
            leaf[stack[-1]] += count
        for name in set(stack):  # a recursive function counts once per sample
            anywhere[name] += count
    return {
        name: Share(100.0 * leaf[name] / total, 100.0 * anywhere[name] / total) for name in anywhere
    }


def top_functions(by_name: Mapping[str, Share], count: int = TOP) -> set[str]:
    """The ``count`` functions with the largest self share and those with the largest total."""
    by_self = sorted(by_name, key=lambda n: (-by_name[n].self, n))[:count]
    by_total = sorted(by_name, key=lambda n: (-by_name[n].total, n))[:count]
    return set(by_self) | set(by_total)


def compare(
    fleetflame: Mapping[str, Share],
    pyspy: Mapping[str, Share],
    top: int = TOP,
    focus: Iterable[str] = (),
) -> list[Row]:
    """Rows for the top functions of either tool (and ``focus``), the largest self share first."""
    names = top_functions(fleetflame, top) | top_functions(pyspy, top) | set(focus)
    rows = [Row(n, fleetflame.get(n, NO_SHARE), pyspy.get(n, NO_SHARE)) for n in names]
    return sorted(
        rows,
        key=lambda r: (
            -max(r.fleetflame.self, r.pyspy.self),
            -max(r.fleetflame.total, r.pyspy.total),
            r.function,
        ),
    )


def ceiling_misses(by_name: Mapping[str, Share], ceilings: Mapping[str, float]) -> list[str]:
    """Functions whose total share is above their ceiling, as ``name 14.7% > 0.5%``."""
    return [
        f"{name} {by_name.get(name, NO_SHARE).total:.1f}% > {limit}%"
        for name, limit in sorted(ceilings.items())
        if by_name.get(name, NO_SHARE).total > limit
    ]


@dataclass
class Comparison:
    """Everything one run's two profiles say, side by side."""

    fleetflame: Profile
    pyspy: Profile
    renaming: dict[str, str]
    rows: list[Row]
    ceiling_misses: list[str]


def compare_profiles(
    fleetflame_text: str,
    pyspy_text: str,
    modules: ModuleMap,
    focus: Iterable[str] = (),
    ceilings: Mapping[str, float] | None = None,
) -> Comparison:
    """Compares fleetflame's /stacks text with py-spy's raw output of the same window."""
    ours = fleetflame_profile(parse_folded(fleetflame_text), modules)
    reference = pyspy_profile(parse_folded(pyspy_text), modules)
    renaming = reconcile(_functions(reference), _functions(ours))
    ours = renamed(ours, renaming)
    our_shares = shares(ours)
    rows = compare(our_shares, shares(reference), focus=focus)
    return Comparison(ours, reference, renaming, rows, ceiling_misses(our_shares, ceilings or {}))


def fleetflame_part(text: str, modules: ModuleMap, renaming: Mapping[str, str]) -> Profile:
    """A part of fleetflame's window (one of its consecutive reads) named as the whole was."""
    return renamed(fleetflame_profile(parse_folded(text), modules), renaming)


def _functions(profile: Profile) -> set[str]:
    return {name for stack in profile.stacks for name in stack}


def _add(stacks: dict[Stack, int], stack: Stack, count: int) -> None:
    stacks[stack] = stacks.get(stack, 0) + count


@dataclass(frozen=True)
class ThreadRate:
    """One thread's samples per second: by its CPU clock (the ground truth), and by each tool."""

    name: str
    cpu: float
    fleetflame: float
    pyspy: float


def fleetflame_thread_samples(stacks: Mapping[Stack, int]) -> Counter[str]:
    """Samples per thread name, from fleetflame's ``[thread:NAME]`` root frames."""
    samples: Counter[str] = Counter()
    for stack, count in stacks.items():
        if stack and stack[0].startswith("[thread:") and stack[0].endswith("]"):
            samples[unescape_frame(stack[0][len("[thread:") : -1])] += count
    return samples


def pyspy_thread_samples(stacks: Mapping[Stack, int]) -> tuple[Counter[str], dict[int, str]]:
    """Samples per thread name from py-spy's ``thread (ID): NAME`` roots, and the name of each
    OS thread id (py-spy shows the OS id in decimal when it knows it, else a hex Python id)."""
    samples: Counter[str] = Counter()
    names: dict[int, str] = {}
    for stack, count in stacks.items():
        for frame in stack[:2]:
            match = _THREAD_ROOT.match(frame)
            if match:
                name = match.group("name") or ""
                samples[name] += count
                thread_id = frame[len("thread (") : frame.index(")")]
                if thread_id.isdigit():
                    names[int(thread_id)] = name
                break
    return samples, names


def thread_rates(
    cpu_by_thread_id: Mapping[int, float],
    names: Mapping[int, str],
    fleetflame: Mapping[str, int],
    pyspy: Mapping[str, int],
    seconds: float,
    wall: float,
    interval: float = 0.01,
) -> list[ThreadRate]:
    """Each thread's samples per second by its CPU clock and by each tool, busiest first.

    ``cpu_by_thread_id`` is the CPU seconds each OS thread used over ``wall`` seconds; a thread
    py-spy did not name is ``tid N``.
    """
    cpu: dict[str, float] = {}
    for thread_id, used in cpu_by_thread_id.items():
        name = names.get(thread_id, f"tid {thread_id}")
        cpu[name] = cpu.get(name, 0.0) + used / wall / interval
    rates = [
        ThreadRate(
            name,
            cpu.get(name, 0.0),
            fleetflame.get(name, 0) / seconds,
            pyspy.get(name, 0) / seconds,
        )
        for name in set(cpu) | set(fleetflame) | set(pyspy)
    ]
    return sorted(rates, key=lambda r: (-max(r.cpu, r.fleetflame, r.pyspy), r.name))
