"""Channel target URIs, options and security, shared by the async and the sync client.

gRPC balances over several servers only when one channel names them all: several
"host:port" targets become one `ipv4:a:p,b:p` (or `ipv6:[a]:p,...`) URI, and every
channel asks for `round_robin`, so a `dns:///name:port` that resolves to several
servers is balanced too. Such a URI lists addresses of one family: a name that resolves to
both (`localhost`: 127.0.0.1 and ::1) gives those its server accepts TCP connections on, probed
(`probe`), as gRPC itself reaches one name over either family (when neither accepts, a family
that got no answer in time wins over one that refused: a busy server's full backlog drops
connections, a refusal means nothing listens); targets that need both
families cannot share a channel (ValueError naming them). A single target is passed to gRPC
as given; a list in one string, "a:p,b:p", is several targets. With TLS, a channel over
several targets checks every server's certificate against the first target's host
(`channel_authority`): gRPC gives one channel one authority, so each server's certificate
must name that host (or pass `grpc.ssl_target_name_override`); wok's own balancer checks
each server by its own name.

Health checking: the service config asks gRPC to watch each server's `grpc.health.v1`
status of the service "" (`healthCheckConfig`), so a server that turns NOT_SERVING (wok
does as it starts to drain) or is gone stops getting new calls; a server without the
health service counts as healthy. The watch runs in gRPC's core: nothing to import.

Retries (on by default, `retries=False` turns them off): a call of the inference service
that ends with UNAVAILABLE (the server went away, refused the connection, or is stopping)
is sent again, up to 5 attempts in all, after a random backoff of up to 50 ms, 100 ms,
200 ms, 400 ms; round_robin picks the server of each attempt anew. No other status is
retried: INVALID_ARGUMENT, NOT_FOUND, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED and INTERNAL
are the server's answer. A call is retried only until the server's response headers
arrive, so an answer is never duplicated; inference is idempotent anyway. The retry
budget (`retryThrottling`): each failed attempt takes a token, each success gives 0.1
back, out of 100; below 50 no call is retried, so a dead fleet costs at most about one
extra attempt per ten calls instead of five attempts per call.

A ModelStreamInfer stream is retried too, as a whole: gRPC replays the requests written so far
(up to its 256 KiB retry buffer) on a new attempt, and holds the stream's writes meanwhile.
That is safe for wok's own clients: it happens only before the response headers, which wok's
server sends with a stream's first answer, so no answer is ever repeated (requests the server
had read may run twice; inference has no side effect), and `stream_infer` writes from a task of
its own, so a held write holds nothing else. `stream_retries=False` leaves streams out (their
method's own config, without a retryPolicy, wins over the service's): the bench's stream
sender does, because it sends open loop with each request's deadline as its relative `timeout`
parameter, which a replay would restart, so a retry would hand the server, late and at once,
requests the sender had already counted DEADLINE_EXCEEDED; it replaces a failed stream itself.

Keepalive: with calls in flight, the channel pings a connection after 10 s without a ping
and closes it when a ping's ack does not come within 5 s, so the calls on a server that
hangs (SIGSTOP, a dead node, a silently dropped connection) fail with UNAVAILABLE, and are
retried, instead of waiting for their deadline. How soon depends on the connection's
traffic as the server hung: gRPC also pings as answers arrive (to size its flow-control
window), so on a connection that was carrying calls a ping is out already and they fail
about 5 s after the hang (measured 5.1-5.3 s); on one that was quiet they wait for
keepalive's ping: up to 10 + 5 s (measured 12 s after 3 s of quiet). With a single
target the retries then wait for a new connection to the same server, which a stopped one
never completes: up to 5 s more (11.6 s in all after a call, measured). wok's server accepts pings every 5 s;
others may answer pings more often than their policy allows with GOAWAY (too_many_pings):
raise `grpc.keepalive_time_ms` for them. Reconnection to a server that went away backs off
from 1 s to at most 5 s, so a restarted server gets traffic again within about 5 s.

A server that hangs with its connections open still gets its share of the calls until
an unanswered ping closes the connection (above), and a slow or failing (INTERNAL) server stays in the
rotation: round robin cannot tell. `wok.clients.balancer` (`AsyncClient(...,
balancer="wok")`, the bench's default for several targets) hedges and ejects such servers
on top of per-replica channels made with these same options.

Security: `TLS` makes the channel a TLS one (with the caller's root certificates, or
gRPC's bundled roots) and, with a certificate and key, presents them for mTLS; a token is
sent as the call metadata `authorization: Bearer <token>` on every call (over plaintext
too, where it can be read on the way: use it with TLS beyond loopback).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import copy
import enum
import errno
import gc
import ipaddress
import json
import os
import re
import selectors
import socket
import ssl
import tempfile
import threading
import time
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from wok.errors import quoted_name, shown_value
from wok.numerals import ascii_digits

ROUND_ROBIN = json.dumps({"loadBalancingConfig": [{"round_robin": {}}]})
INFERENCE_SERVICE = "inference.GRPCInferenceService"
STREAM_METHOD = "ModelStreamInfer"
RETRY_POLICY: dict[str, Any] = {
    "maxAttempts": 5,  # gRPC's own ceiling
    "initialBackoff": "0.05s",
    "maxBackoff": "1s",
    "backoffMultiplier": 2,
    "retryableStatusCodes": ["UNAVAILABLE"],
}
RETRY_THROTTLING: dict[str, Any] = {"maxTokens": 100, "tokenRatio": 0.1}
KEEPALIVE_OPTIONS: dict[str, Any] = {
    "grpc.keepalive_time_ms": 10_000,
    "grpc.keepalive_timeout_ms": 5_000,
    # Since gRPC core 1.60 (grpc/grpc#34647) an unanswered ping, keepalive's among them, closes
    # the connection after this, not after keepalive_timeout_ms (default 60 s): a call held by
    # a stopped server waited out its whole deadline.
    "grpc.http2.ping_timeout_ms": 5_000,
    "grpc.keepalive_permit_without_calls": 0,
    "grpc.http2.max_pings_without_data": 0,
    "grpc.initial_reconnect_backoff_ms": 1_000,
    "grpc.max_reconnect_backoff_ms": 5_000,
    # Also the longest a connection attempt may take (default 20 s): a retry sent to a stopped
    # server, which accepts the TCP connection but never sends its HTTP/2 settings, fails then.
    "grpc.min_reconnect_backoff_ms": 5_000,
}
_DEFAULT_OPTIONS: dict[str, Any] = {
    # gRPC's 4 MiB default receive limit is far below a large batch of tensors; the
    # server enforces its own request limit and answers with a clear error.
    "grpc.max_send_message_length": -1,
    "grpc.max_receive_message_length": -1,
    **KEEPALIVE_OPTIONS,
}
_SCHEMES = ("dns:", "ipv4:", "ipv6:", "unix:", "unix-abstract:", "vsock:", "xds:", "google-c2p:")


def service_config(*, retries: bool = True, health_check: bool = True, stream_retries: bool = True) -> str:
    """The channel's service config: round_robin, and health checking and retries unless turned off;
    with `stream_retries=False` ModelStreamInfer streams are not retried, other calls still are."""
    config: dict[str, Any] = {"loadBalancingConfig": [{"round_robin": {}}]}
    if health_check:
        config["healthCheckConfig"] = {"serviceName": ""}
    if retries:
        config["methodConfig"] = [{"name": [{"service": INFERENCE_SERVICE}], "retryPolicy": RETRY_POLICY}]
        if not stream_retries:
            config["methodConfig"].append({"name": [{"service": INFERENCE_SERVICE, "method": STREAM_METHOD}]})
        config["retryThrottling"] = RETRY_THROTTLING
    return json.dumps(config)


def channel_options(
    options: Sequence[tuple[str, Any]] | None,
    *,
    retries: bool = True,
    health_check: bool = True,
    stream_retries: bool = True,
) -> list[tuple[str, Any]]:
    """The client defaults with the caller's options on top (a caller's key wins).

    `retries`, `health_check` and `stream_retries` shape the service config (`service_config`).
    Without retries gRPC still resends, transparently, a call that never reached any server.
    """
    merged = dict(_DEFAULT_OPTIONS)
    merged["grpc.service_config"] = service_config(
        retries=retries, health_check=health_check, stream_retries=stream_retries
    )
    merged.update(options or ())
    return list(merged.items())


TARGET_EXPECTED = "expected host:port, a gRPC target URI or a list of them"


def channel_target(target: str | Sequence[str]) -> str:
    """The gRPC target URI for one target, or for several "host:port" servers.

    One target (any form gRPC accepts: "host:port", "dns:///name:port", "unix:path",
    "ipv4:a:p,b:p") is returned as is; a string "a:p,b:p" without a scheme is a list of
    several. Several must each be "host:port" or "[v6]:port";
    host names among them are resolved here, once, because a gRPC URI can list several
    addresses but not several names, and of one address family only. A name with addresses of
    both families gets those of the family its server answers on best (probed, `probe`): the one
    that accepts TCP connections, else the one that did not answer in time over one that refused
    (a refusal is certain, a timeout may be a server too busy to accept); one that does as well
    on both (a dual-stack server: one server, listed once; or one not up yet) gets the other
    targets' family, IPv4 if they leave it open. ValueError when the targets need both
    families. This blocks for the lookups and up to PROBE_TIMEOUT_S for the probe
    (`looks_up` tells whether it does either).
    """
    targets = target_list(target)
    if not targets or (len(targets) == 1 and isinstance(targets[0], str) and not targets[0].strip()):
        # An empty target made a channel that failed only at the first call, UNKNOWN "the target uri is not valid".
        if isinstance(target, str):
            got = quoted_name(target)
        else:
            got = f"[{quoted_name(targets[0])}]" if targets else f"an empty {type(target).__name__}"
        raise ValueError(f"target: {TARGET_EXPECTED}; got {got}")
    if len(targets) == 1:
        return targets[0]
    resolved = [_addresses(t) for t in targets]
    both = [a for r in resolved if len(r) > 1 for addrs in r.values() for a in addrs]
    outcomes = probe(both, PROBE_TIMEOUT_S) if both else {}
    needs: dict[socket.AddressFamily, tuple[str, str]] = {}  # family: (the first target needing it, why)
    for t, r in zip(targets, resolved):
        if len(r) == 1:
            needs.setdefault(next(iter(r)), (t, "its only family"))
            continue
        families = preferred_families([a for addrs in r.values() for a in addrs], outcomes)
        if len(families) == 1:  # else either will do: a dual-stack server, or one not up yet
            family = families.pop()
            if any(outcomes.get(a) is Probe.ACCEPTED for a in r[family]):
                why = "the one family its server accepts connections on"
            else:
                why = f"connections there got no answer within {PROBE_TIMEOUT_S} s, the other family's were refused"
            needs.setdefault(family, (t, why))
    if len(needs) > 1:
        (t4, why4), (t6, why6) = needs[socket.AF_INET], needs[socket.AF_INET6]
        raise ValueError(
            f"targets {quoted_name(t4)} (IPv4: {why4}) and {quoted_name(t6)} (IPv6: {why6}) need different address "
            "families, and one gRPC channel lists addresses of one family; give targets of one family, or use the "
            "wok balancer (AsyncClient(..., balancer='wok'), wok bench --balancer wok): it opens a channel per address"
        )
    family = next(iter(needs), socket.AF_INET)
    scheme = "ipv4" if family == socket.AF_INET else "ipv6"
    return f"{scheme}:" + ",".join(dict.fromkeys(a for r in resolved for a in r[family]))


def channel_authority(target: str | Sequence[str]) -> str | None:
    """The authority a TLS channel over several targets checks certificates against: the first
    target as given ("host:port"); None for one target, whose URI gRPC derives it from.

    Without it gRPC takes the authority of a merged `ipv4:a:p,b:p` URI from its whole path,
    which no certificate names, and every handshake fails hostname verification.
    """
    targets = target_list(target)
    return targets[0] if len(targets) > 1 else None


def target_list(target: str | Sequence[str]) -> list[str]:
    """The targets `target` names: a string "a:p,b:p" without a scheme, or a list, is several; any
    other string (one "host:port", a URI such as "dns:///name:port" or "ipv4:a:p,b:p") is one."""
    if isinstance(target, str):
        if "," not in target or target.startswith(_SCHEMES):
            return [target]
        return [t.strip() for t in target.split(",")]
    if not is_target_list(target):
        raise TypeError(f"target: {TARGET_EXPECTED}; got {shown_value(target)}")
    return list(target)


def is_target_list(target: object) -> bool:
    """Whether `target`, not a string, may be a list of targets. None was list()'s "'NoneType' object is not
    iterable"; bytes, iterable, a list of integers ("argument of type 'int' is not iterable", or with the wok balancer
    "target '49': ... needs host:port")."""
    return isinstance(target, Iterable) and not isinstance(target, (bytes, bytearray, memoryview))


def split_host_port(text: str) -> tuple[str, int] | None:
    """(host, port) of "host:port" or "[ipv6]:port" (brackets removed); None if it is neither."""
    host, sep, port = text.rpartition(":")
    if not sep or not ascii_digits(port) or not host:
        return None
    return (host[1:-1] if host.startswith("[") and host.endswith("]") else host), int(port)


def looks_up(target: str | Sequence[str]) -> bool:
    """Whether `channel_target(target)` resolves names (and so may probe, `probe`): several
    targets of which one names a host, not an IP address. Raises channel_target's ValueError for
    a malformed list; does no I/O."""
    return bool(names_looked_up(target))


def names_looked_up(target: str | Sequence[str]) -> list[str]:
    """The host names (not IP addresses) `channel_target(target)` resolves, each once, in the targets'
    order: none for one target, which gRPC resolves itself. Raises channel_target's ValueError for a
    malformed list; does no I/O."""
    targets = target_list(target)
    if len(targets) < 2:
        return []
    return list(dict.fromkeys(host for host, _ in map(_host_port, targets) if not _is_ip(host)))


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _host_port(target: str) -> tuple[str, int]:
    """(host, port) of one of several targets: "host:port" or "[v6]:port"."""
    if "/" in target or (target.count(":") != 1 and not target.startswith("[")):
        raise ValueError(f"target: expected host:port or [ipv6]:port, as each of several is; got {quoted_name(target)}")
    parsed = split_host_port(target)
    if parsed is None:
        raise ValueError(f"target: expected host:port; got {quoted_name(target)}")
    return parsed


def _addresses(target: str) -> dict[socket.AddressFamily, list[str]]:
    """The addresses of one "host:port", by family, as "addr:port" (IPv6 in brackets)."""
    host, port = _host_port(target)
    try:
        ips = [ipaddress.ip_address(host)]
    except ValueError:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise ValueError(f"target {quoted_name(target)}: cannot resolve {quoted_name(host)}: {exc}") from None
        ips = [ipaddress.ip_address(info[4][0]) for info in infos]
    out: dict[socket.AddressFamily, list[str]] = {}
    for ip in dict.fromkeys(ips):
        if ip.version == 4:
            out.setdefault(socket.AF_INET, []).append(f"{ip}:{port}")
        else:
            out.setdefault(socket.AF_INET6, []).append(f"[{ip}]:{port}")
    return out


PROBE_TIMEOUT_S = 0.25  # a loopback or LAN connect takes well under a millisecond


def family_of(address: str) -> socket.AddressFamily:
    """AF_INET6 for "[v6]:port", else AF_INET."""
    return socket.AF_INET6 if address.startswith("[") else socket.AF_INET


class Probe(enum.Enum):
    """How an address answered a probe's TCP connect (`probe`)."""

    ACCEPTED = 2
    TIMED_OUT = 1  # no answer in time: a server too busy to accept (its queue full), or a host that drops it
    REFUSED = 0  # refused, unreachable, or a family this host lacks: certain, and known at once


def accepted_families(addresses: Sequence[str], accepted: Collection[str]) -> set[socket.AddressFamily]:
    """The families of those of one name's `addresses` ("ip:port", "[v6]:port") that are among
    `accepted` (those that took a probe's TCP connection): both for a dual-stack server, none for
    one not up yet."""
    return {family_of(a) for a in addresses if a in accepted}


def preferred_families(addresses: Sequence[str], outcomes: Mapping[str, Probe]) -> set[socket.AddressFamily]:
    """The families of one name's `addresses` whose best probe outcome (`probe`) is the best of
    them all: accepted over timed out over refused (an address missing from `outcomes` counts as
    refused). Both when they tie: a dual-stack server, or one not up yet."""
    best: dict[socket.AddressFamily, int] = {}
    for a in addresses:
        rank = outcomes.get(a, Probe.REFUSED).value
        best[family_of(a)] = max(best.get(family_of(a), rank), rank)
    top = max(best.values(), default=0)
    return {family for family, rank in best.items() if rank == top}


def accepting(addresses: Sequence[str], timeout: float = PROBE_TIMEOUT_S) -> set[str]:
    """Those of `addresses` ("ip:port", "[v6]:port") that accept a TCP connection within `timeout`
    seconds (`probe`)."""
    return {a for a, outcome in probe(addresses, timeout).items() if outcome is Probe.ACCEPTED}


def probe(addresses: Sequence[str], timeout: float = PROBE_TIMEOUT_S) -> dict[str, Probe]:
    """How each of `addresses` ("ip:port", "[v6]:port") answers a TCP connect within `timeout`
    seconds, all tried at once; the connections are closed at once, nothing is sent on them.
    Blocks up to `timeout`: run it on a thread from async code. A family this host lacks (IPv6
    turned off) is REFUSED, as is an address it has no route to; OSError naming the address when no
    socket can be made or connected for want of file descriptors, memory (EMFILE, ENFILE, ENOBUFS,
    ENOMEM) or a local port (EADDRNOTAVAIL with a route there): this host's shortage, no answer of
    the address."""
    outcomes = {address: Probe.TIMED_OUT for address in addresses}
    selector = selectors.DefaultSelector()
    try:
        for address in outcomes:
            parsed = split_host_port(address)
            if parsed is None:
                raise ValueError(f"address {quoted_name(address)}: expected ip:port or [ipv6]:port")
            try:
                sock = socket.socket(family_of(address), socket.SOCK_STREAM)
            except OSError as exc:
                if exc.errno in _SHORTAGES:
                    # Counted as REFUSED, a moment's shortage of descriptors chose a name's family (the
                    # other one, or IPv4 for a tie) for as long as the balancer kept its replicas.
                    raise OSError(
                        exc.errno, f"address {quoted_name(address)}: no socket to probe it with: {exc.strerror}"
                    ) from exc
                outcomes[address] = Probe.REFUSED  # no such family on this host (IPv6 turned off)
                continue
            try:
                sock.setblocking(False)
                err = sock.connect_ex(parsed)
                if err in _IN_PROGRESS:
                    selector.register(sock, selectors.EVENT_WRITE, (address, parsed))
                    sock = None
                    continue
                outcomes[address] = _answer(address, parsed, err)
            finally:
                if sock is not None:
                    sock.close()
        deadline = time.monotonic() + timeout
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for key, _ in selector.select(left):
                sock = key.fileobj
                selector.unregister(sock)
                with sock:
                    err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if err != errno.ETIMEDOUT:
                        outcomes[key.data[0]] = _answer(*key.data, err)
    finally:
        for key in list(selector.get_map().values()):
            key.fileobj.close()
        selector.close()
    return outcomes


def _answer(address: str, parsed: tuple[str, int], err: int) -> Probe:
    """What connect()'s error `err` (0: none) says of `address`: ACCEPTED, or REFUSED (refused, no route
    there: ENETUNREACH, EHOSTUNREACH; a family this host cannot use: EAFNOSUPPORT, or EADDRNOTAVAIL without
    a source address); OSError naming the address for this host's shortage, which says nothing of it."""
    if err == 0:
        return Probe.ACCEPTED
    if err in _SHORTAGES:
        # Counted as REFUSED, a moment's want of kernel memory chose a name's family as socket()'s shortage did.
        raise OSError(err, f"address {quoted_name(address)}: no memory to probe it with: {os.strerror(err)}")
    if err == errno.EADDRNOTAVAIL and _out_of_ports(address, parsed):
        raise OSError(err, f"address {quoted_name(address)}: no local port left to probe it from: {os.strerror(err)}")
    return Probe.REFUSED


def _out_of_ports(address: str, parsed: tuple[str, int]) -> bool:
    """Whether a TCP connect's EADDRNOTAVAIL to `address` was for want of a local port rather than of a
    source address of its family: the kernel says the same of both, and the second is a family this host
    cannot use (IPv6 turned off by sysctl, as in Docker's default containers: connect to ::1 fails so).
    A UDP connect tells them apart: it picks the source address as TCP's does, but takes no TCP port and
    sends nothing."""
    try:
        with socket.socket(family_of(address), socket.SOCK_DGRAM) as udp:
            udp.connect(parsed)
    except OSError as exc:
        # EAGAIN: no UDP port left either; EMFILE and the like: no socket. A shortage all the same.
        return exc.errno == errno.EAGAIN or exc.errno in _SHORTAGES
    return True


# socket()'s and connect()'s errors that tell of this process's or host's resources, not of the address.
_SHORTAGES = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
# EAGAIN is EWOULDBLOCK on Linux and macOS, a connect in progress where a system says so (asyncio reads it so
# too); Linux's TCP tells a want of local ports by EADDRNOTAVAIL (`_out_of_ports`), never by EAGAIN.
_IN_PROGRESS = {errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EAGAIN, getattr(errno, "WSAEWOULDBLOCK", -1)}


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
        if self.certificate_chain is not None:
            with _pem_files(self.certificate_chain, self.private_key) as (cert, key):
                _check_pair(cert, key, "certificate_chain (PEM bytes)", "private_key (PEM bytes)")

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
        """TLS from PEM files; ValueError naming a file that cannot be read, or a certificate and a
        key that are not a pair."""
        pems = [None if p is None else _read(p) for p in (root_certificates, certificate_chain, private_key)]
        try:
            return cls(*pems)  # checks the pair
        except ValueError:
            if certificate_chain is not None and private_key is not None:
                _check_pair(certificate_chain, private_key)  # again on the files, for a message naming them
            raise

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(self.root_certificates, self.private_key, self.certificate_chain)


def _read(path: str | Path) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None


class _EncryptedKey(Exception):
    pass


def _refuse_password() -> bytes:
    raise _EncryptedKey


@contextlib.contextmanager
def _pem_files(*pems: bytes) -> Iterator[list[str]]:
    """Paths that read as `pems`, for OpenSSL, which loads a key only from a file: memory-backed
    files where the system has them (Linux), so a key given as bytes never reaches a disk, else
    files in a temporary folder only the user can read."""
    if hasattr(os, "memfd_create"):
        fds = []
        try:
            for pem in pems:
                fds.append(os.memfd_create("wok-pem", os.MFD_CLOEXEC))
                os.write(fds[-1], pem)
            yield [f"/proc/self/fd/{fd}" for fd in fds]
        finally:
            for fd in fds:
                os.close(fd)
        return
    with tempfile.TemporaryDirectory(prefix="wok-pem-") as folder:  # mode 0700
        paths = []
        for i, pem in enumerate(pems):
            paths.append(os.path.join(folder, str(i)))
            fd = os.open(paths[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(pem)
        yield paths


def _check_pair(cert: str | Path, key: str | Path, cert_name: str | None = None, key_name: str | None = None) -> None:
    """ValueError unless `key` is the unencrypted PEM key of the PEM certificate in `cert`; the
    message calls them `cert_name` and `key_name` (default: the paths).

    gRPC finds out only at the first handshake, and then says no more than "Failed to create
    security handshaker" (UNAVAILABLE); OpenSSL, as wok's server does at its start, names it.
    """
    cert_path, key_path = cert, key
    cert, key = cert_name or cert, key_name or key
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(
            str(cert_path), str(key_path), password=_refuse_password
        )
    except _EncryptedKey:
        raise ValueError(f"private key {key} is encrypted; gRPC needs an unencrypted PEM key") from None
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc):
            raise ValueError(
                f"private key {key} is not the key of the certificate in {cert}: give the key the certificate was "
                "made for"
            ) from None
        raise ValueError(
            f"certificate {cert} and private key {key}: expected a PEM certificate and its PEM private key; "
            f"OpenSSL cannot load them ({exc.reason or exc})"
        ) from None


def channel_credentials(tls: TLS | bool | None) -> grpc.ChannelCredentials | None:
    """The credentials for `tls`: None (or False) is plaintext, True is TLS with gRPC's bundled roots."""
    if tls is None or tls is False:
        return None
    if tls is True:
        tls = TLS()
    if not isinstance(tls, TLS):
        raise TypeError(f"tls: expected a TLS, True, False or None; got {type(tls).__name__}")
    return tls.credentials()


WATCH_END_S = 0.05  # a watch sees its channel closed within this, unless a call holds the channel


async def close_ending_watches(channels: Iterable[grpc.aio.Channel], watches: Iterable[asyncio.Future]) -> None:
    """Close grpc.aio channels, then see their pending connectivity watches (tasks awaiting
    `wait_for_state_change`) end with them. A watch cancelled instead stays in gRPC's core, and
    its completion, handed over after this loop closed, makes gRPC's poller log "Exception in
    callback PollerCompletionQueue._handle_events ... Event loop is closed" on whatever loop
    runs gRPC next. A call in a reference cycle (an error's traceback holds its frames) keeps
    its channel, and so the watches, open in the core until the collector frees it: that is run
    once when a watch is slow to end. A watch still pending then (a call still referenced) is
    cancelled: waiting longer would not let the call go."""
    for channel in channels:
        await channel.close()
    watches = list(watches)
    pending = [w for w in watches if not w.done()]
    if pending:
        _, pending = await asyncio.wait(pending, timeout=WATCH_END_S)
    if pending:
        gc.collect()
        _, pending = await asyncio.wait(pending, timeout=WATCH_END_S)
    for w in pending:
        w.cancel()
    await asyncio.gather(*watches, return_exceptions=True)  # their errors (the channel closed) are read


def retrieved(future: asyncio.Future) -> None:
    """Read a done future's outcome (a done callback, or once it is known done), so that asyncio never
    logs its exception as never retrieved."""
    if not future.cancelled():
        future.exception()


def on_thread(name: str, fn, *args, **kwargs) -> concurrent.futures.Future:
    """`fn(*args, **kwargs)` on a daemon thread of its own named `name`, as a future any loop can await
    (`asyncio.wrap_future`): for a blocking name lookup, which nothing can stop.

    Not the loop's default executor: its future would belong to the loop that made it, and a lookup that
    hangs (a DNS server that never answers: resolv.conf's timeout × attempts, 30 s by default) kept one of
    its threads, which asyncio.run's end (shutdown_default_executor) and the interpreter's exit both wait
    for, long after the client was closed. Awaited through `loop_future`, a cancel ends the wait at once and
    the thread's late result is dropped, quietly on a closed loop too."""
    future: concurrent.futures.Future = concurrent.futures.Future()
    # Running from the start: a first call cancelled before the thread ran would otherwise cancel
    # it through asyncio.wrap_future, and every later call would raise CancelledError.
    future.set_running_or_notify_cancel()

    def run() -> None:
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # the awaiting caller's to get
            future.set_exception(exc)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future


def shown_names(names: Sequence[str]) -> str:
    """Host names as a first call's timeout names what it waited for: 'a', 'b'."""
    return ", ".join(map(quoted_name, names))


def looked_up_target(lookup: concurrent.futures.Future | None, target: str | None, given):
    """A client's `target`: `target` where no lookup runs (or it has been taken), the targets as `given` while it
    runs, then its result (or error, `lookup_result`). It never waits: result() of a pending future blocks."""
    if lookup is None:
        return target
    return lookup_result(lookup) if lookup.done() else given


def lookup_result(lookup: concurrent.futures.Future):
    """A done lookup's result, or a copy of its error: Future.result() raises the one stored error each time, and
    each raise added its frames, and their locals (a call's arrays), to that error's traceback, kept as long as
    the client."""
    error = lookup.exception()
    if error is None:
        return lookup.result()
    try:
        fresh = copy.copy(error)  # its type, args and attributes; no traceback, no chain
    except Exception:  # an error that cannot be copied: this raise's frames kept, until the next
        fresh = error.with_traceback(None)
    raise fresh from None


def loop_future(future: concurrent.futures.Future) -> asyncio.Future:
    """`future` (an `on_thread` one) as a future of the running loop, as `asyncio.wrap_future` makes it, whose
    outcome, coming once the loop has closed, is dropped quietly: whoever awaited it went with the loop.

    Not wrap_future: its hand-over checks that the loop is open, then calls its call_soon_threadsafe from the
    thread that ended `future`; a loop closed between the two (asyncio.run ending as a lookup's answer came)
    raised there, and concurrent.futures logged "exception calling callback for <Future ...>" with the loop's
    RuntimeError. Cancelling the loop's future does not cancel `future` (wrap_future tries to: an `on_thread`
    future runs from the start and cannot be)."""
    loop = asyncio.get_running_loop()
    waiter = loop.create_future()

    def settle(done: concurrent.futures.Future) -> None:  # on the loop
        if waiter.done():  # its waiter cancelled (a call's timeout, close())
            return
        if done.cancelled():
            waiter.cancel()
        elif done.exception() is not None:
            waiter.set_exception(done.exception())
        else:
            waiter.set_result(done.result())

    def hand_over(done: concurrent.futures.Future) -> None:  # on the thread that ended `future`
        try:
            loop.call_soon_threadsafe(settle, done)
        except RuntimeError:
            if not loop.is_closed():
                raise

    future.add_done_callback(hand_over)
    return waiter


def loop_state(loop: asyncio.AbstractEventLoop) -> str:
    """What `loop` (a loop other than the running one) is doing, as a refusal to use it from elsewhere names it."""
    if loop.is_closed():
        return "is closed"
    if loop.is_running():
        return "is running, on another thread"
    return "is open but not running (a Runner or run_until_complete between its runs)"


NAME_OPTIONS = ("grpc.default_authority", "grpc.ssl_target_name_override")


def open_channel(
    grpc_module, target: str, credentials: grpc.ChannelCredentials | None, options, authority: str | None = None
):
    """A channel of `grpc_module` (grpc, or grpc.aio): TLS when there are credentials, else plaintext.

    `authority` (`channel_authority`) is the name TLS checks the servers' certificates against,
    unless the options already name one.
    """
    if credentials is None:
        return grpc_module.insecure_channel(target, options=options)
    options = list(options or ())
    if authority is not None and not any(key in NAME_OPTIONS for key, _ in options):
        options.append(("grpc.default_authority", authority))
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
        # The token itself is never part of the message, nor any of its characters.
        if not isinstance(token, str):
            got = type(token).__name__
        elif not token:
            got = "an empty string"
        else:
            at = next(i for i, c in enumerate(token) if not _TOKEN.fullmatch(c))
            got = f"a string of {len(token)} characters, the one at index {at} not visible ASCII"
            got += " (the token is not shown)"
        raise ValueError(f"token: expected a non-empty string of visible ASCII characters, without spaces; got {got}")
    return (("authorization", f"Bearer {token}"),)
