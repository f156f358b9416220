"""Static targets, port ranges, discovery files and stable sharding."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest

from collector.targets import (
    MAX_RANGE,
    TargetError,
    TargetSet,
    in_shard,
    parse_shard,
    parse_target_spec,
    shard_of,
)


def test_host_port_and_ranges():
    (t,) = parse_target_spec("web-3:8021", {"env": "prod"})
    assert (t.host, t.port, t.address, t.optional) == ("web-3", 8021, "web-3:8021", False)
    assert t.url == "http://web-3:8021/profile.json" and dict(t.labels) == {"env": "prod"}
    ranged = parse_target_spec("10.0.0.5:8021-8024")
    assert [t.address for t in ranged] == [f"10.0.0.5:{p}" for p in range(8021, 8025)]
    assert all(t.optional for t in ranged)
    (v6,) = parse_target_spec("[::1]:9000")
    assert v6.host == "::1" and v6.address == "[::1]:9000"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("web-3", "expected host:port"),
        (":8021", "expected host:port"),
        ("web:http", "not a number"),
        ("web:0", "1 to 65535"),
        ("web:70000", "1 to 65535"),
        ("web:8030-8021", "empty"),
        (f"web:1-{MAX_RANGE + 1}", "over"),
        ("[::1]9000", "ipv6"),
    ],
)
def test_bad_specs_are_clear_errors(spec, message):
    with pytest.raises(TargetError, match=message):
        parse_target_spec(spec)


def test_shard_spec():
    assert parse_shard("2/4") == (2, 4)
    for bad in ("0/4", "5/4", "2", "a/b", "2/0"):
        with pytest.raises(TargetError):
            parse_shard(bad)


def test_sharding_partitions_targets_and_is_stable_across_processes():
    addresses = [f"10.0.{i // 250}.{i % 250}:{8021 + i % 16}" for i in range(2000)]
    owners = [[a for a in addresses if in_shard(a, (k, 4))] for k in range(1, 5)]
    assert sorted(sum(owners, [])) == sorted(addresses)  # every target exactly once
    assert all(400 < len(part) < 600 for part in owners)  # roughly balanced
    # A different interpreter (different hash seed) computes the same shards.
    code = (
        "from collector.targets import shard_of; print([shard_of(f'h:{p}', 4) for p in range(50)])"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    ).stdout
    assert out.strip() == str([shard_of(f"h:{p}", 4) for p in range(50)])


def write(path, text):
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def test_discovery_file_json_and_toml_with_labels(tmp_path):
    write(
        tmp_path / "a.json",
        json.dumps(
            [
                {"targets": ["w1:8021", "w2:8021"], "labels": {"service": "api"}},
                {"targets": ["w3:8030-8031"]},
            ]
        ),
    )
    write(tmp_path / "b.toml", '[[group]]\ntargets = ["w9:8021"]\nlabels = {service = "batch"}\n')
    ts = TargetSet(["s1:8021"], static_labels={"env": "prod"}, files=[str(tmp_path / "*")])
    found = {t.address: t for t in ts.current()}
    assert set(found) == {"s1:8021", "w1:8021", "w2:8021", "w3:8030", "w3:8031", "w9:8021"}
    assert dict(found["w1:8021"].labels) == {"service": "api"}
    assert dict(found["w9:8021"].labels) == {"service": "batch"}
    assert dict(found["s1:8021"].labels) == {"env": "prod"}
    assert found["w3:8030"].optional and not found["w1:8021"].optional


def test_a_pattern_that_matches_no_file_is_said_once(tmp_path, logs):
    # It ran with no targets and said nothing (a deploy's volume mounted elsewhere).
    ts = TargetSet(files=[str(tmp_path / "*.json")])
    assert ts.current() == [] and ts.current() == []
    assert len(logs.matching("level=warning", "target_files: no file matches")) == 1
    write(tmp_path / "a.json", json.dumps([{"targets": ["w1:8021"]}]))
    assert [t.address for t in ts.current()] == ["w1:8021"]
    (tmp_path / "a.json").unlink()
    ts.current()  # matches nothing again: said again
    assert len(logs.matching("level=warning", "target_files: no file matches")) == 2


def test_discovery_file_is_reread_when_it_changes(tmp_path):
    path = tmp_path / "targets.json"
    write(path, json.dumps([{"targets": ["w1:8021"]}]))
    ts = TargetSet(files=[str(path)])
    assert [t.address for t in ts.current()] == ["w1:8021"]
    write(path, json.dumps([{"targets": ["w1:8021", "w2:8021"], "labels": {"x": "y"}}]))
    assert sorted(t.address for t in ts.current()) == ["w1:8021", "w2:8021"]
    path.unlink()
    assert ts.current() == []


def test_broken_discovery_file_keeps_the_last_good_targets(tmp_path, caplog):
    path = tmp_path / "targets.json"
    write(path, json.dumps([{"targets": ["w1:8021"]}]))
    ts = TargetSet(files=[str(path)])
    assert len(ts.current()) == 1
    for broken in (
        '[{"targets": ["w1:8021"',
        '[{"targets": ["nope"]}]',
        '{"targets": []}',
        '[{"targets": ["w:1"], "labels": {"a": 1}}]',
    ):
        write(path, broken)
        with caplog.at_level(logging.ERROR, logger="collector.targets"):
            assert [t.address for t in ts.current()] == ["w1:8021"]
        assert "discovery file rejected" in caplog.text
        caplog.clear()


def test_explicit_listing_beats_a_range_and_shard_filters(tmp_path):
    path = tmp_path / "t.json"
    write(path, json.dumps([{"targets": ["h:8022"], "labels": {"a": "b"}}]))
    ts = TargetSet(["h:8021-8023"], files=[str(path)])
    found = {t.address: t for t in ts.current()}
    assert not found["h:8022"].optional and dict(found["h:8022"].labels) == {"a": "b"}
    sharded = TargetSet(["h:8000-8099"], shard=(3, 4)).current()
    assert sharded and all(shard_of(t.address, 4) == 3 for t in sharded)
