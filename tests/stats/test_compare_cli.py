"""``fleetflame compare``: folded files in, a ranked table or JSON out, and an exit status a
CI job can gate on (1: a significant regression, 0: none, 2: bad input)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from synthfleet import draw, leaf_with_share, profiles, with_change, zipf_truth

from collector.compare import main
from collector.stats import SETTINGS
from sampler.profile import format_folded
from sampler.settings import markdown_table

ROOT = Path(__file__).resolve().parents[2]
TRUTH = zipf_truth(functions=150)
LEAF = leaf_with_share(TRUTH, 2.0)
SLOWER = TRUTH.leaves[LEAF]


def write_side(folder: Path, truth, replicates: int, seed: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    drawn = draw(np.random.default_rng(seed), truth, replicates)
    for i, counts in enumerate(profiles(truth, drawn)):
        (folder / f"{i:03d}.folded").write_text(format_folded(counts))
    return folder


@pytest.fixture
def sides(tmp_path):
    """Baseline A, a rerun of it (A2), and B where one function's self share grew 3 points."""
    return (
        write_side(tmp_path / "a", TRUTH, 10, 1),
        write_side(tmp_path / "a2", TRUTH, 10, 2),
        write_side(tmp_path / "b", with_change(TRUTH, LEAF, 3.0), 10, 3),
    )


def run(capsys, *argv):
    status = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return status, out, err


def test_a_regression_fails_the_gate_with_its_findings_in_json(capsys, sides):
    a, _, b = sides
    status, out, err = run(capsys, a, "--vs", b, "--json")
    assert status == 1, err
    doc = json.loads(out)
    assert doc["replicates"]["a"] == doc["replicates"]["b"] == 10
    top = doc["findings"][0]
    assert set(top) >= {
        "function", "kind", "a_share", "b_share", "change", "ci_low", "ci_high", "p", "q",
        "significant",
    }  # fmt: skip
    assert (top["function"], top["kind"], top["significant"]) == (SLOWER, "self", True)
    assert abs(top["change"] - 3.0) < 0.5 and top["ci_low"] < top["change"] < top["ci_high"]
    assert {(r["function"], r["kind"]) for r in doc["regressions"]} == {
        (SLOWER, "self"),
        (TRUTH.callers[LEAF], "total"),
    }
    floor = doc["noise_floor"]
    assert floor["splits"] == 20 and 0 < floor["mde"] < floor["largest_change"]
    assert len(doc["files"]["a"]) == 10


def test_no_regression_passes_and_the_table_says_why(capsys, sides):
    a, a2, _ = sides
    status, out, err = run(capsys, a, "--vs", a2)
    assert status == 0, err
    assert "A: 10 replicates" in out and "noise floor" in out
    assert "OK: no significant regression above 2 points" in out
    # The median of the functions' own detectable changes, and their range beside it.
    found = re.search(
        r"smallest detectable change: median ([\d.]+) points over the (\d+) judged "
        r"self shares that vary \(([\d.]+) to ([\d.]+); 80% power\)",
        out,
    )
    assert found, out
    median, low, high = float(found[1]), float(found[3]), float(found[4])
    assert 0 < low <= median <= high


def test_fail_above_moves_the_gate(capsys, sides):
    a, _, b = sides
    assert run(capsys, a, "--vs", b, "--fail-above", "5")[0] == 0
    status, out, _ = run(capsys, a, "--vs", b, "--fail-above", "1")
    assert status == 1
    assert SLOWER in out.split("FAIL:")[1]
    line = next(line for line in out.splitlines() if SLOWER in line and "self" in line)
    assert "significant" in line


def test_settings_come_from_the_environment_too(capsys, sides, monkeypatch):
    a, _, b = sides
    monkeypatch.setenv("FLEETFLAME_COMPARE_FAIL_ABOVE", "5")
    assert run(capsys, a, "--vs", b)[0] == 0
    assert run(capsys, a, "--vs", b, "--fail-above", "1")[0] == 1  # the option wins


def test_files_and_directories_mix_and_empty_files_are_left_out(capsys, sides, tmp_path):
    a, _, b = sides
    (a / "empty.folded").write_text("")
    (a / ".fleetflame-partial").write_text("garbage")  # a file being written: not *.folded
    (a / "notes.txt").write_text("garbage")
    status, out, _ = run(capsys, *sorted(a.glob("00[0-4].folded")), a, "--vs", b, "--json")
    # The five files named twice on side A are read twice: each argument counts.
    doc = json.loads(out)
    assert doc["replicates"]["a"] == 15 and len(doc["files"]["a"]) == 16


def test_per_directory_makes_each_directory_one_replicate(capsys, tmp_path):
    """Three runs a side, each its own process writing its minutes into its own directory."""
    a = [write_side(tmp_path / f"a{i}", TRUTH, 4, 10 + i) for i in range(3)]
    b = [write_side(tmp_path / f"b{i}", with_change(TRUTH, LEAF, 3.0), 4, 20 + i) for i in range(3)]
    status, out, err = run(capsys, *a, "--vs", *b, "--per-directory", "--json")
    assert status == 1, err
    doc = json.loads(out)
    assert doc["replicates"]["a"] == 3 and doc["files"]["a"] == [str(d) for d in a]
    assert doc["replicates"]["a_samples"] == 12 * 6000
    assert doc["findings"][0]["function"] == SLOWER
    status, _, err = run(capsys, a[0] / "000.folded", a[1], "--vs", *b, "--per-directory")
    assert status == 2 and "is no directory (--per-directory)" in err


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["{a}/missing.folded", "--vs", "{b}"], "missing.folded is no file or directory"),
        (["{empty}", "--vs", "{b}"], "holds no *.folded file"),
        (["{a}", "--vs", "{bad}"], "bad.folded: line 2: count 'x' is not a whole number"),
        (["{a}", "--vs", "{binary}"], "not UTF-8 text"),
        (["{a}", "--vs", "{a}/000.folded"], "is on both sides"),
        (["{a}", "--vs", "{b}/000.folded"], "side B has 1 profile(s) with samples"),
        (["{a}"], "give both sides"),
        (["{a}", "--vs", "{b}", "--fdr", "2"], "fdr must be between 0 and 1"),
        (["{a}", "--vs", "{b}", "--min-samples", "many"], "option --min-samples"),
        (["--a-label", "version:1", "{a}", "--vs", "{b}"], "--a-label need --database-url"),
        (["--database-url", "sqlite:///x.db", "--a-label", "version:1"], "needs --service"),
        (["--database-url", "sqlite:///x.db", "--service", "s"], "say what differs"),
        (["{a}", "--database-url", "sqlite:///x.db", "--service", "s"], "not both"),
    ],
)
def test_bad_input_exits_2_with_a_clear_message(capsys, sides, tmp_path, arguments, message):
    a, _, b = sides
    (tmp_path / "empty").mkdir()
    (tmp_path / "bad.folded").write_text("main;f 3\nmain;g x\n")
    (tmp_path / "binary.folded").write_bytes(b"\xff\xfe main 3\n")
    paths = {"a": a, "b": b, "empty": tmp_path / "empty"}
    paths |= {"bad": tmp_path / "bad.folded", "binary": tmp_path / "binary.folded"}
    status, out, err = run(capsys, *(arg.format(**paths) for arg in arguments))
    assert status == 2 and out == ""
    assert err.startswith("fleetflame compare: ") and message in err, err


def test_the_fleetflame_command_runs_it(sides):
    a, _, b = sides
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "sampler.cli", "compare", str(a), "--vs", str(b), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in env.items() if not k.startswith("FLEETFLAME_")},
    )
    assert result.returncode == 1, result.stderr
    assert json.loads(result.stdout)["findings"][0]["function"] == SLOWER


def test_docs_list_every_setting():
    assert markdown_table(SETTINGS) in (ROOT / "docs" / "regressions.md").read_text()
