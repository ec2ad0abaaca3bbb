"""A request of millions of typed values leaves the event loop to the other requests while it is read."""

from __future__ import annotations

import asyncio
import textwrap
import time

import grpc
import numpy as np
import pytest

from wok.codec import CONTENTS_CHUNK, decode_request, decode_response
from wok.v2pb import grpc_service_pb2 as pb

N = 1 << 22  # UINT8 values: ~0.2 s to read one by one on this machine, in 64 chunks

MODEL = textwrap.dedent(
    """
    import torch
    from torch import nn


    class Total(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.double().sum(dim=1, keepdim=True).float()


    def build() -> nn.Module:
        return Total()
    """
)

CONFIG = textwrap.dedent(
    f"""
    platform = "python"
    factory = "model:build"
    max_batch_size = 1

    [[inputs]]
    name = "X"
    datatype = "UINT8"
    dims = [{N}]

    [[outputs]]
    name = "TOTAL"
    datatype = "FP32"
    dims = [1]

    [dynamic_batching]
    max_queue_delay_ms = 0

    [instances]
    devices = ["cpu"]
    """
)


async def test_a_request_of_millions_of_typed_values_does_not_hold_the_event_loop_while_it_is_read(serve, tmp_path):
    (tmp_path / "repo" / "big").mkdir(parents=True)
    (tmp_path / "repo" / "big" / "model.py").write_text(MODEL)
    (tmp_path / "repo" / "big" / "config.toml").write_text(CONFIG)
    x = (np.arange(N) % 251).astype(np.uint8)
    req = pb.ModelInferRequest(model_name="big")
    req.inputs.add(name="X", datatype="UINT8", shape=[1, N]).contents.uint_contents.extend(x.tolist())
    payload = req.SerializeToString()  # sent as bytes: the client's own serialization is not on the loop

    async with serve(repository=tmp_path / "repo") as server:
        servable = server.runtimes["big"].servable
        t0 = time.perf_counter()
        # Parsed and read in one piece, as every request was: how long the loop was held before.
        decode_request(pb.ModelInferRequest.FromString(payload), servable, server.settings.max_request_bytes)
        whole_s = time.perf_counter() - t0

        gaps = []
        done = asyncio.Event()

        async def beside():  # the loop's other work: how long it waits for a turn
            last = time.perf_counter()
            while not done.is_set():
                await asyncio.sleep(0)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            infer = ch.unary_unary(
                "/inference.GRPCInferenceService/ModelInfer",
                request_serializer=None,
                response_deserializer=pb.ModelInferResponse.FromString,
            )
            task = asyncio.ensure_future(beside())
            try:
                resp = await infer(payload)
            finally:
                done.set()
                await task
    assert decode_response(resp)["TOTAL"].tolist() == [[np.float32(x.sum(dtype=np.int64)).item()]]
    # What remains of the request on the loop in one piece is protobuf's parse (~10 ns a value
    # against ~40 to read one, and ~10 more for the size check).
    longest = max(gaps)
    assert longest < whole_s / 2, f"the loop waited {longest * 1e3:.1f} ms; a whole read takes {whole_s * 1e3:.1f} ms"


async def test_a_request_being_read_when_the_stop_begins_is_refused_at_its_next_chunk(serve, tmp_path):
    (tmp_path / "repo" / "big").mkdir(parents=True)
    (tmp_path / "repo" / "big" / "model.py").write_text(MODEL)
    (tmp_path / "repo" / "big" / "config.toml").write_text(CONFIG)
    req = pb.ModelInferRequest(model_name="big")
    req.inputs.add(name="X", datatype="UINT8", shape=[1, N]).contents.uint_contents.extend([1] * N)
    payload = req.SerializeToString()

    async with serve(repository=tmp_path / "repo") as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            infer = ch.unary_unary(
                "/inference.GRPCInferenceService/ModelInfer",
                request_serializer=None,
                response_deserializer=pb.ModelInferResponse.FromString,
            )
            call = asyncio.ensure_future(infer(payload))
            while server.service.active == 0:  # its handler has begun; it waits a turn before the decode
                await asyncio.sleep(0)
            for _ in range(3):  # past its check of the stop, its first chunk read
                await asyncio.sleep(0)
            stop = asyncio.ensure_future(server.stop(grace=5.0))
            turns = 0
            while server.service.active:  # until the handler has its answer (not the client: the
                await asyncio.sleep(0)  # transport's turns would count too)
                turns += 1
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call
            await stop
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "shutting down" in info.value.details()
    # 63 chunks, a turn each, were left to read: the stop waited for them before it ended the call.
    assert turns < N // CONTENTS_CHUNK // 2, f"the refusal took {turns} turns of the loop"
