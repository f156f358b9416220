"""Names with a byte that is not UTF-8 (a file name as os.fsdecode decodes it: a lone
surrogate) in a frame, a thread, a tag or a process label: every endpoint still answers, with
the byte written out, and the collector accepts the profile."""

import os
import threading
import time
import xml.etree.ElementTree as ET

import pytest
from samplerhelpers import get, get_json

import sampler
from sampler.profile import decode_document, parse_folded

NAME = os.fsdecode(b"/srv/app/caf\xe9.py")  # '/srv/app/caf\udce9.py'
WRITTEN = "caf%5Cudce9"  # the frame's text on the wire: \udce9, its backslash escaped


@pytest.fixture
def running():
    s = sampler.start(port=0, mode="wall", driver="thread", interval=0.005, labels={"dir": NAME})
    yield s
    sampler.stop()


def spin_in_undecodable_file(stop: threading.Event) -> None:
    code = compile("while not stop.is_set():\n    sum(range(500))\n", NAME, "exec")
    exec(code, {"stop": stop})  # no __name__: the frame is named by its file


def test_every_endpoint_answers_with_the_byte_written_out(running):
    stop = threading.Event()
    worker = threading.Thread(
        target=spin_in_undecodable_file, args=(stop,), name=os.fsdecode(b"th\xff")
    )
    worker.start()
    try:
        with sampler.tag(file=os.fsdecode(b"report-\xe9.csv")):
            time.sleep(0.3)
        stacks = parse_folded(get(running.url + "/stacks").decode())
        assert any(WRITTEN in stack for stack in stacks), list(stacks)[:5]
        document = get(running.url + "/profile.json")
        profile = decode_document(document)  # what the collector does with it
        assert any(WRITTEN in stack for _, stack in profile.stacks)
        assert {"file": "report-\\udce9.csv"} in [dict(s) for s in profile.label_sets]
        assert profile.labels["dir"] == "/srv/app/caf\\udce9.py"
        ET.fromstring(get(running.url + "/flamegraph.svg"))  # well-formed
        dump = get(running.url + "/dump").decode()
        assert WRITTEN in dump and "th%5Cudcff" in dump
        threads = get_json(running.url + "/dump?format=json")["threads"]
        assert NAME in [frame["file"] for thread in threads for frame in thread["frames"]]
    finally:
        stop.set()
        worker.join()


def test_a_label_of_many_undecodable_bytes_is_cut_after_it_is_written_out():
    # Each such byte takes six characters written out: 200 of them passed the wire's 1,024.
    long_name = os.fsdecode(bytes(range(0x80, 0x80 + 100)) * 2)
    s = sampler.start(port=0, labels={"path": "x" * 5000, os.fsdecode(b"\xff") * 300: "v"})
    try:
        with sampler.tag(file=long_name, **{long_name: "k"}):
            spin = time.thread_time() + 0.2
            while time.thread_time() < spin:  # samples in the tag: its label set is sent
                pass
        document = get(s.url + "/profile.json")
    finally:
        sampler.stop()
    profile = decode_document(document)  # the collector takes it
    assert len(profile.labels["path"]) == 1024
    assert any(len(dict(labels).get("file", "")) == 200 for labels in profile.label_sets)


def test_too_many_or_too_long_labels_are_cut_as_the_wire_bounds_them():
    # Each within its own bound, together over the wire's: the collector refused the whole
    # profile (70 process labels; a tag of 70 keys; a service of 300 characters).
    many = {f"k{i:02}": "v" for i in range(70)}
    s = sampler.start(port=0, service="s" * 300, labels=many)
    try:
        with sampler.tag(**{f"t{i:02}": "v" for i in range(70)}):
            spin = time.thread_time() + 0.2
            while time.thread_time() < spin:
                pass
        document = get(s.url + "/profile.json")
    finally:
        sampler.stop()
    profile = decode_document(document)
    assert len(profile.labels) == 64 and profile.labels["service"] == "s" * 256
    tagged = [dict(labels) for labels in profile.label_sets if len(labels) > 1]
    assert tagged and all(len(labels) == 64 for labels in tagged)
    assert all(labels["fleetflame"] == "labels-over-limit" for labels in tagged)
