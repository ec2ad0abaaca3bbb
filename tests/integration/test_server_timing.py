"""The server-timing trailer (`server_timing`): each answer's stage times, read by a real client."""

from __future__ import annotations

import asyncio
import threading
import time

import grpc
import numpy as np
import pytest

from wok.codec import encode_request
from wok.servertiming import (
    SERVER_TIMING,
    TIMING_COLUMNS,
    TIMING_PARTS,
    TIMING_STAGES,
    parse_server_timing,
    server_timing,
)
from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

ROUNDING_MS = 0.0005 * len(TIMING_STAGES)  # each stage is written to the µs


async def _timed_call(stub, request) -> tuple[float, dict[str, float] | None]:
    """(the client's latency in ms, the parsed trailer or None)."""
    t0 = time.perf_counter()
    call = stub.ModelInfer(request)
    await call
    latency_ms = 1e3 * (time.perf_counter() - t0)
    trailer = dict(await call.trailing_metadata()).get(SERVER_TIMING)
    return latency_ms, (parse_server_timing(trailer) if trailer is not None else None)


async def _call_window(stub, request) -> tuple[float, float, dict[str, float]]:
    """(when the call was sent, when its answer was in, in perf_counter ms; the parsed trailer)."""
    sent = 1e3 * time.perf_counter()
    call = stub.ModelInfer(request)
    await call
    answered = 1e3 * time.perf_counter()
    trailer = dict(await call.trailing_metadata()).get(SERVER_TIMING)
    assert trailer is not None, "no server-timing trailer with server_timing on"
    return sent, answered, parse_server_timing(trailer)


def _dispatched_within(sent: float, answered: float, t: dict[str, float]) -> tuple[float, float]:
    """Bounds (perf_counter ms) on when the request's batch was dispatched, for a server in this
    process (one clock): it arrived after it was sent and its answer was built before it was in."""
    return sent + t["decode"] + t["queue"], answered - t["batch"] - t["respond"] - t["encode"]


def _gate_and_watch(rt) -> tuple[threading.Event, asyncio.Event, list[float]]:
    """Of a model with one instance: a gate its every forward waits for (at most 10 s), an event set
    once two batches have been handed to the instance, and the requests' first input values in
    the order they were queued (a batch takes the queue's first ones)."""
    (inst,) = rt.executor.instances
    gate, handed_over, order = threading.Event(), asyncio.Event(), []
    batches = 0

    def held(module, args) -> None:
        gate.wait(10)

    inst.module.register_forward_pre_hook(held)

    def observer(rows, future) -> None:
        nonlocal batches
        batches += 1
        if batches >= 2:
            handed_over.set()

    inst.observer = observer
    submit = rt.batcher.submit

    def recorded(inputs, *args, **kwargs):
        order.append(float(inputs["INPUT0"][0, 0]))
        return submit(inputs, *args, **kwargs)

    rt.batcher.submit = recorded
    return gate, handed_over, order


def _check_stages(t: dict[str, float]) -> None:
    assert set(t) == set(TIMING_COLUMNS), t  # the parts, and its batch's requests and samples
    assert all(v >= 0 for v in t.values()), t
    parts = sum(t[s] for s in TIMING_STAGES if s != "total")
    assert abs(parts - t["total"]) <= ROUNDING_MS, t
    assert t["start"] + t["compute"] <= t["batch"] + ROUNDING_MS, t  # both inside the batch


async def test_a_lone_request_carries_its_stage_times_and_its_queue_delay_window(serve):
    async with serve(models=("mlp",), server_timing=True) as server:
        delay_ms = server.runtimes["mlp"].servable.config.dynamic_batching.max_queue_delay_ms
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            x = np.ones((1, 256), np.float32)
            for _ in range(3):
                latency_ms, t = await _timed_call(stub, encode_request("mlp", {"INPUT0": x}))
                assert t is not None, "no server-timing trailer with server_timing on"
                _check_stages(t)
                # Alone in the queue, it leaves when the window closes (timerfd flush: not early).
                assert t["queue"] >= delay_ms - 0.05, t
                assert t["batch"] > 0, t
                assert t["total"] <= latency_ms, (t, latency_ms)


async def test_the_batch_stage_is_the_model_and_a_second_batch_waits_behind_the_first(serve, slow_repository):
    sleep_ms = 50.0
    # The 8 requests reach the server spread out on a loaded host (the client and the server share
    # this loop). With a 1 ms window they made 3 batches there: a lone early request, a full batch
    # on the spare slot, and a partial one held in the queue until the instance was idle, which
    # then started at once. So: the longest window (a batch leaves only with 4), and the first
    # batch held at the worker (a gate before the model) until the second has been handed over.
    root = slow_repository(sleep_ms=sleep_ms, max_batch_size=4, delay_ms=60_000.0)
    async with serve(models=(), repository=root, server_timing=True) as server:
        rt = server.runtimes["slow"]
        gate, handed_over, order = _gate_and_watch(rt)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                stub = pb_grpc.GRPCInferenceServiceStub(channel)
                requests = [encode_request("slow", {"INPUT0": np.full((1, 4), i, np.float32)}) for i in range(8)]
                calls = [asyncio.ensure_future(_call_window(stub, r)) for r in requests]
                try:
                    await asyncio.wait_for(handed_over.wait(), 10)
                except asyncio.TimeoutError:
                    pytest.fail(f"2 batches not handed over while the first waits: {rt.batcher.queued} queued")
                assert rt.batcher.queued == 0 and rt.batcher.inflight == 2
                gate.set()
                got = await asyncio.gather(*calls)
        finally:
            gate.set()
    for _, _, t in got:
        _check_stages(t)
        assert t["compute"] >= sleep_ms, t  # the model sleeps per batch
    # The first batch took the first 4 requests queued; a batch's requests share its batch stage.
    assert sorted(order) == list(range(8)), order
    first = [got[int(v)] for v in order[:4]]
    later = [got[int(v)] for v in order[4:]]
    first_batch = first[0][2]["batch"]
    assert {g[2]["batch"] for g in first} == {first_batch} and len({g[2]["batch"] for g in later}) == 1, got
    # The second batch leaves the queue at once (a CPU instance takes 2 batches in flight) and
    # waits at the worker behind the first, inside its batch stage (a batch held in the queue
    # until the worker is free would start within a hop). It waits the first's whole run here (it
    # was handed over before the gate opened); half the model's time tells a wait from a hop.
    assert all(t["start"] >= sleep_ms / 2 for _, _, t in later), [t for _, _, t in got]
    # And its start ends no sooner than the first batch's end, however late it was dispatched:
    # instants on the one perf_counter clock, bounded by the client's send and receive.
    first_end = max(_dispatched_within(*g)[0] for g in first) + first_batch
    for g in later:
        latest_start = _dispatched_within(*g)[1] + g[2]["start"]
        assert latest_start >= first_end - 4 * ROUNDING_MS, (g, first_end)


async def test_each_answer_carries_its_batchs_requests_and_samples(serve, slow_repository):
    """Requests of 1, 1 and 2 rows fill a batch of 4 samples (the window is a minute: only a full batch
    leaves), so each says 3 requests and 4 samples and their batch's one compute; a lone request of 4
    rows is a batch of its own: 1 request, 4 samples."""
    root = slow_repository(sleep_ms=1.0, max_batch_size=4, delay_ms=60_000.0)
    async with serve(models=(), repository=root, server_timing=True) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)

            def request(rows: int):
                return encode_request("slow", {"INPUT0": np.ones((rows, 4), np.float32)})

            shared = await asyncio.gather(*(_call_window(stub, request(rows)) for rows in (1, 1, 2)))
            _, _, alone = await _call_window(stub, request(4))
    for _, _, t in shared:
        _check_stages(t)
        assert (t["batch_requests"], t["batch_samples"]) == (3, 4), t
    assert len({t["compute"] for _, _, t in shared}) == 1, shared  # one batch: one model time
    _check_stages(alone)
    assert (alone["batch_requests"], alone["batch_samples"]) == (1, 4), alone


async def test_off_by_default_no_trailer_and_errors_keep_their_status(serve):
    async with serve(models=("mlp",)) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            _, t = await _timed_call(stub, encode_request("mlp", {"INPUT0": np.ones((1, 256), np.float32)}))
    assert t is None
    async with serve(models=("mlp",), server_timing=True) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.ModelInfer(encode_request("mlp", {"INPUT0": np.ones((1, 255), np.float32)}))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "INPUT0" in err.value.details() and "256" in err.value.details()
            _, t = await _timed_call(stub, encode_request("mlp", {"INPUT0": np.ones((1, 256), np.float32)}))
            assert t is not None  # the server still serves, with its trailer


def test_the_value_round_trips_and_reads_the_w3c_syntax():
    value = server_timing(10.0, 10.000021, 10.005021, 10.005121, 0.0012, 10.006521, 10.006621, 10.006631)
    t = parse_server_timing(value)
    assert t == {
        "decode": 0.021,
        "queue": 5.0,
        "batch": 1.5,
        "respond": 0.1,
        "encode": 0.01,
        "total": 6.631,
        "start": 0.1,
        "compute": 1.2,
    }
    assert parse_server_timing('cache;desc="Cache Read";dur=23.2, miss, db;dur=53') == {"cache": 23.2, "db": 53.0}
    with pytest.raises(ValueError, match="'db': dur 'x'"):
        parse_server_timing("db;dur=x")


@pytest.mark.parametrize(
    "value", ["db;dur=٣", "db;dur=３.５", "db;dur=1.٥"], ids=["arabic-indic", "fullwidth", "mixed"]
)
def test_a_dur_in_digits_other_than_ascii_is_refused(value):
    """float() read "٣" as 3: a figure no server writes (wok writes ASCII) is not a time."""
    with pytest.raises(ValueError, match=r"'db': dur .* is not a number"):
        parse_server_timing(value)


def test_the_batchs_size_rides_as_a_desc_and_a_trailer_without_it_still_parses():
    times = (10.0, 10.000021, 10.005021, 10.005121, 0.0012, 10.006521, 10.006621, 10.006631)
    old = server_timing(*times)  # as a server from before the counts writes it
    value = server_timing(*times, batch_requests=27, batch_samples=54)
    assert value == old + ", batch_requests;desc=27, batch_samples;desc=54"
    t = parse_server_timing(value)
    assert set(t) == set(TIMING_COLUMNS) and (t["batch_requests"], t["batch_samples"]) == (27, 54)
    assert set(parse_server_timing(old)) == set(TIMING_PARTS)  # no counts: absent, not 0
    # W3C's desc is a token or a quoted string; a count of either form reads the same.
    assert parse_server_timing('batch_requests;desc="3"') == {"batch_requests": 3.0}
    with pytest.raises(ValueError, match="'batch_requests': desc 'many' is not a whole number"):
        parse_server_timing("batch_requests;desc=many")


def test_commas_and_semicolons_in_a_quoted_desc_separate_nothing():
    """Split at every comma and semicolon, another server's `desc="hit, miss"` made a metric `miss"`
    of its dur and lost its own, and `desc="a;dur=5"` a dur `5"`, refused as no number."""
    assert parse_server_timing('cache;desc="hit, miss";dur=1.5, total;dur=2') == {"cache": 1.5, "total": 2.0}
    assert parse_server_timing('db;desc="a;dur=5";dur=1') == {"db": 1.0}
    # A quoted string's escapes are its text (RFC 9110 5.6.4): `\"` is a quote, not its end.
    assert parse_server_timing(r'db;desc="say \", then";dur=3, batch_requests;desc="\4"') == {
        "db": 3.0,
        "batch_requests": 4.0,
    }


class _NotByChar(str):
    """Text that refuses to be read character by character."""

    def __iter__(self):
        raise AssertionError(f"{str(self)!r} read character by character")


def test_a_trailer_without_quoted_strings_is_split_as_str_split_splits_it():
    """The bench's workers parse every answer's trailer. Split character by character for the quoted strings
    wok's trailer never has, it took ~3× str.split's time: ~15 µs more an answer, in the load generator."""
    from wok.fieldvalues import split_unquoted

    value = server_timing(0.0, 1e-5, 1e-3, 1.1e-3, 8e-4, 3e-3, 3.1e-3, 3.2e-3, batch_requests=16, batch_samples=16)
    assert parse_server_timing(_NotByChar(value)) == parse_server_timing(value)
    assert split_unquoted(_NotByChar("decode;dur=0.012"), ";") == ["decode", "dur=0.012"]
    # With a quote in it, the text is read through, as before.
    assert split_unquoted('db;desc="a;b";dur=1', ";") == ["db", 'desc="a;b"', "dur=1"]
