"""Output files (a profile, an SVG, a trace) get the mode a plain open() would give them."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from contextlib import contextmanager

import pytest
from samplerhelpers import env, exits

from sampler._files import write_text_atomically
from sampler._trace_write import write_atomically as write_trace

pytestmark = pytest.mark.parallel


@contextmanager
def umask(mask):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def mode(path):
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_file_gets_the_umask_and_an_old_one_keeps_its_mode(tmp_path):
    new, kept = tmp_path / "new.folded", tmp_path / "kept.folded"
    kept.write_text("old\n")
    kept.chmod(0o640)
    with umask(0o022):
        write_text_atomically(str(new), "a;b 1\n")
        write_text_atomically(str(kept), "a;b 2\n")
        write_trace(str(tmp_path / "run.json"), ["{}"], lambda: {})
    with umask(0o077):
        write_text_atomically(str(tmp_path / "private.folded"), "a;b 1\n")
    assert mode(new) == 0o644 and new.read_text() == "a;b 1\n"
    assert mode(kept) == 0o640 and kept.read_text() == "a;b 2\n"
    assert mode(tmp_path / "run.json") == 0o644
    assert mode(tmp_path / "private.folded") == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "kept.folded",
        "new.folded",
        "private.folded",
        "run.json",
    ]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "out.folded"
    target.write_text("old\n")

    with pytest.raises(TypeError):
        write_text_atomically(str(target), 42)  # type: ignore[arg-type]
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.folded"]


def test_the_run_command_writes_readable_profiles(tmp_path):
    out, svg = tmp_path / "out.folded", tmp_path / "out.svg"
    command = [sys.executable, "-m", "sampler", "run", "-o", str(out), "--svg", str(svg)]
    subprocess.run(
        [
            "sh",
            "-c",
            'umask 022 && exec "$@"',
            "sh",
            *command,
            *exits(0),
        ],
        env=env(),
        timeout=60,
    )
    assert mode(out) == 0o644 and mode(svg) == 0o644
