"""Why a listening port cannot be had, in words, found before the server loads its models.

The server takes its ports only once the models are warm (a gRPC server bound but not started
completes clients' connections and leaves their calls hanging, where a closed port refuses them).
`bind_error` binds a plain socket with the options the real bind uses, then lets it go: a port in
use, an address not on this machine or a port the process may not take fails the start at once,
not after minutes of loading, and gRPC's own refusal names no cause at all.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
from pathlib import Path

from .config import ServerSettings, host_port

_UNPRIVILEGED_PORT_START = Path("/proc/sys/net/ipv4/ip_unprivileged_port_start")


def _wildcard(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


def _candidates(host: str, port: int) -> list[tuple[int, tuple]]:
    """(family, socket address) for each address gRPC would listen on for `host`; raises socket.gaierror.

    A wildcard (0.0.0.0 or ::) is every address of both families to gRPC (a dual-stack [::] socket,
    or 0.0.0.0 where there is none); a name, each address it resolves to."""
    if _wildcard(host):
        return [(socket.AF_INET6, ("::", port)), (socket.AF_INET, ("0.0.0.0", port))]
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    return [(family, sockaddr) for family, _, _, _, sockaddr in infos]


def bind_error(host: str, port: int) -> OSError | None:
    """The error a listener on `host:port` would meet, or None if a socket binds there now.

    With the options of the real binds (SO_REUSEADDR on, as gRPC and asyncio set it, so that a port
    in TIME_WAIT after a restart is not refused; SO_REUSEPORT off, as wok sets gRPC's). As gRPC takes
    it, one address of a name or a wildcard that binds is enough: this check never refuses an
    address the real bind would take. Blocks while a name resolves."""
    try:
        candidates = _candidates(host, port)
    except OSError as exc:  # socket.gaierror: the name does not resolve
        return exc
    first: OSError | None = None
    for family, sockaddr in candidates:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6 and _wildcard(sockaddr[0]):
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
                sock.bind(sockaddr)
            return None
        except OSError as exc:
            first = first or exc
    return first


def _unprivileged_port_start() -> int:
    try:
        return int(_UNPRIVILEGED_PORT_START.read_text())
    except (OSError, ValueError):
        return 1024


def bind_cause(exc: OSError, host: str, port: int) -> str:
    """What `exc`, met binding `host:port`, means to an operator: its cause, and the errno's name."""
    code = exc.errno if isinstance(exc.errno, int) and exc.errno > 0 else None
    if code is None:
        # A name that does not resolve is a gaierror, whose negative errno strerror cannot name.
        return f"{host} does not resolve ({(exc.strerror or str(exc)).lower()})"
    name = errno.errorcode.get(code, str(code))
    if code == errno.EADDRINUSE:
        return f"the port is in use by another socket ({name}; `ss -ltnp 'sport = :{port}'` names its process)"
    if code == errno.EADDRNOTAVAIL:
        return f"{host} is not one of this machine's addresses ({name})"
    if code == errno.EACCES:
        start = _unprivileged_port_start()
        if 0 < port < start:
            return f"permission denied ({name}): a port below {start} needs root or CAP_NET_BIND_SERVICE"
        return f"permission denied ({name})"
    return f"{os.strerror(code).lower()} ({name})"


def bind_refusal(what: str, host: str, port: int, exc: OSError) -> str:
    """`cannot bind the <what> to <host:port>: <cause>`, the message of a start that failed there."""
    return f"cannot bind the {what} to {host_port(host, port)}: {bind_cause(exc, host, port)}"


def check_ports(settings: ServerSettings) -> None:
    """OSError naming the port, its address and the cause, for the first port of `settings` (gRPC, the
    health port, the metrics port) that cannot be had now."""
    ports = [("gRPC port", settings.host, settings.grpc_port)]
    if settings.health_port is not None:
        ports.append(("health port", settings.health_bind_host, settings.health_port))
    if settings.metrics_port is not None:
        ports.append(("metrics port", settings.metrics_host, settings.metrics_port))
    for what, host, port in ports:
        exc = bind_error(host, port)
        if exc is not None:
            raise OSError(bind_refusal(what, host, port, exc)) from exc
