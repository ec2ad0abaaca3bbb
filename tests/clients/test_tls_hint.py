"""A plaintext client at a TLS-only port: its UNAVAILABLE says that the server may speak TLS.

The server closes such a connection before HTTP/2 begins, and gRPC says only "Socket closed";
the clients add a hint (errors.PLAINTEXT_HINT) where they are plaintext and nothing was answered
on their channel yet, and `wok bench ramp` one in its own options. A closed port, a TLS client and
a channel that has had an answer get none. The certificates are test_security's (its `pki`).
"""

from __future__ import annotations

import asyncio
import importlib.util
import pickle
import socket
import sys
from pathlib import Path

import grpc
import numpy as np
import pytest

from wok.clients import AsyncClient, Client, InferError
from wok.clients.errors import PLAINTEXT_HINT, Answers

_spec = importlib.util.spec_from_file_location(
    "wok_tls_hint_security", Path(__file__).parents[1] / "integration" / "test_security.py"
)
_security = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = _security  # its dataclass looks its module up there
_spec.loader.exec_module(_security)
pki = _security.pki  # the module's fixture: a CA, a server certificate for 127.0.0.1, one from another CA

pytestmark = pytest.mark.timeout(120)
CODE = grpc.StatusCode
CALL_S = 30.0
X = np.zeros((1, 256), dtype=np.float32)
BENCH_HINT = (
    "(the server closed the connection before gRPC began: a TLS-only server (the bench connected in plaintext: "
    "give --tls-ca PATH, or --tls to trust gRPC's bundled roots), or no gRPC server behind the port)"
)


def closed(port: int) -> str:
    return f"connections to all backends failing; last error: UNAVAILABLE: ipv4:127.0.0.1:{port}: Socket closed"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sync_error(target: str, call, **client) -> InferError:
    with Client(target, **client) as c, pytest.raises(InferError) as info:
        call(c)
    return info.value


def async_error(target: str, call, **client) -> InferError:
    async def run() -> InferError:
        async with AsyncClient(target, **client) as c:
            with pytest.raises(InferError) as info:
                await call(c)
        return info.value

    return asyncio.run(run())


async def _stream(c: AsyncClient) -> None:
    async for _ in c.stream_infer([("mlp", {"INPUT0": X})], timeout=CALL_S):
        pass


def test_a_plaintext_client_at_a_tls_port_is_told_the_server_may_speak_tls(start_server, pki, capsys, tmp_path):
    from wok.__main__ import main

    server = start_server(
        "--models", "mlp", "--torch-threads", "1",
        "--tls-cert", str(pki.path("ca-server.pem")), "--tls-key", str(pki.path("ca-server.key")),
    )  # fmt: skip
    target = f"127.0.0.1:{server.port}"
    errors = [
        sync_error(target, lambda c: c.server_live(timeout=CALL_S)),
        sync_error(target, lambda c: c.model_metadata("mlp", timeout=CALL_S), retries=False),
        sync_error(target, lambda c: list(c.stream_infer([("mlp", {"INPUT0": X})], timeout=CALL_S))),
        async_error(target, lambda c: c.infer("mlp", {"INPUT0": X}, timeout=CALL_S)),
        async_error(target, lambda c: c.server_ready(timeout=CALL_S), balancer="wok"),
        async_error(target, _stream),
    ]
    for err in errors:
        assert (err.code, err.details, err.hint) == (CODE.UNAVAILABLE, closed(server.port), PLAINTEXT_HINT)
        assert str(err) == (
            f"UNAVAILABLE: {closed(server.port)} (the server closed the connection before gRPC began: a TLS-only "
            "server (this client is plaintext: pass tls=, a wok.clients.TLS with its CA, or True), or no gRPC server "
            "behind the port)"
        )
    # A TLS client that does not trust the certificate fails too, without the hint; one that does is served.
    err = sync_error(target, lambda c: c.server_live(timeout=CALL_S), tls=pki.tls("other-ca.pem"), retries=False)
    assert err.code == CODE.UNAVAILABLE and err.hint == "" and "(this client is plaintext" not in str(err)
    with Client(target, tls=pki.tls()) as c:
        assert c.server_live(timeout=CALL_S)

    argv = ["bench", "ramp", "--target", target, "--model", "mlp", "--steps", "20", "--step-duration", "0.5s"]
    argv += ["--warmup", "0.1s", "--workers", "1", "--metrics-url", "none"]
    assert main(argv) == 1
    assert capsys.readouterr().err.splitlines()[-1] == f"wok bench: UNAVAILABLE: {closed(server.port)} {BENCH_HINT}"
    assert main([*argv, "--tls-ca", str(pki.path("ca.pem")), "--json", str(tmp_path / "r.json")]) == 0, (
        capsys.readouterr().err
    )


def test_a_port_where_nothing_listens_gets_no_hint(capsys):
    from wok.__main__ import main

    port = free_port()
    refused = (
        f"connections to all backends failing; last error: UNKNOWN: ipv4:127.0.0.1:{port}: "
        "Failed to connect to remote host: Connection refused"
    )
    target = f"127.0.0.1:{port}"
    for err in (
        sync_error(target, lambda c: c.server_live(timeout=CALL_S), retries=False),
        async_error(target, lambda c: c.server_live(timeout=CALL_S), retries=False),
    ):
        assert (err.code, err.details, err.hint, str(err)) == (CODE.UNAVAILABLE, refused, "", f"UNAVAILABLE: {refused}")
    argv = ["bench", "ramp", "--target", target, "--model", "mlp", "--steps", "20", "--step-duration", "0.5s"]
    assert main([*argv, "--workers", "1", "--metrics-url", "none"]) == 1
    assert capsys.readouterr().err.splitlines()[-1] == f"wok bench: UNAVAILABLE: {refused}"


class _Failed(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def test_the_hint_is_only_for_a_plaintext_channel_that_never_had_an_answer():
    # A server killed with a call in flight closes the socket too ("Stream removed (Socket closed)").
    dropped = _Failed(CODE.UNAVAILABLE, "Stream removed (Socket closed)")
    assert Answers(plaintext=True).error(dropped).hint == PLAINTEXT_HINT
    assert Answers(plaintext=False).error(dropped).hint == ""  # a TLS client
    answered = Answers(plaintext=True)
    answered.answered = True  # as the clients mark it after a call succeeds or a stream yields
    assert answered.error(dropped).hint == ""
    # A status only a server gives is an answer; the client's own deadline is not.
    waited = Answers(plaintext=True)
    assert waited.error(_Failed(CODE.DEADLINE_EXCEEDED, "Deadline Exceeded")).hint == ""
    assert waited.error(dropped).hint == PLAINTEXT_HINT
    told = Answers(plaintext=True)
    assert told.error(_Failed(CODE.NOT_FOUND, "no model 'x'")).hint == ""
    assert told.error(dropped).hint == ""
    # Not a closed socket: a refused connection, or the server's own UNAVAILABLE.
    for details in ("failed to connect: Connection refused", "mlp is draining"):
        assert Answers(plaintext=True).error(_Failed(CODE.UNAVAILABLE, details)).hint == ""
    err = Answers(plaintext=True).error(dropped)
    assert str(err) == f"UNAVAILABLE: Stream removed (Socket closed) ({PLAINTEXT_HINT})"
    back = pickle.loads(pickle.dumps(err))  # load generators hand errors between processes
    assert (back.code, back.details, back.hint, str(back)) == (err.code, err.details, err.hint, str(err))
