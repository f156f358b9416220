"""The flamegraph page's tree transformations, run in Node as the browser runs them: "hide
waiting" (a wall-mode tree without its [waiting] samples, each ancestor reduced by what was
taken out below it) and "collapse chains" (frames every sample below passes through, drawn as
one)."""

import json
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def node(name, value, *children):
    return {"name": name, "value": value, "children": list(children)}


def test_waiting_samples_are_taken_out_of_every_ancestor():
    tree = node(
        "all",
        100,
        node(
            "app:serve",
            100,
            node(
                "app:query", 70, node("db:execute", 70, node("[waiting]", 60, node("[socket]", 60)))
            ),
            node("app:render", 30),
        ),
    )
    out = subprocess.run(
        [
            shutil.which("node"),
            str(ROOT / "tests/webui/trees_check.mjs"),
            str(ROOT / "webui/static/js/trees.js"),
            json.dumps(tree),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    kept = json.loads(out.stdout)
    assert kept["value"] == 40
    serve = kept["children"][0]
    assert serve["value"] == 40
    query, render = serve["children"]
    assert (query["name"], query["value"]) == ("app:query", 10)
    assert query["children"][0] == {"name": "db:execute", "value": 10, "children": []}
    assert render["value"] == 30


def run_trees(tree, name):
    out = subprocess.run(
        [
            shutil.which("node"),
            str(ROOT / "tests/webui/trees_check.mjs"),
            str(ROOT / "webui/static/js/trees.js"),
            json.dumps(tree),
            name,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(out.stdout)


def chain(names, value, *below):
    """Frames ``names`` one under the other, all holding ``value``, over ``below``."""
    top = node(names[-1], value, *below)
    for name in reversed(names[:-1]):
        top = node(name, value, top)
    return top


def test_long_chains_are_collapsed_into_one_frame_and_short_ones_kept():
    launcher = [f"runpy:frame{i}" for i in range(12)]
    tree = node(
        "all",
        100,
        chain(
            launcher,
            90,
            # Under the chain's end: a short chain (3 frames) above a fork, then two leaves.
            chain(["app:a", "app:b", "app:c"], 90, node("app:x", 60), node("app:y", 30)),
        ),
        node("other", 10),
    )
    out = run_trees(tree, "collapseChains")
    top, other = out["children"]
    # The launcher's 12 frames and app:a..c end in the fork: one chain of 15 frames.
    assert top["name"] == "runpy:frame0 … app:c"
    assert top["frames"] == [*launcher, "app:a", "app:b", "app:c"]
    assert top["value"] == 90
    assert [c["name"] for c in top["children"]] == ["app:x", "app:y"]
    assert other == {"name": "other", "value": 10, "children": []}
    # A chain broken by a frame's own samples (self time) ends there; 3 frames stay as they are.
    tree = node("all", 10, chain(["a", "b"], 10, node("c", 10, node("d", 8), node("e", 2))))
    kept = run_trees(tree, "collapseChains")
    assert kept == tree
    partly = node("all", 10, chain(["a", "b", "c", "d"], 10, node("e", 7)))
    (collapsed,) = run_trees(partly, "collapseChains")["children"]
    assert collapsed["frames"] == ["a", "b", "c", "d"] and collapsed["children"][0]["name"] == "e"
