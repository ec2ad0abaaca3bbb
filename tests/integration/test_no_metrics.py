"""`wok serve --no-metrics`: no HTTP port at all, unless --admin needs one; there /metrics answers 404,
and /events gives the figures it can count without metrics and null, with the reason, for the rest."""

from __future__ import annotations

import asyncio
import http.client
import json
import os

import grpc
import numpy as np
import pytest

from wok.auth import security_warnings
from wok.codec import encode_request
from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

METRICS_OFF = b"metrics are off: this server runs with --no-metrics\n"


def listening_ports(pid: int) -> set[int]:
    """The TCP ports process `pid` listens on (its sockets' inodes, found in /proc/net/tcp{,6})."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if link.startswith("socket:["):
            inodes.add(link[len("socket:[") : -1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.read().splitlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                    ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


def get(conn: http.client.HTTPConnection, path: str, method: str = "GET") -> tuple[int, bytes]:
    conn.request(method, path)
    r = conn.getresponse()
    return r.status, r.read()


# The `wok serve` arguments of each test that runs a server process of its own.
OWN_SERVERS = {
    "test_no_metrics_opens_no_http_port_and_says_so": ("--models", "mlp", "--no-metrics"),
    "test_no_metrics_with_admin_opens_the_port_for_the_admin_api_and_metrics_answers_404": (
        "--models",
        "mlp",
        "--no-metrics",
        "--admin",
    ),
}


@pytest.fixture(scope="module")
def own_servers(request, start_server_module, at_once):
    """The server of each selected test of OWN_SERVERS, all started at once (each start is mostly a
    process's imports). Not autouse: made by the first of those tests. Each test stops its own; one
    left running (its test failed or never ran) is killed here."""
    selected = {item.originalname for item in request.session.items if getattr(item, "module", None) is request.module}
    args = {name: a for name, a in OWN_SERVERS.items() if name in selected}
    with at_once(start_server_module, args) as servers:
        yield servers


def own_server(own_servers, request):
    """The test's own server of `own_servers`: no other test talks to it."""
    assert request.node.originalname in own_servers, f"{request.node.originalname}: not in OWN_SERVERS"
    return own_servers[request.node.originalname]


def test_no_metrics_opens_no_http_port_and_says_so(own_servers, request):
    sp = own_server(own_servers, request)
    assert "wok: metrics off (--no-metrics): no HTTP port" in sp.log
    assert not any(line.startswith("wok: metrics on") for line in sp.log)
    assert listening_ports(sp.proc.pid) == {sp.port}
    assert sp.terminate() == 0


def test_no_metrics_with_admin_opens_the_port_for_the_admin_api_and_metrics_answers_404(own_servers, request):
    sp = own_server(own_servers, request)
    line = sp.wait_for_line("wok: metrics off (--no-metrics); admin API on http://")
    assert line.endswith(" (/metrics answers 404)")
    host, port = line.split("http://")[1].split()[0].rsplit(":", 1)
    assert listening_ports(sp.proc.pid) == {sp.port, int(port)}
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        assert get(conn, "/metrics") == (404, METRICS_OFF)
        status, body = get(conn, "/admin/batching")
        assert status == 200 and [m["model"] for m in json.loads(body)["models"]] == ["mlp"]
    finally:
        conn.close()
    assert sp.terminate() == 0


async def test_the_metrics_port_of_a_server_recording_none_answers_404_and_keeps_the_connection(serve):
    async with serve(models=("mlp",), metrics=False, admin=True) as server:

        def talk() -> list[tuple[int, bytes]]:
            conn = http.client.HTTPConnection("127.0.0.1", server.http.port, timeout=10)
            try:  # one kept-alive connection throughout
                return [get(conn, "/metrics"), get(conn, "/metrics", "HEAD"), get(conn, "/admin/faults")]
            finally:
                conn.close()

        (status, body), head, faults = await asyncio.to_thread(talk)
    assert (status, body) == (404, METRICS_OFF)
    assert head == (404, b"")
    assert faults[0] == 200


async def _first_tick_after_requests(server, requests: int) -> dict:
    """The first /events tick that counts `requests` successes, after that many one-request batches."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.http.port)
    try:
        writer.write(f"GET /events HTTP/1.1\r\nHost: 127.0.0.1:{server.http.port}\r\n\r\n".encode())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert b"200 OK" in head
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            for _ in range(requests):
                await stub.ModelInfer(encode_request("mlp", {"INPUT0": np.ones((3, 256), np.float32)}))
        while True:  # the answers are out, so a tick made from now on counts them
            line = await asyncio.wait_for(reader.readline(), 10)
            if line.startswith(b"data: "):
                event = json.loads(line[6:])
                if event["type"] == "tick" and event["models"]["mlp"]["succeeded"] >= requests:
                    return event
    finally:
        writer.close()


async def test_events_ticks_with_metrics_off_count_busy_time_and_say_responses_are_not_counted(serve):
    async with serve(models=("mlp",), metrics=False, admin=True) as server:
        tick = await _first_tick_after_requests(server, 3)
    mlp = tick["models"]["mlp"]
    assert (mlp["samples"], mlp["batches"], mlp["flushes"]) == (9, 3, {"delay": 3})
    # Counted without metrics, from the batches' worker times: real, not the zeros of metrics that are off.
    assert len(mlp["busy_s"]) == 1 and mlp["busy_s"][0] > 0, mlp
    # Counted only as metrics: null, with the reason, rather than an empty count that reads as no traffic.
    assert mlp["responses"] is None, mlp
    assert set(tick.get("unavailable", ())) == {"responses"}, tick
    assert "--no-metrics" in tick["unavailable"]["responses"]


async def test_events_ticks_with_metrics_on_take_their_figures_from_the_metrics(serve):
    async with serve(models=("mlp",), metrics=True, admin=True) as server:
        tick = await _first_tick_after_requests(server, 2)
        busy = server.runtimes["mlp"].metrics.busy_seconds
    mlp = tick["models"]["mlp"]
    assert "unavailable" not in tick
    assert mlp["responses"] == {"OK": 2}
    assert mlp["busy_s"] == [round(b, 6) for b in busy] and busy[0] > 0


async def test_a_library_server_with_metrics_off_serves_on_its_port_only_what_its_warning_names(serve):
    """Settings with metrics off keep a metrics port (the CLI clears it without --admin): what the
    port serves is what security_warnings must name for it beyond loopback."""
    for admin in (False, True):
        async with serve(models=("mlp",), metrics=False, admin=admin) as server:

            def talk() -> dict[str, int]:
                conn = http.client.HTTPConnection("127.0.0.1", server.http.port, timeout=10)
                try:
                    answers = {path: get(conn, path)[0] for path in ("/metrics", "/admin/faults")}
                finally:
                    conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", server.http.port, timeout=10)
                try:  # a stream: only its status is read
                    conn.request("GET", "/events")
                    answers["/events"] = conn.getresponse().status
                finally:
                    conn.close()
                return answers

            answers = await asyncio.to_thread(talk)
            exposed = server.settings.model_copy(update={"metrics_host": "0.0.0.0"})
            warnings = security_warnings(exposed)
        assert answers["/metrics"] == 404
        if admin:
            assert answers["/admin/faults"] == answers["/events"] == 200
            [warning] = warnings
            assert warning.startswith("the admin API (/admin/*, /events) listens on 0.0.0.0:"), warning
            assert "/metrics listens" not in warning and "/metrics is off" in warning
        else:
            assert answers["/admin/faults"] == answers["/events"] == 404
            assert warnings == [], "the port serves only 404s (and at / that metrics are off): nothing is exposed"
