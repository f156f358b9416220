"""The core as a package: one namespace of every module's names, loaded as they are used."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import sampler.profile

ROOT = Path(__file__).resolve().parents[2]
MODULES = ("counts", "document", "folded", "frames", "profiles", "pruning", "tree", "windows")


def test_every_modules_public_names_are_the_packages():
    names = []
    for name in MODULES:
        module = importlib.import_module(f"sampler.profile.{name}")
        names += module.__all__
        for public in module.__all__:
            assert getattr(sampler.profile, public) is getattr(module, public)
    assert sorted(sampler.profile.__all__) == sorted(names)
    assert len(set(names)) == len(names)  # no name in two modules
    assert set(names) <= set(dir(sampler.profile))


def test_import_sampler_loads_only_the_frames_of_the_core():
    code = (
        "import sys, sampler\n"
        "print(*sorted(m for m in sys.modules if m.startswith('sampler.profile')))\n"
        "from sampler.profile import subtract, Node\n"
        "print(*sorted(m for m in sys.modules if m.startswith('sampler.profile')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout.splitlines()
    assert out[0].split() == ["sampler.profile", "sampler.profile.frames"]
    assert {"sampler.profile.counts", "sampler.profile.tree"} <= set(out[1].split())
    assert "sampler.profile.pruning" not in out[1].split()


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no_such_name"):
        sampler.profile.no_such_name  # noqa: B018
