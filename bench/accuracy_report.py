"""What bench/accuracy.py prints and stores: pure functions from results to lines and documents."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from accuracy_compare import GOAL_POINTS, Comparison, Profile, ThreadRate
from accuracy_stats import (
    GOAL,
    Judged,
    Judgement,
    Noise,
    met_counts,
    misses,
    verdict,
    worst,
)
from accuracy_suite import Workload


def table_lines(
    judgements: Sequence[Judgement], focus: Iterable[str] = (), limit: int = 12
) -> list[str]:
    """A table of the top functions, every focus function and every difference past the goal:
    both tools' shares side by side, the difference, its standard error, the criterion met."""
    focus = set(focus)
    shown = [
        j
        for index, j in enumerate(judgements)
        if index < limit or j.function in focus or (j.self.met, j.total.met) != (GOAL, GOAL)
    ]
    lines = [
        f"  {'self % (a leaf: vs its truth)':<32}"
        f"  {'total % (diff against the truth where one is given)':<50}",
        f"  {'fleetf':>6} {'py-spy':>6} {'diff':>6} {'SE':>4} {'met':<5}"
        f"  {'fleetf':>6} {'py-spy':>6} {'truth':>6} {'diff':>6} {'SE':>4} {'met':<5}  function",
    ]
    for judgement in shown:
        ours, reference = judgement.row.fleetflame, judgement.row.pyspy
        truth = "" if judgement.truth is None else f"{judgement.truth:.1f}"
        mark = "  *" if judgement.function in focus else ""
        lines.append(
            f"  {ours.self:6.1f} {reference.self:6.1f} {_judged(judgement.self)}"
            f"  {ours.total:6.1f} {reference.total:6.1f} {truth:>6} {_judged(judgement.total)}"
            f"  {_clip(judgement.function)}{mark}"
        )
    if len(shown) < len(judgements):
        lines.append(
            f"  ... and {len(judgements) - len(shown)} more compared functions,"
            f" all within {GOAL_POINTS:g} points (--json has them)"
        )
    return lines


def _judged(judged: Judged) -> str:
    return f"{judged.diff:+6.1f} {judged.se:4.1f} {judged.met:<5}"


def reference_note(pyspy_per_second: float, cpu_per_second: float) -> str | None:
    """What it means when py-spy's samples per second stray from the process's CPU clock."""
    gap = pyspy_per_second - cpu_per_second
    if abs(gap) <= max(5.0, 0.1 * cpu_per_second):
        return None
    if gap > 0:
        return (
            f"py-spy has {gap:.0f} samples/s more than the process's CPU clock: it counts a "
            "thread that is runnable but waiting for a core (a busy machine) as running, and "
            "some waiting threads too (it reads a thread's state just before it stops the "
            "process, benfred/py-spy#92); the thread table shows which"
        )
    return (
        f"py-spy has {-gap:.0f} samples/s fewer than the process's CPU clock: CPU it did not "
        "see (threads it took for idle, or work without the GIL under --gil)"
    )


def thread_lines(rates: Sequence[ThreadRate], least: float = 0.5) -> list[str]:
    """A table of the threads that either tool or the CPU clock puts above ``least`` per second."""
    shown = [r for r in rates if max(r.cpu, r.fleetflame, r.pyspy) >= least]
    lines = [f"  {'CPU':>7} {'fleetf':>7} {'py-spy':>7}  thread (samples/s; CPU: its clock)"]
    for rate in shown:
        lines.append(f"  {rate.cpu:7.1f} {rate.fleetflame:7.1f} {rate.pyspy:7.1f}  {rate.name}")
    return lines


def _rate(value: float | None) -> str:
    return "?" if value is None else f"{value:.1f}"


def _clip(name: str, width: int = 70) -> str:
    return name if len(name) <= width else "..." + name[-(width - 3) :]


def summary_lines(results: Sequence[Mapping[str, Any]]) -> list[str]:
    """The final table: workload x engine, worst differences, noise, samples/s, PASS/MISS."""
    lines = [
        f"{'workload':<17}{'engine':<15}{'worst self':>11}{'total':>7}{'A/A self':>10}"
        f"{'total':>7}{'disp':>6}{'fleetf/s':>9}{'ticks/s':>8}{'py-spy/s':>9} {'mode':<8}"
        f"{'CPU/s':>6}  verdict"
    ]
    for result in results:
        engine = result["engine_requested"]
        if result.get("engine") and result["engine"] != engine:
            engine = f"{engine}->{result['engine']}"
        if result.get("error"):
            lines.append(f"{result['workload']:<17}{engine:<15}  ERROR: {result['error'][:100]}")
            continue
        notes = [*result["misses"], *result["ceiling_misses"]]
        if result["verdict"] == "PASS" and result["met_counts"]:
            notes.append(", ".join(f"{n} by {met}" for met, n in result["met_counts"].items()))
        pyspy_rate, cpu_rate = result["pyspy"]["per_second"], 100 * result["process_cpus"]
        if reference_note(pyspy_rate, cpu_rate):
            notes.append(f"py-spy {pyspy_rate - cpu_rate:+.0f}/s off the CPU clock")
        if result.get("attempts", 1) > 1:
            notes.append("the first window failed: a second run")
        noise = result.get("noise") or {}
        lines.append(
            f"{result['workload']:<17}{engine:<15}"
            f"{_signed(result['worst_self']['diff']):>11}{_signed(result['worst_total']['diff']):>7}"
            f"{_rate(noise.get('self_floor')):>10}{_rate(noise.get('total_floor')):>7}"
            f"{_rate(noise.get('dispersion')):>6}"
            f"{result['fleetflame']['per_second']:>9.1f}"
            f"{_rate(result['fleetflame'].get('ticks_per_second')):>8}"
            f"{result['pyspy']['per_second']:>9.1f} {result['pyspy'].get('mode', '?'):<8}"
            f"{100 * result['process_cpus']:>6.1f}"
            f"  {result['verdict']}" + (f" ({'; '.join(notes)})" if notes else "")
        )
    return lines


def _signed(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f}"


def result_document(
    comparison: Comparison,
    judgements: Sequence[Judgement],
    noise: Noise | None,
    info: Mapping[str, Any],
    seconds: float,
    extra: Mapping[str, Any],
    load: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """One run's result as a JSON object: both tools' samples, every judged function, the
    noise, the worst differences and the verdict."""

    def tool(profile: Profile) -> dict[str, Any]:
        return {
            "samples": profile.samples,
            "per_second": profile.samples / seconds,
            "left_out": profile.left_out,
        }

    def worst_of(kind: str) -> dict[str, Any]:
        judgement = worst(judgements, kind)
        if judgement is None:
            return {"function": None, "diff": None}
        judged: Judged = getattr(judgement, kind)
        return {"function": judgement.function, **vars(judged)}

    return {
        "engine": info.get("engine", "python"),
        "engine_info": {
            k: v for k, v in info.items() if "engine" in k and k != "engine" and v is not None
        },
        "driver": info.get("driver"),
        "pid": info["instance"]["pid"],
        "seconds": seconds,
        "overhead_percent": info.get("overhead_percent"),
        "interval": info.get("interval"),
        "effective_interval": info.get("effective_interval"),
        "fleetflame": tool(comparison.fleetflame),
        "pyspy": tool(comparison.pyspy),
        "worst_self": worst_of("self"),
        "worst_total": worst_of("total"),
        "noise": noise.to_document() if noise else None,
        "ceiling_misses": comparison.ceiling_misses,
        "misses": misses(judgements),
        "met_counts": met_counts(judgements),
        "verdict": verdict(judgements, comparison.ceiling_misses),
        "renamed": comparison.renaming,
        "functions": [judgement.to_document() for judgement in judgements],
        "workload_facts": dict(extra),
        "load": load,
    }


def _stretched(result: Mapping[str, Any]) -> str:
    """Says whether the overhead budget stretched the tick interval (fewer ticks than the CPU
    clock, by design: docs/sampler.md)."""
    interval, effective = result.get("interval"), result.get("effective_interval")
    if not interval or not effective or effective <= interval:
        return ""
    return f", its budget stretched the interval to {1000 * effective:.1f} ms as the window ended"


def report_lines(workload: Workload, result: Mapping[str, Any]) -> list[str]:
    """What one run prints: engines, samples, worst differences, noise, what was left out, the
    table."""
    head = f"== {workload.name}, engine {result['engine_requested']}"
    if result.get("error"):
        return [head, f"   ERROR: {result['error']}"]
    engine_note = f"ran {result['engine']}, driver {result['driver']}"
    if result["engine_info"]:
        engine_note += f", {result['engine_info']}"
    ours, reference = result["fleetflame"], result["pyspy"]
    lines = [
        f"{head} ({engine_note}), pid {result['pid']}",
        f"   {workload.about}",
        f"   {result['seconds']:g} s window: fleetflame {ours['samples']} samples"
        f" ({ours['per_second']:.1f}/s) from {_rate(ours['ticks_per_second'])} ticks/s, py-spy"
        f" ({reference['mode']} mode) {reference['samples']} ({reference['per_second']:.1f}/s);"
        " the process's CPU clock"
        f" {100 * result['process_cpus']:.1f}/s; fleetflame's overhead"
        f" {result['overhead_percent']}% (its /info){_stretched(result)}",
        f"   worst self difference {_worst(result['worst_self'])}, worst total"
        f" {_worst(result['worst_total'])}: {result['verdict']}",
    ]
    noise = result.get("noise")
    if noise:
        lines.append(
            f"   A/A: fleetflame's two halves of the window differ by at most"
            f" {noise['self_worst']:.1f} self and {noise['total_worst']:.1f} total points;"
            f" noise floor of two whole windows {noise['self_floor']:.1f} and"
            f" {noise['total_floor']:.1f} points; dispersion {_rate(noise['dispersion'])}"
            " (A/A variance over binomial: 1 for independent samples)"
        )
    for miss in result["misses"]:
        lines.append(f"   MISS: {miss}")
    note = reference_note(reference["per_second"], 100 * result["process_cpus"])
    if note:
        lines.append(f"   check: {note}")
    for miss in result["ceiling_misses"]:
        lines.append(f"   over its ceiling in fleetflame: {miss}")
    for reason, count in {**ours["left_out"], **reference["left_out"]}.items():
        lines.append(f"   left out: {reason}: {count}")
    for old, new in sorted(result["renamed"].items()):
        lines.append(f"   fleetflame's {old} is py-spy's {new}")
    if result["workload_facts"]:
        lines.append(f"   workload: {json.dumps(result['workload_facts'], sort_keys=True)}")
    if result["load"]:
        lines.append(
            f"   load: {result['load']['requests']} requests, {result['load']['errors']} errors"
        )
    judgements = [Judgement.from_document(f) for f in result["functions"]]
    lines += ["   " + line for line in table_lines(judgements, workload.focus)]
    rates = [ThreadRate(**rate) for rate in result["threads"]]
    if len([r for r in rates if max(r.cpu, r.fleetflame, r.pyspy) >= 0.5]) > 1:
        lines += ["   " + line for line in thread_lines(rates)]
    return lines


def _worst(worst: Mapping[str, Any]) -> str:
    if worst["function"] is None:
        return "none"
    return (
        f"{worst['diff']:+.1f} points (SE {worst['se']:.1f}, met: {worst['met']})"
        f" in {worst['function']}"
    )
