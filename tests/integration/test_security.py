"""Security of the gRPC port: TLS, mTLS, bearer tokens, message size limits, loopback
defaults, and where Python model code may come from (docs/security.md).

Certificates are made here, for this run only: a CA, a server certificate for 127.0.0.1
and localhost, a client certificate from the same CA, and one from a CA the server does
not trust.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import datetime
import ipaddress
import json
import logging
import os
import re
import socket
import ssl
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc

from wok.auth import MALFORMED, MISSING, REFUSED, TokenCheck, load_tokens, parse_tokens, security_warnings
from wok.clients import TLS, AsyncClient, Client, InferError
from wok.clients.channel import auth_metadata, channel_credentials, tls_mode
from wok.codec import encode_request
from wok.config import model_config_from_dict, server_settings
from wok.errors import ConfigError, quoted_name
from wok.v2pb import grpc_service_pb2 as pb
from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

TOKEN_A = "tok-A-1b0c4ee6a1f94c8a8d1e"
TOKEN_B = "tok-B-9f21d7c3e5a64b0f9c2a"
WRONG = "tok-X-00000000000000000000"
X = np.linspace(-1, 1, 256, dtype=np.float32).reshape(1, 256)
CALL_S = 30.0  # generous: a shared 2-core machine is slow, never wrong


# -- a throwaway PKI -------------------------------------------------------------------------
def _pem_key(key, password: bytes | None = None) -> bytes:
    enc = serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, enc)


def _cert(
    subject: str, key, issuer: x509.Certificate | None, issuer_key, *, ca=False, server=False
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    b = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer.subject if issuer else name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    if issuer is not None:
        b = b.add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), critical=False)
    if not ca:
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        b = b.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if server:
        san = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        b = b.add_extension(x509.SubjectAlternativeName(san), critical=False)
    return b.sign(issuer_key, hashes.SHA256())


@dataclass
class PKI:
    dir: Path

    def path(self, name: str) -> Path:
        return self.dir / name

    def read(self, name: str) -> bytes:
        return (self.dir / name).read_bytes()

    def tls(self, ca="ca.pem", cert: str | None = None) -> TLS:
        if cert is None:
            return TLS(self.read(ca))
        return TLS(self.read(ca), self.read(f"{cert}.pem"), self.read(f"{cert}.key"))


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> PKI:
    d = tmp_path_factory.mktemp("pki")
    files: dict[str, bytes] = {}
    for ca_name in ("ca", "other-ca"):
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca = _cert(f"wok test {ca_name}", ca_key, None, ca_key, ca=True)
        files[f"{ca_name}.pem"] = ca.public_bytes(serialization.Encoding.PEM)
        for leaf, server in ((f"{ca_name}-server", True), (f"{ca_name}-client", False)):
            key = ec.generate_private_key(ec.SECP256R1())
            files[f"{leaf}.pem"] = _cert(leaf, key, ca, ca_key, server=server).public_bytes(serialization.Encoding.PEM)
            files[f"{leaf}.key"] = _pem_key(key)
    files["encrypted.key"] = _pem_key(ec.generate_private_key(ec.SECP256R1()), b"secret")
    files["tokens"] = f"# accepted tokens\n{TOKEN_A}\n\n{TOKEN_B}\n".encode()
    for name, data in files.items():
        (d / name).write_bytes(data)
    return PKI(d)


def tls_settings(pki: PKI, *, mtls=False) -> dict:
    out = {"tls_cert": pki.path("ca-server.pem"), "tls_key": pki.path("ca-server.key")}
    if mtls:
        out["tls_client_ca"] = pki.path("ca.pem")
    return out


# -- tokens, without a server ---------------------------------------------------------------
def test_token_file_format_and_its_errors_never_show_a_token():
    text = f"# comment\n{TOKEN_A}, {TOKEN_B}\n  {TOKEN_A}  \n"
    assert parse_tokens(text, "f") == (TOKEN_A, TOKEN_B)
    with pytest.raises(ValueError, match=r"^f holds no token$"):
        parse_tokens("# only a comment\n\n", "f")
    short = "short-token-123"  # 15 characters
    with pytest.raises(ValueError) as info:
        parse_tokens(f"{TOKEN_A}\n{short}\n", "f")
    assert str(info.value) == "f: token 2 (line 2) is 15 characters; at least 16 are needed"
    with pytest.raises(ValueError) as info:
        parse_tokens('tok"en-with-a-quote-1234', "f")
    assert str(info.value).startswith("f: token 1 (line 1) holds U+0022, which a bearer token cannot (allowed: ")
    assert "quote" not in str(info.value)
    # Lines end at LF, a CR before it dropped; tabs separate as spaces and commas do.
    assert parse_tokens(f"# comment\r\n{TOKEN_A}\t{TOKEN_B}\r\n", "f") == (TOKEN_A, TOKEN_B)


def test_a_token_file_beginning_with_a_bom_is_read_as_without_it(tmp_path):
    # PowerShell 5's Out-File and Set-Content -Encoding UTF8 write one: refused, "holds U+FEFF", its first line's
    # '#' starting no comment.
    tokens = tmp_path / "tokens"
    tokens.write_bytes(f"\ufeff# the tokens\r\n{TOKEN_A}\r\n{TOKEN_B}\r\n".encode())
    assert load_tokens(tokens) == (TOKEN_A, TOKEN_B)
    tokens.write_bytes(f"\ufeff{TOKEN_A}\n".encode())
    assert load_tokens(tokens) == (TOKEN_A,)


@pytest.mark.parametrize(
    ("raw", "where"),
    [
        (b"tok-\xff-not-utf-8\n", "invalid start byte at byte 4, line 1"),
        (b"# tokens\n\n" + b"t" * 20 + b"\ntok-\xc3(\n", "invalid continuation byte at byte 35, line 4"),
        # The offset is the file's: the BOM the decoding skips is counted.
        (codecs.BOM_UTF8 + b"# x\n\n\x80", "invalid start byte at byte 8, line 3"),
    ],
    ids=["first-line", "fourth-line", "after-bom"],
)
def test_a_token_file_that_is_not_utf8_is_named_with_the_bytes_offset_and_line(tmp_path, raw, where):
    # "is not UTF-8 text" alone: a file of many tokens was searched by hand.
    tokens = tmp_path / "tokens"
    tokens.write_bytes(raw)
    with pytest.raises(ValueError) as info:
        load_tokens(tokens)
    assert str(info.value) == f"{tokens} is not UTF-8 text ({where})"


def test_a_token_of_padding_alone_is_said_to_hold_nothing_before_it():
    # It was said to hold "'=' before its end", which it has none of.
    with pytest.raises(ValueError) as info:
        parse_tokens(f"{TOKEN_A}\n{'=' * 20}\n", "f")
    assert str(info.value).startswith("f: token 2 (line 2) holds no character before its '=', which a bearer token ")
    with pytest.raises(ValueError) as info:
        parse_tokens("tok=en-with-a-pad-1234", "f")
    assert str(info.value).startswith("f: token 1 (line 1) holds '=' before its end, which a bearer token cannot")


@pytest.mark.parametrize("space", ["\xa0", "\u2028", "\u3000", "\x1c", "\x0b"])
def test_a_token_holding_another_space_is_refused_naming_its_file_and_line_not_split_in_two(tmp_path, space):
    # Split on every Unicode space and line break, the token's halves were accepted, each a token (and shorter):
    # the bearer header's token is trimmed of ' ' and '\t' alone (fieldvalues.OWS), and so is a token file's.
    tokens = tmp_path / "tokens"
    tokens.write_text(f"# the tokens\n{TOKEN_A}\n{TOKEN_B}{space}{TOKEN_A}\n", encoding="utf-8")
    msg = settings_error(auth_token_file=tokens)
    assert f"{tokens}: token 2 (line 3) holds U+{ord(space):04X}, which a bearer token cannot" in msg, msg
    assert TOKEN_B not in msg


def test_token_check_accepts_only_a_bearer_token_it_knows():
    check = TokenCheck([TOKEN_A, TOKEN_B])
    assert check.refusal([("authorization", f"Bearer {TOKEN_A}")]) is None
    assert check.refusal([("user-agent", "x"), ("authorization", f"bearer {TOKEN_B}")]) is None  # scheme: any case
    assert check.refusal(None) == MISSING
    assert check.refusal([("user-agent", "x")]) == MISSING
    assert check.refusal([("authorization", f"Bearer {WRONG}")]) == REFUSED
    assert check.refusal([("authorization", f"Bearer {TOKEN_A}x")]) == REFUSED  # a longer one is another token
    assert check.refusal([("authorization", f"Bearer {TOKEN_A[:-1]}")]) == REFUSED
    assert check.refusal([("authorization", f"Basic {TOKEN_A}")]) == MALFORMED
    assert check.refusal([("authorization", "Bearer ")]) == MALFORMED
    assert check.refusal([("authorization", TOKEN_A)]) == MALFORMED
    # Spaces and tabs alone are white space around a field value (RFC 9110 5.6.3): str.strip() also took a
    # no-break space or a \x1c-\x1f, and a token with one after it was the token.
    assert check.refusal([("authorization", f" Bearer {TOKEN_A}\t")]) is None
    for other in ("\xa0", "\x1f", "\x0b", "\u2003"):
        assert check.refusal([("authorization", f"Bearer {TOKEN_A}{other}")]) == REFUSED, repr(other)
        assert check.refusal([("authorization", f"{other}Bearer {TOKEN_A}")]) == MALFORMED, repr(other)
    two = [("authorization", f"Bearer {TOKEN_A}"), ("authorization", f"Bearer {TOKEN_B}")]
    assert check.refusal(two) == MALFORMED
    for details in (MISSING, MALFORMED, REFUSED):
        assert TOKEN_A not in details and "tok-" not in details
        # The one refusal form: the input, what was expected, what was got (here never the value itself).
        assert re.fullmatch(r"metadata 'authorization': expected [^;]+; got [^;]+", details), details


def test_client_token_and_tls_arguments_are_checked_without_echoing_secrets(pki):
    assert auth_metadata(None) is None
    assert auth_metadata(TOKEN_A) == (("authorization", f"Bearer {TOKEN_A}"),)
    expected = "token: expected a non-empty string of visible ASCII characters, without spaces; got "
    for bad, got in (
        ("", "an empty string"),
        ("two words", "a string of 9 characters, the one at index 3 not visible ASCII (the token is not shown)"),
        ("line\nbreak", "a string of 10 characters, the one at index 4 not visible ASCII (the token is not shown)"),
        (b"token", "bytes"),
    ):
        with pytest.raises(ValueError) as info:
            auth_metadata(bad)
        assert str(info.value) == expected + got
    with pytest.raises(TypeError) as type_info:
        channel_credentials("yes")
    assert str(type_info.value) == "tls: expected a TLS, True, False or None; got str"
    with pytest.raises(ValueError, match="needs its private key"):
        TLS(pki.read("ca.pem"), certificate_chain=pki.read("ca-client.pem"))
    tls = pki.tls(cert="ca-client")
    assert "PRIVATE" not in repr(tls) and repr(tls) == "TLS(root_certificates=custom, client_certificate=True)"
    assert (tls_mode(None), tls_mode(True), tls_mode(pki.tls()), tls_mode(tls)) == ("none", "tls", "tls", "mtls")
    with pytest.raises(ValueError, match=r"cannot read .*nope\.pem"):
        TLS.from_files(pki.path("nope.pem"))


# -- settings: each mistake named at construction ---------------------------------------------
def settings_error(**values) -> str:
    with pytest.raises(ConfigError) as info:
        server_settings(**values)
    return str(info.value)


def test_tls_settings_name_each_mistake(pki, tmp_path):
    p = pki.path
    assert "tls_cert is given without tls_key" in settings_error(tls_cert=p("ca-server.pem"))
    assert "tls_key is given without tls_cert" in settings_error(tls_key=p("ca-server.key"))
    assert "tls_client_ca needs tls_cert and tls_key" in settings_error(tls_client_ca=p("ca.pem"))
    msg = settings_error(tls_cert=tmp_path / "missing.pem", tls_key=p("ca-server.key"))
    assert f"tls_cert: {tmp_path / 'missing.pem'} does not exist" in msg
    assert f"{tmp_path} is not a file" in settings_error(tls_cert=tmp_path, tls_key=p("ca-server.key"))
    msg = settings_error(tls_cert=p("ca-server.pem"), tls_key=p("other-ca-server.key"))
    assert f"tls_key {p('other-ca-server.key')} is not the key of the certificate in tls_cert" in msg
    msg = settings_error(tls_cert=p("ca-server.pem"), tls_key=p("encrypted.key"))
    assert "is encrypted; gRPC needs an unencrypted PEM key" in msg
    msg = settings_error(tls_cert=p("ca-server.key"), tls_key=p("ca-server.key"))
    assert f"tls_cert {p('ca-server.key')} holds no PEM certificate" in msg
    # Damaged files: OpenSSL says "PEM lib" for either; the message says which and what.
    for name, source in (("cert", "ca-server.pem"), ("key", "ca-server.key")):
        lines = p(source).read_text().splitlines()
        lines[len(lines) // 2] = "!" * len(lines[len(lines) // 2])  # a line of the base64 body
        (tmp_path / f"damaged.{name}").write_text("\n".join(lines) + "\n")
    truncated = tmp_path / "truncated.pem"
    truncated.write_text("".join(p("ca-server.pem").read_text().splitlines(keepends=True)[:-3]))
    for bad in (tmp_path / "damaged.cert", truncated):
        msg = settings_error(tls_cert=bad, tls_key=p("ca-server.key"))
        assert f"tls_cert {bad}: a PEM certificate in it cannot be decoded (damaged or truncated)" in msg, msg
    msg = settings_error(tls_cert=p("ca-server.pem"), tls_key=tmp_path / "damaged.key")
    assert f"tls_key {tmp_path / 'damaged.key'}: its PEM private key cannot be decoded" in msg, msg
    msg = settings_error(**tls_settings(pki), tls_client_ca=p("ca-server.key"))
    assert f"tls_client_ca {p('ca-server.key')} holds no PEM CA certificate" in msg
    msg = settings_error(**tls_settings(pki), tls_client_ca=p("ca-client.pem"))
    assert f"tls_client_ca {p('ca-client.pem')} holds 1 certificate(s) that are not a CA's" in msg
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(pki.read("ca.pem") + pki.read("other-ca-client.pem"))
    assert "holds 1 certificate(s) that are not a CA's" in settings_error(**tls_settings(pki), tls_client_ca=bundle)
    # No key's contents in a message, even when the key is where a certificate should be.
    key_lines = {line for name in ("ca-server.key", "other-ca-server.key") for line in pki.read(name).decode().split()}
    assert not {w for w in msg.split() if len(w) > 20} & key_lines
    s = server_settings(**tls_settings(pki, mtls=True))
    assert (s.tls_cert, s.tls_client_ca) == (p("ca-server.pem"), p("ca.pem"))


def test_token_settings_name_each_mistake(pki, tmp_path, monkeypatch):
    missing = tmp_path / "no-tokens"
    assert f"auth_token_file: {missing} does not exist" in settings_error(auth_token_file=missing)
    empty = tmp_path / "empty"
    empty.write_text("# nothing yet\n")
    assert f"{empty} holds no token" in settings_error(auth_token_file=empty)
    monkeypatch.delenv("WOK_TEST_TOKENS", raising=False)
    assert "environment variable WOK_TEST_TOKENS is not set, or empty" in settings_error(
        auth_token_env="WOK_TEST_TOKENS"
    )
    monkeypatch.setenv("WOK_TEST_TOKENS", "tooshort")
    msg = settings_error(auth_token_env="WOK_TEST_TOKENS")
    assert "environment variable WOK_TEST_TOKENS: token 1 (line 1) is 8 characters" in msg and "tooshort" not in msg
    assert "auth_token_env: expected a string matching '^[A-Za-z_][A-Za-z0-9_]*$'; got 'NOT-A-NAME'" in settings_error(
        auth_token_env="NOT-A-NAME"
    )
    monkeypatch.setenv("WOK_TEST_TOKENS", f"{TOKEN_A},{TOKEN_B}")
    assert server_settings(auth_token_env="WOK_TEST_TOKENS", auth_token_file=pki.path("tokens")).auth_token_env


def test_warnings_for_settings_that_expose_the_server():
    assert security_warnings(server_settings()) == []  # the defaults: loopback only
    exposed = security_warnings(server_settings(host="0.0.0.0"))
    assert len(exposed) == 2
    assert exposed[0].startswith("gRPC listens on 0.0.0.0 without TLS: requests and responses travel in clear")
    assert exposed[1].startswith("gRPC listens on 0.0.0.0 without authentication")
    metrics = security_warnings(server_settings(metrics_host="::"))
    assert len(metrics) == 1 and metrics[0].startswith("/metrics listens on [::]: plain HTTP without authentication")
    assert security_warnings(server_settings(metrics_host="::", metrics_port=None)) == []
    assert security_warnings(server_settings(host="::1", metrics_host="localhost")) == []


def test_warnings_stop_when_tls_and_a_token_protect_the_port(pki):
    s = server_settings(host="0.0.0.0", auth_token_file=pki.path("tokens"), **tls_settings(pki))
    assert security_warnings(s) == []
    token_only = security_warnings(server_settings(host="10.1.2.3", auth_token_file=pki.path("tokens")))
    assert token_only == [
        "gRPC listens on 10.1.2.3 without TLS: bearer tokens, requests and responses travel in clear text "
        "(give --tls-cert/--tls-key)"
    ]


# -- tokens through a real server -------------------------------------------------------------
async def test_calls_without_an_accepted_token_get_unauthenticated(serve, pki, caplog):
    caplog.set_level(logging.WARNING, logger="wok.auth")
    async with serve(models=("mlp",), auth_token_file=pki.path("tokens")) as server:
        target = f"127.0.0.1:{server.port}"
        async with AsyncClient(target) as anonymous, AsyncClient(target, token=WRONG) as wrong:
            for client, details in ((anonymous, MISSING), (wrong, REFUSED)):
                for call in (client.server_live(timeout=CALL_S), client.infer("mlp", {"INPUT0": X}, timeout=CALL_S)):
                    with pytest.raises(InferError) as info:
                        await call
                    assert info.value.code == grpc.StatusCode.UNAUTHENTICATED
                    assert info.value.details == details
                    assert WRONG not in info.value.details
            with pytest.raises(InferError) as info:
                async for _ in anonymous.stream_infer([("mlp", {"INPUT0": X})], timeout=CALL_S):
                    pass
            assert (info.value.code, info.value.details) == (grpc.StatusCode.UNAUTHENTICATED, MISSING)
        for token in (TOKEN_A, TOKEN_B):
            async with AsyncClient(target, token=token) as client:
                assert await client.server_live(timeout=CALL_S)
                out = await client.infer("mlp", {"INPUT0": X}, timeout=CALL_S)
                assert out["OUTPUT0"].shape == (1, 256)
                results = [r async for r in client.stream_infer([("mlp", {"INPUT0": X})] * 3, timeout=CALL_S)]
                assert [r.error for r in results] == [None] * 3
        assert server.runtime("mlp").stats.inference_count == 2 + 2 * 3  # refused calls never reached the model
    refused = [r.getMessage() for r in caplog.records if r.name == "wok.auth"]
    assert refused and "without an accepted bearer token" in refused[0]
    assert all(WRONG not in m and TOKEN_A not in m for m in refused)


async def test_unary_calls_taken_by_the_extra_accept_tasks_need_a_token_too(serve, pki):
    # server/accept.py accepts most unary ModelInfer calls outside grpc.aio's own chain; the
    # token check must hold for them as for any other.
    async with serve(models=("mlp",), auth_token_file=pki.path("tokens")) as server:
        counts = server.accept.accepted["/inference.GRPCInferenceService/ModelInfer"]
        assert server.accept.running == len(counts) == 4
        target = f"127.0.0.1:{server.port}"
        async with AsyncClient(target) as anonymous:
            refused = await asyncio.gather(
                *(anonymous.infer("mlp", {"INPUT0": X}, timeout=CALL_S) for _ in range(60)), return_exceptions=True
            )
        assert {(r.code, r.details) for r in refused} == {(grpc.StatusCode.UNAUTHENTICATED, MISSING)}
        taken = sum(counts)
        assert taken > 0
        async with AsyncClient(target, token=TOKEN_A) as client:
            outs = await asyncio.gather(*(client.infer("mlp", {"INPUT0": X}, timeout=CALL_S) for _ in range(60)))
        assert all(o["OUTPUT0"].shape == (1, 256) for o in outs)
        assert sum(counts) > taken
        assert server.runtime("mlp").stats.inference_count == 60


async def test_a_refused_call_is_answered_before_its_request_is_read(serve, pki):
    # A body the server would reject as too large (INVALID_ARGUMENT) is never looked at:
    # the token check comes first, for known and unknown methods alike.
    async with serve(models=("mlp",), auth_token_file=pki.path("tokens"), max_request_bytes=4096) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            big = encode_request("mlp", {"INPUT0": np.ones((8, 256), np.float32)}).SerializeToString()
            infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
            unknown = channel.unary_unary("/inference.GRPCInferenceService/TraceSetting")  # Triton's, not wok's
            for call in (infer, unknown):
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await call(big, timeout=CALL_S)
                assert (info.value.code(), info.value.details()) == (grpc.StatusCode.UNAUTHENTICATED, MISSING)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await infer(big, timeout=CALL_S, metadata=(("authorization", f"Bearer {TOKEN_A}"),))
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await unknown(b"", timeout=CALL_S, metadata=(("authorization", f"Bearer {TOKEN_A}"),))
            assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_health_checks_need_no_token_and_reflection_does(serve, pki):
    async with serve(models=("mlp",), auth_token_file=pki.path("tokens")) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for service in ("", "inference.GRPCInferenceService", "mlp"):
                resp = await health.Check(health_pb2.HealthCheckRequest(service=service), timeout=CALL_S)
                assert resp.status == health_pb2.HealthCheckResponse.SERVING
            watch = health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=CALL_S)
            assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
            watch.cancel()
            reflect = channel.stream_stream("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo")
            call = reflect(timeout=CALL_S)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call.read()
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


# A field tag whose varint runs past the end of the message: protobuf refuses it.
GARBAGE = b"\xff\xff\xff\xff\x0f"
SERVER_METADATA = "/inference.GRPCInferenceService/ServerMetadata"
SERVER_READY = "/inference.GRPCInferenceService/ServerReady"
SERVER_LIVE = "/inference.GRPCInferenceService/ServerLive"
HEALTH_CHECK = "/grpc.health.v1.Health/Check"


async def test_bytes_that_do_not_parse_get_invalid_argument_with_a_token_and_on_health_without_one(serve, pki, caplog):
    # grpc.aio answered UNKNOWN and logged an ERROR with a traceback for each: on health, which
    # needs no token, anyone who reaches the port could flood the log.
    caplog.set_level(logging.WARNING)
    token = (("authorization", f"Bearer {TOKEN_A}"),)
    async with serve(models=("mlp",), auth_token_file=pki.path("tokens")) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            for method, message_type, metadata in (
                (SERVER_METADATA, "inference.ServerMetadataRequest", token),
                (HEALTH_CHECK, "grpc.health.v1.HealthCheckRequest", None),
            ):
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await channel.unary_unary(method)(GARBAGE, timeout=CALL_S, metadata=metadata)
                code, details = info.value.code(), info.value.details()
                assert code == grpc.StatusCode.INVALID_ARGUMENT, (method, code, details)
                assert details.startswith(f"message is not a valid {message_type} ({len(GARBAGE)} bytes): "), details
                assert details.endswith(f" (sent to {method})"), details
            # Without a token the body is never read.
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await channel.unary_unary(SERVER_METADATA)(GARBAGE, timeout=CALL_S)
            assert (info.value.code(), info.value.details()) == (grpc.StatusCode.UNAUTHENTICATED, MISSING)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, errors


async def _refused(call) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call(b"", timeout=CALL_S)
    assert (info.value.code(), info.value.details()) == (grpc.StatusCode.UNAUTHENTICATED, MISSING)


def _refused_count(line: str) -> int:
    found = re.match(r"refused (\d+) call\(s\) without an accepted bearer token; latest: ", line)
    assert found, line
    return int(found[1])


async def test_refusals_inside_the_log_window_are_logged_at_its_end_without_another_refusal(serve, pki, caplog):
    # The count of a burst waited for the next refusal at least a window later, maybe forever, and
    # that line then named the later call.
    caplog.set_level(logging.WARNING, logger="wok.auth")
    window_s, burst = 1.0, 20
    lines: list[str] = []
    all_logged = asyncio.Event()

    class Lines(logging.Handler):  # on the loop's thread: the refusals and the window's end run there
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())
            if sum(map(_refused_count, lines)) == 1 + burst:
                all_logged.set()

    handler = Lines()
    logging.getLogger("wok.auth").addHandler(handler)
    try:
        async with serve(models=("mlp",), auth_token_file=pki.path("tokens")) as server:
            server._token_interceptor.log_every_s = window_s
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                await _refused(channel.unary_unary(SERVER_READY))
                first_at = asyncio.get_running_loop().time()
                assert len(lines) == 1 and _refused_count(lines[0]) == 1 and SERVER_READY in lines[0], lines
                await asyncio.gather(*(_refused(channel.unary_unary(SERVER_LIVE)) for _ in range(burst)))
                if asyncio.get_running_loop().time() - first_at < window_s * 0.9:
                    assert len(lines) == 1, lines  # still at most one line per window
                await asyncio.wait_for(all_logged.wait(), window_s + CALL_S)
    finally:
        logging.getLogger("wok.auth").removeHandler(handler)
    # One line at the window's end, or more should a slow machine spread the burst past it: each
    # names the burst's latest call.
    assert all(f"latest: {SERVER_LIVE} from ipv4:127.0.0.1:" in line for line in lines[1:]), lines


async def test_refusals_still_held_at_the_stop_are_logged_by_it_and_leave_nothing_scheduled(serve, pki, caplog):
    caplog.set_level(logging.WARNING, logger="wok.auth")
    async with serve(models=("mlp",), auth_token_file=pki.path("tokens")) as server:
        interceptor = server._token_interceptor  # the default window, 10 s: the stop comes first
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            await _refused(channel.unary_unary(SERVER_READY))
            for _ in range(2):
                await _refused(channel.unary_unary(SERVER_LIVE))
        held = [r.getMessage() for r in caplog.records if r.name == "wok.auth"]
        assert len(held) == 1 and _refused_count(held[0]) == 1, held
        await server.stop(grace=5)
        assert interceptor._flush is None
    lines = [r.getMessage() for r in caplog.records if r.name == "wok.auth"]
    assert len(lines) == 2 and _refused_count(lines[1]) == 2 and f"latest: {SERVER_LIVE}" in lines[1], lines


async def test_the_token_can_come_from_an_environment_variable(serve, monkeypatch):
    monkeypatch.setenv("WOK_TEST_TOKENS", f"{TOKEN_B}")
    async with serve(models=("mlp",), auth_token_env="WOK_TEST_TOKENS") as server:
        target = f"127.0.0.1:{server.port}"

        def blocking() -> None:  # the blocking client, off the loop that runs the server
            with Client(target, token=TOKEN_B) as client:
                assert client.infer("mlp", {"INPUT0": X}, timeout=CALL_S)["OUTPUT0"].shape == (1, 256)
            with Client(target, token=TOKEN_A) as client:
                with pytest.raises(InferError) as info:
                    client.server_ready(timeout=CALL_S)
                assert info.value.code == grpc.StatusCode.UNAUTHENTICATED

        await asyncio.to_thread(blocking)


# -- TLS and mTLS ---------------------------------------------------------------------------
async def assert_cannot_connect(target: str, **client) -> None:
    # Without retries: each retry of an UNAVAILABLE call would only meet the same refusal, after
    # up to 0.75 s of backoff in all.
    async with AsyncClient(target, retries=False, **client) as c:
        with pytest.raises(InferError) as info:
            await c.server_live(timeout=CALL_S)
    assert info.value.code == grpc.StatusCode.UNAVAILABLE, info.value


async def test_tls_server_talks_only_tls_to_clients_that_trust_it(serve, pki):
    async with serve(models=("mlp",), **tls_settings(pki)) as server:
        target = f"127.0.0.1:{server.port}"
        async with AsyncClient(target, tls=pki.tls()) as client:
            assert await client.server_live(timeout=CALL_S)
            assert (await client.infer("mlp", {"INPUT0": X}, timeout=CALL_S))["OUTPUT0"].shape == (1, 256)
        async with AsyncClient(f"localhost:{server.port}", tls=pki.tls()) as client:  # the certificate's DNS name
            assert await client.server_live(timeout=CALL_S)
        await assert_cannot_connect(target)  # plaintext
        await assert_cannot_connect(target, tls=pki.tls("other-ca.pem"))  # a CA that did not sign it
        await assert_cannot_connect(target, tls=True)  # gRPC's bundled public roots
        # A client certificate is optional without tls_client_ca.
        async with AsyncClient(target, tls=pki.tls(cert="other-ca-client")) as client:
            assert await client.server_live(timeout=CALL_S)


async def test_tls_over_several_targets_checks_each_certificate_against_the_first_targets_host(serve, pki):
    # One gRPC channel over several servers has one authority: without the first target's, gRPC
    # took the merged `ipv4:a,b` URI's whole path, which no certificate names, and every
    # handshake failed hostname verification (UNAVAILABLE).
    async with serve(models=("mlp",), **tls_settings(pki)) as one, serve(models=("mlp",), **tls_settings(pki)) as two:
        for targets in (
            f"127.0.0.1:{one.port},127.0.0.1:{two.port}",
            [f"localhost:{one.port}", f"localhost:{two.port}"],
        ):
            async with AsyncClient(targets, tls=pki.tls()) as client:
                for _ in range(4):
                    assert (await client.infer("mlp", {"INPUT0": X}, timeout=CALL_S))["OUTPUT0"].shape == (1, 256)

            def blocking(targets=targets) -> bool:  # the blocking client, off the loop that runs the servers
                with Client(targets, tls=pki.tls()) as client:
                    return client.server_live(timeout=CALL_S)

            assert await asyncio.to_thread(blocking)
        # The servers' certificate does not name "wok.invalid": an override the caller gives still wins.
        override = [("grpc.ssl_target_name_override", "wok.invalid")]
        await assert_cannot_connect(f"127.0.0.1:{one.port},127.0.0.1:{two.port}", tls=pki.tls(), options=override)


async def test_mtls_refuses_clients_without_a_certificate_from_its_ca(serve, pki):
    async with serve(models=("mlp",), **tls_settings(pki, mtls=True)) as server:
        target = f"127.0.0.1:{server.port}"
        await assert_cannot_connect(target, tls=pki.tls())  # no certificate
        await assert_cannot_connect(target, tls=pki.tls(cert="other-ca-client"))  # one the CA did not sign
        await assert_cannot_connect(target)  # plaintext
        async with AsyncClient(target, tls=pki.tls(cert="ca-client")) as client:
            assert (await client.infer("mlp", {"INPUT0": X}, timeout=CALL_S))["OUTPUT0"].shape == (1, 256)

        def blocking() -> bool:
            with Client(target, tls=TLS.from_files(pki.path("ca.pem"), *_client_files(pki))) as client:
                return client.server_live(timeout=CALL_S)

        assert await asyncio.to_thread(blocking)


async def test_the_plaintext_health_port_answers_probes_of_an_mtls_server_and_nothing_else(serve, pki):
    """`--health-port`: what the kubelet's gRPC probe (plaintext, no client certificate)
    can reach when the main port needs mTLS; it carries the same health states, turns
    NOT_SERVING at the drain with the main port, and serves no other service."""
    async with serve(models=("mlp",), health_port=0, **tls_settings(pki, mtls=True)) as server:
        assert server.health_port not in (None, 0, server.port)
        await assert_cannot_connect(f"127.0.0.1:{server.port}")  # the main port stays mTLS only
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.health_port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            for service in ("", "mlp", "inference.GRPCInferenceService"):
                reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=CALL_S)
                assert reply.status == health_pb2.HealthCheckResponse.SERVING, service
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.Check(health_pb2.HealthCheckRequest(service="no-such-model"), timeout=CALL_S)
            assert info.value.code() == grpc.StatusCode.NOT_FOUND
            live = channel.unary_unary(
                "/inference.GRPCInferenceService/ServerLive",
                request_serializer=pb.ServerLiveRequest.SerializeToString,
                response_deserializer=pb.ServerLiveResponse.FromString,
            )
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await live(pb.ServerLiveRequest(), timeout=CALL_S)
            assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED

            watch = stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=CALL_S)
            assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
            stopping = asyncio.ensure_future(server.stop(grace=5))
            assert (await watch.read()).status == health_pb2.HealthCheckResponse.NOT_SERVING
            await stopping
        with pytest.raises(grpc.aio.AioRpcError) as info:  # and it closes with the server
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.health_port}") as channel:
                await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2)
        assert info.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def _client_files(pki: PKI) -> tuple[Path, Path]:
    return pki.path("ca-client.pem"), pki.path("ca-client.key")


async def test_tls_and_token_together(serve, pki):
    async with serve(models=("mlp",), auth_token_file=pki.path("tokens"), **tls_settings(pki)) as server:
        target = f"127.0.0.1:{server.port}"
        async with AsyncClient(target, tls=pki.tls()) as client:
            with pytest.raises(InferError) as info:
                await client.infer("mlp", {"INPUT0": X}, timeout=CALL_S)
            assert (info.value.code, info.value.details) == (grpc.StatusCode.UNAUTHENTICATED, MISSING)
        async with AsyncClient(target, tls=pki.tls(), token=TOKEN_A) as client:
            assert (await client.infer("mlp", {"INPUT0": X}, timeout=CALL_S))["OUTPUT0"].shape == (1, 256)


# -- message size limits ----------------------------------------------------------------------
BIG_OUTPUT_MODEL = textwrap.dedent(
    """
    import torch
    from torch import nn


    class Spread(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.expand(x.shape[0], 300_000).contiguous()


    def build() -> nn.Module:
        return Spread()
    """
)


def big_output_repository(root: Path) -> Path:
    d = root / "repo" / "spread"
    d.mkdir(parents=True)
    (d / "model.py").write_text(BIG_OUTPUT_MODEL)
    (d / "config.toml").write_text(
        textwrap.dedent(
            """
            platform = "python"
            factory = "model:build"
            max_batch_size = 4
            [[inputs]]
            name = "INPUT0"
            datatype = "FP32"
            dims = [1]
            [[outputs]]
            name = "OUTPUT0"
            datatype = "FP32"
            dims = [300000]
            [dynamic_batching]
            max_queue_delay_ms = 0
            [instances]
            devices = ["cpu"]
            """
        )
    )
    return d.parent


async def test_oversized_requests_and_responses_end_in_resource_exhausted_and_the_server_goes_on(serve, tmp_path):
    # max_request_bytes = 1024: the decoder refuses requests over 1,024 bytes (INVALID_ARGUMENT,
    # tests/integration/test_bad_input.py); gRPC itself refuses messages over
    # 4 × 1,024 + 1,048,576 = 1,052,672 bytes, both ways, before any of wok's code runs.
    async with serve(repository=big_output_repository(tmp_path), max_request_bytes=1024) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}", options=_unlimited()) as channel:
            infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
            small = encode_request("spread", {"INPUT0": np.ones((1, 1), np.float32)}).SerializeToString()
            for size, code in ((1_052_672 + 1, grpc.StatusCode.RESOURCE_EXHAUSTED), (1_052_672, None)):
                # A request of exactly `size` bytes: a raw-contents padding of the right length.
                request = _request_of_size(size)
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await infer(request, timeout=CALL_S)
                if code is not None:
                    assert info.value.code() == code, info.value.details()
                    assert "larger than max (1052673 vs. 1052672)" in info.value.details()
                else:  # through gRPC, and refused by the decoder
                    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
                    assert "over the limit of 1024 bytes" in info.value.details()
            # One row out is 1,200,000 bytes of FP32: over the send limit.
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await infer(small, timeout=CALL_S)
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, info.value.details()
            # The server goes on serving, that model included.
            stats = pb_grpc.GRPCInferenceServiceStub(channel)
            assert (await stats.ServerLive(pb.ServerLiveRequest(), timeout=CALL_S)).live
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await infer(small, timeout=CALL_S)
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert server.runtime("spread").stats.inference_count == 2


def _unlimited() -> list[tuple[str, int]]:
    return [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]


def _request_of_size(size: int) -> bytes:
    """A serialized ModelInferRequest of exactly `size` bytes."""
    req = pb.ModelInferRequest(model_name="spread")
    req.raw_input_contents.append(b"")
    base = req.ByteSize()
    pad = size - base
    # The length prefix grows with the padding; find the padding that lands exactly on size.
    while True:
        req.raw_input_contents[0] = b"\0" * pad
        if req.ByteSize() == size:
            return req.SerializeToString()
        pad -= req.ByteSize() - size


# -- loopback by default ------------------------------------------------------------------------
def _listening(port: int, pid: int) -> list[str]:
    """Local addresses on which process `pid` has a TCP socket listening on `port`, from /proc/net/tcp{,6}.
    Its own sockets only: another process on this shared machine listening on that port number at another
    address (127.0.0.1 beside the server's ::1) failed the test."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):  # closed since the listing
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    out = []
    for name, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        with open(name) as f:
            next(f)
            for line in f:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                addr_hex, port_hex = local.split(":")
                if state == "0A" and int(port_hex, 16) == port and inode in inodes:
                    raw = bytes.fromhex(addr_hex)
                    # The kernel prints each 32-bit word in host (little-endian) order.
                    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
                    assert len(addr_hex) == width
                    ip = ipaddress.ip_address(words)
                    # gRPC binds 127.0.0.1 on an IPv6 socket, as ::ffff:127.0.0.1.
                    out.append(str(getattr(ip, "ipv4_mapped", None) or ip))
    return out


def test_grpc_and_metrics_listen_on_loopback_unless_told_otherwise(servers):
    sp = servers["plain"]
    metrics = next(line for line in sp.log if "wok: metrics on http://" in line)
    metrics_port = int(metrics.rsplit(":", 1)[1].split("/")[0])
    for port in (sp.port, metrics_port):
        addresses = _listening(port, sp.proc.pid)
        assert addresses, f"nothing listens on port {port}"
        assert all(ipaddress.ip_address(a).is_loopback for a in addresses), (port, addresses)
    assert any("wok: gRPC security: plaintext, no token" in line for line in sp.log)
    assert not any("WARNING" in line for line in sp.log), sp.log
    defaults = server_settings()
    assert (defaults.host, defaults.metrics_host) == ("127.0.0.1", "127.0.0.1")


def test_ipv6_loopback_serves_grpc_health_and_metrics_and_prints_bracketed_addresses(servers):
    import urllib.request

    sp = servers["ipv6"]
    assert sp.host == "[::1]", sp.log
    assert _listening(sp.port, sp.proc.pid) == ["::1"]
    metrics = next(line for line in sp.log if "wok: metrics on http://" in line).split(" on ", 1)[1]
    assert metrics.startswith("http://[::1]:"), metrics  # a URL a browser or curl takes as it is
    assert "wok_batch_size" in urllib.request.urlopen(metrics, timeout=10).read().decode()
    health = sp.wait_for_line("wok: health (plaintext) on ").rsplit(" ", 1)[1]
    assert health.startswith("[::1]:"), health
    with grpc.insecure_channel(health) as ch:
        answer = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service="mlp"), timeout=10)
    assert answer.status == health_pb2.HealthCheckResponse.SERVING
    with Client(sp.target) as client:
        out = client.infer("mlp", {"INPUT0": np.ones((2, 256), np.float32)})
    assert out["OUTPUT0"].shape == (2, 256)


async def test_the_ipv6_wildcard_serves_both_families_on_grpc_and_metrics_alike(serve, caplog):
    import urllib.request

    caplog.set_level(logging.WARNING, logger="wok")
    async with serve(models=("mlp",), host="::", metrics_host="[::]") as server:
        for host in ("127.0.0.1", "[::1]"):
            url = f"http://{host}:{server.http.port}/metrics"
            body = (await asyncio.to_thread(urllib.request.urlopen, url, timeout=10)).read().decode()
            assert "wok_batch_size" in body, host
            async with AsyncClient(f"{host}:{server.port}") as client:
                assert await client.server_live(timeout=CALL_S), host
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name == "wok"]
    assert warned[0].startswith("gRPC listens on [::] without TLS")
    assert warned[2].startswith("/metrics listens on [::]: plain HTTP")


TAKEN = "test_a_port_already_taken_is_named_in_the_error_and_the_exit_status_is_1"


@pytest.fixture(scope="module", autouse=True)
def _port_taken_serve(request):
    """For TAKEN, if selected: a port taken (bound and listening), and `wok serve` started on it as
    the module begins, so that its imports overlap the module's other tests. It is its test's own;
    the port stays taken until the module ends. (port, the process)."""
    if not any(
        getattr(item, "module", None) is request.module and item.originalname == TAKEN for item in request.session.items
    ):
        yield None
        return
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.Popen(
            [sys.executable, "-m", "wok", "serve", "--models", "mlp", "--port", str(port), "--metrics-port", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            yield port, proc
        finally:
            if proc.returncode is None:  # its test, which waits for it, did not run
                proc.kill()
                proc.communicate()


async def test_a_port_already_taken_is_named_in_the_error_and_the_exit_status_is_1(_port_taken_serve):
    from wok.app import WokServer, build_repository

    # `wok serve` itself for one case (started by the fixture, on a port it holds): its words and
    # exit status for a start that fails. The other causes reach it through the same StartError,
    # so they are checked on a server in this process (a child costs seconds of imports and a
    # model load each).
    port, proc = _port_taken_serve
    cases = {
        ("health port", "the port is in use"): {"metrics_port": 0, "health_port": port},
        ("metrics port", "the port is in use by another socket (EADDRINUSE"): {"metrics_port": port},
        # A host name that does not resolve: its cause in words (it read "unknown error -2").
        "unresolved": {"metrics_port": 0, "metrics_host": "nosuchhost.invalid"},
    }
    errs = {}
    for case, values in cases.items():
        settings = server_settings(grpc_port=0, demo_models=("mlp",), **values)
        server = WokServer(settings, build_repository(settings))
        try:
            with pytest.raises(OSError) as info:
                await server.start()
        finally:
            await server.stop(grace=0)
        errs[case] = str(info.value)
    _, err = await asyncio.to_thread(proc.communicate, timeout=120)
    assert proc.returncode == 1, err
    assert f"wok: cannot start: cannot bind the gRPC port to 127.0.0.1:{port}: the port is in use" in err, err
    unresolved = errs.pop("unresolved")
    for (name, cause), msg in errs.items():
        assert f"cannot bind the {name} to 127.0.0.1:{port}: {cause}" in msg, msg
    assert "cannot bind the metrics port to nosuchhost.invalid:0: " in unresolved, unresolved
    # Its words depend on the resolver ("name or service not known", "temporary failure in name
    # resolution"); strerror's number-only fallback is what must not appear.
    assert "unknown error" not in unresolved and re.search(r"nosuchhost\.invalid:0: [a-z]", unresolved), unresolved


async def test_binding_beyond_loopback_without_protection_is_logged(serve, caplog):
    caplog.set_level(logging.WARNING, logger="wok")
    async with serve(models=("mlp",), host="0.0.0.0", metrics_host="0.0.0.0"):
        pass
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name == "wok"]
    assert len(warned) == 3, warned
    assert warned[0].startswith("gRPC listens on 0.0.0.0 without TLS")
    assert warned[2].startswith("/metrics listens on 0.0.0.0")


# -- where model code comes from ---------------------------------------------------------------
PROBE = textwrap.dedent(
    """
    import os
    from pathlib import Path

    Path(os.environ["WOK_PROBE_MARKER"]).write_text("imported")


    def build():
        raise RuntimeError("never built")
    """
)


@pytest.fixture
def probe(tmp_path, monkeypatch) -> Path:
    """A module `wok_probe_evil` on sys.path and in the current folder (as a model folder too),
    which writes a marker file if anything imports it."""
    marker = tmp_path / "imported"
    monkeypatch.setenv("WOK_PROBE_MARKER", str(marker))
    code = tmp_path / "code"
    (code / "evil").mkdir(parents=True)
    (code / "wok_probe_evil.py").write_text(PROBE)
    (code / "evil" / "wok_probe_evil.py").write_text(PROBE)
    (code / "evil" / "config.toml").write_text(
        'platform = "python"\nfactory = "wok_probe_evil:build"\nmax_batch_size = 1\n'
        '[[inputs]]\nname = "I"\ndatatype = "FP32"\ndims = [1]\n'
        '[[outputs]]\nname = "O"\ndatatype = "FP32"\ndims = [1]\n'
    )
    monkeypatch.syspath_prepend(str(code))
    monkeypatch.chdir(code)
    return marker


async def test_no_request_and_no_stray_file_makes_the_server_import_code(serve, probe):
    async with serve(models=("mlp",)) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            for name in ("wok_probe_evil", "wok_probe_evil:build", "evil", "./evil", "../code/evil", "this"):
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.ModelInfer(encode_request(name, {"I": np.ones((1, 1), np.float32)}), timeout=CALL_S)
                assert info.value.code() == grpc.StatusCode.NOT_FOUND
                for call, request in (
                    (stub.ModelMetadata, pb.ModelMetadataRequest),
                    (stub.ModelConfig, pb.ModelConfigRequest),
                ):
                    with pytest.raises(grpc.aio.AioRpcError) as info:
                        await call(request(name=name), timeout=CALL_S)
                    assert info.value.code() == grpc.StatusCode.NOT_FOUND
            # V2's repository-control calls are not served: nothing loads a model at run time.
            for method in ("RepositoryModelLoad", "RepositoryModelUnload"):
                call = channel.unary_unary(f"/inference.GRPCInferenceService/{method}")
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await call(b"", timeout=CALL_S)
                assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
            index = await stub.RepositoryIndex(pb.RepositoryIndexRequest(), timeout=CALL_S)
            assert [m.name for m in index.models] == ["mlp"]
    assert not probe.exists()
    assert "wok_probe_evil" not in sys.modules


def test_demo_model_names_never_import_a_module(probe):
    from wok.app import build_repository

    with pytest.raises(ValueError, match="unknown demo model 'wok_probe_evil'"):
        build_repository(server_settings(demo_models=("wok_probe_evil",)))
    assert not probe.exists()


def test_factory_names_cannot_leave_the_repository(probe):
    base = {
        "name": "m",
        "platform": "python",
        "max_batch_size": 1,
        "inputs": [{"name": "I", "datatype": "FP32", "dims": [1]}],
        "outputs": [{"name": "O", "datatype": "FP32", "dims": [1]}],
    }
    # Before this check, '..x' became the path '//x.py' (the file system's root) and
    # '...tmp.x' became '/tmp/x.py'.
    for factory in ("..wok_probe_evil:build", "...code.wok_probe_evil:build", "/abs/path:build", "a/b:c", "a.:b"):
        with pytest.raises(ConfigError) as info:
            model_config_from_dict({**base, "factory": factory}, "cfg")
        assert "factory: expected 'module:callable' with a dotted module name, such as 'model:build' or " in str(
            info.value
        ), factory
        assert str(info.value).endswith(f"; got {quoted_name(factory)}"), factory
    for factory in ("model:build", "pkg.models_2:build_it", "_x:_y"):
        assert model_config_from_dict({**base, "factory": factory}, "cfg").factory == factory
    assert not probe.exists()


def test_a_repository_imports_only_from_its_own_folders(probe, tmp_path):
    from wok.repository import ModelRepository

    # The explicitly configured repository is the one place model code comes from: the
    # probe's folder is served only when it is (part of) the repository given.
    with pytest.raises(ConfigError, match="has no model folders"):
        ModelRepository.from_directory(tmp_path / "code" / "evil")
    assert not probe.exists()
    with pytest.raises(ConfigError, match=r"config\.toml: factory 'wok_probe_evil:build' failed"):
        ModelRepository.from_directory(tmp_path / "code")
    assert probe.read_text() == "imported"


# -- the same server, the command line, tritonclient and the bench ------------------------------
@pytest.fixture(scope="module", autouse=True)
def _servers_starting(start_server_module, pki):
    """Starts the module's `wok serve` processes at once as the module begins (each start is
    mostly a process's imports), while the in-process tests run: two alike with TLS and tokens,
    one with the defaults, one on IPv6 loopback. No test stops or reconfigures them."""
    from concurrent.futures import ThreadPoolExecutor

    secured = ["--tls-cert", str(pki.path("ca-server.pem")), "--tls-key", str(pki.path("ca-server.key"))]
    secured += ["--auth-token-file", str(pki.path("tokens")), "--health-port", "0"]
    flags = {
        "secured": secured,
        "secured-2": secured,
        "plain": [],
        "ipv6": ["--host", "::1", "--metrics-host", "[::1]", "--health-port", "0"],
    }
    with ThreadPoolExecutor(len(flags)) as ex:
        yield {name: ex.submit(start_server_module, "--models", "mlp", *f) for name, f in flags.items()}


@pytest.fixture(scope="module")
def servers(_servers_starting) -> dict:
    return {name: started.result() for name, started in _servers_starting.items()}


@pytest.fixture(scope="module")
def secured_server(servers):
    return servers["secured"]


def test_wok_serve_flags_turn_on_tls_and_tokens(secured_server, pki):
    # Printed after the ready line, so waited for: the fixture returns at the ready line.
    assert secured_server.wait_for_line("wok: gRPC security: ") == "wok: gRPC security: TLS, bearer token required"
    # The plaintext health port a kubelet probe can reach, printed with the port it got.
    line = secured_server.wait_for_line("wok: health (plaintext) on ")
    with grpc.insecure_channel(line.rsplit(" ", 1)[1]) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=CALL_S)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    with Client(secured_server.target, tls=pki.tls(), token=TOKEN_A) as client:
        assert client.infer("mlp", {"INPUT0": X}, timeout=CALL_S)["OUTPUT0"].shape == (1, 256)
    with Client(secured_server.target, retries=False) as plaintext:
        with pytest.raises(InferError) as info:
            plaintext.server_live(timeout=CALL_S)
        assert info.value.code == grpc.StatusCode.UNAVAILABLE


def test_failed_handshakes_do_not_fill_the_servers_log(servers, pki):
    # gRPC core logged each at INFO, a line per connection ("Handshake failed with error
    # SSL_ERROR_SSL: ... WRONG_VERSION_NUMBER"): 300 plaintext connections, 300 lines in 0.2 s.
    sp = servers["secured-2"]
    for _ in range(20):
        with socket.create_connection((sp.host, sp.port), timeout=CALL_S) as s:
            s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            s.recv(100)  # the server's end of it: the handshake has failed by then
    # A TLS server name the certificate does not list: gRPC logged it at ERROR, as sent.
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    for _ in range(5):
        with socket.create_connection((sp.host, sp.port), timeout=CALL_S) as s:
            with context.wrap_socket(s, server_hostname="not-in-the-certificate.example"):
                pass
    with Client(sp.target, tls=pki.tls(), token=TOKEN_A) as client:  # and it keeps serving
        assert client.infer("mlp", {"INPUT0": X}, timeout=CALL_S)["OUTPUT0"].shape == (1, 256)
    with sp.lines:  # the lines come on the server's stderr, read by a thread: give them a moment
        sp.lines.wait_for(lambda: any(_grpc_core_line(line) for line in sp.log), timeout=1.5)
    assert not [line for line in sp.log if _grpc_core_line(line)], "\n".join(sp.log[-5:])


def _grpc_core_line(line: str) -> bool:
    return "Handshake failed" in line or "not-in-the-certificate" in line or "ssl_transport_security" in line


def test_wok_serve_refuses_bad_security_options_with_exit_2(pki, tmp_path):
    cmd = [sys.executable, "-m", "wok", "serve", "--port", "0", "--models", "mlp"]
    # The two token sources are checked field by field, so one start names both; the TLS pair is
    # checked only once every field is valid, so it needs a start of its own.
    cases = {
        ("--tls-cert", str(pki.path("ca-server.pem"))): ["wok: --tls-cert is given without --tls-key"],
        ("--auth-token-file", str(tmp_path / "none"), "--auth-token-env", "WOK_TEST_UNSET_TOKENS"): [
            f"{tmp_path / 'none'} does not exist",
            "environment variable WOK_TEST_UNSET_TOKENS is not set",
        ],
    }
    env = {k: v for k, v in os.environ.items() if k != "WOK_TEST_UNSET_TOKENS"}
    # All at once: each is a process's imports, then the refusal.
    procs = [
        (messages, subprocess.Popen([*cmd, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
        for args, messages in cases.items()
    ]
    for messages, proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 2, err
        for message in messages:
            assert message in err, err


TRITON_PEER = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    target, ca, token = sys.argv[1], sys.argv[2], sys.stdin.read().strip()
    client = grpcclient.InferenceServerClient(target, ssl=True, root_certificates=ca)
    headers = {"authorization": f"Bearer {token}"}
    x = np.linspace(-1, 1, 256, dtype=np.float32).reshape(1, 256)
    inp = grpcclient.InferInput("INPUT0", [1, 256], "FP32")
    inp.set_data_from_numpy(x)
    out = {"live": client.is_server_live(headers=headers)}
    result = client.infer("mlp", [inp], headers=headers, client_timeout=60)
    out["output"] = result.as_numpy("OUTPUT0").tolist()
    try:
        client.infer("mlp", [inp], client_timeout=60)
        out["without_token"] = "accepted"
    except InferenceServerException as exc:
        out["without_token"] = [exc.status(), exc.message()]
    print(json.dumps(out))
    """
)


def test_unmodified_tritonclient_reaches_the_tls_and_token_server(secured_server, pki, tmp_path):
    peer = tmp_path / "peer.py"
    peer.write_text(TRITON_PEER)
    # The token goes through stdin: never on a command line.
    proc = subprocess.run(
        [sys.executable, str(peer), secured_server.target, str(pki.path("ca.pem"))],
        input=TOKEN_B,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["live"] is True
    with Client(secured_server.target, tls=pki.tls(), token=TOKEN_A) as client:
        expected = client.infer("mlp", {"INPUT0": X}, timeout=CALL_S)["OUTPUT0"]
    np.testing.assert_allclose(np.array(out["output"], np.float32), expected, rtol=1e-5, atol=1e-6)
    assert out["without_token"][0] == "StatusCode.UNAUTHENTICATED"
    assert out["without_token"][1] == MISSING


def test_bench_ramp_over_tls_with_a_token_and_without_one(secured_server, pki, tmp_path, monkeypatch):
    from wok.__main__ import main

    out = tmp_path / "ramp.json"
    common = ["bench", "ramp", "--target", secured_server.target, "--model", "mlp", "--steps", "20"]
    common += ["--step-duration", "0.5s", "--warmup", "0.2s", "--workers", "1", "--metrics-url", "none"]
    common += ["--tls-ca", str(pki.path("ca.pem"))]
    monkeypatch.setenv("WOK_TEST_BENCH_TOKEN", TOKEN_A)
    assert main([*common, "--token-env", "WOK_TEST_BENCH_TOKEN", "--json", str(out)]) == 0
    text = out.read_text()
    result = json.loads(text)
    assert result["steps"][0]["success_rate"] == 1.0
    assert (result["config"]["tls"], result["config"]["token"]) == ("tls", True)
    assert TOKEN_A not in text and "BEGIN" not in text
    # Without the token the ramp cannot even read the model's metadata.
    assert main(common) == 1
    # A wrong option combination is a usage error.
    assert main([*common, "--token-env", "WOK_TEST_BENCH_TOKEN", "--token-file", str(pki.path("tokens"))]) == 2


def test_bench_ramp_over_tls_to_two_servers_on_grpcs_balancer(servers, pki, tmp_path, monkeypatch):
    # The bench's setup client and its workers each open one channel over both servers: both
    # check the certificates against the first target's host.
    from wok.__main__ import main

    secured_server, second = servers["secured"], servers["secured-2"]
    out = tmp_path / "ramp.json"
    argv = ["bench", "ramp", "--target", f"{secured_server.target},{second.target}", "--balancer", "grpc"]
    argv += ["--model", "mlp", "--steps", "20", "--step-duration", "0.5s", "--warmup", "0.2s", "--workers", "1"]
    argv += ["--metrics-url", "none", "--tls-ca", str(pki.path("ca.pem")), "--token-env", "WOK_TEST_BENCH_TOKEN"]
    monkeypatch.setenv("WOK_TEST_BENCH_TOKEN", TOKEN_A)
    assert main([*argv, "--json", str(out)]) == 0
    (step,) = json.loads(out.read_text())["steps"]
    assert step["success_rate"] == 1.0 and step["requests"] > 0
