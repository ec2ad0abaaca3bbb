"""Many concurrent requests through a real server: batched, and each answer its own."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import grpc
import numpy as np

from wok.codec import decode_response, encode_request
from wok.v2pb import grpc_service_pb2 as pb
from wok.v2pb import grpc_service_pb2_grpc as pb_grpc


async def test_512_concurrent_requests_match_one_at_a_time_and_are_batched(serve):
    async with serve(models=("mlp",)) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            rng = np.random.default_rng(7)
            xs = rng.standard_normal((512, 256), dtype=np.float32)

            async def one(i: int) -> np.ndarray:
                req = encode_request("mlp", {"INPUT0": xs[i : i + 1]}, request_id=str(i))
                resp = await stub.ModelInfer(req)
                assert resp.id == str(i)
                return decode_response(resp)["OUTPUT0"]

            concurrent = await asyncio.gather(*(one(i) for i in range(512)))
            stats = (await stub.ModelStatistics(pb.ModelStatisticsRequest(name="mlp"))).model_stats[0]
            # A lone request is a batch of one whatever the window; without it, each of these
            # would first wait out mlp's 5 ms for company that never comes.
            batcher = server.runtime("mlp").batcher
            batcher.set_policy(replace(batcher.policy, max_queue_delay_s=0.0))
            sequential = [await one(i) for i in range(512)]

    for i in range(512):
        np.testing.assert_allclose(concurrent[i], sequential[i], rtol=1e-5, atol=1e-6)
    assert stats.inference_count == 512
    mean_batch = stats.inference_count / stats.execution_count
    assert mean_batch >= 8, f"mean batch size {mean_batch:.1f} over {stats.execution_count} batches"
    assert sum(b.compute_infer.count for b in stats.batch_stats) == stats.execution_count
    assert all(b.batch_size <= 32 for b in stats.batch_stats)


async def test_each_demo_model_answers_a_multi_row_request(serve):
    async with serve() as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            ids = np.arange(6, dtype=np.int64).reshape(3, 2)
            cases = {
                "mlp": ({"INPUT0": np.ones((3, 256), np.float32)}, "OUTPUT0", (3, 256)),
                "recsys": ({"dense": np.ones((3, 13), np.float32), "ids": ids}, "score", (3, 1)),
                "encoder": ({"tokens": ids}, "embedding", (3, 128)),
            }
            for model, (inputs, out, shape) in cases.items():
                got = decode_response(await stub.ModelInfer(encode_request(model, inputs)))
                assert got[out].shape == shape and got[out].dtype == np.float32
                assert np.isfinite(got[out]).all()


async def test_3000_calls_in_flight_at_once_all_succeed(serve):
    # gRPC core's own pending-call limit (1000 by default) would cancel some of these.
    async with serve(models=("mlp",)) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            req = encode_request("mlp", {"INPUT0": np.ones((1, 256), np.float32)})
            results = await asyncio.gather(*(stub.ModelInfer(req) for _ in range(3000)), return_exceptions=True)
    failed = [r for r in results if isinstance(r, Exception)]
    assert not failed, f"{len(failed)} failed, first: {failed[0]!r}"
