"""bench/accuracy_report.py: what the harness prints, from results to lines."""

from __future__ import annotations

import accuracy_report
from accuracy_compare import Row, Share
from accuracy_stats import BY_SE, GOAL, Judged, Judgement


def test_reference_note_only_when_pyspy_strays_from_the_cpu_clock():
    assert accuracy_report.reference_note(100.0, 96.0) is None
    assert "more than the process's CPU clock" in accuracy_report.reference_note(260.0, 78.0)
    assert "fewer than the process's CPU clock" in accuracy_report.reference_note(70.0, 96.0)


def test_summary_lines_show_a_fallback_an_error_and_a_doubtful_reference():
    result = {
        "workload": "threads",
        "engine_requested": "native",
        "engine": "python",
        "worst_self": {"diff": -31.2},
        "worst_total": {"diff": 1.0},
        "noise": {"self_floor": 2.1, "total_floor": 2.4, "dispersion": 1.3},
        "fleetflame": {"per_second": 89.0, "ticks_per_second": 2.5},
        "pyspy": {"per_second": 121.2, "mode": "gil"},
        "process_cpus": 0.9,
        "ceiling_misses": [],
        "misses": ["__main__:burn self -31.2 (22.0 SE)"],
        "met_counts": {"MISS": 1},
        "verdict": "MISS",
    }
    failed = {"workload": "black", "engine_requested": "python", "error": "py-spy failed (1)"}
    header, row, error = accuracy_report.summary_lines([result, failed])
    assert "native->python" in row and "-31.2" in row and " 2.5 " in row
    assert " 2.1 " in row and " 2.4 " in row and " 1.3 " in row
    assert "MISS (__main__:burn self -31.2 (22.0 SE); py-spy +31/s off the CPU clock)" in row
    assert " gil " in row
    assert "ERROR: py-spy failed (1)" in error


def test_summary_lines_say_which_criteria_a_pass_needed():
    result = {
        "workload": "black",
        "engine_requested": "native",
        "engine": "native",
        "worst_self": {"diff": 3.4},
        "worst_total": {"diff": -1.0},
        "noise": None,
        "fleetflame": {"per_second": 99.0, "ticks_per_second": 99.0},
        "pyspy": {"per_second": 100.2, "mode": "default"},
        "process_cpus": 0.99,
        "ceiling_misses": [],
        "misses": [],
        "met_counts": {"SE": 1},
        "verdict": "PASS",
    }
    _, row = accuracy_report.summary_lines([result])
    assert row.endswith("PASS (1 by SE)")
    _, row = accuracy_report.summary_lines([{**result, "attempts": 2}])
    assert row.endswith("PASS (1 by SE; the first window failed: a second run)")
    assert "+3.4" in row and "-1.0" in row


def judged(function: str, share: float, met: str = GOAL) -> Judgement:
    return Judgement(
        Row(function, Share(share, share), Share(share, share)),
        None,
        Judged(0.0, 1.0, met),
        Judged(0.0, 1.0, GOAL),
    )


def test_table_lines_mark_focus_functions_and_keep_them_past_the_limit():
    judgements = [judged(f"m:f{i}", 10.0 - i) for i in range(5)]
    lines = accuracy_report.table_lines(judgements, focus=["m:f4"], limit=2)
    assert len(lines) == 2 + 3 + 1
    assert lines[-2].endswith("m:f4  *")
    assert lines[-1] == "  ... and 2 more compared functions, all within 3 points (--json has them)"


def test_table_lines_show_every_difference_past_the_goal_and_the_truth():
    judgements = [judged(f"m:f{i}", 10.0 - i) for i in range(4)]
    judgements.append(judged("m:noisy", 1.0, BY_SE))
    judgements.append(
        Judgement(
            Row("flask.app:Flask.wsgi_app", Share(0.0, 90.6), Share(0.0, 81.7)),
            88.5,
            Judged(0.0, 0.0, GOAL),
            Judged(2.1, 1.7, GOAL),
        )
    )
    lines = accuracy_report.table_lines(judgements, focus=["flask.app:Flask.wsgi_app"], limit=1)
    assert [line.split()[-1] for line in lines[2:-1]] == ["m:f0", "m:noisy", "*"]
    noisy, truth = lines[3], lines[4]
    assert " SE " in noisy
    assert "   90.6   81.7   88.5   +2.1  1.7 goal " in truth
