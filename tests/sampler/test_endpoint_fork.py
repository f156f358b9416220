"""A forked child whose single port the parent holds serves on the next free one."""

import json
import logging
import os
import socket

import pytest
from samplerhelpers import free_port, get_json, run_python

import sampler
from sampler._server import CHILD_PORT_TRIES, start_server

# Ports and processes, no clock: runs beside other tests (tests/conftest.py).
pytestmark = pytest.mark.parallel


@pytest.fixture
def busy_port():
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    yield busy.getsockname()[1]
    busy.close()


@pytest.fixture
def no_endpoint():
    s = sampler.start(port="none", driver="thread")
    yield s
    sampler.stop()


def test_a_child_takes_the_next_free_port_and_says_so(no_endpoint, busy_port, caplog):
    with caplog.at_level(logging.WARNING, logger="sampler"):
        server = start_server(
            no_endpoint,
            "127.0.0.1",
            (busy_port, busy_port),
            None,
            no_endpoint._excluded.add,
            in_child=True,
        )
    try:
        assert busy_port < server.port <= busy_port + CHILD_PORT_TRIES
        assert get_json(server.url + "/info")["instance"]["pid"] == os.getpid()
        assert caplog.messages == [
            f"fleetflame sampler in child {os.getpid()}: port {busy_port} is taken, "
            f"serving on {server.port}"
        ]
    finally:
        server.stop()


def test_outside_a_child_a_taken_port_stays_an_error(no_endpoint, busy_port):
    with pytest.raises(sampler.SamplerError, match=f"port {busy_port}: .*range"):
        start_server(
            no_endpoint, "127.0.0.1", (busy_port, busy_port), None, no_endpoint._excluded.add
        )


def test_a_child_never_leaves_a_configured_range(no_endpoint):
    taken = []
    for _ in range(20):  # two neighbouring ports, both taken
        first = socket.socket()
        first.bind(("127.0.0.1", 0))
        port = first.getsockname()[1]
        second = socket.socket()
        try:
            second.bind(("127.0.0.1", port + 1))
        except OSError:
            first.close()
            second.close()
            continue
        taken = [first, second]
        break
    for sock in taken:
        sock.listen()
    try:
        with pytest.raises(sampler.SamplerError, match=f"ports {port}-{port + 1}"):
            start_server(
                no_endpoint,
                "127.0.0.1",
                (port, port + 1),
                None,
                no_endpoint._excluded.add,
                in_child=True,
            )
    finally:
        for sock in taken:
            sock.close()


FORKER = r"""
import json, os, sys, urllib.request
import sampler

s = sampler.start(port=int(sys.argv[1]), driver="thread")
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    me = sampler.running()
    found = {"url": me.url, "pid": os.getpid()}
    if me.url:
        with urllib.request.urlopen(me.url + "/info", timeout=10) as answer:
            found["served_pid"] = json.loads(answer.read())["instance"]["pid"]
    os.write(write, json.dumps(found).encode())
    os._exit(0)
os.close(write)
found = json.loads(os.read(read, 65536))
os.waitpid(pid, 0)
print(json.dumps({"parent": s.url, "child": found}))
sampler.stop()
"""


def test_a_forked_child_of_a_single_port_sampler_serves_its_own_profile():
    port = free_port()
    run = run_python("-c", FORKER, str(port))
    found = json.loads(run.stdout)
    child = found["child"]
    assert found["parent"] == f"http://127.0.0.1:{port}"
    assert child["url"] is not None and child["url"] != found["parent"]
    assert child["served_pid"] == child["pid"]
    served_port = int(child["url"].rsplit(":", 1)[1])
    assert (
        f"fleetflame sampler in child {child['pid']}: port {port} is taken, "
        f"serving on {served_port}" in run.stderr
    )
