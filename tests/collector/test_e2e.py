"""End to end: real sampler workers, a real collector process, SQLite and PostgreSQL.

The samples the workers report equal, exactly, the samples the database holds, across a
worker restart and a collector restart.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from pollhelpers import ROOT, Worker, folded_by_instance, stored, wait_until

pytestmark = pytest.mark.slow


def write_targets(path, workers):
    tmp = path.with_suffix(".tmp")
    tmp.write_text(
        json.dumps([{"targets": [w.address for w in workers], "labels": {"environment": "test"}}])
    )
    os.replace(tmp, path)


class CollectorProcess:
    def __init__(self, config, log_path):
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.log = open(log_path, "a")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "collector", "--config", str(config)],
            env=env,
            stdout=self.log,
            stderr=self.log,
        )

    def stop(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(60)
        self.log.close()
        return code


def wait_for_exact(db_url, instance_id, document):
    """Waits until the database holds exactly a worker's final counts; says how they differ."""
    final = folded_by_instance(document)
    try:
        wait_until(
            lambda: stored(db_url, instance_id) == final,
            timeout=60,
            what=f"{instance_id}'s final counts in the database",
        )
    except AssertionError as timeout:
        held = stored(db_url, instance_id)
        differ = {
            stack: (held.get(stack, 0), final.get(stack, 0))
            for stack in held.keys() | final.keys()
            if held.get(stack, 0) != final.get(stack, 0)
        }
        raise AssertionError(f"{timeout}: (stored, worker) where they differ: {differ}") from None


def test_workers_and_database_agree_exactly(db_url, tmp_path):
    sd = tmp_path / "targets.json"
    config = tmp_path / "collector.toml"
    config.write_text(
        f'database_url = "{db_url}"\n'
        f'target_files = ["{sd.name}"]\n'
        'poll_interval = 0.5\nhealth_listen = ""\nconnect_timeout = 1.0\n'
    )
    log_path = tmp_path / "collector.log"
    a, b = Worker(tmp_path, "api", "a"), Worker(tmp_path, "batch", "b")
    workers = [a, b]
    collector = None
    try:
        write_targets(sd, workers)
        collector = CollectorProcess(config, log_path)
        wait_until(
            lambda: "collector started" in log_path.read_text(),
            timeout=60,
            what="the collector to migrate and start",
        )

        def has(instance_id):
            return lambda: stored(db_url, instance_id)

        a_id, b_id = a.profile()["instance"]["id"], b.profile()["instance"]["id"]
        wait_until(has(a_id), timeout=60, what="worker a's samples")
        wait_until(has(b_id), timeout=60, what="worker b's samples")

        # Worker restart: a stops working, is fully collected, then killed and replaced.
        final_a = a.idle()
        wait_for_exact(db_url, a_id, final_a)
        a.kill()
        a2 = Worker(tmp_path, "api", "a2")
        workers = [a2, b]
        write_targets(sd, workers)
        a2_id = a2.profile()["instance"]["id"]
        wait_until(has(a2_id), timeout=60, what="the restarted worker's samples")

        # Collector restart (SIGKILL: no goodbye flush) while the workers keep sampling.
        collector.stop(signal.SIGKILL)
        collector = CollectorProcess(config, log_path)

        finals = {w.profile()["instance"]["id"]: w.idle() for w in workers}
        for instance_id, doc in finals.items():
            wait_for_exact(db_url, instance_id, doc)
        assert collector.stop() == 0
        collector = None
    finally:
        if collector is not None:
            collector.stop(signal.SIGKILL)
        for w in workers + [a]:
            w.kill()
    # Exactly: every instance ever seen, nothing more, nothing less.
    assert stored(db_url, a_id) == folded_by_instance(final_a)
    for instance_id, doc in finals.items():
        assert stored(db_url, instance_id) == folded_by_instance(doc)
        assert sum(folded_by_instance(doc).values()) > 0
    everything = stored(db_url)
    expected: dict[str, int] = {}
    for doc in [final_a, *finals.values()]:
        for stack, count in folded_by_instance(doc).items():
            expected[stack] = expected.get(stack, 0) + count
    assert everything == expected
    log = log_path.read_text()
    assert "cursors loaded" in log and "targets=" in log
