"""Metrics: histogram arithmetic by hand, and a live scrape after real traffic."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import socket
import subprocess
import time
import urllib.request

import grpc
import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.parser import text_string_to_metric_families

from wok.app import TickProcessCollector, default_registry
from wok.batcher import Batcher, BatchingPolicy
from wok.bench.scrape import histogram_quantile
from wok.codec import encode_request
from wok.config import DynamicBatchingConfig
from wok.metrics import BATCH_SIZE_BUCKETS, LATENCY_BUCKETS, NOT_RUN, STAGES, WeightedHistogram, WokMetrics
from wok.stats import ModelStats
from wok.v2pb import grpc_service_pb2 as pb
from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

from ..conftest import REPEAT_MODEL, write_python_model, write_slow_model


@pytest.mark.parametrize("bounds", [LATENCY_BUCKETS, BATCH_SIZE_BUCKETS], ids=["latency", "batch_size"])
def test_bucket_bounds_are_written_as_prometheus_client_writes_them(bounds):
    # Whole-number bounds went out as le="1", where prometheus_client (and Prometheus 3, on
    # ingestion) write le="1.0": a matcher written for one missed the other's series.
    reg = CollectorRegistry()
    Histogram("h", "", buckets=bounds, registry=reg)
    theirs = [s.labels["le"] for s in next(iter(reg.collect())).samples if s.name == "h_bucket"]
    ours = [le for le, _ in WeightedHistogram(bounds).cumulative()]
    assert ours == theirs
    assert "1.0" in ours and "1" not in ours


def test_weighted_observation_equals_repeated_observations():
    a, b = WeightedHistogram((1.0, 2.0, 5.0)), WeightedHistogram((1.0, 2.0, 5.0))
    for value, n in ((0.5, 3), (1.0, 2), (1.5, 1), (7.0, 4)):
        a.observe(value, n)
        for _ in range(n):
            b.observe(value)
    assert a.counts == b.counts == [5, 1, 0, 4]  # 1.0 is in the le="1.0" bucket: le is inclusive
    assert a.total == pytest.approx(0.5 * 3 + 1.0 * 2 + 1.5 + 7.0 * 4)
    assert a.cumulative() == [("1.0", 5), ("2.0", 6), ("5.0", 6), ("+Inf", 10)]


def test_latency_buckets_resolve_sub_millisecond_and_multi_second_times():
    assert LATENCY_BUCKETS[0] <= 25e-6 and LATENCY_BUCKETS[-1] >= 60
    assert list(LATENCY_BUCKETS) == sorted(LATENCY_BUCKETS)
    # No two neighbours more than 3x apart: a quantile read off them is within that factor.
    assert max(b / a for a, b in itertools.pairwise(LATENCY_BUCKETS)) <= 3.0
    # Where SLO P99s live, a quantile read off the buckets is within 1.5x.
    near_slo = [b for b in LATENCY_BUCKETS if 2.5e-3 <= b <= 100e-3]
    assert max(b / a for a, b in itertools.pairwise(near_slo)) <= 1.5


def test_an_injected_registry_holds_the_series_and_close_removes_them():
    registry = CollectorRegistry()
    metrics = WokMetrics(registry, gpu=False)
    m = metrics.model("mlp", instances=1)
    m.record_batch(
        0, requests=2, samples=3, queue_waits=[0.001, 0.002], assemble=1e-4, h2d=0, compute=0.01, d2h=1e-5, busy=0.0102
    )
    assert registry.get_sample_value("wok_batch_size_count", {"model": "mlp"}) == 1
    assert (
        registry.get_sample_value("wok_request_stage_duration_seconds_count", {"model": "mlp", "stage": "compute"}) == 2
    )
    assert registry.get_sample_value(
        "wok_instance_busy_seconds_total", {"model": "mlp", "model_instance": "0"}
    ) == pytest.approx(0.0102)
    m.record_idle_queued(0, 0.003)
    m.record_idle_queued(0, 0.001)
    assert registry.get_sample_value(
        "wok_instance_idle_queued_seconds_total", {"model": "mlp", "model_instance": "0"}
    ) == pytest.approx(0.004)
    metrics.close()
    assert registry.get_sample_value("wok_batch_size_count", {"model": "mlp"}) is None


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="the process collector reads /proc")
def test_a_process_start_time_is_true_to_the_clock_tick():
    # It read up to 1 s early (/proc/stat's boot time is whole seconds): a bench could not tell a replica
    # back within a second of a window's start from one started before it.
    before = time.time()
    child = subprocess.Popen(["sleep", "30"])
    try:
        after = time.time()
        registry = CollectorRegistry()
        TickProcessCollector(registry=registry, pid=lambda: child.pid)
        started = registry.get_sample_value("process_start_time_seconds")
    finally:
        child.kill()
        child.wait()
    tick = 1 / os.sysconf("SC_CLK_TCK")
    assert before - tick <= started <= after, (before, started, after)
    # The server's registry reads its own start so.
    own = CollectorRegistry()
    TickProcessCollector(registry=own)
    # (The boot time is read from two clocks, a few microseconds apart.)
    assert default_registry().get_sample_value("process_start_time_seconds") == pytest.approx(
        own.get_sample_value("process_start_time_seconds"), abs=1e-3
    )


def stage_count(registry: CollectorRegistry, model: str, stage: str) -> float | None:
    return registry.get_sample_value("wok_request_stage_duration_seconds_count", {"model": model, "stage": stage})


def test_a_stage_reported_as_not_run_is_not_observed_and_a_real_copy_is():
    registry = CollectorRegistry()
    m = WokMetrics(registry, gpu=False).model("mlp", instances=2)
    m.record_batch(0, 2, 2, [0.001, 0.001], assemble=1e-4, h2d=NOT_RUN, compute=0.01, d2h=2e-5, busy=0.01)  # CPU
    m.record_batch(1, 3, 3, [0.001] * 3, assemble=1e-4, h2d=3e-5, compute=0.01, d2h=4e-5, busy=0.01)  # CUDA
    assert stage_count(registry, "mlp", "h2d") == 3
    assert stage_count(registry, "mlp", "compute") == stage_count(registry, "mlp", "d2h") == 5


async def test_a_cpu_batch_observes_no_host_to_device_copy_and_keeps_the_series(gated):
    _, _, ex = gated(max_batch_size=4, delay_ms=60_000)
    assert not ex.instances[0].cuda
    registry = CollectorRegistry()
    metrics = WokMetrics(registry, gpu=False)
    b = Batcher("gated", ex, BatchingPolicy(4, 60.0), ModelStats("gated"), metrics.model("gated", 1))
    b.start()
    ps = [b.submit({"INPUT0": np.ones((1, 4), np.float32)}, 1, None, None) for _ in range(4)]  # a size flush
    await asyncio.gather(*(p.future for p in ps))
    await b.stop()
    assert stage_count(registry, "gated", "compute") == stage_count(registry, "gated", "assemble") == 4
    # The split of the outputs is real work on the CPU too: it stays in "d2h".
    assert stage_count(registry, "gated", "d2h") == 4
    # Exported with its labels (a dashboard's query finds it), never observed: its P99 is NaN,
    # not the ~25 µs an all-zero histogram interpolates to.
    assert stage_count(registry, "gated", "h2d") == 0
    bucket = {"model": "gated", "stage": "h2d", "le": "2.5e-05"}
    assert registry.get_sample_value("wok_request_stage_duration_seconds_bucket", bucket) == 0
    metrics.close()


def observed(server, model: str, requests: int) -> dict[str, int]:
    """Requests each stage histogram counts: h2d only on CUDA instances, where a copy in happens."""
    cuda = all(inst.cuda for inst in server.runtimes[model].executor.instances)
    return {stage: requests if stage != "h2d" or cuda else 0 for stage in STAGES}


def scrape(port: int) -> dict:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {f.name: f for f in text_string_to_metric_families(body)}


def sample(families: dict, family: str, suffix: str, **labels) -> float:
    for s in families[family].samples:
        if s.name == family + suffix and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    raise KeyError((family, suffix, labels))


async def test_after_a_burst_every_stage_has_counts_and_stage_means_add_up_to_the_end_to_end_mean(serve):
    async with serve() as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            rng = np.random.default_rng(0)
            reqs = {
                "mlp": lambda: {"INPUT0": rng.standard_normal((1, 256), dtype=np.float32)},
                "recsys": lambda: {"dense": np.ones((1, 13), np.float32), "ids": rng.integers(0, 50, (1, 7))},
                "encoder": lambda: {"tokens": rng.integers(0, 50, (1, int(rng.integers(1, 40))))},
            }
            calls = [stub.ModelInfer(encode_request(m, make())) for m, make in reqs.items() for _ in range(150)]
            await asyncio.gather(*calls)
            families = await asyncio.to_thread(scrape, server.http.port)
    for model in reqs:
        n = sample(families, "wok_request_duration_seconds", "_count", model=model)
        assert n == 150
        e2e_mean = sample(families, "wok_request_duration_seconds", "_sum", model=model) / n
        stage_means = {}
        for stage, expected in observed(server, model, 150).items():
            count = sample(families, "wok_request_stage_duration_seconds", "_count", model=model, stage=stage)
            assert count == expected, (model, stage)
            if count:
                total = sample(families, "wok_request_stage_duration_seconds", "_sum", model=model, stage=stage)
                stage_means[stage] = total / count
        assert sum(stage_means.values()) == pytest.approx(e2e_mean, rel=0.10), (model, stage_means, e2e_mean)
        assert sample(families, "wok_responses", "_total", model=model, code="OK") == 150
        assert sample(families, "wok_batch_size", "_sum", model=model) == 150
        assert sample(families, "wok_queue_depth", "", model=model) == 0


async def test_rejections_and_status_codes_are_counted_by_reason(serve):
    async with serve(models=("mlp",)) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            for bad in (encode_request("mlp", {"INPUT0": np.ones((1, 3), np.float32)}), encode_request("nope", {})):
                with pytest.raises(grpc.aio.AioRpcError):
                    await stub.ModelInfer(bad)
            families = await asyncio.to_thread(scrape, server.http.port)
    assert sample(families, "wok_rejected_requests", "_total", model="mlp", reason="invalid") == 1
    assert sample(families, "wok_responses", "_total", model="mlp", code="INVALID_ARGUMENT") == 1
    assert sample(families, "wok_rejected_requests", "_total", model="", reason="not_found") == 1


async def test_every_answer_is_counted_once_in_wok_responses_unknown_models_included(serve):
    unparsable = b"\xff\xff\xff"  # a bad wire type: no request, so no model, can be read from it
    async with serve(models=("mlp",)) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            ok = encode_request("mlp", {"INPUT0": np.ones((1, 256), np.float32)})
            unknown = encode_request("nope", {})
            await stub.ModelInfer(ok)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.ModelInfer(unknown)
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
            answers = [a async for a in stub.ModelStreamInfer(iter([ok, unknown]))]
            assert sorted(bool(a.error_message) for a in answers) == [False, True]
            raw = ch.unary_unary("/inference.GRPCInferenceService/ModelInfer")  # bytes in, bytes out
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await raw(unparsable)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            raw_stream = ch.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
            answers = [pb.ModelStreamInferResponse.FromString(a) async for a in raw_stream(iter([unparsable]))]
            assert [bool(a.error_message) for a in answers] == [True]
            families = await asyncio.to_thread(scrape, server.http.port)
    responses = {
        (s.labels["model"], s.labels["code"]): s.value
        for s in families["wok_responses"].samples
        if s.name == "wok_responses_total"
    }
    # Six requests, six answers: one unary and one streamed of each model, and of bytes that are no
    # request; the unknown model and the bytes as model="".
    assert responses == {("mlp", "OK"): 2, ("", "NOT_FOUND"): 2, ("", "INVALID_ARGUMENT"): 2}
    assert sample(families, "wok_rejected_requests", "_total", model="", reason="not_found") == 2
    assert sample(families, "wok_rejected_requests", "_total", model="", reason="invalid") == 2


async def test_the_server_names_the_grpc_port_it_bound_in_wok_server_info(serve):
    # Asked for port 0: the info names the port bound, which a scraper can match with its target.
    async with serve(models=("mlp",)) as server:
        families = await asyncio.to_thread(scrape, server.http.port)
    assert server.port > 0 and server.settings.grpc_port == 0
    assert [(s.name, s.labels, s.value) for s in families["wok_server_info"].samples] == [
        ("wok_server_info", {"grpc_port": str(server.port)}, 1.0)
    ]


async def test_openmetrics_is_served_when_asked_for(serve):
    async with serve(models=("mlp",)) as server:
        req = urllib.request.Request(
            f"http://127.0.0.1:{server.http.port}/metrics",
            headers={"Accept": "application/openmetrics-text; version=1.0.0"},
        )
        resp = await asyncio.to_thread(urllib.request.urlopen, req, timeout=10)
        body = resp.read().decode()
    assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
    assert body.rstrip().endswith("# EOF")
    assert "wok_batch_size" in body


async def test_a_client_that_never_finishes_its_request_is_dropped_and_scrapes_go_on(serve, monkeypatch):
    from wok import http

    monkeypatch.setattr(http, "HEADER_TIMEOUT_S", 0.2)
    async with serve(models=("mlp",)) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.http.port)
        writer.write(b"GET /metr")  # and never the rest
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), timeout=5) == b""  # the server closed it
        writer.close()
        families = await asyncio.to_thread(scrape, server.http.port)
    assert "wok_batch_size" in families


async def test_idle_connections_at_the_cap_make_room_for_a_scrape_oldest_first(serve, monkeypatch):
    from wok import http

    monkeypatch.setattr(http, "MAX_CONNECTIONS", 2)
    async with serve(models=("mlp",)) as server:
        port = server.http.port
        # Two kept-alive connections, idle after one request each: before, they held the port
        # for IDLE_TIMEOUT_S and a scraper's connection was closed unanswered.
        held = []
        for _ in range(2):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            await reader.readuntil(b"wok: metrics at /metrics\n")
            held.append((reader, writer))
        families = await asyncio.to_thread(scrape, port)
        assert "wok_batch_size" in families
        # The one idle longest was closed for it; the other is still served.
        assert await asyncio.wait_for(held[0][0].read(), timeout=5) == b""
        held[1][1].write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert b"200 OK" in await asyncio.wait_for(held[1][0].readuntil(b"/metrics\n"), timeout=5)
        for _, w in held:
            w.close()


async def test_connections_beyond_the_cap_get_503_and_are_closed_at_once_when_none_is_idle(serve, monkeypatch, caplog):
    """They were closed with no answer and no log line (docs/security.md)."""
    from wok import http

    monkeypatch.setattr(http, "MAX_CONNECTIONS", 2)
    async with serve(models=("mlp",), admin=True) as server:
        port = server.http.port
        held = []
        for _ in range(2):  # two /events streams: busy, never waiting for a request
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(f"GET /events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
            await reader.readuntil(b"\r\n\r\n")
            held.append((reader, writer))
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        with caplog.at_level(logging.WARNING, "wok.http"):
            answer = await asyncio.wait_for(reader.read(), timeout=5)
        assert answer.startswith(b"HTTP/1.1 503 Service Unavailable\r\n") and answer.endswith(b"try again\n"), answer
        for _, w in [*held, (reader, writer)]:
            w.close()
    refusals = [r.getMessage() for r in caplog.records if "new connection(s)" in r.getMessage()]
    assert [m.split(":")[1] for m in refusals] == [" refused 1 new connection(s) (503, closed) since the last warning"]


async def test_event_streams_past_their_cap_get_503_and_leave_the_port_to_others(serve, monkeypatch):
    from wok import http

    monkeypatch.setattr(http, "MAX_EVENT_STREAMS", 1)
    async with serve(models=("mlp",), admin=True) as server:
        port = server.http.port
        request = f"GET /events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
        first = await asyncio.open_connection("127.0.0.1", port)
        first[1].write(request)
        assert b"200 OK" in await first[0].readuntil(b"\r\n\r\n")
        second = await asyncio.open_connection("127.0.0.1", port)
        second[1].write(request)
        answer = await asyncio.wait_for(second[0].read(), timeout=5)
        assert (
            answer.startswith(b"HTTP/1.1 503 ") and b"GET /events: expected fewer than 1 streams open; got 1" in answer
        )
        first[1].close()
        second[1].close()
        families = await asyncio.to_thread(scrape, port)
    assert "wok_batch_size" in families


async def test_a_client_that_never_reads_its_answer_is_dropped(serve, monkeypatch):
    from wok import http

    monkeypatch.setattr(http, "WRITE_TIMEOUT_S", 0.3)
    async with serve(models=("mlp",)) as server:
        sock = socket.create_connection(("127.0.0.1", server.http.port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        # Pipelined scrapes whose answers (tens of KiB each) are never read fill both socket
        # buffers; the server's drain then waits, until WRITE_TIMEOUT_S ends the connection.
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 200)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while not server.http._clients and loop.time() < deadline:  # until the server has it
            await asyncio.sleep(0.01)
        assert server.http._clients
        while server.http._clients and loop.time() < deadline:
            await asyncio.sleep(0.05)
        assert not server.http._clients
        sock.close()
        families = await asyncio.to_thread(scrape, server.http.port)
    assert "wok_batch_size" in families


async def test_callers_that_gave_up_are_in_no_stage_so_stages_still_add_up(serve, slow_repository):
    repo = slow_repository(sleep_ms=40, max_batch_size=4, delay_ms=1)
    async with serve(repository=repo) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            x = {"INPUT0": np.ones((1, 4), np.float32)}
            # Deadlines that expire while the batches run: those callers are gone when they end.
            calls = [stub.ModelInfer(encode_request("slow", x), timeout=0.03 if i % 2 else 10) for i in range(24)]
            results = await asyncio.gather(*calls, return_exceptions=True)
            families = await asyncio.to_thread(scrape, server.http.port)
    ok = sum(not isinstance(r, Exception) for r in results)
    assert 0 < ok < 24
    assert sample(families, "wok_request_duration_seconds", "_count", model="slow") == ok
    for stage, expected in observed(server, "slow", ok).items():
        count = sample(families, "wok_request_stage_duration_seconds", "_count", model="slow", stage=stage)
        assert count == expected, (stage, count, ok)


async def test_a_caller_cancelled_after_its_batch_ran_is_counted_end_to_end_as_in_the_stages(
    serve, slow_repository, monkeypatch
):
    # Its batch ran for a caller still there, so the batcher put it in the stage histograms; the
    # handler cancelled before it resumed (its client gone just then) must count it end to end too.
    async with serve(repository=slow_repository(sleep_ms=1, max_batch_size=4, delay_ms=0)) as server:
        batcher = server.runtimes["slow"].batcher
        submit = batcher.submit

        def submit_then_cancel_on_result(*args, **kwargs):
            p = submit(*args, **kwargs)
            # Added before the handler awaits the future, so it runs first: the handler is
            # cancelled with the future's result set and its resumption already scheduled.
            p.future.add_done_callback(lambda _: handler.cancel())
            return p

        monkeypatch.setattr(batcher, "submit", submit_then_cancel_on_result)
        request = encode_request("slow", {"INPUT0": np.ones((1, 4), np.float32)})
        handler = asyncio.ensure_future(server.service.infer(request, None))
        with pytest.raises(asyncio.CancelledError):
            await handler
        registry = server.metrics.registry
        end_to_end = registry.get_sample_value("wok_request_duration_seconds_count", {"model": "slow"})
        counts = {stage: stage_count(registry, "slow", stage) for stage in STAGES}
        cancelled = registry.get_sample_value("wok_responses_total", {"model": "slow", "code": "CANCELLED"})
    assert cancelled == 1
    assert end_to_end == 1
    assert counts == observed(server, "slow", 1)


async def test_batches_that_failed_count_busy_in_the_metric_and_the_admin_watch(serve, slow_repository):
    # A failing model occupies its instance all the same: the busy ratio is its utilisation.
    # "slow": 4 NaN requests, a size flush the model fails, rerun in parts, every one failing alone;
    # "one": a batch of one NaN request, which raises (nothing to rerun). Before, neither counted busy.
    repo = slow_repository(sleep_ms=20, max_batch_size=4, delay_ms=60_000)
    write_slow_model(repo, name="one", sleep_ms=20, max_batch_size=1)
    nan = {"INPUT0": np.full((1, 4), np.nan, np.float32)}
    async with serve(repository=repo, admin=True) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            calls = [stub.ModelInfer(encode_request("slow", nan)) for _ in range(4)]
            calls.append(stub.ModelInfer(encode_request("one", nan)))
            results = await asyncio.gather(*calls, return_exceptions=True)
            families = await asyncio.to_thread(scrape, server.http.port)
        watches = server.http.admin.watches
    assert [r.code() for r in results] == [grpc.StatusCode.INTERNAL] * 5, results
    for model, failed in (("slow", 4), ("one", 1)):
        assert sample(families, "wok_responses", "_total", model=model, code="INTERNAL") == failed
        assert sample(families, "wok_batch_size", "_count", model=model) == 0  # no batch was answered
        busy = sample(families, "wok_instance_busy_seconds", "_total", model=model, model_instance="0")
        assert busy > 0, model
        # The admin's own count (its tick's busy_s with --no-metrics) takes the same times.
        assert watches[model].busy == [pytest.approx(busy)], model
    assert sample(families, "wok_batch_reruns", "_total", model="slow") > 0
    assert sample(families, "wok_batch_reruns", "_total", model="one") == 0


async def test_an_answer_refused_as_too_large_is_counted_end_to_end_as_in_the_stages(serve, tmp_path):
    # With --max-request-bytes 1024 the send limit is 4 × 1024 + 1 MiB; the answer, 300,000 FP32
    # values, is over it. Its batch ran for a caller still there, so the batcher put it in the
    # batch stages; the end-to-end histogram (and decode, respond, encode) left it out, so the
    # stages counted requests the end-to-end one did not (docs/metrics.md: the same requests).
    width = 300_000
    write_python_model(
        tmp_path / "repo" / "expand",
        REPEAT_MODEL,
        out_dims=width,
        parameters={"width": width},
        dynamic_batching={"max_queue_delay_ms": 1.0},
    )
    x = {"INPUT0": np.ones((1, 4), np.float32)}
    async with serve(repository=tmp_path / "repo", max_request_bytes=1024) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.ModelInfer(encode_request("expand", x), timeout=30)
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.value
            answers = [a async for a in stub.ModelStreamInfer(iter([encode_request("expand", x)]), timeout=30)]
            assert [a.error_message.startswith("the answer of model 'expand' is ") for a in answers] == [True]
            families = await asyncio.to_thread(scrape, server.http.port)
    assert sample(families, "wok_responses", "_total", model="expand", code="RESOURCE_EXHAUSTED") == 2
    assert sample(families, "wok_request_duration_seconds", "_count", model="expand") == 2
    counts = {
        stage: sample(families, "wok_request_stage_duration_seconds", "_count", model="expand", stage=stage)
        for stage in STAGES
    }
    assert counts == observed(server, "expand", 2)


# A delay flush sends its batch when the oldest request has waited the delay, plus the event
# loop timer's lateness (~0.1 ms): at low rates every queue time is the delay plus a fraction
# of a millisecond, and the end-to-end is that plus the model's time.
@pytest.mark.parametrize(
    ("series", "above_ms", "within_ms"),
    [
        # Queue times just over the default delay: the bucket (5, 5.5] ms holds them, so
        # histogram_quantile's interpolation reads them within its width. With 5 and 7.5 ms
        # neighbours the P99 of 5.0-5.2 ms read as 7.47 ms, at every rate.
        ("queue", (0.0, 0.2), 0.5),
        ("queue", (0.0, 0.5), 0.5),  # a loop late by up to 0.5 ms
        # End-to-end at low load: the delay plus a small model's 0.3-0.8 ms, in (5.5, 6.5] ms, 1 ms wide.
        ("e2e", (0.3, 0.8), 1.0),
    ],
)
def test_quantiles_of_times_just_over_the_default_delay_read_close_to_the_truth(series, above_ms, within_ms):
    delay = DynamicBatchingConfig().max_queue_delay_ms / 1e3
    times = delay + np.linspace(*above_ms, 201) / 1e3
    registry = CollectorRegistry()
    m = WokMetrics(registry, gpu=False).model("mlp", instances=1)
    for t in times:
        if series == "queue":
            m.record_batch(0, requests=1, samples=1, queue_waits=[t], assemble=0, h2d=0, compute=0, d2h=0, busy=0)
        else:
            m.record_response(decode=0, respond=0, encode=0, total=t)
    name, labels = (
        ("wok_request_stage_duration_seconds", {"stage": "queue"})
        if series == "queue"
        else ("wok_request_duration_seconds", {})
    )
    buckets = [
        (float(s.labels["le"]), s.value)
        for f in registry.collect()
        for s in f.samples
        if s.name == name + "_bucket" and s.labels["model"] == "mlp" and labels.items() <= s.labels.items()
    ]
    for q in (0.5, 0.99):
        read, truth = histogram_quantile(q, buckets), float(np.quantile(times, q))
        assert abs(read - truth) <= within_ms / 1e3, (series, q, read * 1e3, truth * 1e3)
