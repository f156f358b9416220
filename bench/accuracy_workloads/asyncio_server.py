"""An asyncio streams HTTP server whose request coroutine does CPU work before it answers.

Minimal HTTP/1.1 with keep-alive, enough for loadgen.py. The CPU is spent in the coroutine
``respond`` itself (and the plain function ``checksum`` it calls), between awaits.
"""

from __future__ import annotations

import asyncio
import os
import time

import _common

deadline = _common.start_script()


def checksum(data: bytes) -> int:
    total = 0
    for byte in data:
        total = (total * 31 + byte) & 0xFFFFFFFF
    return total


async def respond(path: str, writer: asyncio.StreamWriter) -> None:
    words = []
    for i in range(3000):
        words.append(f"{path}:{i * i % 977}")
    body = ",".join(sorted(words)).encode()
    digest = checksum(body[:20_000])
    await asyncio.sleep(0)  # a real handler awaits something between its steps
    reply = f"{digest}\n".encode()
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s"
        % (len(reply), reply)
    )
    await writer.drain()


async def serve_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            path = head.split(b" ", 2)[1].decode()
            await respond(path, writer)
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def main() -> None:
    server = await asyncio.start_server(
        serve_connection, "127.0.0.1", int(os.environ["ACCURACY_APP_PORT"])
    )
    async with server:
        _common.write_module_map()
        await asyncio.sleep(max(0.0, deadline - time.monotonic()))


asyncio.run(main())
