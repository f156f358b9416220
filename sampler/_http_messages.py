"""HTTP/1.x request heads in, answers out: the server's pure half (no I/O, no clock).

Only what an embedded endpoint needs: ``GET`` and ``HEAD``, no request bodies, and a
connection kept for further requests only when the client asks (``Connection: keep-alive``).
"""

from __future__ import annotations

MAX_HEAD = 8192
MAX_HEADERS = 100


class Refused(Exception):
    """A request the server answers itself (malformed, too big, wrong method)."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status


def parse_head(head: bytes) -> tuple[str, str, str, list[tuple[str, str]]]:
    """Parses a request head into method, target, version and headers; raises Refused."""
    lines = head.decode("latin-1").replace("\r\n", "\n").rstrip("\n").split("\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        raise Refused("400 Bad Request", "malformed request line")
    method, target, version = parts
    if version not in ("HTTP/1.0", "HTTP/1.1"):
        raise Refused("505 HTTP Version Not Supported", "only HTTP/1.0 and HTTP/1.1")
    if method not in ("GET", "HEAD"):
        raise Refused("405 Method Not Allowed", "only GET is supported")
    if target.startswith(("http://", "https://")):  # absolute form, as sent to a proxy
        target = "/" + target.split("/", 3)[3] if target.count("/") >= 3 else "/"
    if not target.startswith("/"):
        raise Refused("400 Bad Request", "the request target must be a path")
    if len(lines) - 1 > MAX_HEADERS:
        raise Refused("431 Request Header Fields Too Large", f"more than {MAX_HEADERS} headers")
    headers = []
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip() or line[0] in " \t":
            raise Refused("400 Bad Request", "malformed header line")
        lowered = name.lower()
        if lowered == "transfer-encoding" or (
            lowered == "content-length" and value.strip() not in ("", "0")
        ):
            raise Refused("400 Bad Request", "request bodies are not accepted")
        if "_" in name:
            continue  # X_Forwarded and X-Forwarded would land on one environ key: drop it
        headers.append((name, value.strip()))
    return method, target, version, headers


def head_end(data: bytearray, start: int) -> int:
    """Returns where the request head ends (after its blank line) in ``data``, or -1."""
    end = data.find(b"\r\n\r\n", start)
    if end >= 0:
        return end + 4
    end = data.find(b"\n\n", start)
    return end + 2 if end >= 0 else -1


def keeps_alive(connection: str) -> bool:
    """Whether a request's ``Connection`` header asks to keep the connection open."""
    tokens = {token.strip().lower() for token in connection.split(",")}
    return "keep-alive" in tokens and "close" not in tokens


def encode_answer(
    status: str,
    headers: list[tuple[str, str]],
    body: list[bytes],
    *,
    head_only: bool = False,
    keep_alive: bool = False,
) -> bytes:
    content = b"".join(body)
    lines = [f"HTTP/1.1 {status}"]
    lines += [f"{name}: {value}" for name, value in headers]
    if not any(name.lower() == "content-length" for name, _ in headers):
        lines.append(f"Content-Length: {len(content)}")
    lines += ["Connection: keep-alive" if keep_alive else "Connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1") + (b"" if head_only else content)


def encode_error(status: str, message: str) -> bytes:
    headers = [("Content-Type", "text/plain; charset=utf-8")]
    if status.startswith("405"):
        headers.append(("Allow", "GET, HEAD"))
    return encode_answer(status, headers, [message.encode() + b"\n"])
