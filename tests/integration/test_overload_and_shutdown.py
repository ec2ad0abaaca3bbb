"""A full queue rejects at once; SIGTERM drains: every accepted request gets its answer."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest

from wok.codec import decode_request, decode_response, encode_request
from wok.errors import ModelExecutionError
from wok.v2pb import grpc_service_pb2 as pb
from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

from ..conftest import write_python_model


def request(i: int) -> pb.ModelInferRequest:
    return encode_request("slow", {"INPUT0": np.full((1, 4), float(i), np.float32)}, request_id=str(i))


def check_answer(i: int, resp: pb.ModelInferResponse) -> None:
    assert resp.id == str(i)
    np.testing.assert_array_equal(decode_response(resp)["OUTPUT0"], np.full((1, 4), 2.0 * i, np.float32))


async def test_a_burst_over_max_queue_size_is_rejected_at_once_and_the_rest_succeed(
    serve, slow_repository, monkeypatch
):
    from wok import service

    decoded = []

    def counting_decode(request, *args, **kwargs):
        decoded.append(request.id)
        return decode_request(request, *args, **kwargs)

    # A refusal is decided before the request is decoded: under overload it costs no decode.
    monkeypatch.setattr(service, "decode_request", counting_decode)
    repo = slow_repository(sleep_ms=30, max_batch_size=4, delay_ms=1, max_queue_size=8)
    async with serve(repository=repo) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            await stub.ServerReady(pb.ServerReadyRequest())
            results = await asyncio.gather(*(stub.ModelInfer(request(i)) for i in range(64)), return_exceptions=True)
            stats = (await stub.ModelStatistics(pb.ModelStatisticsRequest(name="slow"))).model_stats[0]
    rejected = [r for r in results if isinstance(r, grpc.aio.AioRpcError)]
    others = [r for r in results if isinstance(r, Exception) and not isinstance(r, grpc.aio.AioRpcError)]
    assert not others, others
    assert rejected, "the burst never filled the queue"
    for r in rejected:
        assert r.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert r.details() == "model 'slow' queue is full: 8 requests queued, max_queue_size is 8; retry later"
    accepted = [(i, r) for i, r in enumerate(results) if not isinstance(r, Exception)]
    for i, r in accepted:
        check_answer(i, r)
    assert stats.inference_count == len(accepted) == 64 - len(rejected)
    assert sorted(decoded, key=int) == [str(i) for i, _ in accepted]


HELD_MODEL = """
import sys, time

from torch import nn


class Held(nn.Module):
    # Says on stderr which batch it runs (the warm-up's is zeros), then holds it a while: long
    # enough for the test's signal to land while the batch runs.
    def __init__(self, sleep_ms):
        super().__init__()
        self.sleep_s = sleep_ms / 1e3

    def forward(self, x):
        print(f"test: running {x.flatten()[0].item():g}", file=sys.stderr, flush=True)
        time.sleep(self.sleep_s)
        return x * 2


def build(sleep_ms):
    return Held(sleep_ms)
"""


# Started with SIGHUP ignored, as nohup starts a command (its test reads the dispositions it then has).
NOHUP = ("test_sighup_ignored_at_start_as_under_nohup_stays_ignored", None)
# The signal tests' servers, one each: (test, parameter id) → the slow model's options, and whether
# its model.py is HELD_MODEL (a batch held long enough for the test's signals to land while it runs).
SIGNALLED = {
    NOHUP: ({"sleep_ms": 1}, False),
    # 20 ms per batch of 4: 64 requests need about 0.32 s, so most are queued at the signal.
    ("test_sigterm_mid_burst_answers_every_accepted_request_and_exits_0", None): (
        {"sleep_ms": 20, "max_batch_size": 4, "delay_ms": 1},
        False,
    ),
    ("test_sighup_drains_as_sigterm_does_a_request_in_flight_answered_and_exit_0", None): (
        {"sleep_ms": 1000, "max_batch_size": 4, "delay_ms": 1},
        True,
    ),
    **{
        ("test_only_a_second_sigterm_or_sigint_cuts_the_drain_short", case): (
            {"sleep_ms": 1500, "max_batch_size": 4, "delay_ms": 1},
            True,
        )
        for case in ("hup-term-drains", "hup-int-term-exits", "term-term-exits")
    },
}


def _key(item) -> tuple[str, str | None]:
    callspec = getattr(item, "callspec", None)
    return item.originalname, callspec.id if callspec else None


@pytest.fixture(scope="module")
def signalled(request, tmp_path_factory, start_server_module, write_slow, at_once):
    """A `wok serve` of its own for each selected test of SIGNALLED, all started at once (each start
    is mostly a process's imports), each from a repository of its own written before its start.
    Not autouse: made by the first of those tests, so no start overlaps the module's other tests."""
    selected = {_key(item) for item in request.session.items if getattr(item, "module", None) is request.module}
    args = {}
    for key, (options, held) in SIGNALLED.items():
        if key in selected:
            repo = write_slow(tmp_path_factory.mktemp("signalled") / "repo", **options)
            if held:
                (repo / "slow" / "model.py").write_text(HELD_MODEL)
            grace = () if key == NOHUP else ("--grace-period", "20")
            args[key] = (key == NOHUP, "--model-repository", str(repo), *grace)

    def start(sighup_ignored: bool, *args: str):
        return start_server_module(*args, sighup_ignored=sighup_ignored)

    with at_once(start, args) as servers:
        yield servers


def own_server(signalled, request):
    """The test's own server of `signalled`: no other test sends it anything."""
    key = _key(request.node)
    assert key in signalled, f"{key}: SIGNALLED names no server for this test"
    return signalled[key]


def test_sigterm_mid_burst_answers_every_accepted_request_and_exits_0(signalled, request):
    sp = own_server(signalled, request)
    try:
        results, refused, elapsed = asyncio.run(_burst_then_sigterm(sp))
        code = sp.proc.wait(30)
    finally:
        if sp.proc.poll() is None:
            sp.proc.kill()
    assert code == 0, "\n".join(sp.log[-30:])
    assert elapsed < 20, f"drain took {elapsed:.1f} s, over the grace period"
    for i, r in enumerate(results):
        assert not isinstance(r, Exception), f"request {i} accepted before SIGTERM failed: {r!r}"
        check_answer(i, r)
    # The late call's UNAVAILABLE is the drain's refusal (its handler ran; every run seen), or, the drain over and the
    # port closed before it was sent, the connection's (it reached no handler) — not any UNAVAILABLE.
    connection_refused = (
        f"failed to connect to all addresses; last error: UNKNOWN: ipv4:{sp.target}: "
        "Failed to connect to remote host: Connection refused"
    )
    assert refused.code() == grpc.StatusCode.UNAVAILABLE, refused
    assert refused.details() in ("server is shutting down and accepts no new requests", connection_refused), refused
    assert any("stopping: draining" in line for line in sp.log)


async def _burst_then_sigterm(sp):
    async with grpc.aio.insecure_channel(sp.target) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        calls = [asyncio.ensure_future(stub.ModelInfer(request(i))) for i in range(64)]
        # All 64 are on the wire at once; two finished batches (>= 40 ms later) mean the
        # server has long since taken the rest into its queue.
        while True:
            s = (await stub.ModelStatistics(pb.ModelStatisticsRequest(name="slow"))).model_stats[0]
            if s.inference_count >= 8:
                break
            await asyncio.sleep(0.005)
        sent = time.monotonic()
        sp.proc.send_signal(signal.SIGTERM)
        # Once the server no longer says it is ready (UNAVAILABLE, as Triton's while it exits, or no answer once
        # its port is closed), a new call is refused (UNAVAILABLE), whether the server still drains or has already
        # closed its port.
        refused = None
        try:
            while (await stub.ServerReady(pb.ServerReadyRequest(), timeout=10)).ready:
                await asyncio.sleep(0.002)
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc
        try:
            await stub.ModelInfer(request(999), timeout=10)
        except grpc.aio.AioRpcError as exc:
            refused = exc
        results = await asyncio.gather(*calls, return_exceptions=True)
        elapsed = time.monotonic() - sent
    if refused is None:
        pytest.fail("a request sent after SIGTERM was served")
    return results, refused, elapsed


async def test_a_start_that_fails_in_a_warm_up_leaves_no_model_thread_behind(slow_repository):
    from wok.app import WokServer, build_repository
    from wok.config import server_settings

    repo = slow_repository(sleep_ms=1)
    boom = (
        "from torch import nn\n\n\nclass Boom(nn.Module):\n    def forward(self, x):\n"
        "        raise RuntimeError('warm-up failed')\n\n\ndef build():\n    return Boom()\n"
    )
    # "zboom": after "slow", so one model is running when this one fails.
    write_python_model(repo / "zboom", boom, devices=None)
    s = server_settings(grpc_port=0, model_repository=repo, metrics_port=None)
    server = WokServer(s, build_repository(s))
    with pytest.raises(ModelExecutionError, match="model 'zboom' failed: RuntimeError: warm-up failed"):
        await server.start()
    await server.stop(grace=0)
    left = [t.name for t in threading.enumerate() if t.name.startswith(("wok-zboom", "wok-slow"))]
    assert left == [], left


def test_sighup_drains_as_sigterm_does_a_request_in_flight_answered_and_exit_0(signalled, request):
    # SIGHUP comes when the terminal or ssh session that started the server closes; its default
    # action killed the server at once, with the request in flight lost.
    sp = own_server(signalled, request)
    try:
        result = asyncio.run(_infer_with_hangup(sp))
        code = sp.proc.wait(30)
    finally:
        if sp.proc.poll() is None:
            sp.proc.kill()
    log = "\n".join(sp.log[-30:])
    assert not isinstance(result, Exception), f"the request in flight at SIGHUP failed: {result!r}\n{log}"
    check_answer(7, result)
    assert code == 0, f"expected exit 0 after SIGHUP's drain, as after SIGTERM's; got {code}\n{log}"
    assert "wok: SIGHUP received, stopping" in sp.log, log
    assert any("stopping: draining" in line for line in sp.log), log
    assert "wok: second signal, exiting without draining" not in sp.log, log


async def _infer_with_hangup(sp):
    async with grpc.aio.insecure_channel(sp.target) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        call = asyncio.ensure_future(stub.ModelInfer(request(7), timeout=30))
        await asyncio.to_thread(sp.wait_for_line, "test: running 7")
        # Twice, as a closing terminal sends it to a foreground job (the shell forwards it, then
        # the kernel sends it as the shell exits): a repeated hangup must not cut the drain short.
        sp.proc.send_signal(signal.SIGHUP)
        sp.proc.send_signal(signal.SIGHUP)
        return (await asyncio.gather(call, return_exceptions=True))[0]


def _signal_mask(pid: int, field: str) -> int:
    """A signal mask of /proc/PID/status (SigIgn, SigCgt): bit n-1 is signal n."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1], 16)
    raise AssertionError(f"/proc/{pid}/status: no {field} line")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc/PID/status (Linux)")
def test_sighup_ignored_at_start_as_under_nohup_stays_ignored(signalled, request):
    sp = own_server(signalled, request)  # started with SIGHUP ignored (NOHUP)
    try:
        # Read from the kernel, not by sending SIGHUP: whether a signal was handled would need a wait.
        hup = 1 << (signal.SIGHUP - 1)
        ignored, caught = _signal_mask(sp.proc.pid, "SigIgn"), _signal_mask(sp.proc.pid, "SigCgt")
        assert ignored & hup and not caught & hup, f"SigIgn {ignored:x}, SigCgt {caught:x}: expected SIGHUP ignored"
        sp.proc.send_signal(signal.SIGTERM)
        code = sp.proc.wait(30)
    finally:
        if sp.proc.poll() is None:
            sp.proc.kill()
    log = "\n".join(sp.log[-30:])
    assert code == 0, f"expected exit 0 after SIGTERM's drain; got {code}\n{log}"
    assert "wok: SIGTERM received, stopping" in sp.log, log


@pytest.mark.parametrize(
    ("signals", "expected"),
    [(("SIGHUP", "SIGTERM"), 0), (("SIGHUP", "SIGINT", "SIGTERM"), 1), (("SIGTERM", "SIGTERM"), 1)],
    ids=["hup-term-drains", "hup-int-term-exits", "term-term-exits"],
)
def test_only_a_second_sigterm_or_sigint_cuts_the_drain_short(signalled, request, signals, expected):
    # A process manager stops a server with SIGTERM, often beside the hangup of the terminal that
    # started it, and the kernel hands SIGHUP over first when both are pending: that SIGTERM was
    # taken for an operator's second signal and the server exited 1, its request in flight lost.
    sp = own_server(signalled, request)
    try:
        result = asyncio.run(_infer_with_signals(sp, [getattr(signal, name) for name in signals]))
        code = sp.proc.wait(30)
    finally:
        if sp.proc.poll() is None:
            sp.proc.kill()
    log = "\n".join(sp.log[-30:])
    assert code == expected, f"{' then '.join(signals)}: expected exit {expected}, got {code}\n{log}"
    forced = "wok: second signal, exiting without draining" in sp.log
    assert forced == (expected == 1), log
    if expected == 0:
        assert not isinstance(result, Exception), f"the request in flight failed: {result!r}\n{log}"
        check_answer(7, result)


async def _infer_with_signals(sp, signals):
    async with grpc.aio.insecure_channel(sp.target) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        call = asyncio.ensure_future(stub.ModelInfer(request(7), timeout=30))
        await asyncio.to_thread(sp.wait_for_line, "test: running 7")
        first, *rest = signals
        sp.proc.send_signal(first)
        await asyncio.to_thread(sp.wait_for_line, f"wok: {first.name} received, stopping")
        for i, sig in enumerate(rest):
            sp.proc.send_signal(sig)
            if first == signal.SIGHUP and i == 0:  # taken as the stop: wait until it is, so the next is a second
                await asyncio.to_thread(sp.wait_for_line, f"wok: {sig.name} received, already draining")
        return (await asyncio.gather(call, return_exceptions=True))[0]
