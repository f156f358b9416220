"""Kept-alive connections and gzipped answers, over real sockets: what a polling collector uses."""

import gzip
import socket
import time

import pytest

import sampler
from sampler import _http
from sampler._server import accepts_gzip

# Connections and encodings; the test of the idle and head deadlines is alone.
pytestmark = pytest.mark.parallel

KEEP = b"GET /hello HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n\r\n"


def hello_app(environ, start_response):
    body = b"hi" if environ["PATH_INFO"] == "/hello" else b"bye"
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "2")])
    return [body[:2]]


@pytest.fixture
def server():
    started = []

    def start(**options):
        s = _http.Server(hello_app, "127.0.0.1", 0, **options)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


def read_answer(sock):
    """Reads one answer with a Content-Length from ``sock``; returns (head, body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "closed before an answer"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(
        next(line for line in head.split(b"\r\n") if line.startswith(b"Content-Length"))[15:]
    )
    while len(body) < length:
        body += sock.recv(65536)
    return head.decode("latin-1"), body


def closed(sock, timeout=5.0):
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_a_client_asking_to_keep_the_connection_gets_several_answers_on_it(server):
    s = server()
    with socket.create_connection(("127.0.0.1", s.port), timeout=5) as sock:
        for _ in range(3):
            sock.sendall(KEEP)
            head, body = read_answer(sock)
            assert "Connection: keep-alive" in head and body == b"hi"
        assert s.connections == 1
        # Two requests sent at once are answered in turn.
        sock.sendall(KEEP + KEEP.replace(b"/hello", b"/other"))
        assert read_answer(sock)[1] == b"hi" and read_answer(sock)[1] == b"by"
        sock.sendall(b"GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        head, body = read_answer(sock)
        assert "Connection: close" in head and closed(sock)


def test_without_asking_the_connection_closes_after_one_answer(server):
    s = server()
    with socket.create_connection(("127.0.0.1", s.port), timeout=5) as sock:
        sock.sendall(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
        head, _ = read_answer(sock)
        assert "Connection: close" in head and closed(sock)


@pytest.mark.alone
def test_an_unused_kept_connection_is_closed_and_a_slow_next_head_is_cut(server):
    s = server(keep_alive_timeout=0.3, head_timeout=0.3)
    with socket.create_connection(("127.0.0.1", s.port), timeout=5) as sock:
        sock.sendall(KEEP)
        read_answer(sock)
        started = time.monotonic()
        assert closed(sock) and time.monotonic() - started < 3
    with socket.create_connection(("127.0.0.1", s.port), timeout=5) as sock:
        sock.sendall(KEEP)
        read_answer(sock)
        sock.sendall(b"GET /hel")  # the next head begins, then stalls: the head deadline holds
        head, _ = read_answer(sock)
        assert "408" in head.split("\r\n")[0]


def test_kept_connections_are_the_first_closed_when_the_server_is_full(server):
    s = server(max_connections=4)
    kept = [socket.create_connection(("127.0.0.1", s.port), timeout=5) for _ in range(4)]
    try:
        for sock in kept:
            sock.sendall(KEEP)
            read_answer(sock)
        with socket.create_connection(("127.0.0.1", s.port), timeout=5) as extra:
            extra.sendall(KEEP)
            assert read_answer(extra)[1] == b"hi"
        assert closed(kept[0])
    finally:
        for sock in kept:
            sock.close()


@pytest.mark.parametrize(
    ("header", "accepted"),
    [
        ("gzip", True),
        ("gzip, deflate", True),
        ("deflate, gzip;q=0.5", True),
        ("GZIP", True),
        ("gzip;q=0", False),
        ("deflate", False),
        ("", False),
        ("gzip;q=nonsense", False),
    ],
)
def test_accept_encoding(header, accepted):
    assert accepts_gzip(header) is accepted


def test_answers_from_a_kilobyte_up_are_gzipped_when_accepted():
    from sampler._server import GZIP_MIN_BYTES, _ok

    def answer(body, accept):
        given = []
        out = _ok(lambda status, headers: given.extend(headers), "text/plain", body, accept)
        return dict(given), b"".join(out)

    big = b"main;work;leaf 1\n" * 200
    headers, body = answer(big, {"HTTP_ACCEPT_ENCODING": "gzip"})
    assert headers["Content-Encoding"] == "gzip" and gzip.decompress(body) == big
    assert int(headers["Content-Length"]) == len(body) < len(big) / 10
    headers, body = answer(big, {})
    assert "Content-Encoding" not in headers and body == big
    assert headers["Vary"] == "Accept-Encoding"
    small = b"x" * (GZIP_MIN_BYTES - 1)
    headers, body = answer(small, {"HTTP_ACCEPT_ENCODING": "gzip"})
    assert "Content-Encoding" not in headers and body == small


def test_profile_json_is_gzipped_for_a_client_that_accepts_it():
    import json
    import urllib.request

    s = sampler.start(port=0, service="gzip-test", driver="thread", interval=0.005)
    try:
        end = time.monotonic() + 0.3
        while time.monotonic() < end:
            sum(i * i for i in range(1000))
        request = urllib.request.Request(s.url + "/profile.json")
        request.add_header("Accept-Encoding", "gzip")
        with urllib.request.urlopen(request, timeout=10) as answer:
            encoding, body = answer.headers["Content-Encoding"], answer.read()
        doc = json.loads(gzip.decompress(body))
        assert encoding == "gzip" and doc["format"] == "fleetflame.profile/1"
    finally:
        sampler.stop()
