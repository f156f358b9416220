"""``python -m sampler run --output DIR --every SECONDS``: one folded file per period."""

import re
import subprocess
import sys

import pytest
from samplerhelpers import WORKLOADS, env

from sampler.profile import parse_folded

NAME = re.compile(r"(\d{8}T\d{6}\.\d{3}Z)-p(\d+)-(\d{6})\.folded")


def run(*args, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "sampler", "run", *args],
        env=env(),
        timeout=timeout,
        capture_output=True,
        text=True,
    )


def has(counts, frame):
    return sum(c for s, c in counts.items() if s.endswith(f":{frame};__main__:spin"))


def test_each_file_holds_its_own_period_and_the_files_sort_in_time(tmp_path):
    out = tmp_path / "periods"
    result = run("--output", str(out), "--every", "0.4", str(WORKLOADS / "phases.py"), "0.8")
    assert result.returncode == 0, result.stderr
    names = sorted(p.name for p in out.iterdir())
    assert all(NAME.fullmatch(name) for name in names), names  # no temporary file left
    parts = [NAME.fullmatch(name).groups() for name in names]
    assert [int(seq) for _, _, seq in parts] == list(range(len(names)))
    assert [stamp for stamp, _, _ in parts] == sorted(stamp for stamp, _, _ in parts)
    assert len(names) >= 4  # 1.6 s of CPU in periods of 0.4 s, and the last partial one
    periods = [parse_folded((out / name).read_text()) for name in names]
    one = [has(counts, "phase_one") for counts in periods]
    two = [has(counts, "phase_two") for counts in periods]
    # Phase one ends before phase two starts: with cumulative counts, phase one's samples
    # would be in every file after its first.
    first_two = next(i for i, n in enumerate(two) if n)
    assert one[0] > 0 and two[0] == 0
    assert not any(one[first_two + 1 :]), (one, two)
    assert sum(one) >= 50 and sum(two) >= 50  # 80 each at 100 Hz


@pytest.mark.parallel
def test_without_every_output_is_one_file_as_before(tmp_path):
    out = tmp_path / "out.folded"
    result = run("--output", str(out), str(WORKLOADS / "phases.py"), "0.3")
    assert result.returncode == 0, result.stderr
    counts = parse_folded(out.read_text())
    assert has(counts, "phase_one") and has(counts, "phase_two")


@pytest.mark.parallel
def test_every_needs_a_directory_and_a_positive_period(tmp_path):
    script = str(WORKLOADS / "phases.py")
    result = run("--every", "60", script, "0")
    assert result.returncode == 2 and "--every needs --output DIR" in result.stderr
    result = run("--output", str(tmp_path), "--every", "0", script, "0")
    assert result.returncode == 2 and "positive number of seconds" in result.stderr
    taken = tmp_path / "a-file"
    taken.write_text("")
    result = run("--output", str(taken), "--every", "1", script, "0")
    assert result.returncode == 2 and "cannot make that directory" in result.stderr
