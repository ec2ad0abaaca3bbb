"""A stop under clients that send again at once: every call a handler took gets exactly one answer.

Clients that send each call as the last one ends keep calls arriving through the whole stop. A call whose
`ModelInfer` handler ran is answered: OK if it ran (those the drain held included), UNAVAILABLE "server is
shutting down and accepts no new requests" if it came once the drain had begun. Some calls end CANCELLED: those
that reached gRPC's core as its stop began, before any handler took them (grpc/grpc#41785; README, "Serving").
No handler ran for them, so the server counts none: the codes its handlers gave (`ModelMetrics.responses`) must
equal the codes the clients got for those calls, one for one. A handled call that ended CANCELLED at its client,
or with an answer the client never got, breaks that equality.
"""

from __future__ import annotations

import asyncio
import collections

import grpc
import numpy as np
import pytest

from wok.app import WokServer
from wok.codec import decode_response, encode_request
from wok.config import server_settings
from wok.repository import ModelRepository
from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

from .conftest import gated_servable, until

DRAINING = "server is shutting down and accepts no new requests"
LOOPS = 8  # per model, over CHANNELS channels
CHANNELS = 4
# Refusals the drain must have given the free model's clients before the held batch is let go.
REFUSED_IN_DRAIN = 20


async def _calls_across_a_stop():
    # "held": its batch is held at the gate as the stop begins, so the drain lasts while the "free" model's
    # clients send and are refused; both models' clients go on sending through gRPC's stop.
    held, module = gated_servable(max_batch_size=8, delay_ms=1, name="held", enter_when_closed=True)
    free, _ = gated_servable(max_batch_size=8, delay_ms=1, name="free")
    server = WokServer(server_settings(grpc_port=0, metrics_port=None), ModelRepository([held, free], "test"))
    await server.start()
    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") for _ in range(CHANNELS)]
    ended: dict[str, list[tuple[str, str]]] = {"held": [], "free": []}
    stopped = asyncio.Event()

    async def client(model: str, k: int) -> None:
        stub = pb_grpc.GRPCInferenceServiceStub(channels[k % CHANNELS])
        n = 0
        while not stopped.is_set():
            value = float(1000 * k + n)
            n += 1
            request = encode_request(model, {"INPUT0": np.full((1, 4), value, np.float32)}, request_id=f"{k}-{n}")
            try:
                out = decode_response(await stub.ModelInfer(request, timeout=10))["OUTPUT0"]
            except grpc.aio.AioRpcError as exc:
                ended[model].append((exc.code().name, exc.details()))
                continue
            assert (out == 2 * value).all(), f"{model} call {k}-{n}: not its answer: {out}"
            ended[model].append(("OK", ""))

    def refused(model: str) -> int:
        return sum(1 for code, details in ended[model] if (code, details) == ("UNAVAILABLE", DRAINING))

    clients = [asyncio.ensure_future(client(m, k)) for m in ("held", "free") for k in range(LOOPS)]
    try:
        await until(lambda: all(len(e) >= 3 * LOOPS for e in ended.values()))
        module.gate.clear()
        await until(module.entered.is_set)
        stopping = asyncio.ensure_future(server.stop(grace=10))
        await until(lambda: refused("free") >= REFUSED_IN_DRAIN)
        still_held = server.runtimes["held"].batcher.queued + server.runtimes["held"].batcher.inflight
        module.gate.set()
        await stopping
        stopped.set()
        await asyncio.gather(*clients)
    finally:
        module.gate.set()
        stopped.set()
        for c in clients:
            c.cancel()
        await asyncio.gather(*clients, return_exceptions=True)
        for ch in channels:
            await ch.close()
        await server.stop(grace=5)
    handled = {name: dict(rt.metrics.responses) for name, rt in server.runtimes.items()}
    stats = {name: rt.stats.success.count for name, rt in server.runtimes.items()}
    return ended, handled, stats, still_held


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_every_call_a_handler_took_across_a_stop_gets_its_one_answer(run_on, loop):
    ended, handled, stats, still_held = run_on(loop, _calls_across_a_stop())
    assert still_held > 0, "no request of the held model was waiting as the drain went on"
    for model, calls in ended.items():
        got = collections.Counter(code if details != DRAINING else "UNAVAILABLE (draining)" for code, details in calls)
        # What the handlers gave, as their clients got it: OK, or the drain's refusal. No other code.
        answered = {"OK": got["OK"], "UNAVAILABLE": got["UNAVAILABLE (draining)"]}
        assert handled[model] == {code: n for code, n in answered.items() if n}, (model, handled[model], got)
        assert stats[model] == got["OK"], (model, stats[model], got)
        # The others never reached a handler: cut in gRPC's core as its stop began (CANCELLED), or sent once
        # the port had closed (UNAVAILABLE, the connection's error, not the drain's).
        others = {(code, details) for code, details in calls if code != "OK" and details != DRAINING}
        assert all(code in ("CANCELLED", "UNAVAILABLE") for code, _ in others), others
    assert handled["free"]["UNAVAILABLE"] >= REFUSED_IN_DRAIN, handled
