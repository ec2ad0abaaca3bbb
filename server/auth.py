"""Transport security and authentication of the gRPC port: TLS, mTLS and bearer tokens.

TLS: the server's certificate chain and key (PEM); with a client CA, every client must
present a certificate signed by it (mTLS) or the handshake fails. `check_tls_files`
reads and checks the files when the settings are made, so a bad file fails at start-up
with the file and what is wrong with it, never at the first connection.

Tokens: when a token file or environment variable is configured, every call must carry
the metadata `authorization: Bearer <token>` with one of the accepted tokens, or it ends
with UNAUTHENTICATED before its request is read. The comparison is in constant time (the
SHA-256 digests of the presented and of every accepted token are compared, all of them,
so neither the position nor the length of a match shows in the timing). Tokens never come
from the command line (`ps` shows it to every user) and never appear in a log or status.

Exempt from the token: `grpc.health.v1.Health` (Check and Watch), because Kubernetes'
gRPC probes cannot send metadata; it tells only whether the server is serving.
"""

from __future__ import annotations

import asyncio
import codecs
import hashlib
import hmac
import ipaddress
import logging
import os
import re
import ssl
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from .fieldvalues import OWS
from .ratelog import WindowedWarning

if TYPE_CHECKING:
    from .config import ServerSettings

log = logging.getLogger("wok.auth")

AUTH_METADATA_KEY = "authorization"
# Services a caller may use without a token: the probes of orchestrators cannot send one.
EXEMPT_SERVICES: tuple[str, ...] = ("grpc.health.v1.Health",)
MIN_TOKEN_CHARS = 16
# RFC 6750's b64token: what may follow "Bearer " in an HTTP/2 header.
_TOKEN_CHARS = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
# Between a token file's tokens on a line: commas and OWS (' ', '\t'), the white space the bearer header's token is
# trimmed of (TokenCheck); its lines end at '\n', a '\r' before it dropped. str.splitlines() and a \s split also
# took every Unicode space and line break (\xa0, \u2028, \x1c-\x1f): a token holding one became its halves, each
# accepted (and shorter). Any other character stays in its token, for the check to refuse, naming the line.
_SPLIT = re.compile(r"[ \t,]+")
DENIED_LOG_EVERY_S = 10.0  # at most one warning per this many seconds about refused calls

# The metadata's value is never shown: it may hold a token.
MISSING = "metadata 'authorization': expected 'Bearer <token>' (this server requires a bearer token); got none"
MALFORMED = "metadata 'authorization': expected one entry, 'Bearer <token>' (scheme Bearer); got another form"
REFUSED = "metadata 'authorization': expected a bearer token this server accepts; got another"


# -- files ---------------------------------------------------------------------------------
def read_secret_file(path: Path) -> bytes:
    """The bytes of `path`; ValueError saying why it cannot be read (never its contents)."""
    path = Path(path)
    try:
        # In the try: a stat can fail otherwise than "no such file" (a name too long for the file
        # system), and `wok serve --tls-cert` then ended in an OSError traceback.
        if not path.exists():
            raise ValueError(f"{path} does not exist")
        if not path.is_file():
            raise ValueError(f"{path} is not a file")
        return path.read_bytes()
    except PermissionError:
        raise ValueError(f"{path} is not readable by this process (uid {os.getuid()})") from None
    except OSError as exc:
        raise ValueError(f"{path} cannot be read: {exc.strerror}") from None


def _refuse_password() -> bytes:
    raise ValueError("encrypted")


def check_tls_files(cert: Path, key: Path, client_ca: Path | None) -> None:
    """Check that the certificate chain and key are PEM, unencrypted and a pair, and that the
    client CA file holds at least one certificate; ValueError naming the file otherwise."""
    cert_pem, key_pem = read_secret_file(cert), read_secret_file(key)
    if b"-----BEGIN CERTIFICATE-----" not in cert_pem:
        raise ValueError(f"tls_cert {cert} holds no PEM certificate ('-----BEGIN CERTIFICATE-----')")
    if b"ENCRYPTED" in key_pem:
        raise ValueError(
            f"tls_key {key} is encrypted; gRPC needs an unencrypted PEM key (keep it readable only to wok)"
        )
    if b"PRIVATE KEY-----" not in key_pem:
        raise ValueError(f"tls_key {key} holds no PEM private key ('-----BEGIN ... PRIVATE KEY-----')")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.load_cert_chain(str(cert), str(key), password=_refuse_password)
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc):
            raise ValueError(f"tls_key {key} is not the key of the certificate in tls_cert {cert}") from None
        raise ValueError(_unloadable(cert, cert_pem, key, exc)) from None
    if client_ca is not None:
        ca_pem = read_secret_file(client_ca)
        store = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        try:
            store.load_verify_locations(cadata=ca_pem.decode("ascii"))
        except (ssl.SSLError, UnicodeDecodeError, ValueError):
            raise ValueError(f"tls_client_ca {client_ca} holds no PEM CA certificate") from None
        # A client's own certificate here would make gRPC trust that one client alone (a pin),
        # not the clients a CA signs: refused, so that the file means what its name says.
        counts = store.cert_store_stats()
        leaves = counts["x509"] - counts["x509_ca"]
        if leaves:
            raise ValueError(
                f"tls_client_ca {client_ca} holds {leaves} certificate(s) that are not a CA's (no basicConstraints "
                "CA:TRUE): give the CA certificate that signs the clients' certificates"
            )


def _unloadable(cert: Path, cert_pem: bytes, key: Path, exc: ssl.SSLError) -> str:
    """Which of the pair failed to load, and why: OpenSSL says only "PEM lib" for either file."""
    alone = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        alone.load_verify_locations(cadata=cert_pem.decode("ascii"))
    except (ssl.SSLError, UnicodeDecodeError, ValueError):
        return f"tls_cert {cert}: a PEM certificate in it cannot be decoded (damaged or truncated)"
    if exc.reason == "PEM_LIB" or "PEM lib" in str(exc):
        return f"tls_key {key}: its PEM private key cannot be decoded (damaged or truncated)"
    return f"tls_cert {cert} and tls_key {key} cannot be loaded: {exc.reason or exc}"


def server_credentials(settings: ServerSettings) -> grpc.ServerCredentials | None:
    """The gRPC server credentials the settings ask for; None for plaintext."""
    if settings.tls_cert is None:
        return None
    ca = read_secret_file(settings.tls_client_ca) if settings.tls_client_ca is not None else None
    return grpc.ssl_server_credentials(
        [(read_secret_file(settings.tls_key), read_secret_file(settings.tls_cert))],
        root_certificates=ca,
        require_client_auth=ca is not None,
    )


# -- tokens --------------------------------------------------------------------------------
def _lines_and_tokens(text: str) -> list[tuple[int, str]]:
    """(line number, token) for each token of a token file, in order (`split_tokens`)."""
    found: list[tuple[int, str]] = []
    for number, line in enumerate(text.split("\n"), 1):
        line = line.removesuffix("\r").strip(OWS)
        if line and not line.startswith("#"):
            found.extend((number, t) for t in _SPLIT.split(line) if t)
    return found


def split_tokens(text: str) -> list[str]:
    """The tokens of a token file, in order, unchecked: separated by newlines, spaces, tabs or commas;
    lines starting with '#' are comments. (`wok bench --token-file` sends the first.)"""
    return [token for _, token in _lines_and_tokens(text)]


def parse_tokens(text: str, source: str) -> tuple[str, ...]:
    """The tokens in `text` (`split_tokens`), each checked as the server accepts it. ValueError
    naming `source`, the token's position and its line, never its text (a character it cannot hold
    is named: no accepted token holds it)."""
    tokens = _lines_and_tokens(text)
    if not tokens:
        raise ValueError(f"{source} holds no token")
    for i, (line, token) in enumerate(tokens, 1):
        if not _TOKEN_CHARS.fullmatch(token):
            bad = next((c for c in token if not _TOKEN_CHARS.fullmatch(c) and c != "="), None)
            if bad is not None:
                what = f"U+{ord(bad):04X}"
            else:  # '=' pads a token's end: one of '=' alone has no character before it to pad
                what = "no character before its '='" if not token.strip("=") else "'=' before its end"
            raise ValueError(
                f"{source}: token {i} (line {line}) holds {what}, which a bearer token cannot (allowed: A-Z a-z 0-9 "
                "- . _ ~ + / and trailing =; tokens are separated by newlines, spaces, tabs or commas)"
            )
        if len(token) < MIN_TOKEN_CHARS:
            raise ValueError(
                f"{source}: token {i} (line {line}) is {len(token)} characters; at least {MIN_TOKEN_CHARS} are needed"
            )
    return tuple(dict.fromkeys(t for _, t in tokens))


def decode_token_file(raw: bytes, source: str) -> str:
    """A token file's text, for the server and the bench alike. "-sig": PowerShell 5's Out-File and Set-Content
    -Encoding UTF8 begin the file with a BOM, which was its first token's U+FEFF (refused) or kept a first line's
    '#' from starting a comment. ValueError naming `source`, and the file offset and line of the first byte that is
    not UTF-8, where there is one: without them a file of many tokens was searched by hand. Not the byte's value:
    it is part of a secret."""
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        at = exc.start + (len(codecs.BOM_UTF8) if raw.startswith(codecs.BOM_UTF8) else 0)  # -sig counts after it
        line = raw.count(b"\n", 0, at) + 1
        raise ValueError(f"{source} is not UTF-8 text ({exc.reason} at byte {at}, line {line})") from None


def load_tokens(auth_token_file: Path | None = None, auth_token_env: str | None = None) -> tuple[str, ...]:
    """Every accepted token from the file and the environment variable (either may be None)."""
    tokens: list[str] = []
    if auth_token_file is not None:
        text = decode_token_file(read_secret_file(auth_token_file), str(auth_token_file))
        tokens.extend(parse_tokens(text, str(auth_token_file)))
    if auth_token_env is not None:
        value = os.environ.get(auth_token_env)
        if not value:
            raise ValueError(f"environment variable {auth_token_env} is not set, or empty")
        tokens.extend(parse_tokens(value, f"environment variable {auth_token_env}"))
    return tuple(dict.fromkeys(tokens))


class TokenCheck:
    """Accepts a call's metadata when it holds one accepted bearer token."""

    def __init__(self, tokens: Iterable[str]) -> None:
        self._digests = tuple(hashlib.sha256(t.encode()).digest() for t in tokens)
        if not self._digests:
            raise ValueError("no accepted token given")

    def accepts(self, token: str) -> bool:
        presented = hashlib.sha256(token.encode()).digest()
        ok = False
        for digest in self._digests:  # every one, whatever matched before
            ok |= hmac.compare_digest(presented, digest)
        return ok

    def refusal(self, metadata: Sequence[tuple[str, str | bytes]] | None) -> str | None:
        """None when the metadata authenticates the call; else the status details to send."""
        values = [v for k, v in metadata or () if k == AUTH_METADATA_KEY]
        if not values:
            return MISSING
        if len(values) > 1 or not isinstance(values[0], str):
            return MALFORMED
        # OWS alone (RFC 9110 5.6.3): str.strip() also dropped a no-break space or \x1c-\x1f after the token.
        scheme, _, token = values[0].strip(OWS).partition(" ")
        token = token.strip(OWS)
        if scheme.lower() != "bearer" or not token:
            return MALFORMED
        return None if self.accepts(token) else REFUSED


class BearerTokenInterceptor(grpc.aio.ServerInterceptor):
    """Ends every call without an accepted token with UNAUTHENTICATED, except exempt services.

    A refused call is answered by a handler that never reads the request, whatever the
    method (known or not: a caller without a token learns nothing of what is served).

    Refusals are logged at most once per `log_every_s`: the first at once, those that follow
    within the window in one line at its end (naming the latest); `close()` at the stop logs
    what is still held.
    """

    def __init__(
        self, check: TokenCheck, exempt: Iterable[str] = EXEMPT_SERVICES, *, log_every_s: float = DENIED_LOG_EVERY_S
    ) -> None:
        self.check = check
        self.exempt = frozenset(exempt)
        self._latest: tuple[str, str, str] = ("", "", "")  # method, peer, reason of the latest refusal
        self._warning = WindowedWarning(self._say, log_every_s)

    @property
    def refused(self) -> int:
        return self._warning.count

    @property
    def log_every_s(self) -> float:
        return self._warning.throttle.every_s

    @log_every_s.setter
    def log_every_s(self, seconds: float) -> None:
        self._warning.throttle.every_s = seconds

    @property
    def _flush(self) -> asyncio.TimerHandle | None:
        return self._warning.throttle.window_end

    async def intercept_service(self, continuation, handler_call_details):
        service = handler_call_details.method.lstrip("/").rpartition("/")[0]
        if service not in self.exempt:
            reason = self.check.refusal(handler_call_details.invocation_metadata)
            if reason is not None:
                self._warning.count += 1
                return grpc.stream_stream_rpc_method_handler(self._deny(reason, handler_call_details.method))
        return await continuation(handler_call_details)

    def _deny(self, reason: str, method: str):
        async def deny(request_iterator, context: grpc.aio.ServicerContext):
            self._latest = (method, context.peer(), reason)
            self._warning.due()
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, reason)

        return deny

    def _say(self, count: int) -> None:
        log.warning(
            "refused %d call(s) without an accepted bearer token; latest: %s from %s (%s)", count, *self._latest
        )

    def close(self) -> None:
        """At the server's stop: log the refusals still waiting for their window's end, and leave
        nothing scheduled on the loop."""
        self._warning.close()


def token_interceptor(settings: ServerSettings) -> BearerTokenInterceptor | None:
    """The interceptor the settings ask for; None when no token is configured."""
    if settings.auth_token_file is None and settings.auth_token_env is None:
        return None
    return BearerTokenInterceptor(TokenCheck(load_tokens(settings.auth_token_file, settings.auth_token_env)))


# -- what the operator should hear about ----------------------------------------------------
def is_loopback(host: str) -> bool:
    """Whether `host` (an address or a name) is the loopback interface only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class SecurityMode:
    tls: bool
    mtls: bool
    token: bool

    @classmethod
    def of(cls, settings: ServerSettings) -> SecurityMode:
        return cls(
            tls=settings.tls_cert is not None,
            mtls=settings.tls_client_ca is not None,
            token=settings.auth_token_file is not None or settings.auth_token_env is not None,
        )

    def describe(self) -> str:
        parts = ["TLS with client certificates (mTLS)" if self.mtls else "TLS" if self.tls else "plaintext"]
        parts.append("bearer token required" if self.token else "no token")
        return ", ".join(parts)


def _shown(host: str) -> str:
    """An IPv6 address in brackets, so that a colon after it reads as punctuation."""
    return f"[{host}]" if ":" in host else host


def security_warnings(settings: ServerSettings) -> list[str]:
    """Warnings for settings that expose the server beyond this machine without protection: each
    names what is actually exposed (on the HTTP port: /metrics, the admin API and /events, as on)."""
    mode = SecurityMode.of(settings)
    out = []
    if not is_loopback(settings.host) and not mode.tls:
        what = "bearer tokens, requests and responses travel" if mode.token else "requests and responses travel"
        out.append(
            f"gRPC listens on {_shown(settings.host)} without TLS: {what} in clear text (give --tls-cert/--tls-key)"
        )
    if not is_loopback(settings.host) and not mode.token and not mode.mtls:
        out.append(
            f"gRPC listens on {_shown(settings.host)} without authentication: anyone who reaches it may run the models "
            "(give --auth-token-file, --auth-token-env or --tls-client-ca)"
        )
    # The HTTP port serves /metrics when metrics are on, the admin API and /events with --admin.
    # With neither it answers 404, and at / that metrics are off: nothing to warn about (the CLI
    # then opens no port; a library caller's settings may still open one). With metrics off, a
    # warning about /metrics would name what is not served.
    if settings.metrics_port is None or is_loopback(settings.metrics_host):
        return out
    if not settings.metrics:
        if settings.admin:
            out.append(
                f"the admin API (/admin/*, /events) listens on {_shown(settings.metrics_host)}: plain HTTP without "
                "authentication; anyone who reaches it can inject faults (fail or slow down every request of a "
                "model), change its batching, and read the model names and live batch and traffic figures from "
                "/events (/metrics is off: --no-metrics)"
            )
        return out
    what = "reads the model names and traffic figures"
    if settings.admin:
        what += (
            ", and, with --admin, can inject faults (fail or slow down every request of a model) "
            "and change its batching"
        )
    out.append(
        f"/metrics listens on {_shown(settings.metrics_host)}: plain HTTP without authentication; anyone who "
        f"reaches it {what}"
    )
    return out
