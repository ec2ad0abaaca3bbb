"""`wok demo` at its edges: its server dying or still starting, option values without a finite
value, a refused load body, an admin call without an answer, an oversized request head, an
IPv6 page address.

The server's life is played by a stand-in child (a Python one-liner, started by the demo's own
`popen_wok`) and `wok demo` runs in this process: the real server would spend seconds importing
torch. Only the IPv6 check runs `wok demo --simulate` as a process, to fetch the page it names.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
import urllib.request
from pathlib import Path

import pytest

import wok.demo.cli
from wok.bench.simulate import BatcherModel
from wok.config import DEVICE_FORMS
from wok.demo.cli import LiveDemo, SimulatedDemo
from wok.demo.load import LoadControl
from wok.demo.sim import SimBackend
from wok.demo.web import DemoWeb, Hub
from wok.faults import AdminRequestError

from .conftest import ipv6_loopback

SERVER_UP = (
    "import sys; "
    "print('wok: metrics on http://127.0.0.1:9/metrics', file=sys.stderr); "
    "print('wok: serving mlp on 127.0.0.1:9', file=sys.stderr); "
    "[print(f'log line {i}', file=sys.stderr) for i in range(40)]; "
    "sys.exit(3)"
)


def stand_in_server(monkeypatch, script: str, started=None) -> list:
    """Make the demo start `python -c SCRIPT` for its server; the list gets (Popen, the demo's
    own command). `started(proc)` runs once it is spawned."""
    real = wok.demo.cli.popen_wok
    spawned: list = []

    def popen(cmd):
        proc = real([sys.executable, "-c", script])
        spawned.append((proc, cmd))
        if started is not None:
            started(proc)
        return proc

    monkeypatch.setattr(wok.demo.cli, "popen_wok", popen)
    return spawned


def repository(cmd: list[str]) -> Path:
    return Path(cmd[cmd.index("--model-repository") + 1])


@pytest.mark.timeout(60)
def test_a_server_that_exits_ends_the_demo_with_exit_1_and_its_last_log_lines(wok_cli, monkeypatch):
    spawned = stand_in_server(monkeypatch, SERVER_UP)
    status, _, err = wok_cli("demo", "--port", "0", "--rate", "0")
    assert status == 1, err
    ((_, cmd),) = spawned
    assert "wok demo: page at http://127.0.0.1:" in err
    assert (
        "wok demo: the wok server at 127.0.0.1:9 exited with status 3 while the demo ran; the end of its log:\n" in err
    )
    tail = err[err.index("the end of its log:\n") :].splitlines()[1:]
    assert tail == [f"log line {i}" for i in range(10, 40)], err
    assert not repository(cmd).exists()


@pytest.mark.timeout(60)
def test_ctrl_c_while_the_server_starts_ends_the_demo_at_once(wok_cli, monkeypatch):
    # The stand-in never says it serves: the start would wait for it up to 180 s (here, its 15 s
    # life). The signal comes once it runs, while the demo's own handlers are in place.
    spawned = stand_in_server(
        monkeypatch, "import time; time.sleep(15)", started=lambda proc: os.kill(os.getpid(), signal.SIGINT)
    )
    t0 = time.monotonic()
    status, _, err = wok_cli("demo", "--port", "0", "--rate", "0")
    took = time.monotonic() - t0
    ((proc, cmd),) = spawned
    assert status == 0, err
    assert "page at" not in err and "live" not in err, err
    assert proc.poll() is not None, "the starting server outlived the demo"
    assert not repository(cmd).exists()
    assert took < 10, f"the demo took {took:.1f} s to end after Ctrl-C"


@pytest.mark.parametrize(
    ("option", "value"),
    [("--slo", "1e999"), ("--max-queue-delay", "1e999ms"), ("--alpha", "1e400"), ("--beta", "1e999ms")],
)
def test_an_infinite_duration_exits_2_naming_the_option(option, value, wok_cli, monkeypatch):
    def no_page(self):
        raise AssertionError(f"the demo started with {option} {value}")

    monkeypatch.setattr(DemoWeb, "start", no_page)
    status, _, err = wok_cli("demo", "--simulate", "--port", "0", option, value)
    assert (status, err) == (2, f"wok demo: {option}: expected a finite duration; got {value}\n")


@pytest.mark.parametrize(("alpha", "beta"), [("0ms", "0ms"), ("0", "0s")])
def test_no_batch_time_exits_2_naming_both_options(alpha, beta, wok_cli, monkeypatch):
    def no_page(self):
        raise AssertionError(f"the demo started with --alpha {alpha} --beta {beta}")

    monkeypatch.setattr(DemoWeb, "start", no_page)
    status, _, err = wok_cli("demo", "--simulate", "--port", "0", "--alpha", alpha, "--beta", beta)
    assert (status, err) == (
        2,
        f"wok demo: --alpha and --beta: expected a batch time above 0 (--alpha + --beta > 0); "
        f"got --alpha {alpha} and --beta {beta}\n",
    )


def test_a_refused_load_body_changes_nothing():
    control = LoadControl(100)
    with pytest.raises(ValueError, match=r"^field 'burst_s': expected seconds above 0 up to 30; got null$"):
        control.set({"rate": 777, "burst_rate": 100})
    with pytest.raises(ValueError, match=r"^field 'burst_rate': expected requests per second"):
        control.set({"rate": 777, "burst_rate": -1, "burst_s": 5})
    assert control.describe() == {"rate": 100.0, "current_rate": 100.0, "burst_rate": None, "burst_left_s": 0.0}


@pytest.mark.parametrize(("seconds", "got"), [(0, "0"), (-0.0, "-0.0"), (30.5, "30.5"), (True, "true"), ("5", "'5'")])
def test_a_burst_length_is_checked_as_the_rates_are(seconds, got):
    """'burst_s' had a check of its own, raising a plain ValueError where its neighbours raise AdminRequestError
    (faults.check_number), as the admin API's numbers do; its message is as it was."""
    control = LoadControl(100)
    with pytest.raises(AdminRequestError) as e:
        control.set({"burst_rate": 500, "burst_s": seconds})
    assert str(e.value) == f"field 'burst_s': expected seconds above 0 up to 30; got {got}"
    assert control.set({"burst_rate": 500, "burst_s": 30})["current_rate"] == 500


async def answer(port: int, request: bytes) -> tuple[int, dict]:
    """Send `request` to 127.0.0.1:`port`; the status and JSON body of its answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        lines = head.decode("latin-1").split("\r\n")
        length = next(int(ln.split(":", 1)[1]) for ln in lines if ln.lower().startswith("content-length:"))
        body = await asyncio.wait_for(reader.readexactly(length), 30)
    finally:
        writer.close()
    return int(lines[0].split(" ")[1]), json.loads(body)


async def test_an_admin_call_without_an_answer_gets_504_naming_the_wait(monkeypatch):
    # A server that accepts and never answers, as a stopped (SIGSTOP) one does: a gateway's timeout
    # (504, RFC 9110 15.6.5), which was answered 502, as an answer that was wrong.
    held: list[asyncio.StreamWriter] = []

    async def silent(reader, writer):
        held.append(writer)

    admin = await asyncio.start_server(silent, "127.0.0.1", 0)
    admin_port = admin.sockets[0].getsockname()[1]
    # Not there before the fix (raising=False): the test then waits the fixed 10 s, and fails.
    monkeypatch.setattr("wok.demo.web.ADMIN_TIMEOUT_S", 0.2, raising=False)
    args = argparse.Namespace(instances=2, max_batch_size=32, device="cpu", torch_threads=1)
    backend = LiveDemo(LoadControl(0), args, delay_s=0.005, slo_s=0.05)
    backend.admin = ("127.0.0.1", admin_port)
    web = DemoWeb(backend, Hub(), "127.0.0.1", 0)
    await web.start()
    try:
        body = b'{"mode": "fail"}'
        request = (
            f"POST /api/faults HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        status, got = await answer(web.port, request)
        wait = f"POST /admin/faults: no answer within 0.2 s from 127.0.0.1:{admin_port}"
        assert (status, got) == (504, {"error": f"the wok server did not answer: {wait}"})
    finally:
        await web.stop()
        await backend.close()
        for w in held:
            w.close()
        admin.close()


async def test_an_error_without_text_is_named_by_its_type():
    class Unanswered(SimulatedDemo):
        async def set_batching(self, body):
            raise ConnectionResetError()

    model = BatcherModel(alpha_s=2.5e-4, beta_s=4.4e-5, max_batch_size=32, max_queue_delay_s=0.005)
    web = DemoWeb(Unanswered(SimBackend(LoadControl(0), model), slo_s=0.05), Hub(), "127.0.0.1", 0)
    assert await web._api("POST", "batching", {}) == (
        502,
        {"error": "the wok server did not answer: ConnectionResetError"},
    )


async def test_a_request_head_over_16_kib_gets_431_then_the_page_goes_on():
    model = BatcherModel(alpha_s=2.5e-4, beta_s=4.4e-5, max_batch_size=32, max_queue_delay_s=0.005)
    web = DemoWeb(SimulatedDemo(SimBackend(LoadControl(100), model), slo_s=0.05), Hub(), "127.0.0.1", 0)
    await web.start()
    try:
        big = b"GET /api/config HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n"
        status, got = await answer(web.port, big)
        assert (status, got) == (431, {"error": "request head: expected at most 16384 bytes; got more"})
        status, got = await answer(web.port, b"GET /api/config HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert status == 200 and got["load"]["rate"] == 100
    finally:
        await web.stop()


@pytest.mark.timeout(120)
@pytest.mark.skipif(not ipv6_loopback(), reason="no IPv6 loopback (::1) here")
@pytest.mark.parametrize("host", ["::1", "[::1]"], ids=["bare", "bracketed"])
def test_an_ipv6_page_address_is_printed_in_brackets_and_answers(start_demo, host):
    # "[::1]", as `wok serve --host` takes it (and as the page's address writes it), was refused:
    # "expected an address of this machine, got '[::1]' (Name or service not known)".
    demo = start_demo("--simulate", "--host", host)
    assert demo.url.startswith("http://[::1]:"), demo.url
    with urllib.request.urlopen(demo.url + "api/config", timeout=10) as r:
        assert json.loads(r.read())["mode"] == "simulate"
    assert demo.stop() == 0


def simulated_page() -> DemoWeb:
    """The page's server over the simulator, not started."""
    model = BatcherModel(alpha_s=2.5e-4, beta_s=4.4e-5, max_batch_size=32, max_queue_delay_s=0.005)
    return DemoWeb(SimulatedDemo(SimBackend(LoadControl(100), model), slo_s=0.05), Hub(), "127.0.0.1", 0)


CONFIG = "GET /api/config HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


@pytest.mark.parametrize(
    "first",
    [
        "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
        "GET /api/config HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: TE, Close\r\n\r\n",
        # Two lines are one list (RFC 9110 5.3): only the last was read, and the connection was kept.
        "GET /api/config HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nConnection: TE\r\n\r\n",
        "GET / HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n",
        "POST /api/load HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
    ],
    ids=["close", "close-in-a-list", "close-on-a-first-line", "http-1.0", "http-1.0-post"],
)
async def test_a_request_that_asks_to_close_is_answered_and_its_connection_ends(first):
    # Kept open, the connection waited out the page's 120 s idle timeout, and so did its client,
    # reading to the close. A request pipelined after it is not answered.
    web = simulated_page()
    await web.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", web.port)
        try:
            writer.write((first + CONFIG).encode())
            raw = await asyncio.wait_for(reader.read(), 5)
        finally:
            writer.close()
    finally:
        await web.stop()
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    assert lines[0] == "HTTP/1.1 200 OK", raw[:200]
    assert "Connection: close" in lines[1:], lines
    length = next(int(ln.split(":", 1)[1]) for ln in lines if ln.lower().startswith("content-length:"))
    assert len(body) == length, f"expected one answer of {length} bytes, got {len(body)} after its head"


@pytest.mark.parametrize(
    "first",
    [
        CONFIG,
        "GET /api/config HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: keep-alive\r\n\r\n",
        # A comma in a quoted string separates nothing (RFC 9110 5.6.4): split at it, "close" was an option.
        'GET /api/config HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: x="a,close,b"\r\n\r\n',
    ],
    ids=["http-1.1", "http-1.0-keep-alive", "quoted-comma"],
)
async def test_a_request_that_keeps_its_connection_is_answered_keep_alive(first):
    web = simulated_page()
    await web.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", web.port)
        try:
            writer.write((first + CONFIG).encode())
            for _ in range(2):  # the second answer comes on the same connection
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
                lines = head.decode("latin-1").split("\r\n")
                assert lines[0] == "HTTP/1.1 200 OK" and "Connection: keep-alive" in lines[1:], lines
                length = next(int(ln.split(":", 1)[1]) for ln in lines if ln.lower().startswith("content-length:"))
                assert json.loads(await asyncio.wait_for(reader.readexactly(length), 5))["load"]["rate"] == 100
        finally:
            writer.close()
    finally:
        await web.stop()


LONG = "x" * 100_000
LONG_SHOWN = f"'{'x' * 200}'… (100,000 characters in all)"


@pytest.mark.parametrize(
    ("option", "value", "refusal"),
    [
        # Shown as repr does, whole: one_line cut the 100 KB message at 4,096 characters.
        ("--device", LONG, f"--device: expected {DEVICE_FORMS}; got {LONG_SHOWN}"),
        # IDNA's refusal, naming no option: "encoding with 'idna' codec failed (UnicodeError: label too long)".
        ("--host", LONG, f"--host: expected an address or a host name of this machine; got {LONG_SHOWN}"),
        ("--host", "a b", "--host: expected an address or a host name of this machine; got 'a b'"),
        # asyncio took it for every address of the machine: the page at http://:PORT/, open to all.
        ("--host", "", "--host: expected an address or a host name of this machine; got ''"),
    ],
    ids=["device", "host-long", "host-space", "host-empty"],
)
def test_a_device_or_host_is_refused_before_the_page_listens_quoted_as_names_are(
    option, value, refusal, wok_cli, monkeypatch
):
    def no_page(self):
        raise AssertionError(f"the page listened with {option} {value[:20]!r}")

    monkeypatch.setattr(DemoWeb, "start", no_page)
    status, out, err = wok_cli("demo", "--simulate", "--port", "0", option, value)
    assert (status, out, err) == (2, "", f"wok demo: {refusal}\n")


def test_a_host_label_too_long_is_refused_naming_the_option(wok_cli, monkeypatch):
    """A label over 63 characters: the page's listen raised IDNA's UnicodeError, "wok demo: encoding
    with 'idna' codec failed (UnicodeError: label too long)", naming no option."""
    monkeypatch.setattr(wok.demo.cli, "popen_wok", lambda cmd: pytest.fail("a wok server was started"))
    status, out, err = wok_cli("demo", "--simulate", "--port", "0", "--host", "h" * 70)
    assert (status, out) == (2, ""), err
    assert err == (
        f"wok demo: --host: expected an address of this machine; got '{'h' * 70}' (encoding with 'idna' codec "
        "failed (UnicodeError: label too long))\n"
    )


async def test_the_page_holds_a_slow_fault_to_the_admins_one_bound(monkeypatch):
    """The page's check had 60000 written in beside faults.MAX_DELAY_MS, the admin API's bound: one
    changed, the other went on refusing (or passing on) by the old bound."""
    from wok import faults

    args = argparse.Namespace(instances=2, max_batch_size=32, device="cpu", torch_threads=1)
    live = LiveDemo(LoadControl(0), args, delay_s=0.005, slo_s=0.05)
    try:
        with pytest.raises(ValueError) as info:
            await live.set_faults({"mode": "slow", "delay_ms": faults.MAX_DELAY_MS + 1})
        assert str(info.value) == (
            "field 'delay_ms': expected a number above 0 up to 60000 for mode 'slow'; got 60001.0"
        )
        monkeypatch.setattr(faults, "MAX_DELAY_MS", 10.0)
        with pytest.raises(ValueError) as info:
            await live.set_faults({"mode": "slow", "delay_ms": 11})
        assert str(info.value) == "field 'delay_ms': expected a number above 0 up to 10 for mode 'slow'; got 11"
        # Within the bound it goes on to the admin API: the server is still starting (admin port 0).
        assert (await live.set_faults({"mode": "slow", "delay_ms": 10}))[0] == 503
    finally:
        await live.close()


BIG_BODY = [0] * 30_000  # 90 KB as repr writes it; the page's server takes 64 KiB of JSON, 2 bytes a zero


@pytest.mark.parametrize("body", [[], {"rate": 1, "x": 2}, {"rate": -1}], ids=["no-object", "extra", "field"])
def test_a_refused_load_body_is_an_admin_request_error(body):
    # As its fields' own checks raise it: a body that was no object, or held another field, was a plain ValueError.
    with pytest.raises(AdminRequestError):
        LoadControl(100).set(body)


async def test_a_body_the_demo_refuses_itself_is_an_admin_request_error():
    # As the fields' checks it shares with the admin API raise it: a body that was no object or named another model
    # (simulated or live), or a live slow fault above the admin's bound, was a plain ValueError.
    model = BatcherModel(alpha_s=2.5e-4, beta_s=4.4e-5, max_batch_size=32, max_queue_delay_s=0.005)
    sim = SimBackend(LoadControl(100), model)
    args = argparse.Namespace(instances=2, max_batch_size=32, device="cpu", torch_threads=1)
    live = LiveDemo(LoadControl(0), args, delay_s=0.005, slo_s=0.05)
    try:
        for body in ([], {"model": "encoder", "max_batch_size": 4}):
            with pytest.raises(AdminRequestError):
                sim.set_batching(body)
            with pytest.raises(AdminRequestError):
                await live.set_batching(body)
        with pytest.raises(AdminRequestError):
            await live.set_faults({"mode": "slow", "delay_ms": 0})
    finally:
        await live.close()


async def test_a_refused_body_is_shown_cut_not_whole():
    """A body that is no object, or a field's value, was shown as repr writes it, whole: a 400 of up
    to the body's 64 KiB (and more: repr's spaces), and a field not allowed by its name, unquoted."""
    model = BatcherModel(alpha_s=2.5e-4, beta_s=4.4e-5, max_batch_size=32, max_queue_delay_s=0.005)
    sim = SimBackend(LoadControl(100), model)
    args = argparse.Namespace(instances=2, max_batch_size=32, device="cpu", torch_threads=1)
    live = LiveDemo(LoadControl(0), args, delay_s=0.005, slo_s=0.05)
    cut = "[" + ", ".join(["0"] * 56) + "… (90,000 characters in all)"  # 200 bytes, the note's 33 included
    try:
        refusals = [
            (LoadControl(100).set, BIG_BODY, f"body: expected a JSON object; got {cut}"),
            (
                LoadControl(100).set,
                {"rate": LONG},
                f"field 'rate': expected requests per second from 0 to 5000; got {LONG_SHOWN}",
            ),
            (
                LoadControl(100).set,
                {"x\n" + LONG: BIG_BODY},
                f"field 'x\\n{'x' * 198}'… (100,002 characters in all): expected only rate, burst_rate, burst_s; "
                f"got {cut}",
            ),
            (sim.set_batching, BIG_BODY, f"body: expected a JSON object; got {cut}"),
            (
                sim.set_batching,
                {"max_batch_size": LONG},
                "field 'max_batch_size': expected an integer from 1 to 32 (the model's configured maximum); "
                f"got {LONG_SHOWN}",
            ),
        ]
        for call, body, message in refusals:
            with pytest.raises(ValueError) as info:
                call(body)
            assert str(info.value) == message
        for call, body, message in [
            (live.set_batching, BIG_BODY, f"body: expected a JSON object; got {cut}"),
            (
                live.set_faults,
                {"mode": "slow", "delay_ms": LONG},
                f"field 'delay_ms': expected a number above 0 up to 60000 for mode 'slow'; got {LONG_SHOWN}",
            ),
        ]:
            with pytest.raises(ValueError) as info:
                await call(body)
            assert str(info.value) == message
    finally:
        await live.close()
