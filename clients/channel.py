"""Channel target URIs, options and security, shared by the async and the sync client.

gRPC balances over several servers only when one channel names them all: several
"host:port" targets become one `ipv4:a:p,b:p` (or `ipv6:[a]:p,...`) URI, and every
channel asks for `round_robin`, so a `dns:///name:port` that resolves to several
servers is balanced too. A single target is passed to gRPC as given.

Security: `TLS` makes the channel a TLS one (with the caller's root certificates, or
gRPC's bundled roots) and, with a certificate and key, presents them for mTLS; a token is
sent as the call metadata `authorization: Bearer <token>` on every call (over plaintext
too, where it can be read on the way: use it with TLS beyond loopback).
"""

from __future__ import annotations

import ipaddress
import json
import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

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


@dataclass(frozen=True, repr=False)
class TLS:
    """TLS settings of a channel, as PEM bytes (`TLS.from_files` reads them from files).

    `root_certificates`: the CA(s) the server's certificate must chain to; None trusts
    gRPC's bundled roots. `certificate_chain` and `private_key`, both or neither: the
    client's own certificate, for servers that require one (mTLS). To reach a server by an
    address its certificate does not name, add the channel option
    `("grpc.ssl_target_name_override", "name-in-the-certificate")`.
    """

    root_certificates: bytes | None = None
    certificate_chain: bytes | None = None
    private_key: bytes | None = None

    def __post_init__(self) -> None:
        if (self.certificate_chain is None) != (self.private_key is None):
            raise ValueError("a client certificate needs its private key, and a key its certificate: give both")

    def __repr__(self) -> str:  # never the key
        return (
            f"TLS(root_certificates={'custom' if self.root_certificates else 'default'}, "
            f"client_certificate={self.certificate_chain is not None})"
        )

    @classmethod
    def from_files(
        cls,
        root_certificates: str | Path | None = None,
        certificate_chain: str | Path | None = None,
        private_key: str | Path | None = None,
    ) -> TLS:
        """TLS from PEM files; ValueError naming a file that cannot be read."""
        return cls(*(None if p is None else _read(p) for p in (root_certificates, certificate_chain, private_key)))

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(self.root_certificates, self.private_key, self.certificate_chain)


def _read(path: str | Path) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None


def channel_credentials(tls: TLS | bool | None) -> grpc.ChannelCredentials | None:
    """The credentials for `tls`: None (or False) is plaintext, True is TLS with gRPC's bundled roots."""
    if tls is None or tls is False:
        return None
    if tls is True:
        tls = TLS()
    if not isinstance(tls, TLS):
        raise TypeError(f"tls must be a TLS, True, False or None; got {type(tls).__name__}")
    return tls.credentials()


def open_channel(grpc_module, target: str, credentials: grpc.ChannelCredentials | None, options):
    """A channel of `grpc_module` (grpc, or grpc.aio): TLS when there are credentials, else plaintext."""
    if credentials is None:
        return grpc_module.insecure_channel(target, options=options)
    return grpc_module.secure_channel(target, credentials, options=options)


def tls_mode(tls: TLS | bool | None) -> str:
    """ "none", "tls" or "mtls" (a client certificate is presented): for reports, never the keys."""
    if tls is None or tls is False:
        return "none"
    return "mtls" if isinstance(tls, TLS) and tls.certificate_chain is not None else "tls"


_TOKEN = re.compile(r"[\x21-\x7e]+")  # visible ASCII: what a header value may hold unescaped


def auth_metadata(token: str | None) -> tuple[tuple[str, str], ...] | None:
    """The call metadata that carries `token` as a bearer token; None without a token."""
    if token is None:
        return None
    if not isinstance(token, str) or not _TOKEN.fullmatch(token):
        # The token itself is never part of the message.
        raise ValueError("the token must be a non-empty string of visible ASCII characters, without spaces")
    return (("authorization", f"Bearer {token}"),)
