"""The page's API over real HTTP on loopback: what it refuses (cross-site requests, malformed
requests, values the page must not send), what it answers when the wok server is gone, and the
live demo's server: its queue bound, its faults untouched by refused requests, its end with the demo.

The in-process tests run the page's server (DemoWeb) on a free port with the simulated backend,
or with the live one pointed at a port nobody listens on, or run `wok demo` itself in this process
where it must refuse before starting anything; the rest run `wok demo` as a process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import sys
import tempfile
import time
import urllib.error
import urllib.request
from email.utils import formatdate, parsedate_to_datetime
from pathlib import Path

import pytest

from wok.bench.simulate import BatcherModel
from wok.demo.cli import MODEL, LiveDemo, SimulatedDemo
from wok.demo.load import LoadControl
from wok.demo.sim import SimBackend
from wok.demo.web import DemoWeb, Hub
from wok.http import HOST_SHAPE
from wok.models.limits import MAX_QUEUE_SIZE

from .conftest import live_page

JSON = "application/json"


async def exchange(port: int, request: bytes) -> tuple[int, dict]:
    """Send raw bytes to the page's server; (status, JSON answer) of its first answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        lines = head.decode("latin-1").split("\r\n")
        length = next(int(ln.split(":", 1)[1]) for ln in lines if ln.lower().startswith("content-length:"))
        body = await asyncio.wait_for(reader.readexactly(length), 10)
    finally:
        writer.close()
    return int(lines[0].split(" ")[1]), json.loads(body)


def post(port: int, path: str, body: bytes, ctype: str = JSON, extra: str = "", host: str = "127.0.0.1") -> bytes:
    """A POST as a browser or a tool sends it; `extra` adds header lines."""
    return (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: {ctype}\r\n{extra}"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


@pytest.fixture
async def sim_page():
    """The page's server on a free loopback port, with the simulator (max batch 32, 5 ms, 100/s) behind it."""
    model = BatcherModel(alpha_s=2.5e-4, beta_s=4.4e-5, max_batch_size=32, max_queue_delay_s=0.005)
    backend = SimulatedDemo(SimBackend(LoadControl(100), model), slo_s=0.05)
    web = DemoWeb(backend, Hub(), "127.0.0.1", 0)
    await web.start()
    yield web
    await web.stop()


async def answer_head(port: int, request: bytes) -> tuple[list[str], bytes]:
    """Send raw bytes to the page's server; its first answer's head lines and body (none for a stream)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        lines = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)).decode("latin-1").split("\r\n")[:-2]
        length = next((int(ln.split(":", 1)[1]) for ln in lines if ln.lower().startswith("content-length:")), 0)
        return lines, await asyncio.wait_for(reader.readexactly(length), 10)
    finally:
        writer.close()


async def config(port: int) -> dict:
    status, answer = await exchange(port, f"GET /api/config HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
    assert status == 200, answer
    return answer


async def test_a_batching_body_that_changes_nothing_is_refused_as_the_admin_api_refuses_it(sim_page):
    """The simulator answered `{}` (and the model alone, and a null field) 200, changing nothing,
    where the admin API, which the live page relays to, refuses each (server/admin.py)."""
    port = sim_page.port
    before = (await config(port))["batching"]
    neither = "field 'max_batch_size': expected it or max_queue_delay_ms; got neither"
    for body in (b"{}", b'{"model": "simulated"}'):
        assert await exchange(port, post(port, "/api/batching", body)) == (400, {"error": neither}), body
    refusals = {
        "max_batch_size": (
            "field 'max_batch_size': expected an integer from 1 to 32 (the model's configured maximum); got null"
        ),
        "max_queue_delay_ms": "field 'max_queue_delay_ms': expected a number from 0 to 60000; got null",
    }
    for field, error in refusals.items():
        body = json.dumps({field: None}).encode()
        assert await exchange(port, post(port, "/api/batching", body)) == (400, {"error": error})
    assert (await config(port))["batching"] == before


async def test_a_body_not_in_utf8_is_refused_as_the_admin_api_refuses_it(sim_page):
    """json.loads() of bytes read UTF-16 and UTF-32, and a charset parameter was ignored: JSON is UTF-8
    (RFC 8259 8.1), and the admin API the live page relays to refuses both in the same words."""
    port = sim_page.port
    rate = '{"rate": 5000}'
    status, answer = await exchange(port, post(port, "/api/load", rate.encode("utf-16")))
    assert (status, answer) == (415, {"error": "body: expected JSON in UTF-8 (RFC 8259); got UTF-16 text"})
    charset = post(port, "/api/load", rate.encode(), ctype="application/json; charset=iso-8859-1")
    error = "Content-Type charset: expected utf-8 (JSON is UTF-8, RFC 8259); got 'iso-8859-1'"
    assert await exchange(port, charset) == (415, {"error": error})
    assert (await config(port))["load"]["rate"] == 100
    taken = post(port, "/api/load", b'{"rate": 40}', ctype="application/json; charset=utf-8")
    assert (await exchange(port, taken))[0] == 200


async def test_cross_site_posts_are_refused_and_change_nothing(sim_page):
    port = sim_page.port
    rate = b'{"rate": 5000}'
    status, answer = await exchange(port, post(port, "/api/load", rate, ctype="text/plain"))
    assert status == 415 and "Content-Type: expected application/json" in answer["error"]
    # A C0 separator is no white space in HTTP (RFC 9110 5.6.3): str.strip() dropped it and took the POST.
    status, answer = await exchange(port, post(port, "/api/load", rate, ctype="application/json\x1f"))
    error = "Content-Type: expected application/json for a POST; got 'application/json\\x1f'"
    assert (status, answer) == (415, {"error": error})
    status, answer = await exchange(port, post(port, "/api/load", rate, extra="Origin: http://evil.example\r\n"))
    assert status == 403 and answer["error"].endswith("cross-site requests); got 'http://evil.example'")
    rebound = post(port, "/api/batching", b'{"max_batch_size": 1}', host="rebind.evil.example")
    status, answer = await exchange(port, rebound)
    assert status == 403 and answer["error"].endswith(f"answers; got 'rebind.evil.example:{port}'")
    # A DNS name rebound to loopback must not read the state either.
    get = b"GET /api/config HTTP/1.1\r\nHost: rebind.evil.example\r\n\r\n"
    assert (await exchange(port, get))[0] == 403
    cfg = await config(port)
    assert cfg["load"]["rate"] == 100 and cfg["batching"]["max_batch_size"] == 32
    # The page's own requests: same origin, JSON.
    own = f"Origin: http://127.0.0.1:{port}\r\n"
    status, answer = await exchange(port, post(port, "/api/load", b'{"rate": 40}', extra=own))
    assert status == 200 and answer["rate"] == 40


@pytest.mark.parametrize(
    "host", ["127.0.0.1/x", "localhost?x", "localhost#x", "evil.example@127.0.0.1", "127.0.0.1:80/x", "::1"]
)
async def test_a_host_that_is_not_host_port_gets_400_on_every_path_and_changes_nothing(sim_page, host):
    # The cross-site check read `127.0.0.1/x` as the address 127.0.0.1 (the URL's host), and the
    # POST took; the metrics port refuses such a Host with 400 (RFC 9112 3.2), so does the page.
    port = sim_page.port
    refused = (400, {"error": f"Host: expected {HOST_SHAPE}; got '{host}'"})
    body = b'{"rate": 5000}'
    head = f"POST /api/load HTTP/1.1\r\nHost: {host}\r\nContent-Type: {JSON}\r\nContent-Length: {len(body)}\r\n\r\n"
    assert await exchange(port, head.encode() + body) == refused
    for path in ("/", "/api/config", "/nope"):
        assert await exchange(port, f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()) == refused
    assert (await config(port))["load"]["rate"] == 100


@pytest.mark.parametrize(
    ("hosts", "error"),
    [
        (["evil.example", "127.0.0.1"], "Host: expected one header; got 2: 'evil.example', '127.0.0.1'"),
        (["127.0.0.1", "127.0.0.1"], "Host: expected one header; got 2: '127.0.0.1', '127.0.0.1'"),
        ([], "Host: expected one header; got none (RFC 9112 3.2)"),
    ],
    ids=["two-hosts", "two-equal-hosts", "none"],
)
async def test_an_http_1_1_request_without_exactly_one_host_gets_400_and_changes_nothing(sim_page, hosts, error):
    # Two Hosts were read by the last one (a proxy in front may read the first); none on HTTP/1.1
    # got the cross-site check's 403, where RFC 9112 3.2 asks for 400, as the metrics port answers.
    port, body = sim_page.port, b'{"rate": 5000}'
    fields = "".join(f"Host: {h}\r\n" for h in hosts)
    request = f"POST /api/load HTTP/1.1\r\n{fields}Content-Type: {JSON}\r\nContent-Length: {len(body)}\r\n\r\n"
    assert await exchange(port, request.encode() + body) == (400, {"error": error})
    assert (await config(port))["load"]["rate"] == 100
    # HTTP/1.0 predates Host: none is no shape error there, but not an address either.
    status, answer = await exchange(port, b"GET /api/config HTTP/1.0\r\n\r\n")
    assert (
        status == 403
        and answer["error"] == "Host: expected an IP address or localhost, all the demo's page answers; got ''"
    ), answer


async def test_every_answer_carries_a_date_and_the_hosts_a_browser_sends_are_served(sim_page):
    # RFC 9110 6.6.1: an origin server with a clock MUST send Date in its 2xx, 3xx and 4xx answers.
    port = sim_page.port
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"):
        own = f"Host: {host}\r\nOrigin: http://{host}\r\n"
        requests = {
            200: [
                f"GET / HTTP/1.1\r\n{own}\r\n",
                f"GET /static/demo.js HTTP/1.1\r\n{own}\r\n",
                f"GET /api/config HTTP/1.1\r\n{own}\r\n",
                f"POST /api/load HTTP/1.1\r\n{own}Content-Type: {JSON}\r\nContent-Length: 13\r\n\r\n" + '{"rate": 100}',
                f"GET /api/events HTTP/1.1\r\n{own}\r\n",
            ],
            400: [f"GET / HTTP/1.1\r\nHost: {host}/x\r\n\r\n"],
            403: [f"GET / HTTP/1.1\r\nHost: {host}\r\nOrigin: http://evil.example\r\n\r\n"],
            404: [f"GET /nope HTTP/1.1\r\n{own}\r\n"],
            405: [f"DELETE / HTTP/1.1\r\n{own}\r\n"],
            431: [f"GET / HTTP/1.1\r\n{own}X-Big: {'a' * 20_000}\r\n\r\n"],
        }
        for status, sent in requests.items():
            for request in sent:
                lines, _ = await answer_head(port, request.encode())
                assert lines[0].startswith(f"HTTP/1.1 {status} "), (request[:60], lines)
                dates = [ln[len("Date: ") :] for ln in lines if ln.startswith("Date: ")]
                assert len(dates) == 1, (request[:60], lines)
                # IMF-fixdate, in GMT (RFC 9110 5.6.7): it reads back, and is written back the same.
                assert formatdate(parsedate_to_datetime(dates[0]).timestamp(), usegmt=True) == dates[0], dates


async def test_a_404_names_the_path_asked_for_escaped_and_cut_and_the_paths_served(sim_page):
    port = sim_page.port
    served = (
        "; paths: /, /static/<file> (the page's script and style), GET /api/config, GET /api/events, "
        "POST /api/load, POST /api/batching, POST /api/faults"
    )
    status, answer = await exchange(port, b"GET /nope\x1b\xe9 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert (status, answer) == (404, {"error": "no path '/nope\\x1b\\xe9' here" + served})
    # Whatever the method (it got 405, which says the path exists).
    status, answer = await exchange(port, post(port, "/static/nope.js", b"{}"))
    assert (status, answer) == (404, {"error": "no path '/static/nope.js' here" + served})
    # A 10 KB path makes no 10 KB answer.
    status, answer = await exchange(port, b"GET /" + b"a" * 10_000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert (status, answer) == (404, {"error": f"no path '/{'a' * 199}'… (10,001 characters in all) here" + served})
    the_api = "; the API: GET /api/config, GET /api/events, POST /api/load, POST /api/batching, POST /api/faults"
    status, answer = await exchange(port, b"GET /api/load HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert (status, answer) == (404, {"error": "no API 'GET /api/load'" + the_api})


@pytest.mark.parametrize(
    ("request_", "error"),
    [
        (b"POST /api/load HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: abc\r\n\r\n", "Content-Length: expected"),
        (b"POST /api/load HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: -5\r\n\r\n", "got '-5'"),
        (
            b"GARBAGE\r\n\r\n",
            "request line: expected a method, a target and a version separated by single spaces; got 'GARBAGE'",
        ),
        (post(0, "/api/load", b"[" * 30_000 + b"]" * 30_000), "body: expected JSON; got one nested too deeply"),
    ],
    ids=["length-abc", "length-negative", "request-line", "nested-json"],
)
async def test_malformed_requests_get_400_and_the_server_goes_on(sim_page, request_, error):
    status, answer = await exchange(sim_page.port, request_)
    assert status == 400 and error in answer["error"]
    assert (await config(sim_page.port))["load"]["rate"] == 100


async def test_simulator_refuses_a_batch_above_the_configured_maximum(sim_page):
    port = sim_page.port
    status, answer = await exchange(port, post(port, "/api/batching", b'{"max_batch_size": 200}'))
    assert status == 400 and answer["error"] == (
        "field 'max_batch_size': expected an integer from 1 to 32 (the model's configured maximum); got 200"
    )
    status, answer = await exchange(port, post(port, "/api/batching", b'{"max_batch_size": 8}'))
    assert status == 200 and (answer["max_batch_size"], answer["limit_batch_size"]) == (8, 32)
    status, answer = await exchange(port, post(port, "/api/batching", b'{"max_batch_size": 32}'))
    assert status == 200 and answer["max_batch_size"] == 32


@pytest.mark.parametrize(
    ("body", "error"),
    [
        # Taken: the simulated model changed though the body named another.
        (
            b'{"model": "encoder", "max_batch_size": 4}',
            "field 'model': expected 'simulated' (the one model simulated) or none; got 'encoder'",
        ),
        # Taken, changing nothing, where the live server's admin API refuses a field it does not know.
        (
            b'{"max_batch": 4}',
            "field 'max_batch': expected only the fields max_batch_size, max_queue_delay_ms, model; got 4",
        ),
    ],
    ids=["another-model", "unknown-field"],
)
async def test_simulator_refuses_another_model_or_an_unknown_field_and_changes_nothing(sim_page, body, error):
    port = sim_page.port
    status, answer = await exchange(port, post(port, "/api/batching", body))
    assert (status, answer) == (400, {"error": error})
    assert (await config(port))["batching"]["max_batch_size"] == 32
    status, answer = await exchange(port, post(port, "/api/batching", b'{"model": "simulated", "max_batch_size": 4}'))
    assert status == 200 and answer["max_batch_size"] == 4, answer


async def test_a_body_the_demo_refuses_itself_is_answered_400_with_its_message(sim_page):
    # The refusals raised as AdminRequestError, a ValueError, are answered as before: 400 and the message, simulated
    # or live (refused before any call to the admin port, here one where nothing listens).
    live, backend = await live_page(_closed_port())
    no_object = (b"[]", "body: expected a JSON object; got []")
    try:
        for port, path, (body, error) in [
            (sim_page.port, "/api/batching", no_object),
            (live.port, "/api/batching", no_object),
            (live.port, "/api/faults", no_object),
            (
                live.port,
                "/api/faults",
                (
                    b'{"mode": "slow", "delay_ms": 0}',
                    "field 'delay_ms': expected a number above 0 up to 60000 for mode 'slow'; got 0",
                ),
            ),
        ]:
            assert await exchange(port, post(port, path, body)) == (400, {"error": error}), (port, path, body)
    finally:
        await live.stop()
        await backend.close()


async def test_the_live_demo_refuses_another_model_itself_and_sends_its_own():
    """The body's "model" went over the demo's ({"model": MODEL, **body}): sent on to the server,
    which the page does not choose. The demo's model is the one the page controls: a body that
    names another is refused here, before any call (it got the server's 502 here: nothing listens),
    and one that names the demo's, or none, is sent with the demo's."""
    posted: list[dict] = []

    async def admin_api(reader, writer):  # the admin port's side of one POST, answered 200
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(next(ln for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length:")).split(b":")[1])
        posted.append(json.loads(await reader.readexactly(length)))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
        await writer.drain()
        writer.close()

    admin = await asyncio.start_server(admin_api, "127.0.0.1", 0)
    web, backend = await live_page(admin.sockets[0].getsockname()[1])
    try:
        port = web.port
        for path in ("/api/batching", "/api/faults"):
            status, answer = await exchange(port, post(port, path, b'{"model": "encoder", "mode": "fail"}'))
            error = f"field 'model': expected '{MODEL}' (the demo's model) or none; got 'encoder'"
            assert (status, answer) == (400, {"error": error}), path
        assert posted == []
        for body in (b'{"model": "mlp", "max_batch_size": 4}', b'{"max_batch_size": 4}'):
            assert await exchange(port, post(port, "/api/batching", body)) == (200, {})
        assert posted == [{"max_batch_size": 4, "model": MODEL}] * 2
    finally:
        await web.stop()
        await backend.close()
        admin.close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_live_api_answers_502_when_the_server_is_gone_and_refuses_a_zero_slow_fault():
    args = argparse.Namespace(instances=2, max_batch_size=32, device="cpu", torch_threads=1)
    backend = LiveDemo(LoadControl(0), args, delay_s=0.005, slo_s=0.05)
    backend.admin = ("127.0.0.1", _closed_port())  # as after the server died
    web = DemoWeb(backend, Hub(), "127.0.0.1", 0)
    await web.start()
    try:
        port = web.port
        status, answer = await exchange(port, post(port, "/api/faults", b'{"mode": "slow", "delay_ms": 0}'))
        assert status == 400 and answer["error"].startswith("field 'delay_ms': expected a number above 0"), answer
        status, answer = await exchange(port, post(port, "/api/faults", b'{"instance": 0, "mode": "fail"}'))
        assert status == 502 and answer["error"].startswith("the wok server did not answer: "), answer
        status, answer = await exchange(port, post(port, "/api/batching", b'{"max_batch_size": 4}'))
        assert status == 502, answer
    finally:
        await web.stop()
        await backend.close()


def _request(url: str, body: bytes | None = None, headers: dict | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=body, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture(scope="module")
def live_demos(start_demo_module) -> dict:
    """The live demos the tests below take apart, started at once: each start is mostly
    two processes' imports (the demo's, then its server's)."""
    demos = {"refuses": start_demo_module("--rate", "20", ready=False)}
    demos["stuck"] = start_demo_module("--rate", "0", ready=False)
    demos["overloaded"] = start_demo_module("--rate", "0", ready=False)
    return {name: d.ready() for name, d in demos.items()}


@pytest.mark.timeout(120)
def test_live_demo_refuses_cross_site_faults_and_bounds_the_queue(live_demos):
    demo = live_demos["refuses"]
    admin = _request(demo.url + "api/config")[1]["server"]["admin"]
    fail = b'{"mode": "fail"}'
    assert _request(demo.url + "api/faults", fail, {"Content-Type": "text/plain"})[0] == 415
    assert _request(demo.url + "api/faults", fail, {"Content-Type": JSON, "Origin": "http://evil.example"})[0] == 403
    assert _request(demo.url + "api/faults", fail, {"Content-Type": JSON, "Host": "rebind.evil.example"})[0] == 403
    # Read by the cross-site check as the address 127.0.0.1, it reached the admin API and failed the model.
    assert _request(demo.url + "api/faults", fail, {"Content-Type": JSON, "Host": "127.0.0.1/x"})[0] == 400
    assert _request(admin + "/admin/faults") == (200, {"faults": []})
    slow0 = b'{"mode": "slow", "delay_ms": 0}'
    assert _request(demo.url + "api/faults", slow0, {"Content-Type": JSON})[0] == 400
    assert _request(admin + "/admin/faults") == (200, {"faults": []})
    # The documented bound: past 4,096 queued, RESOURCE_EXHAUSTED (the built-in demo models' own).
    (policy,) = _request(admin + "/admin/batching")[1]["models"]
    assert policy["max_queue_size"] == MAX_QUEUE_SIZE == 4096, policy
    with urllib.request.urlopen(demo.url + "api/events", timeout=10) as stream:
        load = next(json.loads(ln[6:]) for ln in stream if ln.startswith(b'data: {"type":"load"'))
    assert load["skipped"] == 0
    assert demo.stop() == 0


@pytest.mark.timeout(120)
def test_a_second_signal_kills_a_server_that_does_not_drain_at_once(live_demos, proc_tree):
    # A stopped server (SIGSTOP) cannot drain: the demo waited 15 s for it, deaf to a second Ctrl-C.
    demo = live_demos["stuck"]
    (server,) = proc_tree.children(demo.proc.pid)
    port = int(demo.url.rsplit(":", 1)[1].strip("/"))
    try:
        os.kill(server, signal.SIGSTOP)
        demo.proc.send_signal(signal.SIGTERM)
        # The page closes once the demo has begun to stop the server, its second-signal handler in place.
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=5).close()
            except ConnectionRefusedError:
                break
            except ConnectionResetError:
                continue  # a connection queued as the page's socket closed: the next one is refused
        t0 = time.monotonic()
        demo.proc.send_signal(signal.SIGTERM)
        assert demo.proc.wait(10) == 0
        assert time.monotonic() - t0 < 5, "the second signal waited for the server"
        assert not proc_tree.alive(server), "the demo's wok server outlived the demo"
    finally:
        if proc_tree.alive(server):
            os.kill(server, signal.SIGKILL)


def test_a_page_port_in_use_exits_2_in_one_line_before_any_server_starts(wok_cli, monkeypatch):
    # In this process: a child would spend seconds importing torch (demo/web.py pulls in the
    # server's admin routes) before the refusal. A server started anyway would be a child.
    import wok.demo.cli

    def no_server(*args, **kwargs):
        raise AssertionError("a wok server was started for a page that cannot listen")

    monkeypatch.setattr(wok.demo.cli, "popen_wok", no_server)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        status, _, err = wok_cli("demo", "--port", str(port))
    assert status == 2, err
    assert err == f"wok demo: --port: cannot listen on 127.0.0.1:{port}: Address already in use\n"


@pytest.mark.timeout(60)
def test_a_device_the_server_lacks_exits_2_in_one_line_naming_the_option(wok_cli, tmp_path, monkeypatch):
    # The real `wok serve` child (whose refusal this is) started by `wok demo` in this process. It
    # refused with exit 2; the demo said "-m wok serve did not start:" and its log's last 30 lines,
    # timestamps and the temporary config's path, and exited 1.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # read once per process: TMPDIR would not do
    status, _, err = wok_cli("demo", "--port", "0", "--device", "cuda:99")
    assert status == 2, err
    assert err.startswith(
        "wok demo: --device: the wok server refused 'cuda:99': instances.devices: device 'cuda:99' requested but "
    ), err
    assert err.count("\n") == 1, err
    assert not list(tmp_path.iterdir()), "the demo left its model repository behind"


@pytest.mark.timeout(120)
def test_arrivals_not_sent_count_the_last_seconds_and_clear_once_the_demo_keeps_up(live_demos, proc_tree):
    # A lifetime total, the page's red warning stayed up for good after one overload.
    demo = live_demos["overloaded"]
    (server,) = proc_tree.children(demo.proc.pid)
    with urllib.request.urlopen(demo.url + "api/events", timeout=30) as stream:
        loads = (json.loads(ln[6:]) for ln in stream if ln.startswith(b'data: {"type":"load"'))
        try:
            # A stopped server answers nobody: at 5,000/s every one of the demo's callers waits within 2 s.
            os.kill(server, signal.SIGSTOP)
            assert _request(demo.url + "api/load", b'{"rate": 5000}', {"Content-Type": JSON})[0] == 200
            overloaded = next(e for e in loads if e["skipped"] > 0)
            assert _request(demo.url + "api/load", b'{"rate": 20}', {"Content-Type": JSON})[0] == 200
        finally:
            os.kill(server, signal.SIGCONT)
        deadline = time.monotonic() + 20
        kept_up = next(e for e in loads if e["skipped"] == 0 or time.monotonic() > deadline)
    assert kept_up["skipped"] == 0, kept_up
    assert kept_up["skipped_total"] >= overloaded["skipped_total"] >= overloaded["skipped"] > 0


def _repository_of(server: int) -> Path:
    """The model repository a demo's server was started with (the demo's temporary folder)."""
    with open(f"/proc/{server}/cmdline") as f:
        args = f.read().split("\0")
    return Path(args[args.index("--model-repository") + 1])


@pytest.mark.skipif(
    sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's; reads the demos' servers' command lines in /proc"
)
@pytest.mark.timeout(120)
def test_sigkill_of_a_demo_ends_its_server_and_the_next_demo_removes_its_folder_and_no_running_ones(
    start_demo, proc_tree, tmp_path, monkeypatch
):
    # One demo killed for both checks: each start is two processes' imports (the demo's, then its server's).
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    running, killed = start_demo("--rate", "0", ready=False), start_demo("--rate", "0", ready=False)
    running.ready(), killed.ready()
    (running_folder,) = [_repository_of(s) for s in proc_tree.children(running.proc.pid)]
    (server,) = proc_tree.children(killed.proc.pid)
    killed_folder = _repository_of(server)
    try:
        killed.proc.kill()  # nothing of it can remove its folder
        killed.proc.wait(10)
        deadline = time.monotonic() + 15
        while proc_tree.alive(server) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not proc_tree.alive(server), "the demo's wok server outlived the demo"
    finally:
        if proc_tree.alive(server):
            os.kill(server, signal.SIGKILL)
    assert (killed_folder / MODEL / "config.yaml").is_file()
    # A pid file naming a process that runs but is not the demo that wrote it (its pid reused).
    reused = tmp_path / "wok-demo-reused"
    reused.mkdir()
    (reused / "demo.pid").write_text(f"{os.getpid()} 1\n")
    # No pid file: a demo between making its folder and writing the file, or one from before them.
    unmarked = tmp_path / "wok-demo-unmarked"
    unmarked.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    args = argparse.Namespace(instances=2, max_batch_size=32, device="cpu", torch_threads=1)
    new = LiveDemo(LoadControl(0), args, delay_s=0.005, slo_s=0.05)  # a demo starting
    try:
        assert {p.name for p in tmp_path.iterdir()} == {
            running_folder.name,
            unmarked.name,
            Path(new._tmp.name).name,
        }
        assert (running_folder / MODEL / "config.yaml").is_file()
    finally:
        asyncio.run(new.close())
    assert running.stop() == 0


def _framed(head: str, body: bytes = b"") -> bytes:
    return head.encode("latin-1") + body


RATE = b'{"rate": 5000}'


@pytest.mark.parametrize(
    ("request_", "refused"),
    [
        (
            _framed("GET /api/config HTTP/9.9\r\nHost: 127.0.0.1\r\n\r\n"),
            (505, "request line: expected HTTP/1.x as its version (this server speaks HTTP/1.1); got 'HTTP/9.9'"),
        ),
        (
            _framed("GET /api/config http/1.1\r\nHost: 127.0.0.1\r\n\r\n"),
            (400, "request line: expected HTTP/<digit>.<digit> as its version; got 'http/1.1'"),
        ),
        (
            _framed(
                f"P(ST /api/load HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {JSON}\r\nContent-Length: 14\r\n\r\n"
            ),
            (400, "request line: expected a method (a token); got 'P(ST'"),
        ),
        (
            _framed(f"POST /api/load HTTP/1.1\nHost: 127.0.0.1\nContent-Type: {JSON}\nContent-Length: 14\n\n", RATE),
            (400, "request line: expected CRLF at its end; got a bare LF: 'POST /api/load HTTP/1.1'"),
        ),
        (
            _framed(
                f"POST /api/load HTTP/1.1\r\nHost : 127.0.0.1\r\nContent-Type: {JSON}\r\nContent-Length: 14\r\n\r\n"
            ),
            (400, "header line 1: expected no space before the colon; got 'Host : 127.0.0.1'"),
        ),
        (
            _framed(
                f"POST /api/load HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type:\r\n {JSON}\r\nContent-Length: 14\r\n\r\n",
                RATE,
            ),
            (
                400,
                "header line 3: expected a field; got a continuation of the line before (obsolete line folding): "
                "' application/json'",
            ),
        ),
        (
            # Read by the last length, the body was the 14 bytes; a proxy reading the first sends 200.
            _framed(
                f"POST /api/load HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {JSON}\r\n"
                "Content-Length: 200\r\nContent-Length: 14\r\n\r\n",
                RATE,
            ),
            (400, "Content-Length: expected one header; got 2: '200', '14'"),
        ),
    ],
    ids=[
        "version-9.9",
        "version-lower-case",
        "method-not-a-token",
        "bare-lf",
        "space-before-colon",
        "folded",
        "two-lengths",
    ],
)
async def test_a_request_the_metrics_port_refuses_for_its_framing_is_refused_alike_and_changes_nothing(
    sim_page, request_, refused
):
    # Each was served (HTTP/9.9 as 1.1; two lengths by the last; a bare-LF head waited out the
    # idle timeout unanswered): the metrics port's status and message, in the page's JSON.
    status, error = refused
    assert await exchange(sim_page.port, request_) == (status, {"error": error})
    assert (await config(sim_page.port))["load"]["rate"] == 100


async def test_an_absolute_form_target_is_served_and_its_host_is_the_one_checked(sim_page):
    # RFC 9112 3.2.2: a server MUST accept it; it got 404. Its authority takes Host's place (as on
    # the metrics port), so a rebound name there is refused though the Host header is an address.
    port = sim_page.port
    get = f"GET http://127.0.0.1:{port}/api/config?x HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
    status, answer = await exchange(port, get)
    assert status == 200 and answer["load"]["rate"] == 100, answer
    rebound = post(port, f"http://rebind.evil.example:{port}/api/load", RATE)
    assert await exchange(port, rebound) == (
        403,
        {
            "error": "the request target's host: expected an IP address or localhost, all the demo's page answers; "
            f"got 'rebind.evil.example:{port}'"
        },
    )
    not_a_url = post(port, "http://u@127.0.0.1/api/load", RATE)
    assert await exchange(port, not_a_url) == (
        400,
        {
            "error": "request target: expected an http URL with a host and no userinfo; got 'http://u@127.0.0.1/api/load'"
        },
    )
    assert (await config(port))["load"]["rate"] == 100
    own = post(port, f"http://127.0.0.1:{port}/api/load", b'{"rate": 40}')
    status, answer = await exchange(port, own)
    assert status == 200 and answer["rate"] == 40, answer


async def test_the_cross_site_refusal_shows_the_host_escaped_and_cut(sim_page):
    # Shown with repr(), a 16 KiB Host made a 16 KiB 403.
    port = sim_page.port
    status, answer = await exchange(port, f"GET /api/config HTTP/1.1\r\nHost: {'a' * 300}\r\n\r\n".encode())
    assert (status, answer) == (
        403,
        {
            "error": "Host: expected an IP address or localhost, all the demo's page answers; "
            f"got '{'a' * 200}'… (300 characters in all)"
        },
    )


async def _read_answers(reader: asyncio.StreamReader, heads: list[bool]) -> list[tuple[list[str], bytes]]:
    """The answers on one connection, in order, each read by its Content-Length: none for a HEAD's
    (`heads`), whose answer has the GET's length and no body; then the connection's end."""
    answers = []
    for head in heads:
        lines = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)).decode("latin-1").split("\r\n")[:-2]
        length = next(int(ln.split(":", 1)[1]) for ln in lines if ln.lower().startswith("content-length:"))
        answers.append((lines, b"" if head else await asyncio.wait_for(reader.readexactly(length), 10)))
    assert await asyncio.wait_for(reader.read(), 10) == b"", "bytes after the last answer"
    return answers


async def test_head_is_answered_as_get_with_no_body_and_the_kept_alive_connection_goes_on(sim_page):
    # HEAD / got a 405 with a body on a kept-alive connection: the client, reading no body to a
    # HEAD (RFC 9110 9.3.2), read that body as the start of the next answer.
    port = sim_page.port
    host = f"Host: 127.0.0.1:{port}\r\n"
    paths = ["/", "/static/demo.js", "/api/config", "/nowhere", "/api/events", "/api/load"]
    requests = "".join(f"{m} {p} HTTP/1.1\r\n{host}\r\n" for p in paths for m in ("GET", "HEAD") if p != "/api/events")
    requests += f"HEAD /api/events HTTP/1.1\r\n{host}\r\nPUT / HTTP/1.1\r\n{host}Connection: close\r\n\r\n"
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(requests.encode())
        answers = await _read_answers(reader, [False, True] * (len(paths) - 1) + [True, False])
    finally:
        writer.close()
    for (get_lines, get_body), (head_lines, _) in zip(answers[0:-2:2], answers[1:-2:2]):
        # The GET's status line and headers, Content-Length the GET's body's; only the Date may differ.
        assert [ln for ln in head_lines if not ln.startswith("Date:")] == [
            ln for ln in get_lines if not ln.startswith("Date:")
        ]
        assert f"Content-Length: {len(get_body)}" in head_lines
    assert [lines[0] for lines, _ in answers[0:-2:2]] == [
        "HTTP/1.1 200 OK",
        "HTTP/1.1 200 OK",
        "HTTP/1.1 200 OK",
        "HTTP/1.1 404 Not Found",
        "HTTP/1.1 404 Not Found",  # GET /api/load: the API takes POST
    ]
    (events, _), (put_lines, put_body) = answers[-2:]
    # As the metrics port's /events: a stream has no length for a HEAD's answer to give.
    assert events[0] == "HTTP/1.1 405 Method Not Allowed" and "Allow: GET" in events
    assert put_lines[0] == "HTTP/1.1 405 Method Not Allowed" and "Allow: GET, HEAD" in put_lines
    assert json.loads(put_body) == {"error": "'/': expected GET or HEAD; got 'PUT'"}


@pytest.mark.parametrize(
    "extra, status",
    [("Origin: http://evil.example\r\n", "403 Forbidden"), ("Expect: foo\r\n", "417 Expectation Failed")],
)
async def test_a_refused_head_has_no_body(sim_page, extra, status):
    port = sim_page.port
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"HEAD /api/config HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{extra}\r\n".encode())
        [(lines, _)] = await _read_answers(reader, [True])  # and then the connection's end, no body before it
    finally:
        writer.close()
    assert lines[0] == f"HTTP/1.1 {status}" and "Connection: close" in lines


# A request line of 16,385 bytes, its CRLF in them: read whole (16,384 bytes after its first one, the
# reader's limit), then found over the head's limit.
JUST_TOO_LONG = b"HEAD /api/config?" + b"a" * (16_385 - len(b"HEAD /api/config? HTTP/1.1\r\n")) + b" HTTP/1.1\r\n"


@pytest.mark.parametrize(
    "request_head, status",
    [
        (b"HEAD /api/config?" + b"a" * 20_000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", "414 URI Too Long"),
        (JUST_TOO_LONG + b"Host: 127.0.0.1\r\n\r\n", "414 URI Too Long"),
        (
            b"HEAD /api/config HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n",
            "431 Request Header Fields Too Large",
        ),
        (
            b"HEAD /api/config HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 16_340 + b"\r\n\r\n",
            "431 Request Header Fields Too Large",
        ),
        (b"HEAD /api/config HTTP/1.1\nHost: 127.0.0.1\r\n\r\n", "400 Bad Request"),
        (b"HEAD /api/config HTTP/1.1\r\nHost: 127.0.0.1\n\r\n", "400 Bad Request"),
        (b"HEAD  /api/config HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", "400 Bad Request"),
        (b"HEAD  HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", "400 Bad Request"),
    ],
    ids=[
        "url-too-long",
        "url-just-too-long",
        "head-too-large",
        "head-just-too-large",
        "bare-lf-request-line",
        "bare-lf-header",
        "two-spaces",
        "no-target",
    ],
)
async def test_a_head_refused_as_its_head_is_read_has_no_body(sim_page, request_head, status):
    """Refused before its request line was parsed (or because of it), a HEAD's answer carried a body:
    its URL too long (414), its head too large (431), a line malformed (400)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", sim_page.port)
    try:
        writer.write(request_head)
        [(lines, _)] = await _read_answers(reader, [True])  # and then the connection's end, no body before it
    finally:
        writer.close()
    assert lines[0] == f"HTTP/1.1 {status}" and "Connection: close" in lines


async def test_expect_100_continue_gets_a_100_before_the_body_and_another_expectation_417(sim_page):
    # The demo ignored Expect: a client that waits for the 100 before it sends the body (curl for
    # a second) waited; one that expected something else was served as though it had not asked.
    port = sim_page.port
    body = b'{"rate": 40}'
    request = post(port, "/api/load", body, extra="Expect: 100-continue\r\nConnection: close\r\n")
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request[: -len(body)])  # the head alone: the body waits for the 100
        assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10) == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(body)
        [(lines, answer)] = await _read_answers(reader, [False])
    finally:
        writer.close()
    assert lines[0] == "HTTP/1.1 200 OK" and json.loads(answer)["rate"] == 40
    for expect in ("foo", "100-continue, foo"):
        unmet = post(port, "/api/load", b'{"rate": 5000}', extra=f"Expect: {expect}\r\n")
        assert await exchange(port, unmet) == (417, {"error": f"Expect: expected 100-continue; got '{expect}'"})
    # HTTP/1.0 has no Expect (RFC 9110 10.1.1): its client sends the body at once, and waits for no 100.
    old = post(port, "/api/load", b'{"rate": 30}', extra="Expect: 100-continue\r\n").replace(b"HTTP/1.1", b"HTTP/1.0")
    assert (await answer_head(port, old))[0][0] == "HTTP/1.1 200 OK"
    assert (await config(port))["load"]["rate"] == 30


async def test_a_request_that_fails_unexpectedly_gets_500_and_is_logged_and_the_demo_goes_on(caplog):
    # Left to asyncio ("Unhandled exception in client_connected_cb"), such a request had no answer
    # at all. No request reaches this any more: both found (an admin status without a reason
    # phrase here, ENAMETOOLONG from a long /static/ name) are answered as such now, so a backend
    # fails as none should.
    class Failing(SimulatedDemo):
        async def set_batching(self, body):
            raise RuntimeError("a fault of the page server's own")

    model = BatcherModel(alpha_s=2.5e-4, beta_s=4.4e-5, max_batch_size=32, max_queue_delay_s=0.005)
    web = DemoWeb(Failing(SimBackend(LoadControl(100), model), slo_s=0.05), Hub(), "127.0.0.1", 0)
    await web.start()
    try:
        port = web.port
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(post(port, "/api/batching", b'{"max_batch_size": 4}'))  # kept alive: the 500 ends it
            [(lines, answer)] = await _read_answers(reader, [False])
        finally:
            writer.close()
        assert lines[0] == "HTTP/1.1 500 Internal Server Error" and "Connection: close" in lines
        assert json.loads(answer) == {"error": "POST '/api/batching': internal error; see the demo's log"}
        assert (await config(port))["load"]["rate"] == 100
    finally:
        await web.stop()
    failed = [r for r in caplog.records if r.name == "wok.demo" and r.levelname == "ERROR"]
    assert [r.getMessage() for r in failed] == ["POST '/api/batching' failed"] and failed[0].exc_info is not None
    assert not [r for r in caplog.records if r.name == "asyncio"], caplog.text


async def test_a_static_name_too_long_for_the_file_system_gets_404_not_500(sim_page):
    # Looked up on disk, a name over 255 bytes raised ENAMETOOLONG: the page server's 500.
    port = sim_page.port
    name = "a" * 300
    status, answer = await exchange(port, f"GET /static/{name} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    assert status == 404 and answer["error"].startswith(f"no path '/static/{name[:192]}'… (308 characters in all) here")
    lines, script = await answer_head(port, b"GET /static/demo.js HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert lines[0] == "HTTP/1.1 200 OK" and b"EventSource" in script


async def test_a_body_over_64_kib_gets_413_and_changes_nothing(sim_page):
    # RFC 9110 15.5.14, and the metrics port's status for it; it got 400.
    port = sim_page.port
    head = f"POST /api/load HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {JSON}\r\nContent-Length: 65537\r\n\r\n"
    assert await exchange(port, head.encode()) == (
        413,
        {"error": "Content-Length: expected at most 65536 bytes; got '65537'"},
    )
    assert (await config(port))["load"]["rate"] == 100
