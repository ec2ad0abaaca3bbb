"""wok.accept: extra tasks accepting a registered unary method's calls beside grpc.aio's own.

A real grpc.aio server on a loopback port, on asyncio's loop and on uvloop; each test ends
with the tasks gone and no call left in flight. Whether a call was taken by an extra task or
by grpc.aio's chain is the tasks' own count (`accepted`): the extra tasks ask for the next
call in about two loop passes against grpc.aio's five, so under a burst they take most.
"""

from __future__ import annotations

import asyncio
import types

import grpc
import pytest

from wok.accept import CHECKED_GRPCIO, AcceptTasks, grpcio_unchecked, unsupported_reason
from wok.ports import bind_error

LOOPS = ("asyncio", "uvloop")
SERVICE = "wok.test.Echo"
METHOD = f"/{SERVICE}/Echo"
CALLS = 120


async def ended_by_themselves(accept: AcceptTasks) -> None:
    """The server's stop fails the requests the tasks wait on: each ends, none needs cancelling."""
    await asyncio.wait_for(asyncio.gather(*accept._chains), 5)
    assert not any(c.cancelled() for c in accept._chains)


async def echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    if request.startswith(b"bad"):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"echo: {request.decode()} is not allowed")
    await asyncio.sleep(0)
    return request[::-1]


class NeedsToken(grpc.aio.ServerInterceptor):
    """Refuses every call without metadata x-token: ok, before its handler runs."""

    def __init__(self) -> None:
        async def refuse(request, context):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "x-token missing")

        self.refused = 0
        self._refuse = grpc.unary_unary_rpc_method_handler(refuse)

    async def intercept_service(self, continuation, details):
        if ("x-token", "ok") in tuple(details.invocation_metadata or ()):
            return await continuation(details)
        self.refused += 1
        return self._refuse


async def registered_server(handler, interceptors=(), start=True) -> tuple[grpc.aio.Server, int]:
    """A grpc.aio server on a loopback port with `handler` registered as METHOD (and as a generic handler)."""
    server = grpc.aio.server(interceptors=list(interceptors) or None)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {"Echo": handler}),))
    server.add_registered_method_handlers(SERVICE, {"Echo": handler})
    port = server.add_insecure_port("127.0.0.1:0")
    if start:
        await server.start()
    return server, port


async def echo_server(tasks: int, interceptors=()) -> tuple[grpc.aio.Server, AcceptTasks, int]:
    handler = grpc.unary_unary_rpc_method_handler(echo)
    server, port = await registered_server(handler, interceptors)
    accept = AcceptTasks(server, {METHOD: handler}, tasks, interceptors)
    accept.start()
    return server, accept, port


async def stop(server: grpc.aio.Server, accept: AcceptTasks) -> None:
    await server.stop(None)
    await ended_by_themselves(accept)
    await accept.stop()
    assert accept.running == 0
    assert not accept._calls, "a call accepted by an extra task is still in flight"


@pytest.mark.parametrize("loop", LOOPS)
def test_a_burst_is_answered_call_by_call_with_most_taken_by_the_extra_tasks(run_on, loop):
    async def main():
        server, accept, port = await echo_server(tasks=4)
        try:
            assert accept.unsupported is None and accept.running == 4
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                call = channel.unary_unary(METHOD)
                payloads = [f"req-{i}".encode() for i in range(CALLS)]
                answers = await asyncio.gather(*(call(p, timeout=10) for p in payloads))
                assert answers == [p[::-1] for p in payloads]
                # A call the handler aborts gets its own status; the rest of the burst is unaffected.
                results = await asyncio.gather(
                    *(call(b"bad-%d" % i if i % 3 == 0 else b"fine", timeout=10) for i in range(30)),
                    return_exceptions=True,
                )
            for i, r in enumerate(results):
                if i % 3 == 0:
                    assert isinstance(r, grpc.aio.AioRpcError)
                    expected = (grpc.StatusCode.INVALID_ARGUMENT, f"echo: bad-{i} is not allowed")
                    assert (r.code(), r.details()) == expected
                else:
                    assert r == b"enif"
            taken = sum(accept.accepted[METHOD])
            assert (CALLS + 30) // 2 < taken <= CALLS + 30  # most: two passes per accept against five
            assert all(n > 0 for n in accept.accepted[METHOD]), accept.accepted  # every task takes calls
        finally:
            await stop(server, accept)

    run_on(loop, main())


@pytest.mark.parametrize("loop", LOOPS)
def test_the_servers_interceptors_run_for_calls_the_extra_tasks_take(run_on, loop):
    async def main():
        guard = NeedsToken()
        server, accept, port = await echo_server(tasks=4, interceptors=[guard])
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                call = channel.unary_unary(METHOD)
                refused = await asyncio.gather(*(call(b"x", timeout=10) for _ in range(CALLS)), return_exceptions=True)
                assert all(isinstance(r, grpc.aio.AioRpcError) for r in refused)
                refusal = (grpc.StatusCode.UNAUTHENTICATED, "x-token missing")
                assert {(r.code(), r.details()) for r in refused} == {refusal}
                assert guard.refused == CALLS
                assert sum(accept.accepted[METHOD]) > 0
                before = sum(accept.accepted[METHOD])
                token = (("x-token", "ok"),)
                ok = await asyncio.gather(*(call(b"abc", timeout=10, metadata=token) for _ in range(CALLS)))
                assert ok == [b"cba"] * CALLS
                assert sum(accept.accepted[METHOD]) > before
        finally:
            await stop(server, accept)

    run_on(loop, main())


async def test_calls_in_flight_at_a_graceful_stop_are_answered_and_the_tasks_end():
    gate, all_in = asyncio.Event(), asyncio.Event()
    entered = 0

    async def held(request: bytes, context) -> bytes:
        nonlocal entered
        entered += 1
        if entered == 20:
            all_in.set()
        await gate.wait()
        return request

    handler = grpc.unary_unary_rpc_method_handler(held)
    server, port = await registered_server(handler)
    accept = AcceptTasks(server, {METHOD: handler}, 2)
    accept.start()
    try:
        # The answers are written after the stop's final GOAWAY, and gRPC's core closes the server's socket
        # as soon as the last one is written. A client frame it has not read by then makes that close a TCP
        # reset, which drops the answers still in the socket's send queue: with BDP probing on (the default),
        # the first answer makes the client send a ping, and 3-10% of runs on a 2-core host lost answers that way
        # (UNAVAILABLE "recvmsg:Connection reset by peer ... GOAWAY received"), with or without the extra
        # tasks. Without the probe the client sends nothing once the final GOAWAY is out.
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.http2.bdp_probe", 0)]) as channel:
            calls = [asyncio.ensure_future(channel.unary_unary(METHOD)(b"%d" % i, timeout=10)) for i in range(20)]
            await asyncio.wait_for(all_in.wait(), 10)
            stopping = asyncio.ensure_future(server.stop(grace=10))
            await asyncio.sleep(0.05)
            assert not stopping.done()  # the grace period waits for the held calls
            gate.set()
            assert await asyncio.gather(*calls) == [b"%d" % i for i in range(20)]
            await stopping
        await ended_by_themselves(accept)
    finally:
        gate.set()
        await server.stop(None)
        await accept.stop()
    assert accept.running == 0 and not accept._calls
    assert sum(accept.accepted[METHOD]) > 0


async def test_without_grpcio_internals_it_stays_off_and_grpc_aio_serves_alone(caplog):
    handler = grpc.unary_unary_rpc_method_handler(echo)
    server, port = await registered_server(handler)
    try:
        assert unsupported_reason(server) is None  # this grpcio has them
        other = types.SimpleNamespace(_MethodResolver=object, _handle_rpc=lambda method_name: None)
        reason = unsupported_reason(server, other)
        assert reason.endswith(
            "_handle_rpc: expected parameters ('method_name', 'method_resolver', 'interceptors', 'rpc_state', "
            "'loop', 'concurrency_exceeded'); got ('method_name',)"
        )
        assert "has no _MethodResolver" in unsupported_reason(server, types.SimpleNamespace())
        assert "has no AioServer._request_registered_call" in unsupported_reason(types.SimpleNamespace())
        accept = AcceptTasks(server, {METHOD: handler}, 4)
        accept.start(cygrpc=other)
        assert accept.unsupported == reason and accept.running == 0
        assert any("extra accept tasks off" in r.getMessage() for r in caplog.records)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            assert await channel.unary_unary(METHOD)(b"ab", timeout=10) == b"ba"
        assert accept.accepted[METHOD] == [0, 0, 0, 0]
    finally:
        await server.stop(None)
        await accept.stop()


async def test_only_checked_grpcio_versions_and_a_started_server():
    assert grpcio_unchecked() is None  # the installed grpcio: when this fails, read its aio server first
    checked = ", ".join(CHECKED_GRPCIO)
    assert grpcio_unchecked("1.86.0") == f"grpcio 1.86.0 is not among the versions checked ({checked})"
    handler = grpc.unary_unary_rpc_method_handler(echo)
    server, port = await registered_server(handler, start=False)
    assert unsupported_reason(server, version="1.86.0").startswith("grpcio 1.86.0 is not among")
    accept = AcceptTasks(server, {METHOD: handler}, 2)
    with pytest.raises(RuntimeError, match=r"^start the gRPC server before its AcceptTasks$"):
        accept.start()
    assert accept.running == 0
    # grpc.aio's stop does nothing to a server never started: its port stayed bound until the process ended.
    await server.start()
    await server.stop(None)
    assert bind_error("127.0.0.1", port) is None, "the server's port is still bound after its stop"


def test_arguments_are_checked():
    with pytest.raises(ValueError, match=r"^tasks_per_method: expected >= 0; got -1$"):
        AcceptTasks(None, {}, -1)
    with pytest.raises(ValueError, match=r"^method name: expected '/package\.Service/Method'; got 'Echo'$"):
        AcceptTasks(None, {"Echo": None}, 1)


async def test_zero_tasks_start_nothing():
    accept = AcceptTasks(None, {METHOD: None}, 0)
    accept.start()
    assert accept.running == 0 and accept.unsupported is None
    await accept.stop()


async def test_a_method_the_server_did_not_register_ends_its_tasks_with_an_error(caplog):
    handler = grpc.unary_unary_rpc_method_handler(echo)
    server, port = await registered_server(handler)
    accept = AcceptTasks(server, {f"/{SERVICE}/Other": handler}, 2)
    try:
        accept.start()
        await asyncio.wait_for(asyncio.gather(*accept._chains), 10)
        assert accept.running == 0
        errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert len(errors) == 2 and all(f"for /{SERVICE}/Other ended: KeyError" in m for m in errors), errors
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            assert await channel.unary_unary(METHOD)(b"ab", timeout=10) == b"ba"  # grpc.aio's chain still serves
    finally:
        await server.stop(None)
        await accept.stop()
