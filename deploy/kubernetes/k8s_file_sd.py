#!/usr/bin/env python3
"""Writes the collector's discovery file (Prometheus file_sd JSON) from pods the Kubernetes API lists.

A pod opts in with annotations on its template:

    fleetflame.io/scrape: "true"
    fleetflame.io/port: "8021-8036"      # the FLEETFLAME_PORT of its workers: a port or a range
    fleetflame.io/service: "api"         # optional; else the pod's app.kubernetes.io/name or app label

Every running pod with an IP becomes one target group, labelled with its namespace, pod, node,
service and (when the pod has the label app.kubernetes.io/version) version. Runs as a sidecar of
the collector (deploy/kubernetes/collector.yaml), writing into a volume both containers share:

    fleetflame-k8s-sd --output /etc/fleetflame/targets/pods.json --interval 30

In the cluster it uses the pod's service account; outside, point it at ``kubectl proxy``
(``--api-url http://127.0.0.1:8001``). Standard library only. The file is rewritten atomically
and only when the targets change; when the API cannot be reached the last file stays as it is.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import ssl
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

ANNOTATION = "fleetflame.io/"
SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
_PORTS = re.compile(r"^(\d{1,5})(?:-(\d{1,5}))?$")
_TRUE = ("true", "1", "yes", "on")


class DiscoveryError(RuntimeError):
    """The Kubernetes API could not be asked or answered nonsense; the message says which."""


def _port_spec(text: str) -> str | None:
    match = _PORTS.match(text.strip())
    if not match:
        return None
    first = int(match.group(1))
    last = int(match.group(2) or first)
    if not 1 <= first <= last <= 65535 or last - first >= 4096:
        return None
    return f"{first}-{last}" if last != first else str(first)


def targets_from_pods(
    pods: Mapping[str, Any], warn: Callable[[str], None] = lambda _m: None
) -> list[dict[str, Any]]:
    """Turns a Kubernetes PodList into file_sd groups, one per annotated running pod, sorted."""
    groups = []
    for pod in pods.get("items") or []:
        meta = pod.get("metadata") or {}
        notes = meta.get("annotations") or {}
        if str(notes.get(ANNOTATION + "scrape", "")).lower() not in _TRUE:
            continue
        name = f"{meta.get('namespace', '?')}/{meta.get('name', '?')}"
        status = pod.get("status") or {}
        ip = status.get("podIP")
        if status.get("phase") != "Running" or not ip or meta.get("deletionTimestamp"):
            continue  # not serving yet, or going away: the collector would only see refusals
        ports = _port_spec(str(notes.get(ANNOTATION + "port", "8021")))
        if ports is None:
            warn(
                f"pod {name}: annotation {ANNOTATION}port={notes.get(ANNOTATION + 'port')!r} is "
                "not a port or a range like 8021-8036; skipped"
            )
            continue
        pod_labels = meta.get("labels") or {}
        service = (
            notes.get(ANNOTATION + "service")
            or pod_labels.get("app.kubernetes.io/name")
            or pod_labels.get("app")
            or meta.get("name", "unknown")
        )
        labels = {
            "namespace": str(meta.get("namespace", "")),
            "pod": str(meta.get("name", "")),
            "service": str(service),
        }
        node = (pod.get("spec") or {}).get("nodeName")
        if node:
            labels["node"] = str(node)
        if "app.kubernetes.io/version" in pod_labels:
            labels["version"] = str(pod_labels["app.kubernetes.io/version"])
        host = f"[{ip}]" if ":" in ip else ip
        groups.append({"targets": [f"{host}:{ports}"], "labels": labels})
    return sorted(groups, key=lambda g: (g["labels"]["namespace"], g["labels"]["pod"]))


def fetch_pods(
    api_url: str,
    *,
    token: str | None = None,
    ca_file: str | None = None,
    namespace: str | None = None,
    selector: str | None = None,
    timeout: float = 10.0,
) -> dict[str, Any]:
    """Lists pods (of one namespace, or all) from the Kubernetes API."""
    path = (
        f"/api/v1/namespaces/{urllib.parse.quote(namespace)}/pods" if namespace else "/api/v1/pods"
    )
    query = urllib.parse.urlencode({"labelSelector": selector}) if selector else ""
    request = urllib.request.Request(api_url.rstrip("/") + path + (f"?{query}" if query else ""))
    request.add_header("Accept", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    context = ssl.create_default_context(cafile=ca_file) if api_url.startswith("https") else None
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            body = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        hint = " (may the service account list pods? see rbac.yaml)" if exc.code == 403 else ""
        raise DiscoveryError(f"{request.full_url}: HTTP {exc.code}{hint}") from None
    except (OSError, ValueError) as exc:
        raise DiscoveryError(f"{request.full_url}: {exc}") from None
    if not isinstance(body, dict) or body.get("kind") != "PodList":
        raise DiscoveryError(f"{request.full_url}: expected a PodList, got {str(body)[:80]!r}")
    return body


def write_if_changed(path: str, groups: list[dict[str, Any]]) -> bool:
    """Writes the groups as JSON atomically unless the file already holds them; True if written."""
    text = json.dumps(groups, indent=2, sort_keys=True) + "\n"
    try:
        with open(path, encoding="utf-8") as current:
            if current.read() == text:
                return False
    except FileNotFoundError:
        pass
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".pods-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return True


def _in_cluster_defaults(args: argparse.Namespace) -> None:
    if args.api_url is None:
        host, port = (
            os.environ.get("KUBERNETES_SERVICE_HOST"),
            os.environ.get("KUBERNETES_SERVICE_PORT", "443"),
        )
        if not host:
            raise DiscoveryError("not in a cluster (no KUBERNETES_SERVICE_HOST): pass --api-url")
        args.api_url = f"https://{host}:{port}"
        args.token_file = args.token_file or f"{SERVICE_ACCOUNT}/token"
        args.ca_file = args.ca_file or f"{SERVICE_ACCOUNT}/ca.crt"


def _log(message: str) -> None:
    print(f"fleetflame-k8s-sd: {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Writes the discovery file once (--once) or every --interval seconds."""
    parser = argparse.ArgumentParser(prog="fleetflame-k8s-sd", description=__doc__.splitlines()[0])
    parser.add_argument("--output", required=True, help="the discovery file the collector reads")
    parser.add_argument("--interval", type=float, default=30.0, help="seconds between two listings")
    parser.add_argument("--once", action="store_true", help="write once and exit")
    parser.add_argument("--namespace", help="only this namespace (default: all)")
    parser.add_argument("--selector", help="only pods matching this label selector")
    parser.add_argument("--api-url", help="Kubernetes API (default: in-cluster)")
    parser.add_argument("--token-file", help="bearer token file (default: in-cluster)")
    parser.add_argument("--ca-file", help="CA bundle of the API (default: in-cluster)")
    args = parser.parse_args(argv)
    if args.interval < 1:
        parser.error("--interval must be at least 1 second")
    try:
        _in_cluster_defaults(args)
    except DiscoveryError as exc:
        parser.error(str(exc))
    while True:
        try:
            token = Path(args.token_file).read_text().strip() if args.token_file else None
            pods = fetch_pods(
                args.api_url,
                token=token,
                ca_file=args.ca_file,
                namespace=args.namespace,
                selector=args.selector,
            )
            groups = targets_from_pods(pods, warn=_log)
            if write_if_changed(args.output, groups):
                _log(f"wrote {len(groups)} pods to {args.output}")
        except (DiscoveryError, OSError) as exc:
            _log(f"{exc}; keeping the previous {args.output}")
            if args.once:
                return 1
        if args.once:
            return 0
        time.sleep(args.interval)


if __name__ == "__main__":
    sys.exit(main())
