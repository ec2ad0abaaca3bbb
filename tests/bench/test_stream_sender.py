"""`wok bench ramp --rpc stream`: requests on ModelStreamInfer, sent open loop and matched by id."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from wok.bench import stream_sender
from wok.bench.runner import Ramp, RampConfig, build_pool
from wok.bench.workers import OK, Share, WorkerPool
from wok.codec import encode_request
from wok.v2pb import grpc_service_pb2 as pb


def test_appended_fields_set_the_id_and_the_timeout_and_keep_the_request():
    req = encode_request("mlp", {"INPUT0": np.ones((1, 256), np.float32)})
    req.id = "old"
    req.parameters["priority"].int64_param = 2
    wire = req.SerializeToString() + stream_sender.timeout_field(0.25) + stream_sender.id_field(1234)
    got = pb.ModelInferRequest.FromString(wire)
    assert got.id == "1234"  # the later field wins
    assert got.parameters["timeout"].int64_param == 250_000
    assert got.parameters["priority"].int64_param == 2
    assert got.raw_input_contents == req.raw_input_contents and got.model_name == "mlp"
    assert pb.ModelInferRequest.FromString(stream_sender.timeout_field(1e-9)).parameters["timeout"].int64_param == 1


def test_answers_give_their_request_index_and_status_number():
    ok = pb.ModelStreamInferResponse(infer_response=pb.ModelInferResponse(id="17"))
    assert stream_sender.parse_answer(ok.SerializeToString()) == (17, OK)
    failed = pb.ModelStreamInferResponse(error_message="late", infer_response=pb.ModelInferResponse(id="3"))
    failed.infer_response.parameters["status_code"].int64_param = 4
    assert stream_sender.parse_answer(failed.SerializeToString()) == (3, 4)
    bare = pb.ModelStreamInferResponse(error_message="no id, no code")
    assert stream_sender.parse_answer(bare.SerializeToString()) == (None, stream_sender.UNKNOWN)


def test_a_stream_ramp_delivers_every_request_on_schedule(bench_server):
    cfg = RampConfig(
        target=bench_server.target,
        models=[("mlp", 1.0)],
        steps=[100, 400],
        step_duration_s=3.0,
        warmup_s=0.5,
        arrival="constant",
        workers=2,
        rpc="stream",
        streams=3,
    )
    result = Ramp(cfg, progress=lambda _: None).run()
    assert result["config"]["rpc"] == "stream"
    for step in result["steps"]:
        assert step["success_rate"] == 1.0, step
        # Completions in the window: a stall of the shared machine at its end moves a few past it.
        assert abs(step["achieved_qps"] - step["offered_qps"]) <= 0.05 * step["offered_qps"], step
        # At these rates the server answers within its 5 ms window plus a few ms.
        assert step["latency_ms"]["p50"] < 50.0, step["latency_ms"]
    # At 100 QPS, constant, requests come 10 ms apart: each waits out the 5 ms window alone.
    # (At 400 QPS, 2.5 ms apart, the later ones of a window wait less: no such floor.)
    assert result["steps"][0]["latency_ms"]["p50"] > 4.0, result["steps"][0]["latency_ms"]


def test_stream_requests_carry_their_deadline_and_failures_keep_the_unary_code(bench_server):
    cfg = RampConfig(target=bench_server.target, models=[("mlp", 1.0)], steps=[100], step_duration_s=1)
    pool, _, _ = build_pool(cfg)
    workers = WorkerPool(cfg.target, pool, 1, rpc="stream", streams=2)
    try:
        import time

        times = np.arange(0, 0.2, 0.01)
        # 1 µs: every request's deadline passes in the server's queue (mlp waits up to 5 ms).
        share = Share(time.monotonic() + 0.3, times, np.zeros(len(times), dtype=np.int64), 1e-6)
        (out,) = workers.run([share])
    finally:
        workers.close()
    assert len(out.codes) == len(times)
    assert set(out.codes.tolist()) == {4}  # DEADLINE_EXCEEDED, as the unary call would end
    assert np.all(np.isfinite(out.sent)) and np.all(out.done >= out.sent)


def test_a_worker_pool_refuses_a_stream_with_the_wok_balancer_or_no_streams():
    with pytest.raises(ValueError, match="stream"):
        WorkerPool("127.0.0.1:1", [], 1, rpc="stream", balancer="wok")
    with pytest.raises(ValueError, match="stream"):
        WorkerPool("127.0.0.1:1", [], 1, rpc="stream", streams=0)
    with pytest.raises(ValueError, match="rpc"):
        WorkerPool("127.0.0.1:1", [], 1, rpc="bidi")


def test_requests_on_a_stream_that_fails_take_its_code(bench_server):
    """Streams that end (here: the channel is closed under them) leave no request unanswered."""

    async def scenario():
        import grpc

        cfg = RampConfig(target=bench_server.target, models=[("mlp", 1.0)], steps=[100], step_duration_s=1)
        pool, _, _ = build_pool(cfg)
        import time

        times = np.arange(0, 0.05, 0.005)
        share = Share(time.monotonic() + 1.0, times, np.zeros(len(times), dtype=np.int64), 30.0)
        channel = grpc.aio.insecure_channel(bench_server.target)
        task = asyncio.ensure_future(stream_sender.run_share_stream(channel, pool, share, streams=2))
        await asyncio.sleep(0)  # a yield: the sender opens its streams and waits for the first send time
        await channel.close()  # ends both streams before that time (1 s ahead)
        return await asyncio.wait_for(task, 10)

    out = asyncio.run(scenario())
    assert len(out.codes) == 10
    assert np.all(out.codes != OK)  # CANCELLED or UNAVAILABLE, never left unanswered
    assert np.all(np.isfinite(out.done))
