"""A real Prometheus scrapes a real wok server; its P99 agrees with the requests' own.

The server's `wok_request_duration_seconds` histogram, read back through Prometheus'
`histogram_quantile`, must agree with the exact P99 of the same requests' latencies, to the
resolution that `LATENCY_BUCKETS` allows. The latencies it is held to are the server's own, one
per request: the server runs with `server_timing` on, and each answer's `server-timing` trailer
carries its `total` (handler entered → answer built), the very interval the histogram observes
(`record_response` in server/service.py). The client's own latencies are no yardstick for it:
the client shares this process and event loop with the server, and on a starved host its
tail (the loop late to send a request or to take its answer) grows past what the server times.
On a host probed at ~1,100 µs cold forward (normal 260-290), with two busy loops beside it, that
tail put the client's P99 two buckets above Prometheus' (1.41 s against 0.49 s) in 1 run of 6.
The client's P99 is held to a one-sided bound only (each client latency holds its request's
server time): it fails a histogram that reads plainly too high. It needs Debian's `prometheus`
package (which `.ci/run` installs); without it the test skips and says so.

Latency profile (sleep 10 ms, batches of at most 4, 1 ms batching delay, one instance):
the client sends 600 requests at Poisson arrivals averaging 200/s (about 3 s). Under load
the batcher forms the next batch while the current one runs, so a request typically
waits for a running batch and then its own: about 2-3 sleeps end to end. Measured on 2 CPUs
(normal speed): median about 27 ms, P99 about 35 ms. On the slow host above, the server-timed
P99 was 34-50 ms alone and 38-266 ms with two to six busy loops beside it (the client's mean 4-29 ms
above it), and the Prometheus P99 in its bucket every time: it is held to that bucket, not to a
latency.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from bisect import bisect_left
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from wok.codec import encode_request
from wok.metrics import LATENCY_BUCKETS
from wok.servertiming import SERVER_TIMING, parse_server_timing
from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

SLEEP_MS = 10.0
REQUESTS = 600
RATE = 200.0  # requests per second, mean of the Poisson arrivals
# A trailer writes each time to the µs: a total read back is within half of one of what was observed.
TRAILER_ROUNDING_S = 1e-6


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    def __init__(self, binary: str, workdir: Path, metrics_port: int) -> None:
        self.binary = binary
        self.workdir = workdir
        self.metrics_port = metrics_port
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / "prometheus.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        config = self.workdir / "prometheus.yml"
        config.write_text(
            "global:\n"
            "  scrape_interval: 1s\n"
            "  scrape_timeout: 1s\n"
            "scrape_configs:\n"
            "  - job_name: wok\n"
            "    static_configs:\n"
            f"      - targets: ['127.0.0.1:{self.metrics_port}']\n"
        )
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [
                    self.binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={self.workdir / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--web.enable-lifecycle",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError as exc:
            return f"(no Prometheus log: {exc})"
        return "--- prometheus log (tail) ---\n" + "\n".join(text[-lines:])

    def _get(self, path: str, params: dict | None = None) -> tuple[int, bytes]:
        url = self.url + path + ("?" + urllib.parse.urlencode(params) if params else "")
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    async def get(self, path: str, params: dict | None = None) -> tuple[int, bytes]:
        # In a thread: the wok server shares this event loop and must answer scrapes meanwhile.
        return await asyncio.to_thread(self._get, path, params)

    async def query(self, expr: str) -> float | None:
        status, body = await self.get("/api/v1/query", {"query": expr})
        assert status == 200, f"query {expr!r}: HTTP {status}: {body[:500]!r}\n{self.log_tail()}"
        result = json.loads(body)["data"]["result"]
        return float(result[0]["value"][1]) if result else None

    async def wait_until(self, what: str, probe: Callable, timeout: float, interval: float = 0.1):
        """Poll `probe()` (async; truthy when done) until it holds, for at most `timeout` seconds."""
        deadline = time.monotonic() + timeout
        last = None
        while True:
            assert self.proc is not None and self.proc.poll() is None, (
                f"Prometheus exited ({self.proc.returncode}) while waiting for {what}\n{self.log_tail()}"
            )
            with contextlib.suppress(OSError):  # connection refused before it listens
                last = await probe()
                if last:
                    return last
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})\n{self.log_tail()}"
                )
            await asyncio.sleep(interval)


@contextlib.contextmanager
def running_prometheus(binary: str, workdir: Path, metrics_port: int) -> Iterator[Prometheus]:
    prom = Prometheus(binary, workdir, metrics_port)
    try:
        prom.start()
        yield prom
    except BaseException:
        print(prom.log_tail(60))  # shown under "Captured stdout" when the test fails
        raise
    finally:
        prom.stop()


def served_count(metrics_port: int) -> int:
    """The slow model's wok_request_duration_seconds_count, read from the server's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    m = re.search(r'^wok_request_duration_seconds_count\{model="slow"\} (\S+)$', text, re.MULTILINE)
    assert m, text[-3000:]
    return int(float(m.group(1)))


def bucket_of(seconds: float) -> int:
    """Index of the bucket holding `seconds` (le is inclusive): (LATENCY_BUCKETS[i-1], LATENCY_BUCKETS[i]]."""
    return bisect_left(LATENCY_BUCKETS, seconds)


def bucket_bounds(i: int) -> tuple[float, float]:
    return (LATENCY_BUCKETS[i - 1] if i > 0 else 0.0), (LATENCY_BUCKETS[i] if i < len(LATENCY_BUCKETS) else np.inf)


def p99(values: list[float]) -> float:
    """The exact P99 (nearest rank: the ⌈0.99 n⌉-th smallest), the rank histogram_quantile picks its bucket by."""
    return float(np.percentile(values, 99, method="inverted_cdf"))


@pytest.mark.timeout(90)
async def test_prometheus_p99_of_the_server_histogram_matches_the_requests_p99(serve, slow_repository, tmp_path):
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("Debian's prometheus package is not installed (.ci/run installs it with apt-get)")
    repo = slow_repository(sleep_ms=SLEEP_MS, max_batch_size=4, delay_ms=1.0)
    began = time.perf_counter()
    async with serve(models=(), repository=repo, server_timing=True) as server:
        t_server = time.perf_counter()
        with running_prometheus(binary, tmp_path, server.http.port) as prom:

            async def ready():
                return (await prom.get("/-/ready"))[0] == 200

            await prom.wait_until("/-/ready", ready, timeout=30)
            t_prom = time.perf_counter()
            # The load starts without waiting for the target to be up (Prometheus 2.42 finds its
            # targets about 5 s after it is ready): every query below reads the server's cumulative
            # counters after the last request, whenever the first scrape came.

            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                stub = pb_grpc.GRPCInferenceServiceStub(channel)
                req = encode_request("slow", {"INPUT0": np.ones((1, 4), np.float32)})
                # Each request's latency as the client saw it and as the server timed it (its
                # trailer's `total`), in seconds, side by side: every request the histogram counts.
                latencies: list[tuple[float, float]] = []

                async def one() -> None:
                    t0 = time.perf_counter()
                    call = stub.ModelInfer(req)
                    await call
                    client = time.perf_counter() - t0
                    trailer = dict(await call.trailing_metadata()).get(SERVER_TIMING)
                    assert trailer is not None, "an answer without a server-timing trailer, with server_timing on"
                    latencies.append((client, parse_server_timing(trailer)["total"] / 1e3))

                await one()  # warm the channel; counted below
                # Open loop: each request leaves at its scheduled time, whether or not the
                # earlier ones have come back.
                arrivals = np.cumsum(np.random.default_rng(11).exponential(1 / RATE, REQUESTS))
                start = time.perf_counter()
                tasks = []
                for at in arrivals:
                    await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
                    tasks.append(asyncio.create_task(one()))
                results = await asyncio.gather(*tasks, return_exceptions=True)
                t_load = time.perf_counter()
            failed = [r for r in results if isinstance(r, BaseException)]
            assert not failed, f"{len(failed)} of {REQUESTS} failed, first: {failed[0]!r}"
            sent = REQUESTS + 1
            assert len(latencies) == sent, len(latencies)
            # Prometheus' first scrape mostly comes after the load: one read of the test's own, before
            # or after it, so that a count reset by a read fails here or in counted_all. (The last
            # answers may be counted a moment after the client has them.)
            own_read = await asyncio.to_thread(served_count, server.http.port)
            assert 0 < own_read <= sent, own_read

            count_expr = 'sum(wok_request_duration_seconds_count{model="slow"})'

            async def counted_all():
                return await prom.query(count_expr) == sent

            # The first scrape can come up to about 6 s after Prometheus is ready, 3 s after the load.
            await prom.wait_until(f"{count_expr} == {sent}", counted_all, timeout=20)
            t_scraped = time.perf_counter()
            prom_p99 = await prom.query(
                'histogram_quantile(0.99, sum by (le) (wok_request_duration_seconds_bucket{model="slow"}))'
            )
            prom_mean = await prom.query(
                'sum(wok_request_duration_seconds_sum{model="slow"}) / '
                'sum(wok_request_duration_seconds_count{model="slow"})'
            )
            log_tail = prom.log_tail()
            assert prom_p99 is not None and prom_mean is not None, f"empty query result\n{log_tail}"

    client = np.array([c for c, _ in latencies])
    timed = np.array([t for _, t in latencies])
    outside = client - timed  # the client, the transport, gRPC's own work, and the loop's lateness to each
    client_p99, timed_p99 = p99(client), p99(timed)
    i_timed, i_prom = bucket_of(timed_p99), bucket_of(prom_p99)
    lo, hi = bucket_bounds(i_timed)
    prom_lo, prom_hi = bucket_bounds(i_prom)
    client_lo, client_hi = bucket_bounds(bucket_of(client_p99))
    report = (
        f"server-timed P99 {timed_p99 * 1e3:.1f} ms in bucket ({lo * 1e3:g}, {hi * 1e3:g}] ms; "
        f"Prometheus P99 {prom_p99 * 1e3:.1f} ms in bucket ({prom_lo * 1e3:g}, {prom_hi * 1e3:g}] ms; "
        f"client P99 {client_p99 * 1e3:.1f} ms in bucket ({client_lo * 1e3:g}, {client_hi * 1e3:g}] ms; "
        f"means: client {client.mean() * 1e3:.1f} ms, server-timed {timed.mean() * 1e3:.3f} ms, "
        f"Prometheus {prom_mean * 1e3:.3f} ms; outside the server: mean {outside.mean() * 1e3:.1f} ms, "
        f"P50 {np.median(outside) * 1e3:.1f} ms, P99 {p99(outside) * 1e3:.1f} ms, max {outside.max() * 1e3:.1f} ms; "
        f"timings: server up {t_server - began:.1f} s, Prometheus ready {t_prom - t_server:.1f} s, "
        f"{REQUESTS} requests {t_load - t_prom:.1f} s, all counted by Prometheus {t_scraped - t_load:.1f} s later\n"
        f"{log_tail}"
    )
    print(report)
    # histogram_quantile picks the bucket holding the ⌈0.99 n⌉-th smallest observation, the exact P99's,
    # then interpolates linearly inside it (with most requests in the P99's bucket it reads close to
    # that bucket's top): the two agree to within a bucket, not better (a trailer's rounding can move
    # a total on a bound to its neighbour).
    assert abs(i_timed - i_prom) <= 1, report
    assert abs(prom_p99 - timed_p99) <= hi - lo, report
    # Each client latency holds its request's server time, so the client's P99 is at least the
    # server's, which lies above the bottom of Prometheus' bucket: a histogram reading plainly too
    # high fails here too. No bound the other way: the client's own tail is the host's, not wok's.
    assert client_p99 >= prom_lo, report
    # The histogram observes exactly the trailers' totals (to their µs rounding), so its sum over its
    # count is their mean: a histogram that observes some other interval fails here, however wide
    # the buckets its P99 falls in are.
    assert abs(prom_mean - timed.mean()) <= TRAILER_ROUNDING_S, report
    assert SLEEP_MS / 1e3 <= prom_mean <= client.mean(), report
