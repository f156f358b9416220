"""The wire-format document: built by the sampler and by build_document, read back by
decode_document, with its version and limits; and the Profile it carries."""

from __future__ import annotations

import json
import time

import pytest

import sampler
from sampler.profile import (
    LIMITS,
    WIRE_FORMAT,
    DocumentError,
    Limits,
    Profile,
    build_document,
    decode_document,
    document_head,
    encode_document,
    validate_document,
)

HEAD = {
    "instance": {"id": "5f0c3a9e2b7d41c8", "pid": 42, "start_time": 1.5, "host": "web-3"},
    "labels": {"service": "api", "host": "web-3"},
    "mode": "wall",
    "interval": 0.005,
    "effective_interval": 0.005,
    "time": 1795423812.5,
    "generation": 7,
    "label_sets": [{}, {"route": "/up;load"}],
}
STACKS = [(0, "m:a;m:b%3Bc", 40), (1, "m:a", 2), (1, "m:a;m:%22q%22", 5)]


def test_a_built_document_reads_back_with_its_interval():
    doc = build_document(STACKS, **HEAD)
    assert doc["format"] == WIRE_FORMAT and doc["total_samples"] == 47
    read = decode_document(json.dumps(doc).encode())
    assert read.stacks == {(index, stack): count for index, stack, count in STACKS}
    assert (read.instance_id, read.generation, read.since) == ("5f0c3a9e2b7d41c8", 7, 0)
    assert read.label_sets == ({}, {"route": "/up;load"})
    profile = read.profile()
    assert profile == Profile(
        {"m:a;m:b%3Bc": 40, "m:a": 2, "m:a;m:%22q%22": 5}, interval=0.005, mode="wall"
    )
    assert profile.seconds == pytest.approx(47 * 0.005)


def test_encoding_pieces_gives_the_same_json_as_the_whole_document():
    head = document_head(total_samples=47, **HEAD)
    pieces = [b'[0,"m:a;m:b%3Bc",40]', b',[1,"m:a",2]', b',[1,"m:a;m:%22q%22",5]']
    assert json.loads(encode_document(head, pieces)) == build_document(STACKS, **HEAD)
    assert json.loads(encode_document(head, []))["stacks"] == []


def test_the_running_samplers_document_is_valid():
    running = sampler.start(port="none", engine="python", driver="thread", interval=0.002)
    try:
        deadline = time.monotonic() + 10
        while sampler.running().table.total < 20 and time.monotonic() < deadline:
            sum(i * i for i in range(20_000))
    finally:
        sampler.stop()
    read = decode_document(running.profile_json())  # the counts stay readable once stopped
    assert read.interval == 0.002 and read.mode == "cpu"
    assert read.profile().total == read.total_samples >= 20
    as_dict = validate_document(running.profile())
    assert (as_dict.stacks, as_dict.label_sets) == (read.stacks, read.label_sets)


@pytest.mark.parametrize(
    ("fmt", "accepted"),
    [
        ("fleetflame.profile/1", True),
        ("fleetflame.profile/1.4", True),
        ("fleetflame.profile/2", False),
        ("fleetflame.profile/", False),
        ("other/1", False),
    ],
)
def test_a_reader_takes_any_minor_version_of_its_major_one(fmt, accepted):
    doc = {**build_document(STACKS, **HEAD), "format": fmt}
    if accepted:
        assert validate_document(doc).total_samples == 47
    else:
        with pytest.raises(DocumentError, match="format"):
            validate_document(doc)


def test_limits_bound_a_document_and_cannot_change():
    doc = build_document(STACKS, **HEAD)
    with pytest.raises(DocumentError, match="more than the limit of 2"):
        validate_document(doc, Limits(max_stacks=2))
    with pytest.raises(DocumentError, match="longer than"):
        validate_document(doc, Limits(max_stack=5))
    with pytest.raises(AttributeError, match="immutable"):
        LIMITS.max_stacks = 1  # type: ignore[misc]
    assert Limits() == LIMITS and hash(Limits()) == hash(LIMITS)
    assert Limits(max_name=3) != LIMITS


def test_a_document_whose_text_holds_escapes_is_scanned_for_control_characters():
    doc = build_document([(0, "a\u0007b", 1)], **HEAD)
    with pytest.raises(DocumentError, match="control character"):
        decode_document(json.dumps(doc).encode())


def test_profiles_of_other_intervals_merge_at_the_finest():
    coarse = Profile({"a": 3, "b": 1}, interval=0.02)
    fine = Profile({"a": 1}, interval=0.01)
    merged = coarse.merge(fine)
    assert merged == Profile({"a": 7, "b": 2}, interval=0.01)
    assert merged.seconds == pytest.approx(coarse.seconds + fine.seconds)
    with pytest.raises(ValueError, match="never add up"):
        coarse.merge(Profile({"a": 1}, interval=0.02, mode="wall"))
    with pytest.raises(ValueError, match="positive"):
        Profile({}, interval=0)
    assert Profile.parse("a;b 3\n", interval=0.5).tree().total == 3
