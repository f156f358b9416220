"""The shop's background job worker: turns queued orders into compressed invoices.

Run as ``python -m demoshop.jobs``. It is a plain process, not a web worker, so it starts the
sampler itself with the one line a service needs: ``sampler.start_from_env()``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import threading
import zlib
from typing import Any

from demoshop import GOOD_VERSION, catalog


def render_invoice(order_id: int, order: dict[str, Any]) -> str:
    """Renders an order as a plain-text invoice."""
    out = [f"INVOICE #{order_id:08d}  (shop {order.get('version', '?')})", "-" * 60]
    for line in order.get("lines", []):
        out.append(
            f"{line['sku']:<14}{line['qty']:>6} x {line.get('unit_cents', 0) / 100:>10.2f}"
            f" = {line.get('total_cents', 0) / 100:>12.2f}"
        )
    out.append("-" * 60)
    out.append(f"{'TOTAL':<40}{order.get('total_cents', 0) / 100:>20.2f}")
    return "\n".join(out)


def process_order(order_id: int, order: dict[str, Any]) -> tuple[int, str]:
    """Renders, compresses and fingerprints one order's invoice; returns (bytes, sha256)."""
    text = render_invoice(order_id, order)
    packed = zlib.compress(text.encode() * 4, level=9)
    digest = hashlib.sha256(packed).hexdigest()
    for _ in range(20):  # the "PDF" step: key stretching stands in for layout work
        digest = hashlib.sha256((digest + text[:64]).encode()).hexdigest()
    return len(packed), digest


def run(db_path: str, stop: threading.Event, idle_wait: float = 0.2) -> int:
    """Processes orders until ``stop`` is set; returns how many it processed."""
    conn = catalog.connect(db_path)
    done = 0
    try:
        while not stop.is_set():
            orders = catalog.claim_orders(conn, limit=20)
            for order_id, order in orders:
                process_order(order_id, order)
                done += 1
            if not orders:
                stop.wait(idle_wait)
    finally:
        conn.close()
    return done


def main(argv: list[str] | None = None) -> int:
    """Runs the job worker until SIGTERM or SIGINT."""
    parser = argparse.ArgumentParser(prog="python -m demoshop.jobs", description=__doc__)
    parser.add_argument("--db", default=os.environ.get("DEMO_DB", "var/demo/shop.db"))
    args = parser.parse_args(argv)
    catalog.ensure_catalog(args.db)

    import sampler

    sampler.start_from_env()
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    version = os.environ.get("DEMO_VERSION", GOOD_VERSION)
    print(f"demo-jobs {version} (pid {os.getpid()}) processing orders from {args.db}", flush=True)
    done = run(args.db, stop)
    print(f"demo-jobs (pid {os.getpid()}) stopped after {done} orders", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
