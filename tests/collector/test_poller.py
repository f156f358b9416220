"""The poller against real HTTP servers: good, slow, dead and hostile targets."""

from __future__ import annotations

import threading
import time

import pytest
from pollhelpers import (
    closed_port,
    drip,
    drip_head,
    gigantic,
    gzipped,
    hang_mid_response,
    make_doc,
    send_status,
)

from collector.poller import Poller
from collector.targets import parse_target_spec


@pytest.fixture
def poller():
    p = Poller(
        concurrency=8,
        connect_timeout=1.0,
        read_timeout=1.5,
        deadline=3.0,
        max_bytes=4 * 1024 * 1024,
    )
    yield p
    p.close()


def target(address):
    return parse_target_spec(address)[0]


def test_good_target_gives_a_validated_profile_and_reuses_the_connection(poller, servers):
    server = servers(make_doc([(0, "a;b", 3)]))
    for _ in range(3):
        (result,) = poller.poll([target(server.address)])
        assert result.ok and result.profile.stacks == {(0, "a;b"): 3}
    # One kept-alive connection served every request.
    assert server.requests == 3 and server.connections == 1
    assert poller.kept_connections == 1


def test_gzipped_answers_are_decoded_and_a_gzip_bomb_is_cut_at_the_cap(poller, servers):
    import json

    doc = make_doc([(0, f"main;leaf{i}", i + 1) for i in range(100)])
    server = servers()
    server.behaviour = gzipped(json.dumps(doc).encode())
    (result,) = poller.poll([target(server.address)])
    assert result.ok and len(result.profile.stacks) == 100
    assert result.nbytes < len(json.dumps(doc)) / 3  # what was received: compressed
    bomb = b'{"stacks": [' + b" " * (64 * 1024 * 1024)  # 64 MB of spaces: 64 KB gzipped
    server.behaviour = gzipped(bomb, declare=False)
    (result,) = poller.poll([target(server.address)])
    assert result.reason == "too_large" and result.nbytes < 1024 * 1024


def test_a_stale_kept_connection_is_retried_once_on_a_new_one(poller, servers):
    server = servers(make_doc([(0, "a;b", 3)]))
    assert poller.poll([target(server.address)])[0].ok
    (conn,) = poller._idle.values()
    conn.sock.shutdown(2)  # as if the target had closed it while idle
    (result,) = poller.poll([target(server.address)])
    assert result.ok and server.connections == 2


@pytest.mark.parametrize(
    ("behaviour", "reason", "message"),
    [
        (b"{not json", "invalid", "not valid JSON"),
        (b'{"format": "fleetflame.profile/1", "instance": []}', "invalid", "instance"),
        (send_status(500, b"internal error\n"), "http", "HTTP 500: internal error"),
        (send_status(401), "http", "HTTP 401"),
    ],
)
def test_bad_answers_are_classified(poller, servers, behaviour, reason, message):
    server = servers()
    server.behaviour = behaviour
    (result,) = poller.poll([target(server.address)])
    assert not result.ok and result.reason == reason and message in result.error


def test_refused_and_dns_failures(poller):
    results = {
        r.target.host: r
        for r in poller.poll(
            [target(f"127.0.0.1:{closed_port()}"), target("no-such-host.invalid:8021")]
        )
    }
    assert results["127.0.0.1"].reason == "refused"
    assert results["no-such-host.invalid"].reason == "dns"
    assert "DNS lookup failed" in results["no-such-host.invalid"].error


@pytest.mark.parametrize("declare", [False, True])
@pytest.mark.alone
def test_gigantic_payload_is_cut_at_the_cap(poller, servers, declare):
    server = servers()
    server.behaviour = gigantic(total_mb=256, declare=declare)
    started = time.monotonic()
    (result,) = poller.poll([target(server.address)])
    assert result.reason == "too_large" and "byte cap" in result.error
    assert result.nbytes <= 4 * 1024 * 1024
    assert time.monotonic() - started < 20  # it did not read 256 MB


@pytest.mark.alone
def test_hanging_and_dripping_targets_do_not_delay_the_others(poller, servers):
    release = threading.Event()
    hanging, dripping = servers(), servers()
    hanging.behaviour = hang_mid_response(release)
    dripping.behaviour = drip(release)
    good = [servers(make_doc([(0, f"s{i}", i + 1)])) for i in range(5)]
    finished: dict[str, float] = {}
    started = time.monotonic()
    try:
        results = poller.poll(
            [target(hanging.address), target(dripping.address)] + [target(s.address) for s in good],
            on_result=lambda r: finished.setdefault(r.target.address, time.monotonic() - started),
        )
    finally:
        release.set()
    by_address = {r.target.address: r for r in results}
    assert by_address[hanging.address].reason == "timeout"
    assert by_address[dripping.address].reason == "timeout"
    assert "not complete after" in by_address[dripping.address].error
    assert all(by_address[s.address].ok for s in good)
    # The good targets answered long before the stuck ones were given up.
    slowest_good = max(finished[s.address] for s in good)
    assert slowest_good < min(finished[hanging.address], finished[dripping.address])
    # The dripping one was cut by the overall deadline, not after its endless body.
    assert finished[dripping.address] < 3.0 + 1.5 + 5


def test_a_target_dripping_its_head_is_cut_at_the_deadline(poller, servers):
    # Each byte comes within the read timeout, so only the fetch's deadline can end it.
    release = threading.Event()
    dripping = servers()
    dripping.behaviour = drip_head(release)
    results = []
    started = time.monotonic()
    polling = threading.Thread(
        target=lambda: results.append(poller.poll_one(target(dripping.address)))
    )
    polling.start()
    polling.join(poller.deadline + 3)
    release.set()
    polling.join(30)
    assert results and results[0].reason == "timeout", "the fetch outlasted its deadline"
    assert "not complete after 3.0 s" in results[0].error
    assert time.monotonic() - started < poller.deadline + 3


def test_bearer_token_is_sent(servers):
    seen = []

    def behave(handler):
        seen.append(handler.headers.get("Authorization"))
        send_status(401)(handler)

    server = servers()
    server.behaviour = behave
    p = Poller(concurrency=2, token="s3cret")
    try:
        p.poll([target(server.address)])
    finally:
        p.close()
    assert seen == ["Bearer s3cret"]
