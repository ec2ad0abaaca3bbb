"""Each kind of bad request gets its status and a message naming input, expected and got;
the requests around it are unaffected and the server keeps serving."""

from __future__ import annotations

import asyncio

import grpc
import numpy as np
import pytest

from wok.codec import decode_response, encode_request
from wok.v2pb import grpc_service_pb2 as pb
from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

GOOD = {"INPUT0": np.ones((1, 256), np.float32)}


def raw_len_mismatch() -> pb.ModelInferRequest:
    req = encode_request("mlp", GOOD)
    req.raw_input_contents[0] = req.raw_input_contents[0][:-4]
    return req


def typed_count_mismatch() -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name="mlp")
    t = req.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 256])
    t.contents.fp32_contents.extend([1.0] * 255)
    return req


def typed_with_an_extra_field() -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name="mlp")
    t = req.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 256])
    t.contents.fp32_contents.extend([1.0] * 256)
    t.contents.int_contents.extend([7, 8])  # not read for FP32: dropped unseen, were it accepted
    return req


EXTRA_FIELD = (
    "input 'INPUT0': expected values in fp32_contents alone for FP32; got int_contents (2 values) too, "
    "which FP32 is not read from"
)

CASES = {
    "unknown model": (
        encode_request("nope", GOOD),
        grpc.StatusCode.NOT_FOUND,
        "unknown model 'nope'; this server serves: encoder, mlp, recsys",
    ),
    "unknown version": (
        pb.ModelInferRequest(model_name="mlp", model_version="7"),
        grpc.StatusCode.NOT_FOUND,
        "model 'mlp' has no version '7'; available: 1",
    ),
    "wrong datatype": (
        encode_request("mlp", {"INPUT0": np.ones((1, 256), np.float64)}),
        grpc.StatusCode.INVALID_ARGUMENT,
        "input 'INPUT0': expected datatype FP32; got FP64",
    ),
    "wrong shape": (
        encode_request("mlp", {"INPUT0": np.ones((1, 255), np.float32)}),
        grpc.StatusCode.INVALID_ARGUMENT,
        "input 'INPUT0': expected shape [-1, 256] (batch first, -1 = any); got [1, 255]",
    ),
    "missing batch dimension": (
        encode_request("mlp", {"INPUT0": np.ones(256, np.float32)}),
        grpc.StatusCode.INVALID_ARGUMENT,
        "input 'INPUT0': expected shape [-1, 256] (batch first, -1 = any); got [256]",
    ),
    "raw length": (
        raw_len_mismatch(),
        grpc.StatusCode.INVALID_ARGUMENT,
        "input 'INPUT0': expected 1024 bytes of raw content (shape [1, 256] of FP32, 4 bytes each); got 1020 bytes",
    ),
    "typed contents count": (
        typed_count_mismatch(),
        grpc.StatusCode.INVALID_ARGUMENT,
        "input 'INPUT0': expected 256 values (shape [1, 256]) in fp32_contents for FP32, or the tensor in "
        "raw_input_contents; got 255 values",
    ),
    "typed contents beside another field": (typed_with_an_extra_field(), grpc.StatusCode.INVALID_ARGUMENT, EXTRA_FIELD),
    "missing input": (
        encode_request("recsys", {"dense": np.ones((1, 13), np.float32)}),
        grpc.StatusCode.INVALID_ARGUMENT,
        "missing input 'ids' for model 'recsys'; expected inputs: dense, ids",
    ),
    "unexpected input": (
        encode_request("mlp", {**GOOD, "EXTRA": np.ones((1, 2), np.float32)}),
        grpc.StatusCode.INVALID_ARGUMENT,
        "unexpected input 'EXTRA' for model 'mlp'; expected inputs: INPUT0",
    ),
    "too many rows": (
        encode_request("mlp", {"INPUT0": np.ones((33, 256), np.float32)}),
        grpc.StatusCode.INVALID_ARGUMENT,
        "input 'INPUT0': expected at most 32 rows (max_batch_size of model 'mlp'); got 33",
    ),
    "rows differ between inputs": (
        encode_request("recsys", {"dense": np.ones((2, 13), np.float32), "ids": np.ones((3, 2), np.int64)}),
        grpc.StatusCode.INVALID_ARGUMENT,
        "input 'ids': expected 2 rows, as many as input 'dense' has; got 3",
    ),
    "id out of range": (
        encode_request("encoder", {"tokens": np.array([[1, 2, 5000]], np.int64)}),
        grpc.StatusCode.INVALID_ARGUMENT,
        "input 'tokens': expected token ids in [0, 1000); got values from 1 to 5000",
    ),
    "unknown output": (
        encode_request("mlp", GOOD, outputs=["NOPE"]),
        grpc.StatusCode.INVALID_ARGUMENT,
        "unknown output 'NOPE' requested from model 'mlp'; outputs: OUTPUT0",
    ),
    "over the size limit": (
        encode_request("recsys", {"dense": np.ones((1, 13), np.float32), "ids": np.ones((1, 6000), np.int64)}),
        grpc.StatusCode.INVALID_ARGUMENT,
        "request to model 'recsys' is 48",  # then the rest of its size in bytes
    ),
}


async def test_each_bad_request_gets_its_status_and_message_and_the_next_request_succeeds(serve):
    # 40 KiB: 33 rows of mlp input (33 KiB) fit, so that case reaches the row check;
    # 6000 recsys ids (48 KiB) do not.
    async with serve(max_request_bytes=40 * 1024) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            for label, (req, code, message) in CASES.items():
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.ModelInfer(req)
                assert info.value.code() == code, f"{label}: {info.value.details()}"
                assert info.value.details().startswith(message), f"{label}: {info.value.details()}"
                ok = decode_response(await stub.ModelInfer(encode_request("mlp", GOOD)))
                assert ok["OUTPUT0"].shape == (1, 256), label


async def test_a_bad_request_never_affects_the_requests_sent_with_it(serve):
    async with serve(models=("mlp",)) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            x = np.arange(256, dtype=np.float32).reshape(1, 256) / 256
            alone = decode_response(await stub.ModelInfer(encode_request("mlp", {"INPUT0": x})))["OUTPUT0"]
            bad = encode_request("mlp", {"INPUT0": np.ones((1, 255), np.float32)})
            calls = [stub.ModelInfer(encode_request("mlp", {"INPUT0": x})) for _ in range(20)]
            calls[10:10] = [stub.ModelInfer(bad)]
            results = await asyncio.gather(*calls, return_exceptions=True)
    errors = [r for r in results if isinstance(r, Exception)]
    assert len(errors) == 1 and errors[0].code() == grpc.StatusCode.INVALID_ARGUMENT
    for r in results:
        if not isinstance(r, Exception):
            np.testing.assert_allclose(decode_response(r)["OUTPUT0"], alone, rtol=1e-5, atol=1e-6)


async def test_a_shape_of_millions_of_dims_is_refused_in_a_short_message_and_the_requests_sent_with_it_served(serve):
    # Its message wrote every dim: 4 MB of request made 12 MB of message (cut to 4 KiB only as it
    # left), on the event loop; 20 MB held every other request for 6 s and the server took 2 GB.
    n = 4_000_000
    bad = pb.ModelInferRequest(model_name="mlp")
    bad.inputs.add(name="INPUT0", datatype="FP32", shape=[1] * n)
    bad.raw_input_contents.append(b"")
    async with serve(models=("mlp",)) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            calls = [stub.ModelInfer(encode_request("mlp", GOOD)) for _ in range(4)]
            calls[2:2] = [stub.ModelInfer(bad)]
            results = await asyncio.gather(*calls, return_exceptions=True)
    refused = results.pop(2)
    assert isinstance(refused, grpc.aio.AioRpcError), refused
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.details() == (
        "input 'INPUT0': expected shape [-1, 256] (batch first, -1 = any); got "
        f"[{', '.join(['1'] * 16)}, …] (4,000,000 dims)"
    )
    for r in results:
        assert not isinstance(r, Exception), r
        assert decode_response(r)["OUTPUT0"].shape == (1, 256)


async def test_typed_contents_beside_another_field_are_refused_and_the_requests_sent_with_them_served(serve):
    async with serve(models=("mlp",)) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            x = np.arange(256, dtype=np.float32).reshape(1, 256) / 256
            alone = decode_response(await stub.ModelInfer(encode_request("mlp", {"INPUT0": x})))["OUTPUT0"]
            calls = [stub.ModelInfer(encode_request("mlp", {"INPUT0": x})) for _ in range(20)]
            calls[10:10] = [stub.ModelInfer(typed_with_an_extra_field())]
            results = await asyncio.gather(*calls, return_exceptions=True)
    bad = results.pop(10)
    assert isinstance(bad, grpc.aio.AioRpcError), bad
    assert (bad.code(), bad.details()) == (grpc.StatusCode.INVALID_ARGUMENT, EXTRA_FIELD)
    for r in results:
        assert not isinstance(r, Exception), r
        np.testing.assert_allclose(decode_response(r)["OUTPUT0"], alone, rtol=1e-5, atol=1e-6)


async def test_typed_contents_are_accepted_like_raw_ones(serve):
    async with serve(models=("mlp",)) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            x = np.linspace(-1, 1, 512, dtype=np.float32).reshape(2, 256)
            req = pb.ModelInferRequest(model_name="mlp")
            t = req.inputs.add(name="INPUT0", datatype="FP32", shape=[2, 256])
            t.contents.fp32_contents.extend(x.ravel().tolist())
            typed = decode_response(await stub.ModelInfer(req))["OUTPUT0"]
            raw = decode_response(await stub.ModelInfer(encode_request("mlp", {"INPUT0": x})))["OUTPUT0"]
    np.testing.assert_array_equal(typed, raw)


async def test_a_model_that_raises_fails_its_batch_with_internal_and_the_server_keeps_serving(serve, slow_repository):
    repo = slow_repository(sleep_ms=1, max_batch_size=4, delay_ms=50)
    async with serve(repository=repo) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            nan = encode_request("slow", {"INPUT0": np.full((1, 4), np.nan, np.float32)})
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.ModelInfer(nan)
            assert info.value.code() == grpc.StatusCode.INTERNAL
            assert info.value.details() == "model 'slow' failed: ValueError: NaN in batch"
            ok = decode_response(await stub.ModelInfer(encode_request("slow", {"INPUT0": np.ones((1, 4), np.float32)})))
            np.testing.assert_array_equal(ok["OUTPUT0"], np.full((1, 4), 2.0, np.float32))


async def test_a_request_the_model_fails_on_fails_alone_and_the_rest_of_its_batch_is_answered(serve, slow_repository):
    """One request's value makes the model raise for the batch: its three batch mates get their
    answers (the batch is rerun in parts), it gets INTERNAL with the model's error."""
    repo = slow_repository(sleep_ms=1, max_batch_size=4, delay_ms=60_000)  # flushed when 4 have come
    values = [1.0, 2.0, np.nan, 4.0]
    async with serve(repository=repo) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            calls = [
                stub.ModelInfer(encode_request("slow", {"INPUT0": np.full((1, 4), v, np.float32)})) for v in values
            ]
            results = await asyncio.gather(*calls, return_exceptions=True)
            for v, r in zip(values, results):
                if np.isnan(v):
                    assert isinstance(r, grpc.aio.AioRpcError), r
                    assert r.code() == grpc.StatusCode.INTERNAL
                    assert r.details() == "model 'slow' failed: ValueError: NaN in batch (on this request alone)"
                else:
                    np.testing.assert_array_equal(decode_response(r)["OUTPUT0"], np.full((1, 4), 2 * v, np.float32))
            st = (await stub.ModelStatistics(pb.ModelStatisticsRequest(name="slow"))).model_stats[0]
            # One batch executed for the three answered samples; the fourth counted failed.
            assert (st.inference_count, st.execution_count, st.inference_stats.fail.count) == (3, 1, 1)
            assert server.metrics.models["slow"].reruns == 4


@pytest.mark.parametrize("name", ["m" * 20_000, "é" * 6_000], ids=["ascii", "utf-8"])
async def test_a_long_name_echoed_in_an_error_is_cut_and_the_status_is_the_servers(serve, name):
    # The details travel in a header, which the client refuses past 16 KiB (from 8 KiB at
    # random): it reported RESOURCE_EXHAUSTED, not the server's NOT_FOUND, and a client that
    # retries on it retried a request that can never succeed.
    async with serve() as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            for call in (
                stub.ModelInfer(encode_request(name, GOOD)),
                stub.ModelMetadata(pb.ModelMetadataRequest(name=name)),
            ):
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await call
                assert info.value.code() == grpc.StatusCode.NOT_FOUND, info.value.details()[:200]
                details = info.value.details()
                assert name[:100] in details and "characters in all)" in details, details[-200:]
                assert len(details.encode()) < 8192, len(details.encode())
            ok = decode_response(await stub.ModelInfer(encode_request("mlp", GOOD)))
            assert ok["OUTPUT0"].shape == (1, 256)


LONG = 100_000  # characters in a wrong name


def _named(model="mlp", version="", inputs=GOOD, outputs=None) -> pb.ModelInferRequest:
    req = encode_request(model, inputs, outputs)
    req.model_version = version
    return req


EXTRA = {**GOOD, "x" * LONG: np.ones((1, 2), np.float32)}
# Each wrong name at its cut: its first 200 characters, quoted, then its length.
NAME_CASES = {
    "model": (
        _named(model="m" * LONG),
        f"unknown model '{'m' * 200}'… (100,000 characters in all); this server serves",
    ),
    # Leading zeros and all, an integer: version 7, not served.
    "version": (
        _named(version="0" * (LONG - 1) + "7"),
        f"model 'mlp' has no version '{'0' * 200}'… (100,000 characters in all)",
    ),
    "version no integer": (
        _named(version="7" * LONG),
        "model 'mlp': model version: expected an integer from 0 to 2**63-1 in decimal digits, or '' for the version "
        f"served (1); got '{'7' * 200}'… (100,000 characters in all)",
    ),
    "input": (_named(inputs=EXTRA), f"unexpected input '{'x' * 200}'… (100,000 characters in all) for model 'mlp'"),
    "output": (_named(outputs=["o" * LONG]), f"unknown output '{'o' * 200}'… (100,000 characters in all) requested"),
    "control characters": (
        _named(inputs={**GOOD, "a\\b\n\x1b[2K\u202e": np.ones((1, 2), np.float32)}),
        "unexpected input 'a\\\\b\\n\\x1b[2K\\u202e' for model 'mlp'; expected inputs: INPUT0",
    ),
}


@pytest.mark.parametrize("case", NAME_CASES)
async def test_a_wrong_name_is_echoed_cut_and_escaped_alike_on_a_unary_call_and_on_a_stream(serve, case):
    # The stream's error_message was not cut as a unary call's details are (to 4 KiB): a 100 KB
    # wrong name came back whole, 100 KB per bad request, and a newline or a terminal escape in a
    # name went as it was into the client's log.
    req, start = NAME_CASES[case]
    req.id = "bad"
    good = encode_request("mlp", GOOD)
    good.id = "good"
    async with serve(models=("mlp",)) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.ModelInfer(req)
            answers = [a async for a in stub.ModelStreamInfer(iter([req, good]))]
    assert info.value.details().startswith(start), info.value.details()[:400]
    assert len(info.value.details()) < 400, len(info.value.details())
    bad, ok = sorted(answers, key=lambda a: a.infer_response.id)
    assert bad.error_message == info.value.details()
    assert bad.infer_response.parameters["status_code"].int64_param == info.value.code().value[0]
    assert (ok.error_message, decode_response(ok.infer_response)["OUTPUT0"].shape) == ("", (1, 256))
