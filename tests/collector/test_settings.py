"""Settings: one declaration feeding the TOML file, environment variables, CLI and docs."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from collector.settings import (
    SETTINGS,
    SettingsError,
    add_arguments,
    load_settings,
    markdown_table,
)
from collector.targets import TargetSet, parse_shard

ROOT = Path(__file__).resolve().parents[2]


def test_defaults():
    s = load_settings(environ={})
    assert s.poll_interval == 10.0 and s.bucket_seconds == 60
    assert s.database_url.startswith("sqlite:///")
    assert s.as_dict().keys() == {setting.name for setting in SETTINGS}


def test_file_then_env_then_cli(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        'poll_interval = 5\ntargets = ["a:1", "b:2-3"]\ntarget_labels = {env = "prod"}\n'
        'target_files = ["sd/*.json"]\nshard = "1/2"\n'
    )
    s = load_settings(cfg, environ={})
    assert s.poll_interval == 5.0 and s.targets == ["a:1", "b:2-3"]
    assert s.target_labels == {"env": "prod"}
    assert s.target_files == [str(tmp_path / "sd/*.json")]
    env = {
        "FLEETFLAME_COLLECTOR_POLL_INTERVAL": "7.5",
        "FLEETFLAME_COLLECTOR_TARGETS": "x:1, y:2",
        "FLEETFLAME_COLLECTOR_TARGET_LABELS": "env=dev,team=core",
        "OTHER": "ignored",
    }
    s = load_settings(cfg, environ=env)
    assert s.poll_interval == 7.5 and s.targets == ["x:1", "y:2"]
    assert s.target_labels == {"env": "dev", "team": "core"}
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--poll-interval", "2", "--shard", "2/2"])
    s = load_settings(cfg, environ=env, overrides=args)
    assert s.poll_interval == 2.0 and s.shard == "2/2" and s.targets == ["x:1", "y:2"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("poll_interval = 'soon'", "poll_interval: expected a float"),
        ("targets = 'a:1'", "targets: expected a list of strings"),
        ("nonsense = 1", "unknown setting 'nonsense'"),
        ("poll_interval = -1", "must be positive"),
        ("log_format = 'xml'", "not one of"),
        ("shard = '5/4'", "shard"),
        ("targets = ['127.0.0.1:1-0']", "targets: target '127.0.0.1:1-0': port '0'"),
        ("targets = ['127.0.0.1']", "targets: target '127.0.0.1'"),
        ("health_listen = '127.0.0.1:99999'", "'99999' is not a port"),
        ("health_listen = '9021'", "'9021' is not host:port"),
        ("poll_interval = ", "not valid TOML"),
    ],
)
def test_bad_config_files_are_clear_errors(tmp_path, text, message):
    cfg = tmp_path / "c.toml"
    cfg.write_text(text + "\n")
    with pytest.raises(SettingsError, match=message):
        load_settings(cfg, environ={})


def test_a_bad_target_on_the_command_line_is_one_line_and_status_2(tmp_path, capsys):
    from collector.cli import main

    status = main(["--targets", "127.0.0.1:1-0", "--database-url", f"sqlite:///{tmp_path}/x.db"])
    err = capsys.readouterr().err
    assert status == 2 and err.startswith("fleetflame collect: targets: target '127.0.0.1:1-0'")
    assert not (tmp_path / "x.db").exists()  # refused before anything was opened


@pytest.mark.parametrize("once", [True, False])
def test_a_file_that_is_not_a_database_is_one_line_not_a_traceback(tmp_path, once):
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(bytes(range(256)) * 20)
    args = ["--targets", "127.0.0.1:9", "--database-url", f"sqlite:///{garbage}"]
    args += ["--health-listen", "", "--once"] if once else ["--health-listen", ""]
    run = subprocess.run(
        [sys.executable, "-m", "collector", *args], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 2, run.stderr
    assert 'msg="cannot open the store" error="migrating the schema: file is not a database"' in (
        run.stderr
    )
    assert "Traceback" not in run.stderr
    assert garbage.read_bytes() == bytes(range(256)) * 20  # nothing lost


def test_a_one_shot_run_does_not_wait_for_an_unreachable_database(tmp_path):
    # A long run waits for its database to come up; --once fails at once (it waited forever).
    url = "postgresql+psycopg://postgres@127.0.0.1:1/none"  # nothing listens on port 1
    args = ["--targets", "127.0.0.1:9", "--database-url", url, "--health-listen", "", "--once"]
    run = subprocess.run(
        [sys.executable, "-m", "collector", *args], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 1 and "database unavailable" in run.stderr, run.stderr
    assert "retrying" not in run.stderr


def test_a_health_address_taken_is_one_line_and_status_2(tmp_path):
    import socket

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        args = ["--targets", "127.0.0.1:9", "--database-url", f"sqlite:///{tmp_path}/x.db"]
        run = subprocess.run(
            [sys.executable, "-m", "collector", *args, "--health-listen", f"127.0.0.1:{port}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert run.returncode == 2, run.stderr
    assert f"fleetflame collect: health_listen: cannot listen on '127.0.0.1:{port}'" in run.stderr
    assert "Traceback" not in run.stderr


def test_waiting_for_the_database_it_answers_its_health_probe_and_stops_on_sigterm(tmp_path):
    # A liveness probe on /healthz must not restart a collector that waits, as documented,
    # for its database; a SIGTERM meanwhile ends it without starting its jobs.
    import json
    import signal
    import socket
    import time
    import urllib.request

    with socket.create_server(("127.0.0.1", 0)) as probe:
        health = probe.getsockname()[1]
    url = "postgresql+psycopg://postgres@127.0.0.1:1/none"  # nothing listens on port 1
    args = ["--targets", "127.0.0.1:9", "--database-url", url, "--log-level", "info"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "collector", *args, "--health-listen", f"127.0.0.1:{health}"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        answer = None
        for _ in range(100):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{health}/healthz", timeout=2) as r:
                    answer = (r.status, json.loads(r.read()))
                break
            except OSError:
                time.sleep(0.1)
        assert answer is not None and answer[0] == 200, answer
        assert answer[1]["awaiting_database"] is True
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "database unavailable; retrying" in err and "collector started" not in err


def test_a_sqlite_file_in_no_folder_is_named_not_waited_for(tmp_path):
    # Nothing will make the folder: it was retried forever as an outage, the path never named.
    url = f"sqlite:///{tmp_path}/no/such/folder/x.db"
    run = subprocess.run(
        [sys.executable, "-m", "collector", "--targets", "127.0.0.1:9", "--database-url", url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2, run.stderr
    assert f"no folder {tmp_path}/no/such/folder for the SQLite file" in run.stderr, run.stderr
    assert "retrying" not in run.stderr


@pytest.mark.parametrize("days, ok", [(7, False), (8, True)])
def test_retention_must_outlast_the_hourly_tier(days, ok):
    # Rows are rolled up to hours after 7 days: a shorter retention was refused by the store
    # at start, in seconds, as "cannot open the store".
    if ok:
        assert load_settings(environ={}, overrides={"retention_days": days}).retention_days == 8
    else:
        with pytest.raises(SettingsError, match="retention_days: must be more than 7"):
            load_settings(environ={}, overrides={"retention_days": days})


def test_bad_environment_values_name_the_variable():
    with pytest.raises(SettingsError, match="FLEETFLAME_COLLECTOR_POLL_CONCURRENCY"):
        load_settings(environ={"FLEETFLAME_COLLECTOR_POLL_CONCURRENCY": "many"})
    with pytest.raises(SettingsError, match="unknown setting 'pol_interval'"):
        load_settings(environ={"FLEETFLAME_COLLECTOR_POL_INTERVAL": "3"})


def test_missing_config_file():
    with pytest.raises(SettingsError, match="cannot read config file"):
        load_settings("/nonexistent/collector.toml", environ={})


def test_every_setting_is_documented_with_the_generated_table():
    docs = (ROOT / "docs" / "collector.md").read_text()
    for setting in SETTINGS:
        assert f"`{setting.name}`" in docs, f"{setting.name} is not documented in docs/collector.md"
        assert setting.env_var in docs
    # The reference table is generated: regenerate with `python -m collector.settings`.
    assert markdown_table() in docs


def test_deploy_example_config_loads_and_its_targets_parse():
    path = ROOT / "deploy" / "collector.toml"
    s = load_settings(path, environ={})
    assert s.targets and any("-" in spec.rsplit(":", 1)[1] for spec in s.targets)
    assert s.target_files
    parse_shard(s.shard)
    TargetSet(s.targets, static_labels=s.target_labels, files=[])  # raises on a bad spec
    # Every setting in the example is spelled like a declared setting (load_settings checks),
    # and every declared setting appears in it, commented out or not.
    text = path.read_text()
    for setting in SETTINGS:
        assert setting.name in text, f"deploy/collector.toml does not mention {setting.name}"
