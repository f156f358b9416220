"""The server's pure half: request heads parsed, answers encoded, no sockets."""

import pytest

from sampler._http_messages import Refused, encode_answer, encode_error, head_end, parse_head

# Pure parsing, no clock: runs beside other tests (tests/conftest.py).
pytestmark = pytest.mark.parallel


def test_a_head_gives_method_target_version_and_headers():
    head = b"GET /stacks?seconds=5 HTTP/1.1\r\nHost: x\r\nAuthorization:  Bearer t \r\n\r\n"
    assert parse_head(head) == (
        "GET",
        "/stacks?seconds=5",
        "HTTP/1.1",
        [("Host", "x"), ("Authorization", "Bearer t")],
    )


def test_bare_newlines_and_absolute_targets_are_read():
    method, target, _, headers = parse_head(b"HEAD http://h:1/info?x=1 HTTP/1.0\nA: b\n\n")
    assert (method, target, headers) == ("HEAD", "/info?x=1", [("A", "b")])
    assert parse_head(b"GET http://h:1 HTTP/1.0\r\n\r\n")[1] == "/"


def test_headers_with_underscores_are_dropped():
    # X_Forwarded_For and X-Forwarded-For would both be HTTP_X_FORWARDED_FOR in WSGI.
    assert parse_head(b"GET / HTTP/1.1\r\nX_Forwarded_For: evil\r\n\r\n")[3] == []


@pytest.mark.parametrize(
    "head, status",
    [
        (b"PUT / HTTP/1.1\r\n\r\n", "405"),
        (b"GET / HTTP/1.1\r\nContent-Length: 0\r\n\r\n", None),
        (b"GET / HTTP/1.1\r\nContent-Length: 1\r\n\r\n", "400"),
        (b"GET / HTTP/1.1\r\nHost : x\r\n\r\n", "400"),
        (b"GET / HTTP/0.9\r\n\r\n", "505"),
        (b"GET /\r\n\r\n", "400"),
        (b"GET / HTTP/1.1\r\n" + b"A: b\r\n" * 101 + b"\r\n", "431"),
    ],
)
def test_heads_refused_with_a_status(head, status):
    if status is None:
        parse_head(head)
        return
    with pytest.raises(Refused) as refused:
        parse_head(head)
    assert refused.value.status.startswith(status)


def test_head_end_is_after_the_blank_line():
    assert head_end(bytearray(b"GET / HTTP/1.1\r\nA: b\r\n\r\nrest"), 0) == 24
    assert head_end(bytearray(b"GET / HTTP/1.0\n\n"), 0) == 16
    assert head_end(bytearray(b"GET / HTTP/1.1\r\nA: b\r\n"), 0) == -1


def test_answers_close_the_connection_and_say_their_length():
    text = encode_answer("200 OK", [("Content-Type", "text/plain")], [b"he", b"llo"])
    assert text == (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n"
        b"Connection: close\r\n\r\nhello"
    )
    given = encode_answer("200 OK", [("Content-Length", "5")], [b"hello"], head_only=True)
    assert given == b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\n"


def test_a_405_says_what_is_allowed():
    assert b"\r\nAllow: GET, HEAD\r\n" in encode_error("405 Method Not Allowed", "only GET")
