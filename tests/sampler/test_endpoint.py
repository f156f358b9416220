"""The HTTP endpoint, over real sockets: formats, parameters, errors, tokens, slow clients."""

import json
import socket
import threading
import time
import xml.etree.ElementTree as ET

import pytest
from samplerhelpers import HTTPStatusError, free_port, get, get_json

import sampler
from sampler.profile import parse_folded, unescape_frame

# Formats, errors and tokens; the tests that time answers or count a window's samples are alone.
pytestmark = pytest.mark.parallel


def spin(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


@pytest.fixture
def running():
    s = sampler.start(
        port=0,
        service="endpoint-test",
        labels={"version": "9.9"},
        mode="wall",
        driver="thread",
        interval=0.005,
    )
    yield s
    sampler.stop()


def test_stacks_profile_and_info_agree(running):
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait, name="waiter")
    worker.start()
    time.sleep(0.5)
    stop.set()
    worker.join()
    folded = parse_folded(get(running.url + "/stacks").decode())
    later = parse_folded(get(running.url + "/").decode())
    assert all(later[stack] >= count for stack, count in folded.items())
    assert any("threading:Event.wait" in stack for stack in folded)
    doc = get_json(running.url + "/profile.json")
    assert doc["format"] == "fleetflame.profile/1"
    assert doc["labels"] == {
        "service": "endpoint-test",
        "host": socket.gethostname(),
        "version": "9.9",
    }
    assert doc["mode"] == "wall" and doc["interval"] == 0.005
    assert doc["label_sets"][0] == {}
    assert doc["total_samples"] == sum(count for _, _, count in doc["stacks"])
    assert doc["total_samples"] > 0
    info = get_json(running.url + "/info")
    assert info["instance"] == doc["instance"]
    assert info["driver"] == "thread" and info["status"] == "ok"
    assert info["distinct_stacks"] >= len({stack for _, stack, _ in doc["stacks"]})


def test_counts_only_grow_so_readers_never_steal(running):
    first = get_json(running.url + "/profile.json")
    time.sleep(0.3)
    second = get_json(running.url + "/profile.json")
    assert second["instance"]["id"] == first["instance"]["id"]
    before = {(tuple(first["label_sets"][i].items()), s): c for i, s, c in first["stacks"]}
    after = {(tuple(second["label_sets"][i].items()), s): c for i, s, c in second["stacks"]}
    assert all(after.get(key, 0) >= count for key, count in before.items())
    assert second["total_samples"] > first["total_samples"]


@pytest.mark.alone
def test_seconds_gives_a_fresh_profile(running):
    done = threading.Event()

    def later():
        time.sleep(0.3)
        spin_thread = threading.Thread(target=spin, args=(0.5,), name="late-spinner")
        spin_thread.start()
        spin_thread.join()
        done.set()

    cumulative_before = parse_folded(get(running.url + "/stacks").decode())
    assert not any("spin" in s for s in cumulative_before)
    threading.Thread(target=later).start()
    fresh = parse_folded(get(running.url + "/stacks?seconds=1", timeout=20).decode())
    done.wait(10)
    assert any(":spin" in s for s in fresh)
    # The fresh window is about 1 s of wall time per thread, not everything since start.
    assert sum(c for s, c in fresh.items() if ":spin" in s) <= 1.2 / 0.005


def test_flamegraph_svg_is_valid_xml(running):
    time.sleep(0.2)
    svg = get(running.url + "/flamegraph.svg").decode()
    root = ET.fromstring(svg)
    assert root.tag.endswith("svg")
    rects = root.findall(".//{http://www.w3.org/2000/svg}rect")
    assert len(rects) > 3


def test_flamegraph_svg_stays_xml_whatever_the_names_and_title(running):
    # U+FFFF is a character a frame may hold but XML may not; a title comes from the URL.
    from sampler import _svg

    svg = _svg.render({"app:odd\uffffname;app:leaf": 3, "app:ok": 1}, title="a\x01b\ufffe")
    root = ET.fromstring(svg)
    names = [g.get("data-n") for g in root.iter("{http://www.w3.org/2000/svg}g")]
    assert "app:odd[U+FFFF]name" in names
    assert root.find("{http://www.w3.org/2000/svg}title").text == "a[U+0001]b[U+FFFE]"
    ET.fromstring(get(running.url + "/flamegraph.svg?title=a%01b").decode())


@pytest.mark.parametrize(
    "path, status, message",
    [
        ("/nope", 404, "no such endpoint"),
        ("/stacks?seconds=abc", 400, "seconds must be"),
        ("/stacks?seconds=0", 400, "seconds must be"),
        ("/stacks?seconds=100000", 400, "seconds must be"),
        ("/flamegraph.svg?seconds=-1", 400, "seconds must be"),
        ("/profile.json?since=-1", 400, "since must be"),
        ("/profile.json?since=1e3", 400, "since must be"),
        ("/profile.json?since=%C2%B2", 400, "since must be"),
    ],
)
def test_bad_requests_get_a_clear_4xx(running, path, status, message):
    with pytest.raises(HTTPStatusError) as caught:
        get(running.url + path)
    assert caught.value.code == status
    assert message in caught.value.body


def test_post_is_refused(running):
    with pytest.raises(HTTPStatusError) as caught:
        get(running.url + "/stacks", method="POST", data=b"x")
    assert caught.value.code == 405


@pytest.mark.alone
def test_slow_client_does_not_stall_sampling_or_other_clients(running):
    slow = socket.create_connection(("127.0.0.1", running.server.port))
    slow.sendall(b"GET /stacks HTTP/1.1\r\nHost: x\r\n")  # never finishes its headers
    ticks = running.ticks
    started = time.monotonic()
    assert get(running.url + "/info", timeout=5)
    assert time.monotonic() - started < 2
    time.sleep(0.2)
    assert running.ticks > ticks
    slow.close()


@pytest.mark.alone
def test_mounted_in_a_host_server_long_reads_wait_on_a_few_threads_only(running):
    """In a host's own server there is nothing to park in: a long read waits on its thread,
    and past a few of them it is refused, so quick reads always find a slot."""
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args):
            pass

    class Threaded(ThreadingMixIn, WSGIServer):
        daemon_threads = True

    host = make_server(
        "127.0.0.1", 0, sampler.make_wsgi_app(), server_class=Threaded, handler_class=Quiet
    )
    serving = threading.Thread(target=host.serve_forever, kwargs={"poll_interval": 0.05})
    serving.start()
    url = f"http://127.0.0.1:{host.server_address[1]}"
    results = []

    def fetch():
        try:
            get(url + "/stacks?seconds=1", timeout=20)
            results.append(200)
        except HTTPStatusError as exc:
            results.append(exc.code)

    try:
        threads = [threading.Thread(target=fetch) for _ in range(6)]
        for t in threads:
            t.start()
        time.sleep(0.3)
        assert get_json(url + "/info", timeout=5)["status"] == "ok"
        for t in threads:
            t.join()
        assert results.count(200) == 4 and results.count(503) == 2
    finally:
        host.shutdown()
        host.server_close()
        serving.join()


def test_token_is_required_when_set():
    s = sampler.start(port=0, token="s3cret", driver="thread")
    try:
        with pytest.raises(HTTPStatusError) as caught:
            get(s.url + "/stacks")
        assert caught.value.code == 401
        with pytest.raises(HTTPStatusError):
            get(s.url + "/stacks", headers={"Authorization": "Bearer wrong"})
        assert get(s.url + "/info", headers={"Authorization": "Bearer s3cret"})
    finally:
        sampler.stop()


def test_binding_beyond_loopback_requires_a_token():
    with pytest.raises(sampler.ConfigError, match="token"):
        sampler.start(port=0, host="0.0.0.0")
    assert sampler.running() is None


@pytest.mark.parametrize("host", ["::1", "[::1]"])
def test_ipv6_loopback_serves_without_a_token_written_either_way(host):
    # Loopback needs no token, and "[::1]", as a URL writes it, once failed to bind.
    s = sampler.start(port=0, host=host)
    try:
        assert s.url.startswith("http://[::1]:")
        assert get_json(s.url + "/info")["instance"]["id"] == s.instance["id"]
    finally:
        sampler.stop()


@pytest.mark.parallel
@pytest.mark.parametrize(
    "host, loopback",
    [
        ("localhost", True),
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.5", False),
        ("127.evil.example", False),  # a name that only starts like loopback
        ("localhost.example", False),
        ("", False),
    ],
)
def test_what_counts_as_loopback_is_one_rule_for_every_server(host, loopback):
    # The sampler's endpoint, `fleetflame web` and `fleetflame attach` all ask it.
    from sampler.settings import is_loopback

    assert is_loopback(host) is loopback


@pytest.mark.parametrize(
    "token, message",
    [(" ", "blank"), ("\t\n", "blank"), ("s3cret\n", "whitespace"), ("s3\x01cret", "control")],
)
def test_a_token_no_header_can_carry_is_a_config_error_naming_the_setting(
    token, message, monkeypatch
):
    with pytest.raises(sampler.ConfigError, match=f"argument token: .*{message}"):
        sampler.start(port=0, host="0.0.0.0", token=token)
    monkeypatch.setenv("FLEETFLAME_TOKEN", token)
    with pytest.raises(sampler.ConfigError, match=f"FLEETFLAME_TOKEN: .*{message}"):
        sampler.start(port=0, host="0.0.0.0")
    assert sampler.running() is None


@pytest.mark.alone
def test_dump_lists_every_thread_but_the_samplers_own(running):
    stop = threading.Event()

    def busy_dumped():
        while not stop.is_set():
            spin(0.01)

    def waiting_dumped():
        stop.wait()

    threads = [
        threading.Thread(target=busy_dumped, name='busy\nThread 1 "fake"'),
        threading.Thread(target=waiting_dumped, name="waiter", daemon=True),
    ]
    for t in threads:
        t.start()
    try:
        text = get(running.url + "/dump").decode()
        doc = get_json(running.url + "/dump?format=json")
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert text.startswith("Process ")
    assert "fleetflame-" not in text  # the endpoint's and the driver's threads are left out
    headers = [line for line in text.splitlines() if line.startswith("Thread ")]
    assert len(headers) == len(doc["threads"])  # a hostile name injected no line
    assert {"MainThread", "waiter", 'busy\nThread 1 "fake"'} <= {t["name"] for t in doc["threads"]}
    busy = next(h for h in headers if "busy%0AThread 1 %22fake%22" in h)
    assert busy.endswith(", active)") and "daemon" not in busy
    waiter = next(h for h in headers if '"waiter"' in h)
    assert waiter.endswith("daemon, idle)")
    assert "test_endpoint:test_dump_lists_every_thread_but_the_samplers_own" in text
    block = text.split('"waiter"')[1].split("\n\n")[0].splitlines()
    assert block[1].startswith("    threading:Event.wait (") or block[1].startswith(
        "    threading:Condition.wait ("
    )
    assert block[-1].startswith("    threading:Thread._bootstrap (")
    assert doc["format"] == "fleetflame.dump/1"
    by_name = {t["name"]: t for t in doc["threads"]}
    assert by_name["waiter"]["daemon"] is True and by_name["waiter"]["state"] == "idle"
    assert by_name['busy\nThread 1 "fake"']["state"] == "active"
    leaf = by_name["waiter"]["frames"][-1]
    assert leaf["name"] == "threading:Thread._bootstrap" and leaf["line"] > 0


def test_dump_refuses_unknown_formats(running):
    with pytest.raises(HTTPStatusError) as caught:
        get(running.url + "/dump?format=xml")
    assert caught.value.code == 400 and "format must be text or json" in caught.value.body


def test_unknown_path_lists_every_endpoint(running):
    with pytest.raises(HTTPStatusError) as caught:
        get(running.url + "/nope")
    for route in ("/stacks", "/flamegraph.svg", "/profile.json", "/info", "/dump"):
        assert route in caught.value.body


def test_port_range_skips_busy_ports():
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    s = sampler.start(port=f"{port}-{port + 20}", driver="thread")
    try:
        assert port < s.server.port <= port + 20
    finally:
        sampler.stop()
        busy.close()


def test_busy_single_port_is_a_clear_error():
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    try:
        with pytest.raises(sampler.SamplerError, match="range"):
            sampler.start(port=port, driver="thread")
    finally:
        busy.close()
    assert sampler.running() is None


def test_hostile_frame_names_are_escaped_everywhere(running):
    def evil():
        time.sleep(0.3)

    evil.__code__ = evil.__code__.replace(
        co_qualname="evil;name\nwith <img src=x onerror=alert(1)>\u202egnp.exe"
    )
    t = threading.Thread(target=evil, name="evil")
    t.start()
    t.join()
    text = get(running.url + "/stacks").decode()
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        assert count.isdigit()
    folded = parse_folded(text)
    frames = {unescape_frame(f) for stack in folded for f in stack.split(";")}
    assert any(
        f.endswith("evil;name\nwith <img src=x onerror=alert(1)>\u202egnp.exe") for f in frames
    )
    svg = get(running.url + "/flamegraph.svg").decode()
    root = ET.fromstring(svg)  # still well-formed XML
    assert not root.findall(".//{http://www.w3.org/2000/svg}img")
    assert "&lt;img src=x" in svg
    # A right-to-left override would show "exe.png": it is written out instead.
    assert "\u202e" not in svg and "[U+202E]gnp.exe" in svg


def test_profile_json_stacks_parse_as_folded(running):
    time.sleep(0.2)
    doc = json.loads(get(running.url + "/profile.json"))
    text = "".join(f"{stack} {count}\n" for _, stack, count in doc["stacks"])
    assert sum(parse_folded(text).values()) == doc["total_samples"]


def test_free_port_helper_is_free():
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def busy_in_a():
    spin(0.2)


def busy_in_b():
    spin(0.2)


@pytest.mark.alone
def test_since_lists_only_what_changed_after_a_tick_read_before():
    s = sampler.start(port=0, mode="cpu", driver="thread", interval=0.005)
    try:
        busy_in_a()
        time.sleep(0.05)
        first = get_json(s.url + "/profile.json")
        assert first["since"] == 0 and first["generation"] > 0
        busy_in_b()
        time.sleep(0.05)
        since, instance = first["generation"], first["instance"]["id"]
        changed = get_json(f"{s.url}/profile.json?since={since}&instance={instance}")
        full = get_json(s.url + "/profile.json")
        assert changed["since"] == since and changed["generation"] > since
        listed = {stack: count for _, stack, count in changed["stacks"]}
        assert any(":busy_in_b;" in stack for stack in listed)
        assert not any(":busy_in_a;" in stack for stack in listed)
        # Listed counts are cumulative, like the full document's; nothing else changed.
        before = {stack: count for _, stack, count in first["stacks"]}
        after = {stack: count for _, stack, count in full["stacks"]}
        assert {k for k, v in after.items() if v != before.get(k)} <= set(listed)
        assert all(after[k] >= v for k, v in listed.items())
        assert changed["total_samples"] <= full["total_samples"]
        # Another process's id, or a tick not reached yet: the whole document.
        for query in (
            f"since={since}&instance=not-this-one",
            f"since=10{since}&instance={instance}",
        ):
            whole = get_json(f"{s.url}/profile.json?{query}")
            assert whole["since"] == 0 and len(whole["stacks"]) >= len(first["stacks"])
    finally:
        sampler.stop()
