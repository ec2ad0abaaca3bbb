"""Channel target URIs and options, shared by the async and the sync client.

gRPC balances over several servers only when one channel names them all: several
"host:port" targets become one `ipv4:a:p,b:p` (or `ipv6:[a]:p,...`) URI, and every
channel asks for `round_robin`, so a `dns:///name:port` that resolves to several
servers is balanced too. A single target is passed to gRPC as given.
"""

from __future__ import annotations

import ipaddress
import json
import socket
from collections.abc import Sequence
from typing import Any

ROUND_ROBIN = json.dumps({"loadBalancingConfig": [{"round_robin": {}}]})
_DEFAULT_OPTIONS: dict[str, Any] = {
    # gRPC's 4 MiB default receive limit is far below a large batch of tensors; the
    # server enforces its own request limit and answers with a clear error.
    "grpc.max_send_message_length": -1,
    "grpc.max_receive_message_length": -1,
    "grpc.service_config": ROUND_ROBIN,
}


def channel_options(options: Sequence[tuple[str, Any]] | None) -> list[tuple[str, Any]]:
    """The client defaults with the caller's options on top (a caller's key wins)."""
    merged = dict(_DEFAULT_OPTIONS)
    merged.update(options or ())
    return list(merged.items())


def channel_target(target: str | Sequence[str]) -> str:
    """The gRPC target URI for one target, or for several "host:port" servers.

    One target (any form gRPC accepts: "host:port", "dns:///name:port", "unix:path",
    "ipv4:a:p,b:p") is returned as is. Several must each be "host:port" or "[v6]:port";
    host names among them are resolved here, once, because a gRPC URI can list several
    addresses but not several names. All must share one address family (IPv4 preferred).
    """
    if isinstance(target, str):
        return target
    targets = list(target)
    if not targets:
        raise ValueError("no target given")
    if len(targets) == 1:
        return targets[0]
    resolved = [_addresses(t) for t in targets]
    for family, scheme in ((socket.AF_INET, "ipv4"), (socket.AF_INET6, "ipv6")):
        if all(family in r for r in resolved):
            addrs = dict.fromkeys(a for r in resolved for a in r[family])
            return f"{scheme}:" + ",".join(addrs)
    raise ValueError(f"targets {targets} do not share an address family (IPv4 or IPv6)")


def _addresses(target: str) -> dict[socket.AddressFamily, list[str]]:
    """The addresses of one "host:port", by family, as "addr:port" (IPv6 in brackets)."""
    if "/" in target or (target.count(":") != 1 and not target.startswith("[")):
        raise ValueError(f"target {target!r}: with several targets each must be host:port or [ipv6]:port")
    host, sep, port_str = target.rpartition(":")
    if not sep or not port_str.isdigit() or not host:
        raise ValueError(f"target {target!r}: expected host:port")
    port = int(port_str)
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ips = [ipaddress.ip_address(host)]
    except ValueError:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise ValueError(f"target {target!r}: cannot resolve {host!r}: {exc}") from None
        ips = [ipaddress.ip_address(info[4][0]) for info in infos]
    out: dict[socket.AddressFamily, list[str]] = {}
    for ip in dict.fromkeys(ips):
        if ip.version == 4:
            out.setdefault(socket.AF_INET, []).append(f"{ip}:{port}")
        else:
            out.setdefault(socket.AF_INET6, []).append(f"[{ip}]:{port}")
    return out
