"""A name with both address families (`localhost`: 127.0.0.1 and ::1) against servers on one
family or both: the wok balancer and a list of targets for gRPC's balancer reach each server on
the family it listens on, and a dual-stack server is one replica.

This machine's /etc/hosts maps localhost to 127.0.0.1 only, so the names' addresses are given
by a resolver (the balancer's `resolver=`) or a stand-in getaddrinfo. A port's other family is
held by a socket bound without listening, so a connection there is refused, not taken by some
other server.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import socket
import subprocess
import sys
import threading

import grpc
import pytest

from wok.clients import AsyncClient
from wok.clients.balancer import Balancer, BalancerSettings
from wok.clients.channel import channel_target
from wok.v2pb import grpc_service_pb2 as pb

pytestmark = pytest.mark.timeout(60)
METHOD = "/inference.GRPCInferenceService/ModelInfer"
REQUEST = pb.ModelInferRequest(model_name="m").SerializeToString()


def refusing(host: str, port: int = 0) -> socket.socket:
    """A socket bound to host:port that does not listen (yet): connections there are refused."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    # A connection of another test in TIME_WAIT on the port must not stop the bind.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def port_pair() -> tuple[socket.socket, socket.socket]:
    """Sockets on 127.0.0.1:P and [::1]:P, one port P, bound without listening."""
    for _ in range(50):
        v4 = refusing("127.0.0.1")
        try:
            return v4, refusing("::1", port_of(v4))
        except OSError:  # taken on ::1: another port
            v4.close()
    raise RuntimeError("no port free on both 127.0.0.1 and ::1 in 50 tries")


def port_of(sock: socket.socket) -> int:
    return sock.getsockname()[1]


@pytest.fixture
def stub_at(stub):
    """`stub_at("a", "[::1]", port)`: conftest's Stub, listening on that address only
    ("[::]" for both families)."""

    class At(stub):
        def __init__(self, name: str, host: str, port: int = 0) -> None:
            super().__init__(name, address=f"{host}:{port}")

    return At


@contextlib.contextmanager
def v6_port():
    """A port free on ::1 whose IPv4 loopback address refuses connections."""
    v4, v6 = port_pair()
    v6.close()
    try:
        yield port_of(v4)
    finally:
        v4.close()


def both(port: int):
    """A resolver for a name with both families, as `localhost` has on most systems."""

    async def resolver(host: str, p: int) -> list[str]:
        return [f"127.0.0.1:{port}", f"[::1]:{port}"]

    return resolver


async def answer(bal: Balancer) -> str:
    return pb.ModelInferResponse.FromString(await bal.unary_unary(METHOD)(REQUEST, timeout=10)).model_name


async def test_the_balancer_reaches_a_name_over_the_family_its_server_listens_on(stub_at):
    """A server on ::1 only (`wok serve --host ::1`): the name's IPv4 address was the replica,
    every call failed with UNAVAILABLE (connection refused) while gRPC itself connected."""
    with v6_port() as port:
        async with stub_at("a", "[::1]", port) as a, Balancer("box:1", resolver=both(a.port)) as bal:
            assert list(bal.replicas) == [f"[::1]:{port}"]
            assert await answer(bal) == "a"


async def test_a_dual_stack_server_is_one_replica_on_ipv4(stub_at):
    async with stub_at("a", "[::]") as a, Balancer("box:1", resolver=both(a.port)) as bal:
        assert list(bal.replicas) == [f"127.0.0.1:{a.port}"]
        assert await answer(bal) == "a"


async def test_the_system_resolver_gives_the_balancer_both_families(stub_at, monkeypatch):
    """The system resolver itself dropped a name's IPv6 addresses when it had IPv4 ones."""
    real = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kw):
        if host != "box":
            return real(host, port, *args, **kw)
        return [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port)),
            (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::1", port, 0, 0)),
        ]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    with v6_port() as port:
        async with stub_at("a", "[::1]", port), Balancer(f"box:{port}") as bal:
            assert list(bal.replicas) == [f"[::1]:{port}"]
            assert await answer(bal) == "a"


async def test_a_server_not_up_yet_gets_its_family_at_a_lookup_soon_after(stub_at):
    """Neither family accepts at the start: IPv4 by guess, and the name is looked up again
    within a second (not resolve_every_s, 30 s) until its server, on ::1, accepts."""
    v4, v6 = port_pair()
    port = port_of(v4)
    try:
        async with Balancer("box:1", resolver=both(port), settings=BalancerSettings(hedge_after=None)) as bal:
            assert list(bal.replicas) == [f"127.0.0.1:{port}"]
            v6.close()
            async with stub_at("a", "[::1]", port):
                await bal.wait_for(lambda: list(bal.replicas) == [f"[::1]:{port}"], 10)
                assert await answer(bal) == "a"
    finally:
        v4.close()
        v6.close()


async def test_probes_find_the_addresses_that_accept():
    from wok.clients import balancer, channel

    (v4, no6), (no4, v6) = port_pair(), port_pair()  # a listener on each family, refused on the other
    v4.listen()
    v6.listen()
    try:
        addresses = [f"127.0.0.1:{port_of(v4)}", f"[::1]:{port_of(v4)}", f"127.0.0.1:{port_of(v6)}"]
        addresses.append(f"[::1]:{port_of(v6)}")
        expected = {f"127.0.0.1:{port_of(v4)}", f"[::1]:{port_of(v6)}"}
        assert channel.accepting(addresses) == expected
        probed = await balancer.probing(addresses)
        assert {a for a, outcome in probed.items() if outcome is channel.Probe.ACCEPTED} == expected
        assert channel.accepted_families(addresses[:2], expected) == {socket.AF_INET}
    finally:
        for s in (v4, v6, no4, no6):
            s.close()


def test_several_targets_take_the_family_each_server_accepts_on(monkeypatch):
    """`--target localhost:A,localhost:B` for gRPC's balancer: one URI of IPv4 addresses, so a
    server on ::1 only got none of the calls (or every call failed when all were on ::1)."""
    real = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):
        if host != "box":
            return real(host, port, *args, **kwargs)
        return [
            (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::1", port, 0, 0)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port)),
        ]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    (no_a, a6), (no_b, b6), (c4, no_c) = port_pair(), port_pair(), port_pair()
    for sock in (a6, b6, c4):
        sock.listen()
    dual = socket.create_server(("::", 0), family=socket.AF_INET6, dualstack_ipv6=True)
    held = [no_a, no_b, no_c]
    try:
        a, b, c, d = (port_of(s) for s in (a6, b6, c4, dual))
        assert channel_target([f"box:{a}", f"box:{b}"]) == f"ipv6:[::1]:{a},[::1]:{b}"
        # A dual-stack server goes with the other targets' family, listed once.
        assert channel_target([f"box:{d}", f"box:{a}"]) == f"ipv6:[::1]:{d},[::1]:{a}"
        assert channel_target([f"box:{d}", f"box:{c}"]) == f"ipv4:127.0.0.1:{d},127.0.0.1:{c}"
        # Mixed: no one URI reaches both; the error names them and their families.
        with pytest.raises(ValueError, match=rf"'box:{c}' \(IPv4.*'box:{a}' \(IPv6.*balancer='wok'"):
            channel_target([f"box:{c}", f"box:{a}"])
        with pytest.raises(ValueError, match=rf"'10.0.0.1:1' \(IPv4: its only family\).*'box:{a}' \(IPv6"):
            channel_target(["10.0.0.1:1", f"box:{a}"])
    finally:
        for s in (a6, b6, dual, c4, *held):
            s.close()


# -- refused or no answer; the async client's lookup off the loop ----------------------------


def address(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@contextlib.contextmanager
def full(*socks: socket.socket):
    """`socks` (bound, from `port_pair`) listening with a full accept queue: a connection there gets
    no answer (the kernel drops its SYN), as at a server too busy to accept."""
    fillers = []
    try:
        for sock in socks:
            sock.listen(0)
            for _ in range(10):  # a queue of listen(0) holds one connection
                filler = socket.socket(sock.family, socket.SOCK_STREAM)
                fillers.append(filler)
                filler.setblocking(False)
                filler.connect_ex(sock.getsockname())
                if not select.select([], [filler], [], 0.1)[1]:  # no answer: the queue is full
                    break
            else:
                raise RuntimeError(f"{address(sock)}: the accept queue still takes connections after 10")
        yield
    finally:
        for filler in fillers:
            filler.close()


@pytest.fixture
def box(monkeypatch):
    """The name "box" resolves to 127.0.0.1 and ::1, for socket.getaddrinfo (channel_target)."""
    real = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):
        if host != "box":
            return real(host, port, *args, **kwargs)
        return [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port)),
            (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::1", port, 0, 0)),
        ]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


def test_probes_tell_a_refusal_from_no_answer():
    from wok.clients.channel import Probe, preferred_families, probe

    (no4, busy6), (open4, no6) = port_pair(), port_pair()
    open4.listen()
    try:
        with full(busy6):
            got = probe([address(no4), address(busy6), address(open4), address(no6)])
            assert got == {
                address(no4): Probe.REFUSED,
                address(busy6): Probe.TIMED_OUT,
                address(open4): Probe.ACCEPTED,
                address(no6): Probe.REFUSED,
            }
            assert preferred_families([address(no4), address(busy6)], got) == {socket.AF_INET6}
            assert preferred_families([address(open4), address(no6)], got) == {socket.AF_INET}
            assert preferred_families([address(no4), address(no6)], got) == {socket.AF_INET, socket.AF_INET6}
    finally:
        for s in (no4, busy6, open4, no6):
            s.close()


def test_a_family_without_an_answer_wins_over_one_that_refused(box, monkeypatch):
    """Neither family accepts: IPv4 was taken even when it refused (nothing listens there) and IPv6
    only got no answer (a server there, too busy to accept): every call then went to the refusal."""
    from wok.clients import channel

    monkeypatch.setattr(channel, "PROBE_TIMEOUT_S", 0.1)
    (no4, busy6), (busy4, no6), (both4, both6), (none4, none6) = (port_pair() for _ in range(4))
    try:
        with full(busy6, busy4, both4, both6):
            a, b, c, d = (port_of(s) for s in (no4, busy4, both4, none4))
            assert channel_target([f"box:{a}", f"box:{a}"]) == f"ipv6:[::1]:{a}"
            assert channel_target([f"box:{b}", f"box:{b}"]) == f"ipv4:127.0.0.1:{b}"
            # As well on both: IPv4, the server may not be up yet.
            assert channel_target([f"box:{c}", f"box:{d}"]) == f"ipv4:127.0.0.1:{c},127.0.0.1:{d}"
            with pytest.raises(ValueError, match=rf"'box:{a}' \(IPv6: connections there got no answer within 0.1 s"):
                channel_target(["10.0.0.1:1", f"box:{a}"])
    finally:
        for s in (no4, busy6, busy4, no6, both4, both6, none4, none6):
            s.close()


async def test_an_async_client_built_in_a_loop_leaves_the_loop_free(box):
    """Built inside a running loop, the client probed the targets' name on the loop: every task
    stalled for the probe's 250 ms when a server's accept queue was full (a server under overload)."""
    gaps: list[float] = []
    ticking = asyncio.Event()

    async def ticker():
        last = asyncio.get_running_loop().time()
        while True:
            await asyncio.sleep(0.005)
            now = asyncio.get_running_loop().time()
            gaps.append(now - last)
            last = now
            ticking.set()

    no4, busy6 = port_pair()
    try:
        with full(busy6):
            port = port_of(busy6)
            task = asyncio.create_task(ticker())
            try:
                await ticking.wait()
                gaps.clear()
                async with AsyncClient([f"box:{port}", f"box:{port}"]) as client:
                    assert client.target == f"ipv6:[::1]:{port}"
                ticking.clear()
                await ticking.wait()  # the tick that ends a gap spanning the client's making
            finally:
                task.cancel()
    finally:
        no4.close()
        busy6.close()
    assert max(gaps) < 0.1, f"the loop stalled {max(gaps) * 1e3:.0f} ms (the probe takes 250 ms)"


async def test_an_async_client_built_in_a_loop_connects_once_on_the_family_its_server_listens_on(
    box, stub_at, monkeypatch
):
    from wok.clients import aio

    opened = []
    real = aio.open_channel

    def open_channel(*args):
        opened.append(args[1])
        return real(*args)

    monkeypatch.setattr(aio, "open_channel", open_channel)
    with v6_port() as port:
        async with stub_at("a", "[::1]", port):
            client = AsyncClient([f"box:{port}", f"box:{port}"])
            try:
                answers = await asyncio.gather(
                    *(client.server_live(timeout=10) for _ in range(3)), return_exceptions=True
                )
                # The stub has no ServerLive: UNIMPLEMENTED, from the server on ::1.
                assert all(getattr(a, "code", None) == grpc.StatusCode.UNIMPLEMENTED for a in answers), answers
                assert opened == [f"ipv6:[::1]:{port}"]  # concurrent first calls, one channel
            finally:
                await client.close()


async def test_an_async_client_built_in_a_loop_raises_the_lookup_error_at_its_first_call(box, stub_at):
    with v6_port() as port:
        async with stub_at("a", "[::1]", port):
            targets = ["10.0.0.1:1", f"box:{port}"]
            client = AsyncClient(targets)
            try:
                for _ in range(2):  # every call, not only the first
                    with pytest.raises(ValueError, match="need different address families"):
                        await client.server_live()
                with pytest.raises(ValueError, match="need different address families"):
                    _ = client.target
            finally:
                await client.close()
            with pytest.raises(RuntimeError, match="closed"):
                await client.server_live()
            # Made outside a running loop too: the constructor returns, and the first call raises it.
            outside = await asyncio.to_thread(AsyncClient, targets)
            try:
                with pytest.raises(ValueError, match="need different address families"):
                    await outside.server_live()
            finally:
                await outside.close()


async def test_a_first_call_waiting_for_the_lookup_ends_as_calls_in_flight_do(monkeypatch):
    """Closed while its lookup ran, the first call raised RuntimeError ("closed"), where a call in
    flight at close() ends CANCELLED; cancelled before the lookup's thread ran, it cancelled the
    lookup too, and every later call raised CancelledError."""
    import threading

    from wok.clients import InferError, aio

    release = threading.Event()

    def slow_target(target):
        release.wait(10)
        return "ipv4:127.0.0.1:1,127.0.0.1:2"

    monkeypatch.setattr(aio, "channel_target", slow_target)
    try:
        client = AsyncClient(["one:1", "two:2"])
        call = asyncio.ensure_future(client.server_live(timeout=5))
        await asyncio.sleep(0)  # the call now waits for the lookup
        await client.close()
        release.set()
        with pytest.raises(InferError) as info:
            await call
        assert info.value.code == grpc.StatusCode.CANCELLED, info.value
        release.clear()
        client = AsyncClient(["one:1", "two:2"])
        first = asyncio.ensure_future(client.server_live(timeout=5))
        await asyncio.sleep(0)
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        release.set()
        # Its thread sets the lookup's result, then ends: `target` does not wait for it (it never blocks).
        for thread in threading.enumerate():
            if thread.name == "wok-channel-target":
                await asyncio.to_thread(thread.join, 10)
        assert client.target == "ipv4:127.0.0.1:1,127.0.0.1:2"
        await client.close()
    finally:
        release.set()


async def test_the_balancer_prefers_a_family_without_an_answer_over_one_that_refused(monkeypatch):
    """Neither family accepts: the balancer kept the family it had, else IPv4, even when IPv4
    refused (nothing listens) and IPv6 only got no answer (a server with a full accept queue), so
    every call went to the refusal; channel_target already chose IPv6. A tie keeps the family it
    had, and the name is looked up again soon while neither accepts."""
    from wok.clients import balancer

    monkeypatch.setattr(balancer, "PROBE_TIMEOUT_S", 0.1)
    monkeypatch.setattr(balancer, "UNDECIDED_RESOLVE_S", 0.05)
    looked_up = asyncio.Event()
    no4, busy6 = port_pair()
    port = port_of(no4)

    async def resolver(host: str, p: int) -> list[str]:
        looked_up.set()
        return [f"127.0.0.1:{port}", f"[::1]:{port}"]

    async def lookups_after_now() -> None:
        # The first starts after now; the next one starts after the first's choice was applied.
        for _ in range(2):
            looked_up.clear()
            await asyncio.wait_for(looked_up.wait(), 10)  # within resolve_every_s (30 s): undecided

    try:
        with full(busy6):
            settings = BalancerSettings(hedge_after=None)
            async with Balancer("box:1", resolver=resolver, settings=settings) as bal:
                assert list(bal.replicas) == [f"[::1]:{port}"]
                with full(no4):  # no answer on either: a tie keeps the family it had
                    await lookups_after_now()
                    assert list(bal.replicas) == [f"[::1]:{port}"]
                    no4.listen(16)  # room in its queue: IPv4 accepts, and wins over no answer
                    await bal.wait_for(lambda: list(bal.replicas) == [f"127.0.0.1:{port}"], 10)
    finally:
        no4.close()
        busy6.close()


OUT_OF_DESCRIPTORS = """
import errno, os, resource, sys
from wok.clients.channel import probe

resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
held = []
try:
    while True:
        held.append(open(os.devnull))
except OSError as exc:
    assert exc.errno == errno.EMFILE, exc
held.pop().close()  # the one the probe's selector takes: its sockets then find none
try:
    print("answered", probe(["127.0.0.1:1", "[::1]:1"], 0.1))
except OSError as exc:
    print("raised", errno.errorcode[exc.errno], exc.strerror)
"""


@pytest.mark.skipif(sys.platform == "win32", reason="RLIMIT_NOFILE is POSIX's")
def test_a_probe_out_of_file_descriptors_raises_rather_than_count_a_refusal():
    """socket() failing for want of descriptors (EMFILE) counted as REFUSED, as a family this host
    lacks: both families refused, the name's family was a guess, and the balancer kept it."""
    # In a child with a low descriptor limit: filling this process's descriptors would starve gRPC.
    done = subprocess.run([sys.executable, "-c", OUT_OF_DESCRIPTORS], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("raised EMFILE address '127.0.0.1:1': no socket to probe it with: "), done.stdout


# In a network namespace of its own (`unshare -rn`, no root needed where user namespaces are allowed), whose
# settings are its own: the real conditions, which loopback in this one cannot make.
OWN_NETWORK = """
import errno, socket, subprocess
from wok.clients.channel import probe


def shown(addresses):
    try:
        return {a: outcome.name for a, outcome in probe(addresses, 0.5).items()}
    except OSError as exc:
        return f"raised {errno.errorcode[exc.errno]} {exc.strerror}"


print("down:", shown(["127.0.0.1:5000"]))  # loopback not up yet: no route to it
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
server = socket.socket()
server.bind(("127.0.0.1", 5000))
server.listen()
for conf in ("all", "default", "lo"):  # IPv6 turned off as Docker's default containers have it
    with open(f"/proc/sys/net/ipv6/conf/{conf}/disable_ipv6", "w") as f:
        f.write("1")
print("no IPv6:", shown(["[::1]:5000", "127.0.0.1:5000"]))
with open("/proc/sys/net/ipv4/ip_local_port_range", "w") as f:
    f.write("40000 40000")  # one local port, taken by the connection below
held = socket.create_connection(("127.0.0.1", 5000))
print("no port:", shown(["127.0.0.1:5000"]))
"""


def test_a_probe_out_of_local_ports_raises_and_a_family_turned_off_is_refused():
    """connect()'s EADDRNOTAVAIL counted as REFUSED: with no local port left toward a server, its family was
    a guess. The kernel says the same of an IPv6 turned off by sysctl, which must stay a refusal: a UDP
    connect, which needs a route and a source address but no TCP port, tells the two apart."""
    unshare = ["unshare", "-rn"]
    try:
        usable = subprocess.run([*unshare, "true"], capture_output=True, timeout=30).returncode == 0
    except FileNotFoundError:
        usable = False
    if not usable or subprocess.run(["ip", "-V"], capture_output=True).returncode != 0:
        pytest.skip("needs `unshare -rn` (a network namespace of its own) and `ip`")
    done = subprocess.run([*unshare, sys.executable, "-c", OWN_NETWORK], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "down: {'127.0.0.1:5000': 'REFUSED'}",
        "no IPv6: {'[::1]:5000': 'REFUSED', '127.0.0.1:5000': 'ACCEPTED'}",
        "no port: raised EADDRNOTAVAIL address '127.0.0.1:5000': no local port left to probe it from: "
        "Cannot assign requested address",
    ], done.stdout


@pytest.mark.parametrize("err", ["ENOBUFS", "ENOMEM"])
def test_a_connect_out_of_memory_raises_rather_than_count_a_refusal(monkeypatch, err):
    """connect() failing for want of kernel memory counted as REFUSED. The condition cannot be made on
    loopback: the error alone is injected (a socket whose connect_ex returns it); ENETUNREACH, injected the
    same way, stays a refusal."""
    import errno

    from wok.clients.channel import Probe, probe

    answer = getattr(errno, err)

    class Failing(socket.socket):
        def connect_ex(self, address):
            return answer

    monkeypatch.setattr(socket, "socket", Failing)
    with pytest.raises(OSError, match=r"^\[Errno \d+\] address '127.0.0.1:1': no memory to probe it with: ") as raised:
        probe(["127.0.0.1:1"])
    assert raised.value.errno == answer
    answer = errno.ENETUNREACH
    assert probe(["127.0.0.1:1"]) == {"127.0.0.1:1": Probe.REFUSED}


async def test_a_hung_system_lookup_is_one_thread_however_often_the_balancer_starts(monkeypatch):
    """Each start() that failed for a name whose lookup hung left one more thread blocked in getaddrinfo until
    the system resolver gave up (nothing can stop it): a start() retried, or a balancer made per job, piled them
    up. The lookups of one name in flight are one, shared."""
    real = socket.getaddrinfo
    release = threading.Event()
    asked = []

    def getaddrinfo(host, port, *args, **kw):
        if host != "hung.wok-test":
            return real(host, port, *args, **kw)
        asked.append(host)
        release.wait(30)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    settings = BalancerSettings(resolve_timeout_s=0.05)
    try:
        for _ in range(5):
            with pytest.raises(ValueError, match=r"the resolver gave no answer within 0\.05 s"):
                await Balancer("hung.wok-test:1", settings=settings).start()
        threads = [t for t in threading.enumerate() if t.name == "wok-balancer-lookup"]
        assert (len(asked), len(threads)) == (1, 1), (asked, threads)
    finally:
        release.set()
    await asyncio.to_thread(threads[0].join, 10)
    # Its answer came: the next start looks the name up anew, and takes that answer.
    assert not threads[0].is_alive()
    async with Balancer("hung.wok-test:1", settings=settings) as bal:
        assert list(bal.replicas) == ["127.0.0.1:1"] and len(asked) == 2
