"""Fetches every target's /profile.json concurrently, each fetch bounded in time and size.

One ``requests.Session`` with a connection pool as large as the thread pool serves every
fetch, so steady-state polls reuse keep-alive connections. Each fetch has a connect timeout,
a per-read timeout, an overall deadline checked between reads, and a cap on the decoded body
size: a slow, dead or hostile target costs one pool thread for at most about
``fetch_deadline + read_timeout`` seconds and never delays the other targets' results.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import requests
import requests.adapters
import urllib3.exceptions

from collector.deltas import Limits, Profile, ProfileError, decode_profile
from collector.targets import Target

__all__ = ["FetchError", "PollResult", "Poller"]

_CHUNK = 256 * 1024
_MAX_POOLS = 10_000  # targets one collector keeps a connection pool for


class FetchError(Exception):
    """A target could not be fetched; ``reason`` is a short machine-readable kind."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class PollResult:
    """One target's outcome in a poll cycle: a validated profile or an error."""

    target: Target
    profile: Profile | None
    reason: str  # "ok", or the failure kind: refused, timeout, dns, http, too_large, invalid, ...
    error: str
    seconds: float
    nbytes: int

    @property
    def ok(self) -> bool:
        """Whether a valid profile was fetched."""
        return self.profile is not None


class Poller:
    """Polls targets with a bounded thread pool and one pooled HTTP session."""

    def __init__(
        self,
        *,
        concurrency: int = 32,
        connect_timeout: float = 2.0,
        read_timeout: float = 5.0,
        deadline: float = 8.0,
        max_bytes: int = 64 * 1024 * 1024,
        limits: Limits | None = None,
        token: str = "",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.concurrency = concurrency
        self.timeout = (connect_timeout, read_timeout)
        self.deadline = deadline
        self.max_bytes = max_bytes
        self.limits = limits or Limits()
        self._clock = clock
        self.session = requests.Session()
        # urllib3 keeps one connection pool per target (host and port); with fewer pools than
        # targets it evicts and rebuilds them all the time, under one lock every fetch needs.
        adapter = requests.adapters.HTTPAdapter(
            pool_connections=_MAX_POOLS, pool_maxsize=concurrency, max_retries=0
        )
        self.session.mount("http://", adapter)
        self.session.mount("https://", adapter)
        self.session.headers["User-Agent"] = "fleetflame-collector"
        if token:
            self.session.headers["Authorization"] = f"Bearer {token}"
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=concurrency, thread_name_prefix="fleetflame-poll"
        )

    def fetch(self, url: str) -> bytes:
        """Returns the body at ``url``, or raises FetchError on any failure or limit."""
        started = self._clock()
        try:
            response = self.session.get(url, timeout=self.timeout, stream=True)
        except requests.exceptions.ConnectTimeout:
            raise FetchError("timeout", f"connect timed out after {self.timeout[0]} s") from None
        except requests.exceptions.ReadTimeout:
            raise FetchError("timeout", f"no response within {self.timeout[1]} s") from None
        except requests.exceptions.ConnectionError as exc:
            raise _connection_error(exc) from None
        except requests.exceptions.RequestException as exc:
            raise FetchError("http", f"request failed: {exc}") from None
        with response:
            if response.status_code != 200:
                snippet = response.raw.read(200, decode_content=True) or b""
                text = snippet.decode("utf-8", "replace").strip().splitlines()
                raise FetchError(
                    "http", f"HTTP {response.status_code}: {text[0][:120] if text else ''}"
                )
            declared = response.headers.get("Content-Length", "")
            if declared.isdigit() and int(declared) > self.max_bytes:
                raise FetchError(
                    "too_large", f"Content-Length {declared} over the {self.max_bytes} byte cap"
                )
            chunks: list[bytes] = []
            size = 0
            try:
                # read1 returns whatever arrived, so the deadline is checked even when a
                # target drips one byte at a time (a plain read(n) would wait for n bytes).
                while chunk := response.raw.read1(_CHUNK, decode_content=True):
                    size += len(chunk)
                    if size > self.max_bytes:
                        raise FetchError("too_large", f"body over the {self.max_bytes} byte cap")
                    chunks.append(chunk)
                    if self._clock() - started > self.deadline:
                        raise FetchError("timeout", f"body not complete after {self.deadline} s")
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                kind = "timeout" if "timed out" in str(exc).lower() else "broken"
                raise FetchError(kind, f"reading the body failed: {_short(exc)}") from None
        return b"".join(chunks)

    def poll_one(self, target: Target, query: str = "") -> PollResult:
        """Fetches and validates one target (``query`` appended to its URL); never raises."""
        started = self._clock()
        raw = b""
        try:
            raw = self.fetch(target.url + query)
            profile = decode_profile(raw, self.limits)
        except FetchError as exc:
            return PollResult(target, None, exc.reason, str(exc), self._clock() - started, len(raw))
        except ProfileError as exc:
            return PollResult(target, None, "invalid", str(exc), self._clock() - started, len(raw))
        except Exception as exc:  # a bug must cost one target, not the cycle
            return PollResult(
                target,
                None,
                "error",
                f"{type(exc).__name__}: {exc}",
                self._clock() - started,
                len(raw),
            )
        return PollResult(target, profile, "ok", "", self._clock() - started, len(raw))

    def poll(
        self,
        targets: Sequence[Target],
        on_result: Callable[[PollResult], None] | None = None,
        query: Callable[[Target], str] | None = None,
    ) -> list[PollResult]:
        """Polls all targets concurrently; results come back in completion order.

        ``query`` gives the query string of each target's request (see TargetState.since_query).
        """
        futures = [
            self._pool.submit(self.poll_one, target, query(target) if query else "")
            for target in targets
        ]
        results = []
        for future in concurrent.futures.as_completed(futures):
            result = future.result()
            if on_result is not None:
                on_result(result)
            results.append(result)
        return results

    def close(self) -> None:
        """Stops the pool threads and closes pooled connections."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        self.session.close()


def _short(exc: BaseException) -> str:
    text = str(exc)
    # urllib3 nests the useful part in the innermost reason; keep lines short for logs.
    return text if len(text) < 200 else text[:197] + "..."


def _connection_error(exc: requests.exceptions.ConnectionError) -> FetchError:
    text = str(exc)
    lowered = text.lower()
    if (
        "name or service not known" in lowered
        or "nodename nor servname" in lowered
        or ("failed to resolve" in lowered or "temporary failure in name resolution" in lowered)
    ):
        return FetchError("dns", f"DNS lookup failed: {_short(exc)}")
    if "refused" in lowered:
        return FetchError("refused", "connection refused")
    if "timed out" in lowered:
        return FetchError("timeout", f"timed out: {_short(exc)}")
    return FetchError("connection", f"connection failed: {_short(exc)}")
