"""bench/accuracy_compare.py: parsing both tools' output, naming, shares, differences."""

from __future__ import annotations

import accuracy_compare
import pytest
from accuracy_compare import (
    ModuleMap,
    Profile,
    Share,
    ThreadRate,
)

SITE = "/venv/lib/python3.11/site-packages"
MODULES = ModuleMap(
    {
        "/work/app.py": "__main__",
        f"{SITE}/jinja2/environment.py": "jinja2.environment",
        "/work/sampler/_drivers.py": "sampler._drivers",
        "/work/sampler/_core.py": "sampler._core",
        "/work/sampler/_server.py": "sampler._server",
        "/work/sampler/__main__.py": "sampler.__main__",
        "/work/sampler/_stalls.py": "sampler._stalls",
        "/work/sampler/middleware/wsgi.py": "sampler.middleware.wsgi",
        "/work/gunicorn/workers/sync.py": "gunicorn.workers.sync",
    },
    sys_path=[SITE, "/usr/lib/python3.11"],
)


def spy(name: str, path: str) -> str:
    return f"{name} ({path})"


MAIN = spy("<module>", "/work/app.py")
WORK = spy("work", "/work/app.py")


# -- parsing ---------------------------------------------------------------------------------


def test_parse_folded_sums_repeated_stacks_and_splits_on_the_last_space():
    # The profile core's rules: a frame may hold spaces, even at its ends.
    text = "a;b c;d 3\na;b c;d 2\n\n  e 1  \n"
    assert accuracy_compare.parse_folded(text) == {("a", "b c", "d"): 5, ("  e",): 1}


def test_parse_folded_keeps_a_count_with_no_frames():
    assert accuracy_compare.parse_folded(" 4\n") == {(): 4}


def test_parse_folded_names_a_bad_line():
    with pytest.raises(ValueError, match="not folded-stack text"):
        accuracy_compare.parse_folded("a;b many\n")


def test_fleetflame_profile_drops_synthetic_frames_and_unescapes_names():
    stacks = {
        ("[thread:MainThread]", "__main__:<module>", "app:f%3Bg"): 4,
        ("[truncated]", "app:deep"): 2,
        ("[other]",): 1,
    }
    profile = accuracy_compare.fleetflame_profile(stacks)
    assert profile.stacks == {("__main__:<module>", "app:f;g"): 4, ("app:deep",): 2, (): 1}
    assert profile.samples == 7
    assert profile.left_out == {
        "fleetflame [thread:...] frames removed (samples)": 4,
        "fleetflame [truncated] frames removed (samples)": 2,
        "fleetflame [other] frames removed (samples)": 1,
    }


def test_fleetflame_profile_names_a_frame_named_by_its_file_by_its_module():
    stacks = {
        (f"{SITE}/jinja2/environment.py:Environment.getattr",): 3,
        ("jinja2.environment:Environment.getattr",): 1,
        ("<string>:__init__",): 1,
    }
    profile = accuracy_compare.fleetflame_profile(stacks, MODULES)
    assert profile.stacks == {
        ("jinja2.environment:Environment.getattr",): 4,
        ("<string>:__init__",): 1,
    }
    assert profile.left_out == {accuracy_compare.NAMED_BY_FILE: 3}


# -- naming py-spy's frames ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("frame", "name"),
    [
        (
            spy("Environment.getattr", f"{SITE}/jinja2/environment.py"),
            "jinja2.environment:Environment.getattr",
        ),
        (spy("join", "<frozen posixpath>"), "posixpath:join"),
        # Not in the map (imported after it was written): named from sys.path.
        (spy("Loader.load", f"{SITE}/yaml/loader.py"), "yaml.loader:Loader.load"),
        (spy("f", f"{SITE}/pkg/__init__.py"), "pkg:f"),
        # Code compiled from a string: the file stands in for the module, as in fleetflame.
        (
            spy("__create_fn__.<locals>.__init__", "<string>"),
            "<string>:__create_fn__.<locals>.__init__",
        ),
        (spy("root", "<template>"), "<template>:root"),
        # With line numbers (no --nolineno).
        (spy("work", "/work/app.py:12"), "__main__:work"),
        ("garbage", "?:garbage"),
    ],
)
def test_pyspy_function_names_frames_as_fleetflame_does(frame, name):
    assert accuracy_compare.pyspy_function(frame, MODULES) == name


def test_module_map_reads_the_document_a_workload_writes():
    document = {"pid": 1, "modules": {"/a/b.py": "b"}, "sys_path": ["/a"], "extra": {}}
    modules = ModuleMap.from_document(document)
    assert modules.module_for("/a/b.py") == "b"
    assert modules.module_for("/a/c/d.py") == "c.d"
    assert modules.module_for("/elsewhere/e.py") == "/elsewhere/e.py"


def test_pyspy_profile_leaves_out_thread_roots_and_the_samplers_own_threads():
    stacks = {
        ("thread (101): MainThread", MAIN, WORK): 90,
        (
            "thread (102): fleetflame-sampler",
            spy("ThreadDriver._run", "/work/sampler/_drivers.py"),
        ): 5,
        (
            "thread (103): fleetflame-endpoint",
            spy("serve_forever", "/usr/lib/python3.11/socketserver.py"),
        ): 7,
    }
    profile = accuracy_compare.pyspy_profile(stacks, MODULES)
    assert profile.stacks == {("__main__:<module>", "__main__:work"): 90}
    assert profile.left_out == {
        accuracy_compare.ROOTS_REMOVED: 102,
        accuracy_compare.ON_SAMPLER_THREADS: 12,
    }


def test_pyspy_profile_drops_the_endpoints_request_threads():
    request = (
        "thread (104): Thread-2 (process_request_thread)",
        spy("ThreadingMixIn.process_request_thread", "/usr/lib/python3.11/socketserver.py"),
        spy("SamplerApp.__call__", "/work/sampler/_server.py"),
        spy("sleep", "/work/sampler/_core.py"),
    )
    profile = accuracy_compare.pyspy_profile({request: 3}, MODULES)
    assert profile.stacks == {}
    assert profile.left_out[accuracy_compare.IN_ENDPOINT] == 3


def test_pyspy_profile_charges_the_signal_handler_to_the_frame_it_interrupted():
    handler = (
        MAIN,
        WORK,
        spy("SignalDriver._on_signal", "/work/sampler/_drivers.py"),
        spy("Sampler.tick", "/work/sampler/_core.py"),
    )
    profile = accuracy_compare.pyspy_profile({handler: 2}, MODULES)
    assert profile.stacks == {("__main__:<module>", "__main__:work"): 2}
    assert profile.left_out == {accuracy_compare.IN_HANDLER: 2}


def test_pyspy_profile_drops_the_stall_watchers_wrappers_and_keeps_the_request_under_them():
    # A gunicorn request under the stall watcher's timing wrapper: fleetflame hides the wrapper,
    # and the request's frames above it are the host's, not a signal handler's.
    request = (
        MAIN,
        spy("SyncWorker.handle", "/work/gunicorn/workers/sync.py"),
        spy("_timed.<locals>.timed", "/work/sampler/_stalls.py"),
        spy("SyncWorker.handle_request", "/work/gunicorn/workers/sync.py"),
        WORK,
    )
    profile = accuracy_compare.pyspy_profile({request: 5}, MODULES)
    assert profile.stacks == {
        (
            "__main__:<module>",
            "gunicorn.workers.sync:SyncWorker.handle",
            "gunicorn.workers.sync:SyncWorker.handle_request",
            "__main__:work",
        ): 5
    }
    assert profile.left_out == {accuracy_compare.WRAPPERS: 5}


def test_pyspy_profile_keeps_the_middlewares_frames_and_the_app_above_them():
    stack = (MAIN, spy("FleetflameWSGI.__call__", "/work/sampler/middleware/wsgi.py"), WORK)
    profile = accuracy_compare.pyspy_profile({stack: 4}, MODULES)
    assert profile.stacks == {
        ("__main__:<module>", "sampler.middleware.wsgi:FleetflameWSGI.__call__", "__main__:work"): 4
    }


def test_pyspy_profile_keeps_sampler_frames_at_the_root():
    # `python -m sampler run app.py`: the sampler's frames are below the program, not a handler.
    stack = (spy("main", "/work/sampler/__main__.py"), MAIN, WORK)
    profile = accuracy_compare.pyspy_profile({stack: 1}, MODULES)
    assert profile.stacks == {("sampler.__main__:main", "__main__:<module>", "__main__:work"): 1}


# -- matching names the tools spell differently ----------------------------------------------


def test_reconcile_merges_fleetflames_modules_into_pyspys_string_code():
    reference = {"__main__:f", "<string>:__create_fn__.<locals>.__init__"}
    ours = {
        "__main__:f",
        "<string>:__create_fn__.<locals>.__init__",
        "black.lines:__create_fn__.<locals>.__init__",
        "black.brackets:__create_fn__.<locals>.__init__",
    }
    assert accuracy_compare.reconcile(reference, ours) == {
        "black.lines:__create_fn__.<locals>.__init__": "<string>:__create_fn__.<locals>.__init__",
        "black.brackets:__create_fn__.<locals>.__init__": "<string>:__create_fn__.<locals>.__init__",
    }


def test_reconcile_pairs_a_bare_name_with_a_qualified_one_in_the_same_module():
    # A Python (or a py-spy) that reports co_name where the other reports co_qualname.
    assert accuracy_compare.reconcile({"app:Handler.get"}, {"app:get"}) == {
        "app:get": "app:Handler.get"
    }


def test_reconcile_pairs_fleetflames_module_with_pyspys_file_name():
    # A namedtuple's __new__ runs with its module's globals but was compiled from a string.
    renaming = accuracy_compare.reconcile({"<string>:Point.__new__"}, {"geometry:__new__"})
    assert renaming == {"geometry:__new__": "<string>:Point.__new__"}


def test_reconcile_merges_several_into_a_vague_reference_name():
    renaming = accuracy_compare.reconcile({"<template>:root"}, {"a:root", "b:root"})
    assert renaming == {"a:root": "<template>:root", "b:root": "<template>:root"}


def test_reconcile_leaves_different_known_modules_and_ambiguous_names_alone():
    assert accuracy_compare.reconcile({"a:run"}, {"b:run"}) == {}
    assert accuracy_compare.reconcile({"a:X.run"}, {"a:Y.run", "a:Z.run"}) == {}
    assert accuracy_compare.reconcile({"a:f"}, {"a:f"}) == {}
    assert accuracy_compare.reconcile({"a:f.<locals>.<genexpr>"}, {"a:g.<locals>.<genexpr>"}) == {}


def test_renamed_merges_stacks_that_become_equal():
    profile = Profile({("m:a", "x:f"): 2, ("m:a", "y:f"): 3}, {"why": 1})
    merged = accuracy_compare.renamed(profile, {"x:f": "?:f", "y:f": "?:f"})
    assert merged.stacks == {("m:a", "?:f"): 5}
    assert merged.left_out == {"why": 1}


# -- shares and differences ------------------------------------------------------------------


def test_shares_count_self_at_the_leaf_and_total_once_per_sample():
    profile = Profile({("main", "f", "f", "g"): 6, ("main", "f"): 2, (): 2})
    by_name = accuracy_compare.shares(profile)
    assert by_name["g"] == Share(60.0, 60.0)
    assert by_name["f"] == Share(20.0, 80.0)  # recursion counts once
    assert by_name["main"] == Share(0.0, 80.0)  # the frameless samples count in the whole


def test_shares_of_an_empty_profile():
    assert accuracy_compare.shares(Profile({})) == {}


def test_compare_takes_the_top_of_either_tool_plus_the_focus():
    ours = {f"f{i}": Share(float(i), float(i)) for i in range(30)}
    reference = {"only_in_pyspy": Share(50.0, 50.0)}
    rows = accuracy_compare.compare(ours, reference, top=3, focus=["f0"])
    assert [r.function for r in rows] == ["only_in_pyspy", "f29", "f28", "f27", "f0"]
    assert rows[0].fleetflame == accuracy_compare.NO_SHARE


def test_ceiling_misses():
    by_name = {"m:nap": Share(14.7, 14.7), "m:wait": Share(0.2, 0.4)}
    misses = accuracy_compare.ceiling_misses(
        by_name, {"m:nap": 0.5, "m:wait": 0.5, "m:absent": 0.5}
    )
    assert misses == ["m:nap 14.7% > 0.5%"]


def test_compare_profiles_end_to_end():
    # The black case: compiled code has no frames; py-spy charges it to its Python caller, the
    # python engine to whatever Python function ran next (a dataclass __init__).
    fleetflame_text = (
        "[thread:MainThread];__main__:<module>;__main__:format_once 10\n"
        "[thread:MainThread];__main__:<module>;__main__:format_once;"
        "black.lines:__create_fn__.<locals>.__init__ 90\n"
    )
    pyspy_text = (
        f"thread (7): MainThread;{MAIN};{spy('format_once', '/work/app.py')} 95\n"
        f"thread (7): MainThread;{MAIN};{spy('format_once', '/work/app.py')};"
        f"{spy('__create_fn__.<locals>.__init__', '<string>')} 5\n"
    )
    comparison = accuracy_compare.compare_profiles(
        fleetflame_text, pyspy_text, MODULES, focus=["__main__:format_once"]
    )
    by_name = {row.function: row for row in comparison.rows}
    assert set(by_name) == {
        "__main__:<module>",
        "__main__:format_once",
        "<string>:__create_fn__.<locals>.__init__",
    }
    assert by_name["__main__:format_once"].self_diff == pytest.approx(85.0)
    assert by_name["<string>:__create_fn__.<locals>.__init__"].total_diff == pytest.approx(85.0)
    assert comparison.renaming == {
        "black.lines:__create_fn__.<locals>.__init__": "<string>:__create_fn__.<locals>.__init__"
    }
    assert comparison.fleetflame.samples == comparison.pyspy.samples == 100


def test_fleetflame_part_is_named_as_the_whole_window_was():
    part = accuracy_compare.fleetflame_part(
        "[thread:MainThread];__main__:f;black.lines:__create_fn__.<locals>.__init__ 7\n",
        MODULES,
        {"black.lines:__create_fn__.<locals>.__init__": "<string>:__init__"},
    )
    assert part.stacks == {("__main__:f", "<string>:__init__"): 7}


# -- threads and the CPU clock ---------------------------------------------------------------


def test_thread_samples_of_both_tools():
    ours = accuracy_compare.fleetflame_thread_samples(
        {("[thread:burn]", "m:burn"): 90, ("[thread:a%3Bb]", "m:x"): 1, ("m:y",): 4}
    )
    assert ours == {"burn": 90, "a;b": 1}
    reference, names = accuracy_compare.pyspy_thread_samples(
        {
            ("thread (11): burn", "burn (m.py)"): 80,
            ("thread (12): nap", "nap (m.py)"): 20,
            ("thread (0x7f00): other", "f (m.py)"): 1,  # --nonblocking: no OS thread id
        }
    )
    assert reference == {"burn": 80, "nap": 20, "other": 1}
    assert names == {11: "burn", 12: "nap"}


def test_thread_rates_put_both_tools_beside_each_threads_cpu_clock():
    rates = accuracy_compare.thread_rates(
        cpu_by_thread_id={11: 7.8, 12: 0.01, 13: 0.5},
        names={11: "burn", 12: "nap"},
        fleetflame={"burn": 780, "nap": 1},
        pyspy={"burn": 800, "nap": 300},
        seconds=8.0,
        wall=8.0,
    )
    assert rates[0] == ThreadRate("burn", pytest.approx(97.5), 97.5, 100.0)
    assert {r.name for r in rates} == {"burn", "nap", "tid 13"}
    nap = next(r for r in rates if r.name == "nap")
    assert (nap.cpu, nap.fleetflame, nap.pyspy) == (pytest.approx(0.125), 0.125, 37.5)
