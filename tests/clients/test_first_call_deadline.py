"""A call's timeout bounds the client's setup its first call waits for: the name lookup of several targets
(the plain gRPC path) and the wok balancer's start.

The lookups are the system resolver's (glibc's getaddrinfo), made to hang for real: the client runs in a
child with a user, mount and network namespace of its own (`unshare -rmn`, no root needed where user
namespaces are allowed), its /etc/resolv.conf bind-mounted to name a DNS server the child runs on its own
loopback, which holds its answers until the child releases them. Nothing of this machine's changes.

Also there: close() ends the calls waiting for that setup at once, the lookup's late result dropped quietly, and
wait_ready's TimeoutError quotes the caller's timeout when the balancer's start took part of it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.timeout(120)

# What the children share: the record of what is logged (`LOGGED.lines`), and a DNS answer's bytes.
COMMON = r"""
class Logged(logging.Handler):
    # Every record of WARNING and up, the child's whole life: asyncio's "never retrieved", a callback's error.

    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines = []

    def emit(self, record):
        self.lines.append(f"{record.name}: {record.getMessage()}")


LOGGED = Logged()
logging.getLogger().addHandler(LOGGED)


def parsed(query):
    # The name a DNS query asks for, and its question section.
    labels, i = [], 12
    while query[i]:
        labels.append(query[i + 1 : i + 1 + query[i]].decode())
        i += 1 + query[i]
    return ".".join(labels), query[12 : i + 5]


def answer_to(query, question, missing=False):
    # A 127.0.0.1 and no other record; for a `missing` name, that there is no such name (NXDOMAIN).
    a = struct.unpack("!H", question[-4:-2])[0] == 1 and not missing
    header = query[:2] + struct.pack("!HHHHH", 0x8183 if missing else 0x8180, 1, int(a), 0, 0)
    record = struct.pack("!HHHIH", 0xC00C, 1, 1, 60, 4) + bytes([127, 0, 0, 1]) if a else b""
    return header + question + record
"""

CHILD = (
    r"""
import asyncio, gc, json, logging, socket, struct, sys, threading, time

import grpc
import numpy as np

from wok.clients import AsyncClient, InferError
from wok.v2pb import grpc_service_pb2 as pb
from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

TIMEOUT = 0.3
GUARD_S = 3.0  # a call still waiting past this overran: without the fix it waits for the resolver (30 s)


"""
    + COMMON
    + r"""

class Server(pb_grpc.GRPCInferenceServiceServicer):
    async def ModelInfer(self, request, context):
        return pb.ModelInferResponse(model_name=request.model_name, id=request.id)

    async def ServerMetadata(self, request, context):  # (no request limit published)
        return pb.ServerMetadataResponse(name="child")

    async def ModelStreamInfer(self, request_iterator, context):
        async for request in request_iterator:
            yield pb.ModelStreamInferResponse(infer_response=pb.ModelInferResponse(model_name=request.model_name))


class Dns(asyncio.DatagramProtocol):
    # Holds each name's queries until `release(name)`, then answers A 127.0.0.1 and no other record.

    def __init__(self):
        self.arrived, self.released, self.held = {}, set(), {}

    def connection_made(self, transport):
        self.transport = transport

    def event(self, name):
        return self.arrived.setdefault(name, asyncio.Event())

    def datagram_received(self, data, addr):
        name, question = parsed(data)
        self.event(name).set()
        if name in self.released:
            self.answer(data, question, addr)
        else:
            self.held.setdefault(name, []).append((data, question, addr))

    def answer(self, data, question, addr):
        self.transport.sendto(answer_to(data, question), addr)

    def release(self, name):
        self.released.add(name)
        for held in self.held.pop(name, []):
            self.answer(*held)


def described(exc):
    if exc is None:
        return "ok", ""
    if isinstance(exc, InferError):
        return exc.code.name, exc.details
    return type(exc).__name__, str(exc)


async def outcome(call):
    # What a call with TIMEOUT gives, and how long it took; "overran" past GUARD_S.
    t0 = time.monotonic()
    try:
        await asyncio.wait_for(call(), GUARD_S)
        kind, text = "ok", ""
    except asyncio.TimeoutError as exc:
        kind, text = ("overran", "") if time.monotonic() - t0 >= GUARD_S else ("TimeoutError", str(exc))
    except Exception as exc:
        kind, text = described(exc)
    return {"kind": kind, "text": text, "took": round(time.monotonic() - t0, 3)}


async def asked(dns, name):
    # Once the system resolver has asked for `name`: the client waits for its answer.
    try:
        await asyncio.wait_for(dns.event(name).wait(), 20)
    except asyncio.TimeoutError:
        print(json.dumps({"skip": "the system resolver never asked this resolv.conf's server"}))
        sys.exit(0)


async def scenario(dns, port, name, **client_args):
    x = {"INPUT0": np.zeros((1, 4), np.float32)}
    client = AsyncClient(**client_args)
    out = {}
    # A first call without a timeout, waiting for the lookup: it must get its answer once the resolver answers.
    patient = asyncio.ensure_future(client.infer("patient", x))
    await asked(dns, name)

    async def stream():
        async for _ in client.stream_infer([("m", x)], timeout=TIMEOUT):
            pass

    out["infer"] = await outcome(lambda: client.infer("m", x, timeout=TIMEOUT))
    # Large enough to need the server's request limit first (wok.clients.limits): its look-up waits for the setup too.
    large = {"INPUT0": np.zeros((1, 300_000), np.float32)}
    out["large_infer"] = await outcome(lambda: client.infer("m", large, timeout=TIMEOUT))
    out["server_live"] = await outcome(lambda: client.server_live(timeout=TIMEOUT))
    out["request_limit"] = await outcome(lambda: client.request_limit(timeout=TIMEOUT))
    out["stream_infer"] = await outcome(stream)
    out["wait_ready"] = await outcome(lambda: client.wait_ready(timeout=TIMEOUT))
    # The request limit's look-up, started by a caller that did not wait for the setup first (the client's own
    # `_open` first): it ends within its caller's timeout, not once the setup has.
    await client._look_up_limit(TIMEOUT)
    await asyncio.wait([client._lookup], timeout=GUARD_S)
    out["limit_lookup_ended"] = client._lookup.done()
    out["patient_waits"] = not patient.done()
    dns.release(name)
    try:
        await asyncio.wait_for(patient, 20)
        out["patient"] = "answered"
    except Exception as exc:
        out["patient"] = f"{type(exc).__name__}: {exc}"
    out["after"] = await outcome(lambda: client.infer("m", x, timeout=5))
    await client.close()
    return out


async def closing(dns, name, **client_args):
    # Calls waiting for the lookup (or the balancer's start) when the client is closed: how each ends, and how long
    # after close(); then the lookup's answer comes, for nobody.
    x = {"INPUT0": np.zeros((1, 4), np.float32)}
    client = AsyncClient(**client_args)
    calls = {
        "infer": client.infer("m", x, timeout=20),
        "no_timeout": client.server_live(),
        "stream_infer": client.stream_infer([("m", x)], timeout=20).__anext__(),
        "request_limit": client.request_limit(timeout=20),
        "wait_ready": client.wait_ready(timeout=20),
    }
    tasks = {what: asyncio.ensure_future(call) for what, call in calls.items()}
    ended = {}
    for what, task in tasks.items():
        task.add_done_callback(lambda _, what=what: ended.setdefault(what, time.monotonic()))
    await asked(dns, name)
    closed = time.monotonic()
    await client.close()
    await asyncio.wait(tasks.values(), timeout=GUARD_S)
    out = {}
    for what, task in tasks.items():
        if what in ended:
            kind, text = described(task.exception() if not task.cancelled() else asyncio.CancelledError())
            out[what] = {"kind": kind, "text": text, "took": round(ended[what] - closed, 3)}
        else:
            out[what] = {"kind": "overran", "text": "", "took": GUARD_S}
    dns.release(name)
    await asyncio.gather(*tasks.values(), return_exceptions=True)
    # The lookup's thread ends with the resolver's answer, the loop still running to drop it.
    for thread in threading.enumerate():
        if thread.name == "wok-channel-target":
            await asyncio.to_thread(thread.join, 20)
            assert not thread.is_alive(), f"the lookup of {name} still running 20 s after its answer"
    # No wait for the loop past the joins: the thread handed its result to the loop (call_soon_threadsafe,
    # from the future's set_result) before it ended, so ahead of the join's own result, which resumes this.
    return out


async def ready_after_start(dns, name):
    # wait_ready whose timeout the balancer's start takes part of, the rest running out with no replica READY.
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))  # bound and never listening: connections to it are refused
    client = AsyncClient(f"{name}:{dead.getsockname()[1]}", balancer="wok")
    waiting = asyncio.ensure_future(outcome(lambda: client.wait_ready(timeout=1.0)))
    await asked(dns, name)
    dns.release(name)
    out = await waiting
    await client.close()
    dead.close()
    return out


async def main():
    loop = asyncio.get_running_loop()
    transport, dns = await loop.create_datagram_endpoint(Dns, local_addr=("127.0.0.1", 53))
    server = grpc.aio.server()
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(Server(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    results = {
        "grpc": await scenario(dns, port, "grpc.wok-test", target=[f"grpc.wok-test:{port}", f"127.0.0.1:{port}"]),
        "wok": await scenario(dns, port, "wok.wok-test", target=f"wok.wok-test:{port}", balancer="wok"),
        "closing_grpc": await closing(dns, "cg.wok-test", target=[f"cg.wok-test:{port}", f"127.0.0.1:{port}"]),
        "closing_wok": await closing(dns, "cw.wok-test", target=f"cw.wok-test:{port}", balancer="wok"),
        "ready_after_start": await ready_after_start(dns, "ready.wok-test"),
    }
    await server.stop(0)
    transport.close()
    return results


results = asyncio.run(main())
gc.collect()  # a future left with its error unread says so as it goes
results["logged"] = LOGGED.lines
print(json.dumps(results))
"""
)

# The child's namespaces: its loopback up, its resolv.conf the test's (glibc waits 30 s for an answer).
SETUP = 'ip link set lo up && mount --bind "$1" /etc/resolv.conf && shift && exec "$@"'
RESOLV_CONF = "nameserver 127.0.0.1\noptions timeout:30 attempts:1\n"


def _namespaces_work() -> bool:
    try:
        done = subprocess.run(["unshare", "-rmn", "sh", "-c", "ip link set lo up"], capture_output=True, timeout=30)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _run_child(tmp_path_factory, child: str, resolv_conf: str) -> dict:
    """`child`'s last line of output (JSON), run in namespaces of its own with `resolv_conf`; "stderr" its
    stderr, "exited_at" the wall-clock time (time.time(), as the child can tell it) once it has exited."""
    if sys.platform != "linux" or not _namespaces_work():
        pytest.skip("needs `unshare -rmn` (namespaces of its own) and `ip`")
    conf = tmp_path_factory.mktemp("resolver") / "resolv.conf"
    conf.write_text(resolv_conf)
    command = ["unshare", "-rmn", "sh", "-c", SETUP, "sh", str(conf), sys.executable, "-c", child]
    done = subprocess.run(command, capture_output=True, text=True, timeout=100)
    exited_at = time.time()
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout.splitlines()[-1])
    if "skip" in results:
        pytest.skip(results["skip"])
    results["stderr"], results["exited_at"] = done.stderr, exited_at
    return results


@pytest.fixture(scope="module")
def hung_lookups(tmp_path_factory) -> dict:
    """The child's outcomes, by scenario ("grpc": several targets, one a name; "wok": the balancer) and call."""
    return _run_child(tmp_path_factory, CHILD, RESOLV_CONF)


@pytest.mark.parametrize("path", ["grpc", "wok"])
@pytest.mark.parametrize("call", ["infer", "large_infer", "server_live", "request_limit", "stream_infer"])
def test_a_first_call_past_its_timeout_in_the_lookup_ends_deadline_exceeded(hung_lookups, path, call):
    got = hung_lookups[path][call]
    assert got["kind"] == "DEADLINE_EXCEEDED", got
    assert 0.29 <= got["took"] < 2.0, got
    waited = (
        "the lookup of 'grpc.wok-test'" if path == "grpc" else "the balancer's start (the lookup of 'wok.wok-test')"
    )
    assert got["text"].startswith(f"CLIENT: {waited} did not end within the call's timeout of 0.3 s"), got


@pytest.mark.parametrize("path", ["grpc", "wok"])
def test_wait_ready_past_its_timeout_in_the_lookup_raises_timeout_error(hung_lookups, path):
    got = hung_lookups[path]["wait_ready"]
    assert got["kind"] == "TimeoutError", got
    assert 0.29 <= got["took"] < 2.0, got
    waited = (
        "the lookup of 'grpc.wok-test'" if path == "grpc" else "the balancer's start (the lookup of 'wok.wok-test')"
    )
    assert waited in got["text"], got


@pytest.mark.parametrize("path", ["grpc", "wok"])
def test_a_call_out_of_time_leaves_the_lookup_to_the_others(hung_lookups, path):
    """One caller's short timeout must not cancel the lookup a call without one waits for."""
    results = hung_lookups[path]
    assert results["patient_waits"], results
    assert results["patient"] == "answered", results
    assert results["after"]["kind"] == "ok", results


@pytest.mark.parametrize("path", ["grpc", "wok"])
def test_the_request_limits_look_up_is_bounded_by_its_timeout_while_the_setup_hangs(hung_lookups, path):
    """The look-up awaited the client's setup without a bound: started before the setup ended, it ran on past its
    caller's timeout, for as long as the lookup hung. It now takes the caller's deadline for the setup too."""
    assert hung_lookups[path]["limit_lookup_ended"], hung_lookups[path]


def test_request_limit_past_its_timeout_in_the_lookup_raises_not_none(hung_lookups):
    """request_limit's look-up waited for the setup unbounded, and past the caller's timeout it gave None, as a
    server that publishes no limit: the caller could not tell "not looked up" from "no limit"."""
    for path in ("grpc", "wok"):
        got = hung_lookups[path]["request_limit"]
        assert got["text"].endswith("so the server's request limit was not looked up"), got


@pytest.mark.parametrize("path", ["grpc", "wok"])
def test_close_ends_the_calls_waiting_for_the_lookup_at_once(hung_lookups, path):
    """On the plain gRPC path a call waiting for the first lookup at close() waited on, up to its own timeout
    (or for good, without one) or until the resolver answered: the balancer's path ends them at once. Both end
    now as a call in flight at close() does, and the lookup's answer, when it comes, goes nowhere, quietly."""
    from wok.clients.aio import CLOSED_EARLY

    for call, got in hung_lookups[f"closing_{path}"].items():
        assert (got["kind"], got["text"]) == ("CANCELLED", CLOSED_EARLY), (call, got)
        assert got["took"] < 1.0, (call, got)
    assert hung_lookups["logged"] == []
    assert "Traceback" not in hung_lookups["stderr"], hung_lookups["stderr"]


def test_wait_ready_quotes_the_callers_timeout_when_the_balancers_start_took_part_of_it(hung_lookups):
    """The balancer's TimeoutError quoted what was left of the caller's timeout once its start had taken the
    rest ("within 0.997 s" for wait_ready(timeout=1.0)); it quotes the caller's, and says what took the rest."""
    got = hung_lookups["ready_after_start"]
    assert got["kind"] == "TimeoutError", got
    assert 1.0 <= got["took"] < 2.0, got
    waited = "the balancer's start (the lookup of 'ready.wok-test')"
    assert f"not connected (no replica READY) within 1.0 s, of which {waited} took 0." in got["text"], got


# A DNS server that never answers (a UDP socket nobody reads but to note what came), and lookups that end with
# the client: a property read, and asyncio.run's end and the process's exit after close().
SILENT_CHILD = r"""
import asyncio, json, socket, sys, threading, time

from wok.clients import AsyncClient
from wok.clients.balancer import BalancerSettings

silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
silent.bind(("127.0.0.1", 53))
asked = threading.Event()


def note() -> None:
    while True:
        silent.recvfrom(512)
        asked.set()


threading.Thread(target=note, daemon=True).start()


def timed(read):
    t0 = time.monotonic()
    try:
        value = read()
    except Exception as exc:
        value = f"{type(exc).__name__}: {exc}"
    return value, round(time.monotonic() - t0, 3)


async def target_read():
    targets = ["held.wok-test:1", "127.0.0.1:1"]
    client = AsyncClient(targets)
    if not await asyncio.to_thread(asked.wait, 20):
        print(json.dumps({"skip": "the system resolver never asked this resolv.conf's server"}))
        sys.exit(0)
    out = {"given": targets}
    out["open"], out["open_s"] = timed(lambda: client.target)
    await client.close()
    out["closed"], out["closed_s"] = timed(lambda: client.target)
    return out


async def balancer_closed():
    settings = BalancerSettings(resolve_timeout_s=0.3)
    client = AsyncClient("held2.wok-test:1", balancer="wok", balancer_settings=settings)
    try:
        await client.wait_ready(timeout=5)
        started = "ok"
    except ValueError as exc:  # the name did not resolve in resolve_timeout_s
        started = str(exc)
    await client.close()
    return started, time.monotonic(), time.time()


results = {"target": asyncio.run(target_read())}
results["started"], closed, results["closed_at"] = asyncio.run(balancer_closed())
results["run_ended_s"] = round(time.monotonic() - closed, 3)
print(json.dumps(results), flush=True)
"""
# glibc waits this long for the silent server: what a read, asyncio.run or the exit waited, without the fixes.
SILENT_CONF = "nameserver 127.0.0.1\noptions timeout:10 attempts:1\n"


@pytest.fixture(scope="module")
def silent_lookups(tmp_path_factory) -> dict:
    return _run_child(tmp_path_factory, SILENT_CHILD, SILENT_CONF)


def test_target_read_during_the_first_lookup_does_not_block_the_loop(silent_lookups):
    """AsyncClient.target waited for the first lookup's thread (blocking the loop) until the resolver gave up, 10 s
    here, then raised its error, after close() too: it returns the targets as given until the lookup has ended."""
    got = silent_lookups["target"]
    assert got["open"] == got["given"] and got["closed"] == got["given"], got
    assert got["open_s"] < 1.0 and got["closed_s"] < 1.0, got


def test_a_balancers_hung_lookup_holds_neither_asyncio_run_nor_the_exit(silent_lookups):
    """The wok balancer's getaddrinfo ran on the loop's default executor: after close(), asyncio.run's end
    (shutdown_default_executor) and the interpreter's exit waited for its thread until the resolver gave up
    (10 s here). Its lookup is now a daemon thread of its own, waited for by neither."""
    assert "the resolver gave no answer within 0.3 s" in silent_lookups["started"], silent_lookups
    assert silent_lookups["run_ended_s"] < 2.0, silent_lookups
    assert silent_lookups["exited_at"] - silent_lookups["closed_at"] < 5.0, silent_lookups
    assert "Traceback" not in silent_lookups["stderr"], silent_lookups["stderr"]


# A DNS server on a thread of the child's own (`Dns`), after COMMON.
THREADED_DNS = (
    COMMON
    + r"""
class Dns:
    # On a thread (the loops here end): holds each name's queries until `release(name)`, then answers A 127.0.0.1,
    # or for a name in `missing`, that it has no such name (NXDOMAIN).

    def __init__(self):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 53))
        self.lock = threading.Lock()
        self.arrived, self.released, self.held, self.missing = {}, set(), {}, set()
        threading.Thread(target=self.serve, daemon=True).start()

    def asked(self, name):
        with self.lock:
            return self.arrived.setdefault(name, threading.Event())

    def serve(self):
        while True:
            data, addr = self.sock.recvfrom(512)
            name, question = parsed(data)
            self.asked(name).set()
            with self.lock:
                if name not in self.released and name not in self.missing:
                    self.held.setdefault(name, []).append((data, question, addr))
                    continue
            self.answer(data, question, addr, name in self.missing)

    def answer(self, data, question, addr, missing=False):
        self.sock.sendto(answer_to(data, question, missing), addr)

    def release(self, name):
        with self.lock:
            self.released.add(name)
            held = self.held.pop(name, [])
        for query in held:
            self.answer(*query)
"""
)

# A lookup's answer that comes as its loop closes: the thread that ends the lookup hands its result to the loop
# (call_soon_threadsafe) just as the loop closes. The loop here holds such a hand-over until it is closed, so the
# answer comes after the check that the loop is open and before the hand-over, every run.
LATE_CHILD = (
    r"""
import asyncio, json, logging, socket, struct, threading

from wok.clients import AsyncClient
from wok.clients.balancer import system_resolver


"""
    + THREADED_DNS
    + r"""

class ClosingLoop(asyncio.SelectorEventLoop):
    # Once `hold` is set, a call_soon_threadsafe from another thread waits until the loop is closed.

    def __init__(self):
        super().__init__()
        self.owner = threading.get_ident()
        self.hold, self.handing_over, self.closed = threading.Event(), threading.Event(), threading.Event()

    def call_soon_threadsafe(self, *args, **kwargs):
        if self.hold.is_set() and threading.get_ident() != self.owner:
            self.handing_over.set()
            self.closed.wait(20)
        return super().call_soon_threadsafe(*args, **kwargs)

    def close(self):
        super().close()
        self.closed.set()


def answered_as_the_loop_closes(dns, name, thread_name, begin):
    # `begin()` (a coroutine) starts the awaited lookup of `name` and returns what ends its caller; the answer then
    # comes for a loop that is closing. Whether the hand-over came, and the lookup's thread ended.
    loop = ClosingLoop()
    try:
        async def first():
            end = await begin()
            if not dns.asked(name).wait(20):
                return None
            await end()  # the caller gone
            return True

        if loop.run_until_complete(first()) is None:
            return {"skip": "the system resolver never asked this resolv.conf's server"}
        loop.hold.set()
        dns.release(name)
        handed = loop.handing_over.wait(20)
        threads = [t for t in threading.enumerate() if t.name == thread_name]  # (held there, if handed)
    finally:
        loop.close()
    for thread in threads:
        thread.join(20)
    return {"handed_over": handed, "threads": len(threads), "alive": any(t.is_alive() for t in threads)}


def balancer_lookup():
    async def begin():
        task = asyncio.ensure_future(system_resolver("bal.wok-test", 1))
        await asyncio.sleep(0)  # its first step: the lookup started and awaited

        async def end():
            task.cancel()
            await asyncio.wait([task])

        return end

    return begin


def client_lookup():
    async def begin():
        client = AsyncClient(["cli.wok-test:1", "127.0.0.1:1"])
        call = asyncio.ensure_future(client.server_live(timeout=20))
        await asyncio.sleep(0)  # its first step: waiting for the lookup

        async def end():
            await client.close()
            await asyncio.wait([call])
            call.exception()

        return end

    return begin


dns = Dns()
results = {
    "balancer": answered_as_the_loop_closes(dns, "bal.wok-test", "wok-balancer-lookup", balancer_lookup()),
    "client": answered_as_the_loop_closes(dns, "cli.wok-test", "wok-channel-target", client_lookup()),
}
for got in results.values():
    if "skip" in got:
        print(json.dumps(got))
        raise SystemExit(0)
results["logged"] = LOGGED.lines
print(json.dumps(results))
"""
)


def test_a_lookups_answer_as_its_loop_closes_is_dropped_quietly(tmp_path_factory):
    """The thread of a lookup whose caller had gone (cancelled, the client closed) handed its answer to the loop
    through asyncio.wrap_future: a loop that closed between its check and its hand-over raised in that thread, and
    concurrent.futures logged "exception calling callback for <Future ...>: RuntimeError: Event loop is closed".
    The answer is dropped quietly now, on the balancer's lookups and the client's first one alike."""
    got = _run_child(tmp_path_factory, LATE_CHILD, RESOLV_CONF)
    for path in ("balancer", "client"):
        assert got[path] == {"handed_over": True, "threads": 1, "alive": False}, got
    assert got["logged"] == [], got["logged"]
    assert "Traceback" not in got["stderr"], got["stderr"]


# The blocking Client's lookup of several targets, one a name whose DNS answer is held.
SYNC_CHILD = (
    r"""
import asyncio, gc, json, logging, socket, struct, sys, threading, time, weakref
from concurrent import futures

import grpc
import numpy as np

from wok.clients import AsyncClient, Client, InferError
from wok.v2pb import grpc_service_pb2 as pb
from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

TIMEOUT = 0.3
GUARD_S = 3.0  # a call (or the constructor) still waiting past this overran: it waits for the resolver (30 s)
X = {"INPUT0": np.zeros((1, 4), np.float32)}
LARGE = {"INPUT0": np.zeros((1, 300_000), np.float32)}  # needs the server's request limit first


"""
    + THREADED_DNS
    + r"""

class Server(pb_grpc.GRPCInferenceServiceServicer):
    def ModelInfer(self, request, context):
        return pb.ModelInferResponse(model_name=request.model_name, id=request.id)

    def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=True)

    def ServerMetadata(self, request, context):  # (no request limit published)
        return pb.ServerMetadataResponse(name="child")

    def ModelStreamInfer(self, request_iterator, context):
        for request in request_iterator:
            yield pb.ModelStreamInferResponse(infer_response=pb.ModelInferResponse(model_name=request.model_name))


def described(exc):
    if isinstance(exc, InferError):
        return exc.code.name, exc.details
    return type(exc).__name__, str(exc)


def started(call):
    # `call()` on a thread of its own; its outcome in the dict it fills once it ends.
    out = {}

    def run():
        t0 = time.monotonic()
        try:
            out["value"] = call()
            out["kind"], out["text"] = "ok", ""
        except Exception as exc:
            out["kind"], out["text"] = described(exc)
        out["took"], out["ended"] = round(time.monotonic() - t0, 3), time.monotonic()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def outcome(call):
    # What `call()` gives and how long it took; "overran" past GUARD_S (left running).
    thread, out = started(call)
    thread.join(GUARD_S)
    if thread.is_alive():
        return {"kind": "overran", "text": "", "took": GUARD_S}
    return {k: out[k] for k in ("kind", "text", "took")}


def asked(dns, name):
    if not dns.asked(name).wait(20):
        print(json.dumps({"skip": "the system resolver never asked this resolv.conf's server"}))
        sys.exit(0)


def waiting_for_the_lookup(thread):
    # Whether `thread` waits in the client's wait for its lookup (Event.wait called from Client._setup).
    frame = sys._current_frames().get(thread.ident)
    while frame is not None and frame.f_back is not None:
        if frame.f_code.co_name == "wait" and frame.f_back.f_code.co_name == "_setup":
            return True
        frame = frame.f_back
    return False


def made_within(dns, name, make):
    # `make()` (a client's constructor) on a thread, given GUARD_S: the client and what the constructor took, or
    # "overran", once `name`'s answer let it end (it waited for the resolver's answer).
    thread, made = started(make)
    thread.join(GUARD_S)
    if thread.is_alive():
        dns.release(name)
        thread.join(20)
        return made["value"], "overran"
    asked(dns, name)
    return made["value"], {"kind": made["kind"], "took": made["took"]}


def scenario(dns, port):
    name = "sync.wok-test"
    targets = [f"{name}:{port}", f"127.0.0.1:{port}"]
    client, made = made_within(dns, name, lambda: Client(targets))
    out = {"made": made}
    if made == "overran":
        client.close()
        return out
    out["given"], out["target_while_looked_up"] = targets, client.target
    patient, patient_out = started(lambda: client.server_live())  # no timeout: it waits for the lookup
    out["infer"] = outcome(lambda: client.infer("m", X, timeout=TIMEOUT))
    out["large_infer"] = outcome(lambda: client.infer("m", LARGE, timeout=TIMEOUT))
    out["server_live"] = outcome(lambda: client.server_live(timeout=TIMEOUT))
    out["request_limit"] = outcome(lambda: client.request_limit(timeout=TIMEOUT))
    out["stream_infer"] = outcome(lambda: list(client.stream_infer([("m", X)], timeout=TIMEOUT)))
    out["wait_ready"] = outcome(lambda: client.wait_ready(timeout=TIMEOUT))
    out["patient_waits"] = patient.is_alive()
    dns.release(name)
    patient.join(20)
    out["patient"] = {k: patient_out.get(k) for k in ("kind", "text", "value")}
    out["after"] = outcome(lambda: client.infer("m", X, timeout=5))
    out["target"] = client.target
    client.close()
    return out


def closing(dns, port):
    # Calls waiting for the lookup when the client is closed: how each ends, and how long after close().
    name = "closing.wok-test"
    client = Client([f"{name}:{port}", f"127.0.0.1:{port}"])
    calls = {
        "infer": lambda: client.infer("m", X, timeout=20),
        "no_timeout": lambda: client.server_live(),
        "stream_infer": lambda: next(client.stream_infer([("m", X)], timeout=20)),
        "request_limit": lambda: client.request_limit(timeout=20),
        "wait_ready": lambda: client.wait_ready(timeout=20),
    }
    running = {what: started(call) for what, call in calls.items()}
    asked(dns, name)
    deadline = time.monotonic() + 20
    while not all(waiting_for_the_lookup(t) for t, _ in running.values()) and time.monotonic() < deadline:
        time.sleep(0.001)
    closed = time.monotonic()
    client.close()
    out = {}
    for what, (thread, got) in running.items():
        thread.join(GUARD_S)
        if thread.is_alive():
            out[what] = {"kind": "overran", "text": "", "took": GUARD_S}
        else:
            out[what] = {"kind": got["kind"], "text": got["text"], "took": round(got["ended"] - closed, 3)}
    dns.release(name)
    for thread in threading.enumerate():
        if thread.name == "wok-channel-target":
            thread.join(20)
            assert not thread.is_alive(), f"the lookup of {name} still running 20 s after its answer"
    return out


def missing(dns, port):
    # A name that does not resolve: its error to every call, and to `target` once the lookup has ended.
    name = "missing.wok-test"
    dns.missing.add(name)
    client = Client([f"{name}:{port}", f"127.0.0.1:{port}"])
    out = [outcome(lambda: client.server_live(timeout=5)) for _ in range(2)]
    out.append(outcome(lambda: client.target))
    # Each call's inputs, let go once it has failed: the lookup's one stored error, raised again by each call,
    # gathered each raise's frames (and their locals) in its traceback.
    inputs = []
    for _ in range(3):
        x = np.ones((1, 4), np.float32)
        inputs.append(weakref.ref(x))
        outcome(lambda x=x: client.infer("m", {"x": x}, timeout=5))
        del x
    gc.collect()
    out.append({"inputs_kept": sum(ref() is not None for ref in inputs)})
    client.close()
    return out


def async_made_outside_a_loop(dns, port):
    # An AsyncClient made where no loop runs, then used in one: its constructor looked the targets up, as Client's did.
    name = "outside.wok-test"
    targets = [f"{name}:{port}", f"127.0.0.1:{port}"]
    client, made = made_within(dns, name, lambda: AsyncClient(targets))
    if made == "overran":
        return {"made": "overran"}

    async def timed(call):
        t0 = time.monotonic()
        try:
            await asyncio.wait_for(call(), GUARD_S)
            kind, text = "ok", ""
        except asyncio.TimeoutError:
            kind, text = "overran", ""
        except Exception as exc:
            kind, text = described(exc)
        return {"kind": kind, "text": text, "took": round(time.monotonic() - t0, 3)}

    async def first():
        out = {"made": made, "target_while_looked_up": client.target}
        out["infer"] = await timed(lambda: client.infer("m", X, timeout=TIMEOUT))
        return out

    async def then():
        # In a loop of its own (as a script's second asyncio.run): it waited on the first loop's wait for the
        # lookup, which that loop, ended, never completed, past its timeout.
        out = {"after": await timed(lambda: client.infer("m", X, timeout=2))}
        out["target"] = client.target
        await client.close()
        return out

    out = asyncio.run(first())
    dns.release(name)
    return {"given": targets, **out, **asyncio.run(then())}


dns = Dns()
server = grpc.server(futures.ThreadPoolExecutor(4))
pb_grpc.add_GRPCInferenceServiceServicer_to_server(Server(), server)
port = server.add_insecure_port("127.0.0.1:0")
server.start()
results = {"scenario": scenario(dns, port)}
if results["scenario"]["made"] != "overran":
    results["closing"] = closing(dns, port)
    results["missing"] = missing(dns, port)
results["async_outside"] = async_made_outside_a_loop(dns, port)
server.stop(0)
results["logged"] = LOGGED.lines
print(json.dumps(results))
"""
)


@pytest.fixture(scope="module")
def sync_lookups(tmp_path_factory) -> dict:
    return _run_child(tmp_path_factory, SYNC_CHILD, RESOLV_CONF)


def test_a_sync_clients_constructor_does_not_wait_for_the_lookup(sync_lookups):
    """Client() looked its targets up in the constructor, which no timeout bounds: with a DNS server that does not
    answer, up to the system resolver's limit (30 s here). It looks them up on a thread, as AsyncClient does."""
    got = sync_lookups["scenario"]
    assert got["made"] != "overran", "the constructor waited for the lookup"
    assert got["made"]["kind"] == "ok" and got["made"]["took"] < 1.0, got["made"]
    assert got["target_while_looked_up"] == got["given"], got  # (it never waits either)


@pytest.mark.parametrize("call", ["infer", "large_infer", "server_live", "request_limit", "stream_infer"])
def test_a_sync_first_call_past_its_timeout_in_the_lookup_ends_deadline_exceeded(sync_lookups, call):
    got = sync_lookups["scenario"][call]
    assert got["kind"] == "DEADLINE_EXCEEDED", got
    assert 0.29 <= got["took"] < 2.0, got
    assert got["text"].startswith(
        "CLIENT: the lookup of 'sync.wok-test' did not end within the call's timeout of 0.3 s"
    )
    unsent = {
        "request_limit": "the server's request limit was not looked up",
        "stream_infer": "the stream was not opened",
    }
    assert got["text"].endswith(f"so {unsent.get(call, 'the request was not sent')}"), got


def test_sync_wait_ready_past_its_timeout_in_the_lookup_raises_timeout_error(sync_lookups):
    got = sync_lookups["scenario"]["wait_ready"]
    assert got["kind"] == "TimeoutError", got
    assert 0.29 <= got["took"] < 2.0, got
    assert "not connected within 0.3 s: the lookup of 'sync.wok-test' did not end in that time" in got["text"], got


def test_a_sync_call_out_of_time_leaves_the_lookup_to_the_others(sync_lookups):
    got = sync_lookups["scenario"]
    assert got["patient_waits"], got
    assert got["patient"] == {"kind": "ok", "text": "", "value": True}, got
    assert got["after"]["kind"] == "ok", got
    assert got["target"].startswith("ipv4:127.0.0.1:"), got


def test_sync_close_ends_the_calls_waiting_for_the_lookup_at_once(sync_lookups):
    from wok.clients.errors import CLOSED_EARLY

    for call, got in sync_lookups["closing"].items():
        expected = ("RuntimeError", "this Client is closed") if call == "wait_ready" else ("CANCELLED", CLOSED_EARLY)
        assert (got["kind"], got["text"]) == expected, (call, got)
        assert got["took"] < 1.0, (call, got)
    assert sync_lookups["logged"] == []
    assert "Traceback" not in sync_lookups["stderr"], sync_lookups["stderr"]


def test_a_sync_clients_failed_lookup_is_every_calls_error(sync_lookups):
    *errors, kept = sync_lookups["missing"]
    assert kept == {"inputs_kept": 0}  # 3 of 3 before: each raise of the stored error kept its call's frames
    for got in errors:
        assert got["kind"] == "ValueError", got
        assert "cannot resolve 'missing.wok-test'" in got["text"], got


def test_an_async_client_made_outside_a_loop_does_not_wait_for_the_lookup_either(sync_lookups):
    """AsyncClient() made outside a running loop looked its targets up in its constructor, which no timeout bounds
    (up to the system resolver's limit, 30 s here). It looks them up on a thread, as when made in a loop: its first
    call, in a loop, waits for that lookup at most its timeout."""
    got = sync_lookups["async_outside"]
    assert got["made"] != "overran", "the constructor waited for the lookup"
    assert got["made"]["kind"] == "ok" and got["made"]["took"] < 1.0, got["made"]
    assert got["target_while_looked_up"] == got["given"], got
    assert got["infer"]["kind"] == "DEADLINE_EXCEEDED", got
    assert 0.29 <= got["infer"]["took"] < 2.0, got
    assert got["infer"]["text"].startswith(
        "CLIENT: the lookup of 'outside.wok-test' did not end within the call's timeout of 0.3 s"
    ), got
    assert got["after"]["kind"] == "ok", got
    assert got["target"].startswith("ipv4:127.0.0.1:"), got
    assert sync_lookups["logged"] == []
