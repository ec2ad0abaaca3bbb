"""A call's timeout bounds the client's setup its first call waits for: the name lookup of several targets
(the plain gRPC path) and the wok balancer's start.

The lookups are the system resolver's (glibc's getaddrinfo), made to hang for real: the client runs in a
child with a user, mount and network namespace of its own (`unshare -rmn`, no root needed where user
namespaces are allowed), its /etc/resolv.conf bind-mounted to name a DNS server the child runs on its own
loopback, which holds its answers until the child releases them. Nothing of this machine's changes.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(120)

CHILD = r"""
import asyncio, json, struct, sys, time

import grpc
import numpy as np

from wok.clients import AsyncClient, InferError
from wok.v2pb import grpc_service_pb2 as pb
from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

TIMEOUT = 0.3
GUARD_S = 3.0  # a call still waiting past this overran: without the fix it waits for the resolver (30 s)


class Server(pb_grpc.GRPCInferenceServiceServicer):
    async def ModelInfer(self, request, context):
        return pb.ModelInferResponse(model_name=request.model_name, id=request.id)

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
        labels, i = [], 12
        while data[i]:
            labels.append(data[i + 1 : i + 1 + data[i]].decode())
            i += 1 + data[i]
        name, question = ".".join(labels), data[12 : i + 5]
        self.event(name).set()
        if name in self.released:
            self.answer(data, question, addr)
        else:
            self.held.setdefault(name, []).append((data, question, addr))

    def answer(self, data, question, addr):
        a = struct.unpack("!H", question[-4:-2])[0] == 1
        header = data[:2] + struct.pack("!HHHHH", 0x8180, 1, int(a), 0, 0)
        record = struct.pack("!HHHIH", 0xC00C, 1, 1, 60, 4) + bytes([127, 0, 0, 1]) if a else b""
        self.transport.sendto(header + question + record, addr)

    def release(self, name):
        self.released.add(name)
        for held in self.held.pop(name, []):
            self.answer(*held)


async def outcome(call):
    # What a call with TIMEOUT gives, and how long it took; "overran" past GUARD_S.
    t0 = time.monotonic()
    try:
        await asyncio.wait_for(call(), GUARD_S)
        kind, text = "ok", ""
    except asyncio.TimeoutError as exc:
        kind, text = ("overran", "") if time.monotonic() - t0 >= GUARD_S else ("TimeoutError", str(exc))
    except InferError as exc:
        kind, text = exc.code.name, exc.details
    except Exception as exc:
        kind, text = type(exc).__name__, str(exc)
    return {"kind": kind, "text": text, "took": round(time.monotonic() - t0, 3)}


async def scenario(dns, port, name, **client_args):
    x = {"INPUT0": np.zeros((1, 4), np.float32)}
    client = AsyncClient(**client_args)
    out = {}
    # A first call without a timeout, waiting for the lookup: it must get its answer once the resolver answers.
    patient = asyncio.ensure_future(client.infer("patient", x))
    try:
        await asyncio.wait_for(dns.event(name).wait(), 20)
    except asyncio.TimeoutError:
        print(json.dumps({"skip": "the system resolver never asked this resolv.conf's server"}))
        sys.exit(0)

    async def stream():
        async for _ in client.stream_infer([("m", x)], timeout=TIMEOUT):
            pass

    out["infer"] = await outcome(lambda: client.infer("m", x, timeout=TIMEOUT))
    # Large enough to need the server's request limit first (wok.clients.limits): its look-up waits for the setup too.
    large = {"INPUT0": np.zeros((1, 300_000), np.float32)}
    out["large_infer"] = await outcome(lambda: client.infer("m", large, timeout=TIMEOUT))
    out["server_live"] = await outcome(lambda: client.server_live(timeout=TIMEOUT))
    out["stream_infer"] = await outcome(stream)
    out["wait_ready"] = await outcome(lambda: client.wait_ready(timeout=TIMEOUT))
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
    }
    await server.stop(0)
    transport.close()
    print(json.dumps(results))


asyncio.run(main())
"""

# The child's namespaces: its loopback up, its resolv.conf the test's (glibc waits 30 s for an answer).
SETUP = 'ip link set lo up && mount --bind "$1" /etc/resolv.conf && shift && exec "$@"'
RESOLV_CONF = "nameserver 127.0.0.1\noptions timeout:30 attempts:1\n"


def _namespaces_work() -> bool:
    try:
        done = subprocess.run(["unshare", "-rmn", "sh", "-c", "ip link set lo up"], capture_output=True, timeout=30)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


@pytest.fixture(scope="module")
def hung_lookups(tmp_path_factory) -> dict:
    """The child's outcomes, by scenario ("grpc": several targets, one a name; "wok": the balancer) and call."""
    if sys.platform != "linux" or not _namespaces_work():
        pytest.skip("needs `unshare -rmn` (namespaces of its own) and `ip`")
    conf = tmp_path_factory.mktemp("resolver") / "resolv.conf"
    conf.write_text(RESOLV_CONF)
    command = ["unshare", "-rmn", "sh", "-c", SETUP, "sh", str(conf), sys.executable, "-c", CHILD]
    done = subprocess.run(command, capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout.splitlines()[-1])
    if "skip" in results:
        pytest.skip(results["skip"])
    return results


@pytest.mark.parametrize("path", ["grpc", "wok"])
@pytest.mark.parametrize("call", ["infer", "large_infer", "server_live", "stream_infer"])
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
