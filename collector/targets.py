"""Which workers to poll: static targets, port ranges, discovery files and stable sharding.

A discovery file follows Prometheus ``file_sd``: a JSON list of groups
``[{"targets": ["host:port", ...], "labels": {...}}]``, or the same in TOML as
``[[group]] targets = [...] labels = {...}``. Files are re-read when their modification time
or size changes; a file that cannot be parsed keeps its previous targets and logs an error.
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import sys
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from collector.logs import log_event

__all__ = [
    "MAX_RANGE",
    "DiscoveryFile",
    "Target",
    "TargetError",
    "TargetSet",
    "in_shard",
    "parse_shard",
    "parse_target_spec",
]

log = logging.getLogger("collector.targets")

# A range this wide is almost certainly a typo (8021-80360); refuse it rather than open 70k sockets.
MAX_RANGE = 4096


class TargetError(ValueError):
    """A target spec, discovery file or shard spec is malformed; the message says how."""


@dataclass(frozen=True)
class Target:
    """One sampler endpoint to poll, with the labels its discovery attached."""

    host: str
    port: int
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # Expanded from a port range: a closed port is expected, so refusals are not failures.
    optional: bool = False

    @property
    def address(self) -> str:
        """The ``host:port`` identity of the target (IPv6 hosts in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def url(self) -> str:
        """Where its /profile.json is served."""
        return f"http://{self.address}/profile.json"


def _split_host_port(spec: str) -> tuple[str, str]:
    spec = spec.strip()
    if spec.startswith("["):
        host, sep, rest = spec[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise TargetError(f"target {spec!r}: expected [ipv6]:port")
        return host, rest[1:]
    host, sep, port = spec.rpartition(":")
    if not sep or not host:
        raise TargetError(f"target {spec!r}: expected host:port or host:FIRST-LAST")
    return host, port


def _port(text: str, spec: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise TargetError(f"target {spec!r}: port {text!r} is not a number from 1 to 65535")
    return int(text)


def parse_target_spec(spec: str, labels: Mapping[str, str] | None = None) -> list[Target]:
    """Parses ``host:port`` or ``host:FIRST-LAST`` into targets (a range marks them optional)."""
    if not isinstance(spec, str):
        raise TargetError(f"target {spec!r}: expected a string host:port")
    host, ports = _split_host_port(spec)
    frozen = MappingProxyType(dict(labels or {}))
    if "-" in ports:
        first_text, _, last_text = ports.partition("-")
        first, last = _port(first_text, spec), _port(last_text, spec)
        if last < first:
            raise TargetError(f"target {spec!r}: range {first}-{last} is empty")
        if last - first + 1 > MAX_RANGE:
            raise TargetError(
                f"target {spec!r}: range of {last - first + 1} ports is over {MAX_RANGE}"
            )
        return [Target(host, port, frozen, optional=True) for port in range(first, last + 1)]
    return [Target(host, _port(ports, spec), frozen)]


def _check_labels(labels: Any, where: str) -> dict[str, str]:
    if labels is None:
        return {}
    if not isinstance(labels, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
    ):
        raise TargetError(f"{where}: labels must be an object of strings, got {labels!r}")
    return dict(labels)


def parse_groups(groups: Any, where: str) -> list[Target]:
    """Parses file_sd groups (a list of ``{"targets": [...], "labels": {...}}``) into targets."""
    if not isinstance(groups, list):
        raise TargetError(f"{where}: expected a list of target groups")
    targets: list[Target] = []
    for number, group in enumerate(groups, 1):
        if not isinstance(group, dict) or not isinstance(group.get("targets"), list):
            raise TargetError(f"{where}: group {number} needs a 'targets' list")
        unknown = set(group) - {"targets", "labels"}
        if unknown:
            raise TargetError(f"{where}: group {number} has unknown keys {sorted(unknown)}")
        labels = _check_labels(group.get("labels"), f"{where}: group {number}")
        for spec in group["targets"]:
            try:
                targets.extend(parse_target_spec(spec, labels))
            except TargetError as exc:
                raise TargetError(f"{where}: group {number}: {exc}") from None
    return targets


def read_discovery_file(path: str) -> list[Target]:
    """Reads one JSON or TOML discovery file into targets."""
    with open(path, "rb") as file:
        raw = file.read()
    try:
        if path.endswith(".toml"):
            groups = tomllib.loads(raw.decode("utf-8")).get("group", [])
        else:
            groups = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise TargetError(
            f"{path}: not valid {'TOML' if path.endswith('.toml') else 'JSON'}: {exc}"
        ) from None
    return parse_groups(groups, path)


class DiscoveryFile:
    """One discovery file, re-read only when its modification time or size changes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self.targets: list[Target] = []

    def refresh(self) -> bool:
        """Re-reads the file if it changed; returns whether the targets changed."""
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            if self._stamp is None:
                return False
            log_event(log, logging.WARNING, "discovery file vanished", path=self.path)
            self._stamp, self.targets = None, []
            return True
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            targets = read_discovery_file(self.path)
        except (TargetError, OSError) as exc:
            # Keep the last good list: a half-written file must not empty the fleet.
            log_event(log, logging.ERROR, "discovery file rejected", path=self.path, error=str(exc))
            return False
        log_event(log, logging.INFO, "discovery file read", path=self.path, targets=len(targets))
        self.targets = targets
        return True


def parse_shard(spec: str) -> tuple[int, int]:
    """Parses ``K/N`` (1-based) into (k, n)."""
    k_text, sep, n_text = str(spec).partition("/")
    if not sep or not k_text.strip().isdigit() or not n_text.strip().isdigit():
        raise TargetError(f"shard {spec!r}: expected K/N, e.g. 2/4")
    k, n = int(k_text), int(n_text)
    if not 1 <= k <= n:
        raise TargetError(f"shard {spec!r}: K must be from 1 to N")
    return k, n


def shard_of(address: str, n: int) -> int:
    """Returns the 1-based shard of an address; stable across processes and Python versions."""
    digest = hashlib.sha256(address.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % n + 1


def in_shard(address: str, shard: tuple[int, int]) -> bool:
    """Whether this collector's shard polls ``address``."""
    k, n = shard
    return n == 1 or shard_of(address, n) == k


class TargetSet:
    """The current targets: static ones plus discovery files, deduplicated and sharded."""

    def __init__(
        self,
        static: Sequence[str] = (),
        *,
        static_labels: Mapping[str, str] | None = None,
        files: Sequence[str] = (),
        shard: tuple[int, int] = (1, 1),
    ) -> None:
        self._static: list[Target] = []
        for spec in static:
            self._static.extend(parse_target_spec(spec, static_labels))
        self._patterns = list(files)
        self._empty: set[str] = set()  # patterns said to match nothing (said once, until they do)
        self._files: dict[str, DiscoveryFile] = {}
        self._shard = shard
        self._lock = threading.Lock()

    def _expand(self) -> list[str]:
        paths: list[str] = []
        for pattern in self._patterns:
            if glob.has_magic(pattern):
                found = sorted(glob.glob(pattern))
                if not found and pattern not in self._empty:
                    log_event(
                        log, logging.WARNING, "target_files: no file matches", pattern=pattern
                    )
                    self._empty.add(pattern)
                elif found:
                    self._empty.discard(pattern)
                paths.extend(found)
            else:
                paths.append(pattern)
        return paths

    def current(self) -> list[Target]:
        """Returns the targets to poll now, re-reading any discovery file that changed."""
        with self._lock:
            paths = self._expand()
            for path in paths:
                if path not in self._files:
                    self._files[path] = DiscoveryFile(path)
                self._files[path].refresh()
            for path in set(self._files) - set(paths):
                del self._files[path]
            return select(self._static, (self._files[p].targets for p in paths), self._shard)


def select(
    static: Iterable[Target], discovered: Iterable[Iterable[Target]], shard: tuple[int, int]
) -> list[Target]:
    """Merges target lists (the first occurrence of an address wins) and keeps this shard's."""
    seen: dict[str, Target] = {}
    for targets in (static, *discovered):
        for target in targets:
            previous = seen.get(target.address)
            # An explicit listing beats a range: the port is then expected to be open.
            if previous is None or (previous.optional and not target.optional):
                seen[target.address] = target
    return [t for t in seen.values() if in_shard(t.address, shard)]
