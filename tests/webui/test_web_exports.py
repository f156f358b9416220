"""Exports decoded and checked: folded text, speedscope JSON, and pprof by two decoders."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from sampler.profile import parse_folded, unescape_frame
from webui.exports import EXPORTS, ExportInfo
from webui.exports.protobuf import Message, varint

ROOT = Path(__file__).resolve().parents[2]
INFO = ExportInfo(start=1_700_000_000, end=1_700_003_600, mode="cpu", interval=0.01, title="api")
PROFILE = {
    "__main__:<module>;app:serve;app:handle": 40,
    "__main__:<module>;app:serve;app:handle;json:dumps": 21,
    "__main__:<module>;app:serve;app:handle;app:upload:42": 7,
    "__main__:<module>;app:serve;app:handle;app:upload:43": 3,
    "__main__:<module>;<img src=x onerror=alert(1)>;m:semi%3Bcolon": 2,
    "__main__:<module>;r:rec;r:rec;r:rec": 5,
}


# An independent minimal protobuf reader: fields by number, as the encoding spec defines them.
def read_varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        byte = buf[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, i


def fields(buf: bytes) -> list[tuple[int, int | bytes]]:
    out: list[tuple[int, int | bytes]] = []
    i = 0
    while i < len(buf):
        key, i = read_varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = read_varint(buf, i)
            out.append((number, value))
        elif wire == 2:
            length, i = read_varint(buf, i)
            out.append((number, buf[i : i + length]))
            i += length
        else:
            raise AssertionError(f"unexpected wire type {wire}")
    return out


def packed(data: bytes) -> list[int]:
    values, i = [], 0
    while i < len(data):
        value, i = read_varint(data, i)
        values.append(value)
    return values


def one(buf: bytes, number: int, default: int = 0):
    found = [v for n, v in fields(buf) if n == number]
    return found[0] if found else default


def decode_pprof(data: bytes) -> dict:
    raw = gzip.decompress(data)
    top = fields(raw)
    strings = [v.decode() for n, v in top if n == 6]
    functions = {one(v, 1): strings[one(v, 2)] for n, v in top if n == 5}
    locations = {}
    for n, v in top:
        if n == 4:
            line = one(v, 4, b"")
            locations[one(v, 1)] = (functions[one(line, 1)], one(line, 2))
    stacks: dict[str, int] = {}
    values = []
    for n, v in top:
        if n == 2:
            ids = packed(one(v, 1, b""))
            value = packed(one(v, 2, b""))
            values.append(value)
            frames = [f"{name}:{line}" if line else name for name, line in map(locations.get, ids)]
            key = "\n".join(reversed(frames))
            stacks[key] = stacks.get(key, 0) + value[0]
    sample_types = [(strings[one(v, 1)], strings[one(v, 2)]) for n, v in top if n == 1]
    return {
        "strings": strings,
        "functions": functions,
        "locations": locations,
        "stacks": stacks,
        "values": values,
        "sample_types": sample_types,
        "period": one(raw, 12),
        "time_nanos": one(raw, 9),
        "duration_nanos": one(raw, 10),
    }


def expected_stacks() -> dict[str, int]:
    return {
        "\n".join(unescape_frame(f) for f in stack.split(";")): count
        for stack, count in PROFILE.items()
    }


def test_varint_and_message_encoding():
    assert varint(0) == b"\x00" and varint(1) == b"\x01" and varint(300) == b"\xac\x02"
    assert varint(-1) == b"\xff" * 9 + b"\x01"
    msg = Message().uint(1, 150).string(2, "").uint(3, 0).packed(4, [3, 270])
    assert bytes(msg) == b"\x08\x96\x01\x12\x00\x22\x03\x03\x8e\x02"


def test_folded_round_trips():
    text = EXPORTS["folded"].render(PROFILE, INFO).decode()
    assert parse_folded(text) == PROFILE
    assert "m:semi%3Bcolon" in text  # frames stay escaped in folded text


def test_speedscope_document():
    doc = json.loads(EXPORTS["speedscope"].render(PROFILE, INFO))
    assert doc["$schema"] == "https://www.speedscope.app/file-format-schema.json"
    (profile,) = doc["profiles"]
    assert profile["type"] == "sampled"
    names = [frame["name"] for frame in doc["shared"]["frames"]]
    assert len(names) == len(set(names))  # a shared, deduplicated frames table
    rebuilt = {
        "\n".join(names[i] for i in sample): round(weight / INFO.interval)
        for sample, weight in zip(profile["samples"], profile["weights"], strict=True)
    }
    assert rebuilt == expected_stacks()
    assert profile["unit"] == "seconds"  # weights are the time the samples stand for
    assert profile["endValue"] == pytest.approx(sum(PROFILE.values()) * INFO.interval)
    assert "m:semi;colon" in names
    slow = json.loads(EXPORTS["speedscope"].render({"a;b": 3}, ExportInfo(0, 60, interval=0.02)))
    assert slow["profiles"][0]["weights"] == [0.06] and "1 sample = 20 ms" in slow["name"]


def test_pprof_decoded_by_an_independent_reader():
    decoded = decode_pprof(EXPORTS["pprof"].render(PROFILE, INFO))
    assert decoded["strings"][0] == ""
    assert len(decoded["strings"]) == len(set(decoded["strings"]))
    assert decoded["sample_types"] == [("samples", "count"), ("cpu", "nanoseconds")]
    assert decoded["stacks"] == expected_stacks()
    assert all(ns == count * 10_000_000 for count, ns in decoded["values"])
    names = list(decoded["functions"].values())
    assert len(names) == len(set(names))  # functions deduplicated
    # app:upload appears as one function with two line locations.
    upload = [loc for loc in decoded["locations"].values() if loc[0] == "app:upload"]
    assert sorted(upload) == [("app:upload", 42), ("app:upload", 43)]
    assert len(decoded["locations"]) == len(set(decoded["locations"].values()))
    assert decoded["period"] == 10_000_000
    assert decoded["time_nanos"] == INFO.start * 10**9
    assert decoded["duration_nanos"] == 3600 * 10**9


def test_pprof_wall_mode_and_empty_profile():
    wall = ExportInfo(start=0, end=60, mode="wall", interval=0.005)
    decoded = decode_pprof(EXPORTS["pprof"].render({"a;b": 2}, wall))
    assert decoded["sample_types"][1] == ("wall", "nanoseconds")
    assert decoded["values"] == [[2, 10_000_000]]
    empty = decode_pprof(EXPORTS["pprof"].render({}, INFO))
    assert empty["stacks"] == {} and empty["strings"][0] == ""


def test_pprof_decoded_by_pprof_format_package(tmp_path):
    node = shutil.which("node")
    assert node, "node is needed (make setup installs the npm packages)"
    assert (ROOT / "node_modules" / "pprof-format").is_dir(), "run make setup (npm ci)"
    path = tmp_path / "profile.pb.gz"
    path.write_bytes(EXPORTS["pprof"].render(PROFILE, INFO))
    script = ROOT / "tests" / "webui" / "pprof_decode.mjs"
    out = subprocess.run(
        [node, str(script), str(path)], capture_output=True, text=True, timeout=60, check=True
    )
    decoded = json.loads(out.stdout)
    assert decoded["firstString"] == ""
    assert decoded["sampleTypes"] == [["samples", "count"], ["cpu", "nanoseconds"]]
    assert decoded["periodType"] == ["cpu", "nanoseconds"] and decoded["period"] == 10_000_000
    assert decoded["stacks"] == expected_stacks()
    # Nine distinct frames; app:upload:42 and :43 are two locations of one function.
    assert decoded["locations"] == 9 and decoded["functions"] == 8


@pytest.mark.parametrize("name", ["folded", "speedscope", "pprof"])
def test_exports_of_an_empty_profile(name):
    assert isinstance(EXPORTS[name].render({}, INFO), bytes)
