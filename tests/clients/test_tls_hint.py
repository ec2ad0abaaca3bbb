"""A plaintext client at a TLS-only port: its UNAVAILABLE says that the server may speak TLS.

The server closes such a connection before HTTP/2 begins, and gRPC says only "Socket closed";
the clients add a hint (errors.PLAINTEXT_HINT) where they are plaintext and nothing was answered
on their channel yet, and `wok bench ramp` one in its own options. A closed port, a TLS client and
a channel that has had an answer get none. The certificates are test_security's (its `pki`).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import pickle
import signal
import socket
import sys
import threading
import time
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest

from wok.clients import AsyncClient, Client, InferError
from wok.clients.errors import DRAINING_HINT, PLAINTEXT_HINT, Answers

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
    # As a TLS-only port closes a plaintext client's connection (closed()); a server killed with a call in flight
    # says "Stream removed (Socket closed)" instead, and gets no hint (the test below).
    dropped = _Failed(CODE.UNAVAILABLE, closed(8001))
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
    assert str(err) == f"UNAVAILABLE: {closed(8001)} ({PLAINTEXT_HINT})"
    assert Answers(plaintext=True).error(_Failed(CODE.UNAVAILABLE, "Stream removed (Socket closed)")).hint == ""
    back = pickle.loads(pickle.dumps(err))  # load generators hand errors between processes
    assert (back.code, back.details, back.hint, str(back)) == (err.code, err.details, err.hint, str(err))


def _admin_fault(url: str, **fault) -> None:
    body = json.dumps({"model": "mlp", **fault}).encode()
    urllib.request.urlopen(urllib.request.Request(f"{url}/admin/faults", body, {"Content-Type": "application/json"}))


def _slow_call_in_flight(server, call) -> tuple[str, threading.Thread]:
    """`call()` on a thread of its own, once a slow fault of 60 s holds `server`'s mlp, returned when its batch
    runs: the server's metrics URL and the thread."""
    url = server.http_url()
    _admin_fault(url, mode="slow", delay_ms=60000)
    caller = threading.Thread(target=call)
    caller.start()
    deadline = time.monotonic() + CALL_S
    while 'wok_inflight_batches{model="mlp"} 1.0' not in urllib.request.urlopen(f"{url}/metrics").read().decode():
        assert time.monotonic() < deadline, "the call's batch never ran"
        time.sleep(0.05)
    return url, caller


def test_a_server_killed_with_a_first_call_in_flight_gets_no_tls_hint(start_server):
    # The call's stream was open, so gRPC had begun: the socket closed under it ("Stream removed (Socket closed)")
    # says the server went away, not that it speaks TLS; a fresh client (a script's one call) got the TLS hint.
    server = start_server("--models", "mlp", "--torch-threads", "1", "--admin")
    errors: list[InferError] = []
    target = f"127.0.0.1:{server.port}"
    _, caller = _slow_call_in_flight(
        server, lambda: errors.append(sync_error(target, lambda c: c.infer("mlp", {"INPUT0": X}), retries=False))
    )
    server.proc.kill()
    caller.join(CALL_S)
    [err] = errors
    assert (err.code, err.details, err.hint) == (CODE.UNAVAILABLE, "Stream removed (Socket closed)", "")


def test_a_ramp_at_a_draining_server_says_it_drains_not_that_it_may_speak_tls(start_server, capsys):
    from wok.__main__ import main

    server = start_server("--models", "mlp", "--torch-threads", "1", "--admin", "--grace-period", "60")
    answers = []

    def call() -> None:
        with Client(f"127.0.0.1:{server.port}", retries=False) as c:
            answers.append(c.infer("mlp", {"INPUT0": X}, timeout=CALL_S))

    url, caller = _slow_call_in_flight(server, call)  # holds the drain open
    server.proc.send_signal(signal.SIGTERM)
    with server.lines:  # health says NOT_SERVING from the drain's first moment, which this line follows
        assert server.lines.wait_for(lambda: any("wok: stopping: draining" in line for line in server.log), CALL_S)
    argv = ["bench", "ramp", "--target", f"127.0.0.1:{server.port}", "--model", "mlp", "--steps", "20"]
    assert main([*argv, "--step-duration", "0.5s", "--warmup", "0.1s", "--workers", "1", "--metrics-url", "none"]) == 1
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.endswith(f"backend unhealthy ({DRAINING_HINT})"), last
    _admin_fault(url, mode="off")  # taken through the drain, which then ends
    caller.join(CALL_S)
    assert len(answers) == 1 and server.proc.wait(CALL_S) == 0
