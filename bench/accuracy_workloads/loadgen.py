"""A load generator: N threads send GET requests to 127.0.0.1 in a loop until a deadline.

    python loadgen.py --port 8000 --path /report --concurrency 4 --seconds 30 [--keep-alive]

Bounded in time, loopback only. At exit it prints ``{"requests": N, "errors": N}``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import signal
import sys
import threading
import time
from collections import Counter


def client(options: argparse.Namespace, deadline: float, counts: Counter[str]) -> None:
    """Sends requests until the deadline, counting them in ``counts`` (its own)."""
    connection = None
    number = 0
    while time.monotonic() < deadline:
        number += 1
        try:
            if connection is None:
                connection = http.client.HTTPConnection("127.0.0.1", options.port, timeout=10)
            path = f"{options.path}?seed={number % 50}"
            headers = {} if options.keep_alive else {"Connection": "close"}
            connection.request("GET", path, headers=headers)
            connection.getresponse().read()
            counts["requests"] += 1
        except (OSError, http.client.HTTPException):
            counts["errors"] += 1
            time.sleep(0.05)
            connection = None
            continue
        if not options.keep_alive:
            connection.close()
            connection = None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--path", default="/")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--keep-alive", action="store_true")
    options = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    deadline = time.monotonic() + options.seconds
    counts: list[Counter[str]] = [Counter() for _ in range(options.concurrency)]
    clients = [
        threading.Thread(target=client, args=(options, deadline, own), daemon=True)
        for own in counts
    ]
    for thread in clients:
        thread.start()
    try:
        for thread in clients:
            thread.join()
    finally:
        total = sum(counts, Counter())
        print(json.dumps({"requests": total["requests"], "errors": total["errors"]}), flush=True)


if __name__ == "__main__":
    main()
