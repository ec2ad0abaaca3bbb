"""The admin API of a real server (`wok serve --admin`): faults, batching policy, /events."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import math
import re
import urllib.error
import urllib.request

import grpc
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from wok.codec import encode_request
from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

METRICS_LINE = re.compile(r"wok: metrics on (http://\S+)/metrics")


def http(url: str, body=None, method: str | None = None) -> tuple[int, dict | str]:
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    req = urllib.request.Request(url, data=data, method=method or ("POST" if data is not None else "GET"))
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            status, raw, ctype = r.status, r.read(), r.headers.get("Content-Type", "")
    except urllib.error.HTTPError as e:
        status, raw, ctype = e.code, e.read(), e.headers.get("Content-Type", "")
    return status, json.loads(raw) if ctype == "application/json" else raw.decode()


async def ahttp(url: str, body=None, method: str | None = None):
    # The server runs on this test's loop: the blocking client goes to a thread.
    return await asyncio.to_thread(http, url, body, method)


def compute_histogram(text: str, model: str = "mlp") -> tuple[dict[str, float], float]:
    """(cumulative count by `le`, sum) of the compute stage."""
    buckets, total = {}, 0.0
    for fam in text_string_to_metric_families(text):
        if fam.name != "wok_request_stage_duration_seconds":
            continue
        for s in fam.samples:
            if s.labels.get("model") != model or s.labels.get("stage") != "compute":
                continue
            if s.name.endswith("_bucket"):
                buckets[s.labels["le"]] = s.value
            elif s.name.endswith("_sum"):
                total = s.value
    return buckets, total


def fault_gauge(text: str) -> dict[tuple[str, str, str], float]:
    return {
        (s.labels["model"], s.labels["model_instance"], s.labels["mode"]): s.value
        for fam in text_string_to_metric_families(text)
        if fam.name == "wok_injected_faults"
        for s in fam.samples
    }


async def _infer(stub, rows: int = 1):
    return await stub.ModelInfer(encode_request("mlp", {"INPUT0": np.ones((rows, 256), np.float32)}))


@pytest.fixture
async def admin_server(serve):
    async with serve(models=("mlp",), admin=True) as server:
        base = f"http://127.0.0.1:{server.http.port}"
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            yield server, base, pb_grpc.GRPCInferenceServiceStub(channel)


async def test_slow_fault_slows_each_batch_by_its_delay_as_the_compute_histogram_shows(admin_server):
    _server, base, stub = admin_server
    await _infer(stub)
    _, before = await ahttp(base + "/metrics")
    b0, s0 = compute_histogram(before)
    status, state = await ahttp(base + "/admin/faults", {"model": "mlp", "instance": 0, "mode": "slow", "delay_ms": 60})
    assert status == 200
    assert state == {"faults": [{"model": "mlp", "instance": 0, "mode": "slow", "delay_ms": 60.0, "until": None}]}
    assert (await ahttp(base + "/admin/faults"))[1] == state
    for _ in range(3):  # one request at a time: three batches of one
        await _infer(stub)
    _, after = await ahttp(base + "/metrics")
    b1, s1 = compute_histogram(after)
    n = b1["+Inf"] - b0["+Inf"]
    assert n == 3
    # Every new observation lies above 50 ms (the bucket below 60 ms), and the sum grew by 3 × 60 ms at least.
    assert b1["0.05"] == b0["0.05"], (b0, b1)
    assert s1 - s0 >= 3 * 0.060
    assert fault_gauge(after) == {("mlp", "0", "slow"): 1.0, ("mlp", "0", "fail"): 0.0}
    status, state = await ahttp(base + "/admin/faults", {"model": "mlp", "mode": "off"})
    assert (status, state) == (200, {"faults": []})
    await _infer(stub)
    _, last = await ahttp(base + "/metrics")
    b2, _ = compute_histogram(last)
    assert b2["0.05"] == b1["0.05"] + 1, "off: the next batch is fast again"
    assert fault_gauge(last) == {("mlp", "0", "slow"): 0.0, ("mlp", "0", "fail"): 0.0}


async def test_fail_fault_answers_internal_with_its_message_and_off_restores(admin_server):
    _server, base, stub = admin_server
    status, _ = await ahttp(base + "/admin/faults", {"model": "mlp", "mode": "fail", "duration_s": 600})
    assert status == 200
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await _infer(stub)
    assert e.value.code() == grpc.StatusCode.INTERNAL
    assert "model 'mlp' instance 0: failing by fault injection" in e.value.details()
    status, _ = await ahttp(base + "/admin/faults", {"model": "mlp", "instance": 0, "mode": "off"})
    assert status == 200
    out = await _infer(stub)
    assert out.outputs[0].name == "OUTPUT0"


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/admin/faults", {"model": "mlp", "mode": "slow"}, "delay_ms"),
        ("/admin/faults", {"model": "gpt", "mode": "off"}, "model"),
        ("/admin/faults", {"model": "mlp", "mode": "off", "instance": 1}, "instance"),
        ("/admin/faults", [], "(body)"),
        ("/admin/faults", b"{not json", "body"),
        ("/admin/faults", b"[" * 60_000, "body"),  # nested past the parser's recursion limit
        ("/admin/faults", {"model": ["mlp"], "mode": "off"}, "model"),
        ("/admin/batching", {"model": "mlp", "max_batch_size": 0}, "max_batch_size"),
        ("/admin/batching", {"model": "mlp", "max_batch_size": 33}, "max_batch_size"),
        ("/admin/batching", {"model": "mlp", "max_queue_delay_ms": -5}, "max_queue_delay_ms"),
        ("/admin/batching", {"model": "mlp"}, "max_batch_size"),
        # Integers beyond a float's range (math.isfinite raised OverflowError on them, and the
        # connection dropped with no answer), and one beyond Python's 4,300-digit limit.
        ("/admin/batching", {"model": "mlp", "max_queue_delay_ms": 10**400}, "max_queue_delay_ms"),
        ("/admin/batching", {"model": "mlp", "max_queue_delay_ms": -(10**400)}, "max_queue_delay_ms"),
        ("/admin/batching", {"model": "mlp", "max_batch_size": 10**400}, "max_batch_size"),
        ("/admin/faults", {"model": "mlp", "instance": 0, "mode": "slow", "delay_ms": 10**400}, "delay_ms"),
        ("/admin/faults", {"model": "mlp", "mode": "fail", "duration_s": 10**400}, "duration_s"),
        ("/admin/faults", {"model": "mlp", "mode": "off", "instance": 10**400}, "instance"),
        ("/admin/faults", b'{"model": "mlp", "mode": "off", "instance": ' + b"1" * 5000 + b"}", "body"),
    ],
)
async def test_bad_bodies_get_400_naming_the_field(admin_server, path, body, field):
    _, base, _ = admin_server
    status, answer = await ahttp(base + path, body)
    assert status == 400
    prefix = "body: " if field == "body" else f"field '{field}'"
    assert set(answer) == {"error"} and answer["error"].startswith(prefix)
    assert "expected" in answer["error"] and "got" in answer["error"]
    huge = [v for v in body.values() if type(v) is int and abs(v) == 10**400] if isinstance(body, dict) else []
    if huge:
        sign = "a negative" if huge[0] < 0 else "an"
        assert answer["error"].endswith(f"got {sign} integer of 401 digits"), answer  # not all 401 of them


FAULT = b'{"model": "mlp", "mode": "fail", "duration_s": 60}'


@pytest.mark.parametrize(
    ("headers", "status", "says"),
    [
        # A page on another site may send these without a CORS preflight (text/plain, a form).
        ("Content-Type: text/plain", 415, "Content-Type: expected application/json for a POST; got 'text/plain'"),
        ("Content-Type: application/x-www-form-urlencoded", 415, "got 'application/x-www-form-urlencoded'"),
        (
            "Content-Type: application/json\r\nOrigin: http://evil.example",
            403,
            "cross-site requests); got 'http://evil.example'",
        ),
        (
            "Content-Type: application/json\r\nHost: evil.example",
            403,
            "Host: expected an IP address or localhost, all the admin API answers; got 'evil.example",
        ),
        # Not a number of bytes: refused as the head is read, in plain text as other framing errors.
        ("Content-Type: application/json\r\nContent-Length: \xb2", 400, "expected a number of bytes; got '\\xb2'"),
        # JSON is UTF-8 (RFC 8259 8.1): a charset that says otherwise was ignored, and the body read as UTF-8.
        (
            "Content-Type: application/json; charset=utf-16",
            415,
            "Content-Type charset: expected utf-8 (JSON is UTF-8, RFC 8259); got 'utf-16'",
        ),
        (
            'Content-Type: application/json; charset="latin1"',
            415,
            "expected utf-8 (JSON is UTF-8, RFC 8259); got 'latin1'",
        ),
        # Only spaces and tabs are white space around a media type (OWS, RFC 9110 5.6.3, 8.3.1): a no-break
        # space or a C0 separator after it, which str.strip() dropped unseen, makes it another type.
        (
            "Content-Type: application/json\xa0",
            415,
            "Content-Type: expected application/json for a POST; got 'application/json\\xa0'",
        ),
        (
            "Content-Type: application/json\x1f",
            415,
            "Content-Type: expected application/json for a POST; got 'application/json\\x1f'",
        ),
        ("Content-Type: application/json\x0b; charset=utf-8", 415, "got 'application/json\\x0b'"),
        # A charset is a token (RFC 9110 8.3.2): codecs.lookup() read 'utf-8\xa0' as utf-8.
        (
            "Content-Type: application/json; charset=utf-8\xa0",
            415,
            "expected utf-8 (JSON is UTF-8, RFC 8259); got 'utf-8\\xa0'",
        ),
        # A charset is one of its registered names (RFC 9110 8.3.2), not what Python's codecs.lookup() reads as
        # UTF-8 ("UTF_8", "u8", "utf--8", "cp65001", all of which were taken).
        ("Content-Type: application/json; charset=UTF_8", 415, "expected utf-8 (JSON is UTF-8, RFC 8259); got 'UTF_8'"),
        ("Content-Type: application/json; charset=utf--8", 415, "got 'utf--8'"),
    ],
)
async def test_admin_posts_a_browser_page_could_send_are_refused_and_change_nothing(
    admin_server, headers, status, says, raw_http
):
    server, base, _ = admin_server
    port = server.http.port
    lines = headers.split("\r\n")
    if not any(line.startswith("Host:") for line in lines):
        lines.append(f"Host: 127.0.0.1:{port}")
    if not any(line.startswith("Content-Length:") for line in lines):
        lines.append(f"Content-Length: {len(FAULT)}")
    head = "POST /admin/faults HTTP/1.1\r\n" + "\r\n".join(lines) + "\r\n\r\n"
    answer = await raw_http(port, head.encode("latin-1") + FAULT)
    assert answer.startswith(f"HTTP/1.1 {status} ".encode()), answer[:200]
    top, body = answer.split(b"\r\n\r\n", 1)
    assert says in (json.loads(body)["error"] if b"Content-Type: application/json" in top else body.decode("latin-1"))
    assert (await ahttp(base + "/admin/faults"))[1] == {"faults": []}  # nothing was applied


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le"])
async def test_a_body_in_utf16_or_utf32_is_refused_and_changes_nothing(admin_server, raw_http, encoding):
    """json.loads() of bytes guesses UTF-16 and UTF-32 from the NULs of the first bytes: such a fault was
    applied, where JSON between systems is UTF-8 alone (RFC 8259 8.1)."""
    server, base, _ = admin_server
    port = server.http.port
    body = FAULT.decode().encode(encoding)
    head = (
        f"POST /admin/faults HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    answer = await raw_http(port, head.encode() + body)
    assert answer.startswith(b"HTTP/1.1 415 "), answer[:200]
    got = json.detect_encoding(body).upper()
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1]) == {
        "error": f"body: expected JSON in UTF-8 (RFC 8259); got {got} text"
    }
    assert (await ahttp(base + "/admin/faults"))[1] == {"faults": []}


async def test_a_utf8_body_with_a_byte_order_mark_or_charset_utf8_is_taken(admin_server, raw_http):
    """RFC 8259 8.1 lets a reader ignore a byte-order mark; charset=utf-8 (any case, quoted or not) is what JSON is."""
    server, base, _ = admin_server
    port = server.http.port
    for charset, body in (
        ("", b"\xef\xbb\xbf" + FAULT),
        ('; charset="UTF-8"', FAULT),
        ("; Charset=utf-8", FAULT),
        ("; charset=utf8", FAULT),
        ("; charset=UTF8", FAULT),
        ("; charset=csUTF8", FAULT),  # IANA's alias
        # OWS before a parameter's semicolon (RFC 9110 5.6.6), in spaces and tabs.
        (" \t; charset=utf-8", FAULT),
    ):
        head = (
            f"POST /admin/faults HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json{charset}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        answer = await raw_http(port, head.encode() + body)
        assert answer.startswith(b"HTTP/1.1 200 "), (charset, answer[:200])
        await ahttp(base + "/admin/faults", {"model": "mlp", "mode": "off"})


async def test_a_same_origin_post_is_taken(admin_server, raw_http):
    server, base, _ = admin_server
    port = server.http.port
    head = (
        f"POST /admin/faults HTTP/1.1\r\nHost: localhost:{port}\r\nOrigin: http://localhost:{port}\r\n"
        f"Content-Type: application/json; charset=utf-8\r\nContent-Length: {len(FAULT)}\r\nConnection: close\r\n\r\n"
    )
    answer = await raw_http(port, head.encode() + FAULT)
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
    await ahttp(base + "/admin/faults", {"model": "mlp", "mode": "off"})


async def test_a_body_the_server_does_not_read_is_never_taken_for_the_next_request(admin_server, raw_http):
    server, _base, _ = admin_server
    port = server.http.port
    inner = f"GET /admin/faults HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
    for method, path, status in (("POST", "/", 405), ("GET", "/admin/faults", 200), ("POST", "/admin/nowhere", 404)):
        outer = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        outer += f"Content-Length: {len(inner)}\r\n\r\n"
        answer = await raw_http(port, outer.encode() + inner)
        assert answer.startswith(f"HTTP/1.1 {status} ".encode()) and b"Connection: close" in answer, answer[:200]
        assert answer.count(b"HTTP/1.1 ") == 1  # the body was not served as a request of its own


async def test_batching_policy_changes_live(admin_server):
    server, base, stub = admin_server
    change = {"model": "mlp", "max_batch_size": 4, "max_queue_delay_ms": 0}
    status, policy = await ahttp(base + "/admin/batching", change)
    assert status == 200
    assert (policy["max_batch_size"], policy["max_queue_delay_ms"], policy["limit_batch_size"]) == (4, 0.0, 32)
    assert server.runtimes["mlp"].batcher.policy.max_batch_size == 4
    assert (await ahttp(base + "/admin/batching"))[1]["models"] == [policy]
    await asyncio.gather(*(_infer(stub) for _ in range(40)))
    sizes = server.runtimes["mlp"].stats.by_batch_size
    assert max(sizes) <= 4
    # A request the model's config allows (up to 32 rows) is still answered: alone.
    answer = await _infer(stub, rows=20)
    assert list(answer.outputs[0].shape) == [20, 256]
    assert server.runtimes["mlp"].stats.by_batch_size[20].compute_infer.count == 1


async def test_the_window_comes_back_as_sent(admin_server):
    # Kept in seconds, 1001 ms came back 1000.9999999999999: any value with up to 6 decimals must not.
    server, base, _ = admin_server
    for ms in (1001, 1003, 0.1, 2.7, 0.3, 12.345678, 0.000001, 59_999.999999, 60_000):
        status, policy = await ahttp(base + "/admin/batching", {"model": "mlp", "max_queue_delay_ms": ms})
        assert (status, policy["max_queue_delay_ms"]) == (200, ms)
        assert server.runtimes["mlp"].batcher.policy.max_queue_delay_s == ms / 1e3
        assert (await ahttp(base + "/admin/batching"))[1]["models"] == [policy]


async def test_a_negative_zero_is_taken_and_answered_as_zero(admin_server):
    """-0.0 passes `0 <= v` as -0 does, and was kept: a window and a slow fault's delay answered as -0.0."""
    server, base, _ = admin_server
    status, policy = await ahttp(base + "/admin/batching", {"model": "mlp", "max_queue_delay_ms": -0.0})
    assert status == 200 and math.copysign(1, policy["max_queue_delay_ms"]) == 1
    assert math.copysign(1, server.runtimes["mlp"].batcher.policy.max_queue_delay_s) == 1
    status, state = await ahttp(base + "/admin/faults", {"model": "mlp", "mode": "slow", "delay_ms": -0.0})
    assert status == 200 and [math.copysign(1, f["delay_ms"]) for f in state["faults"]] == [1.0]
    await ahttp(base + "/admin/faults", {"model": "mlp", "mode": "off"})


async def test_slo_models_refuse_a_window_they_would_not_use_and_say_their_policy(serve, slow_repository):
    slow_repository(name="fixed")
    root = slow_repository(max_batch_size=8)
    cfg = root / "slow" / "config.toml"
    cfg.write_text(cfg.read_text().replace("[dynamic_batching]\n", '[dynamic_batching]\npolicy = "slo"\nslo_ms = 50\n'))
    async with serve(repository=root, admin=True) as server:
        base = f"http://127.0.0.1:{server.http.port}"
        _, got = await ahttp(base + "/admin/batching")
        assert {m["model"]: m["policy"] for m in got["models"]} == {"fixed": "fixed", "slow": "slo"}
        before = server.runtimes["slow"].batcher.policy
        for body in ({"max_queue_delay_ms": 20}, {"max_batch_size": 2, "max_queue_delay_ms": 20}):
            status, answer = await ahttp(base + "/admin/batching", {"model": "slow", **body})
            assert status == 400
            assert answer["error"] == (
                "field 'max_queue_delay_ms': expected no max_queue_delay_ms for model 'slow', whose batching "
                "policy is 'slo' (only 'fixed' uses a delay window); got 20"
            )
        assert server.runtimes["slow"].batcher.policy == before  # the valid max_batch_size was not taken alone
        status, answer = await ahttp(base + "/admin/batching", {"model": "slow", "max_batch_size": 2})
        assert (status, answer["policy"], answer["max_batch_size"]) == (200, "slo", 2)
        status, answer = await ahttp(base + "/admin/batching", {"model": "fixed", "max_queue_delay_ms": 20})
        assert (status, answer["policy"], answer["max_queue_delay_ms"]) == (200, "fixed", 20)


async def test_a_lower_maximum_drops_preferred_sizes_and_a_higher_one_brings_them_back(serve, slow_repository):
    repo = slow_repository(sleep_ms=1, max_batch_size=8, preferred=(2, 6))
    async with serve(repository=repo, admin=True) as server:
        base = f"http://127.0.0.1:{server.http.port}"
        seen = []
        for size in (4, 8, 1, 6):
            status, policy = await ahttp(base + "/admin/batching", {"model": "slow", "max_batch_size": size})
            assert status == 200
            seen.append((policy["max_batch_size"], policy["preferred_batch_sizes"]))
    assert seen == [(4, [2]), (8, [2, 6]), (1, []), (6, [2, 6])]


async def test_events_stream_batches_with_their_flush_reason_and_ticks(admin_server):
    server, _base, stub = admin_server
    reader, writer = await asyncio.open_connection("127.0.0.1", server.http.port)
    writer.write(f"GET /events HTTP/1.1\r\nHost: 127.0.0.1:{server.http.port}\r\n\r\n".encode())
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert b"200 OK" in head and b"text/event-stream" in head

    async def events():
        while True:
            line = await reader.readline()
            if line.startswith(b"data: "):
                yield json.loads(line[6:])

    stream = events()
    hello = await asyncio.wait_for(anext(stream), 10)
    assert hello["type"] == "hello" and hello["models"]["mlp"]["instances"] == 1
    await _infer(stub, rows=3)  # alone: it waits out the delay window
    seen = {}
    while "batch" not in seen or "tick" not in seen:
        e = await asyncio.wait_for(anext(stream), 10)
        if e["type"] == "batch" or "batch" in seen:  # the first tick after the batch
            seen.setdefault(e["type"], e)
    b = seen["batch"]
    got = (b["model"], b["instance"], b["size"], b["requests"], b["reason"], b["ok"])
    assert got == ("mlp", 0, 3, 1, "delay", True)
    assert b["t_start"] <= b["t_end"]
    t = seen["tick"]["models"]["mlp"]
    assert t["samples"] >= 3 and t["policy"]["max_batch_size"] == 32 and len(t["running"]) == 1
    writer.close()


async def test_without_admin_the_admin_paths_are_404(serve):
    async with serve(models=("mlp",)) as server:
        base = f"http://127.0.0.1:{server.http.port}"
        off = {"model": "mlp", "mode": "off"}
        for path, body in (("/admin/faults", None), ("/admin/faults", off), ("/events", None)):
            status, _ = await ahttp(base + path, body)
            assert status == 404, path
        assert "wok_injected_faults" not in (await ahttp(base + "/metrics"))[1]


@pytest.fixture(scope="module", autouse=True)
def _flagged_start(start_server_module):
    # One process for both flag tests (each looks only at what its own flags change), started as
    # the module begins: its seconds of imports run beside the in-process tests.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        yield pool.submit(start_server_module, "--admin", "--models", "mlp", "--accept-tasks", "0", "--wakeup-drain")


@pytest.fixture(scope="module")
def flagged_server(_flagged_start):
    sp = _flagged_start.result()
    yield sp
    assert sp.terminate() == 0, "\n".join(sp.log[-30:])


def test_wok_serve_admin_flag(flagged_server):
    sp = flagged_server
    base = next(m.group(1) for line in sp.log if (m := METRICS_LINE.search(line)))
    assert http(base + "/admin/faults") == (200, {"faults": []})
    status, state = http(base + "/admin/faults", {"model": "mlp", "mode": "fail"})
    assert status == 200 and state["faults"][0]["mode"] == "fail"


def test_wok_serve_accept_and_wakeup_flags(server_process, flagged_server):
    line = "unary accept: grpc.aio's chain and {} more task(s); gRPC wake-up drain {}"
    assert any(line.format(4, "off") in entry for entry in server_process.log)  # the defaults
    assert any(line.format(0, "on") in entry for entry in flagged_server.log), flagged_server.log
