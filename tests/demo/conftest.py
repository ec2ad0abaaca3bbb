"""`wok demo` as a child process, and headless Chromium (the system's) driven by Playwright."""

from __future__ import annotations

import asyncio
import inspect
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from wok.demo.cli import popen_wok, wait_for_patterns
from wok.ports import bind_error

CHROMIUM = Path("/usr/bin/chromium")
PAGE = re.compile(r"wok demo: page at (http://\S+)")


class DemoProcess:
    """`wok demo --port 0 ARGS`, started at once; `ready()` waits for its page line (`url`)."""

    def __init__(self, *args: str, timeout: float = 120.0) -> None:
        cmd = [sys.executable, "-m", "wok", "demo", "--port", "0", *args]
        # From this (the test's) thread: the demo gets SIGTERM when the thread that started it ends.
        self.proc = popen_wok(cmd)
        self.timeout = timeout
        self.url: str | None = None
        self.log: list[str] = []

    def ready(self) -> DemoProcess:
        if self.url is None:
            found, self.log = wait_for_patterns(self.proc, {"page": PAGE}, self.timeout)
            self.url = found["page"].group(1)
        return self

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


@pytest.fixture(scope="module", autouse=True)
def _children_temp_files(tmp_path_factory) -> Iterator:
    """The demos' temporary files (the model repository each writes) under pytest's own folder,
    which it prunes: a demo the tests SIGKILL cannot remove its own."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TMPDIR", str(tmp_path_factory.mktemp("demo-tmp")))
        yield


def _demo_starter():
    """A start function (`ready=False`: do not wait for the page yet), and a cleanup that stops
    what it started."""
    started: list[DemoProcess] = []

    def start(*args: str, ready: bool = True) -> DemoProcess:
        d = DemoProcess(*args)
        started.append(d)
        return d.ready() if ready else d

    def cleanup() -> None:
        for d in started:
            d.stop()

    return start, cleanup


@pytest.fixture
def start_demo() -> Iterator:
    """`start_demo(*args)`: a `wok demo --port 0 ARGS` process, stopped (SIGTERM) at the end.
    `start_demo(*args, ready=False)` returns as soon as it runs; its `ready()` waits for the page."""
    start, cleanup = _demo_starter()
    yield start
    cleanup()


@pytest.fixture(scope="module")
def start_demo_module() -> Iterator:
    """Like `start_demo`, for demos shared by one test module."""
    start, cleanup = _demo_starter()
    yield start
    cleanup()


@pytest.fixture
def launch_browser():
    """`launch_browser()`: Chromium for one test, launched when called (a demo can start
    meanwhile). Sync Playwright runs an event loop in this thread while it is open, which
    asyncio tests after it could not start theirs in, so it closes with its test."""
    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (Debian's chromium package); Playwright's own download fails here")
    playwright = pytest.importorskip("playwright.sync_api", reason="playwright is in the test extras")
    drivers, browsers = [], []

    def launch():
        assert not drivers, "one browser per test"
        drivers.append(playwright.sync_playwright().start())
        browsers.append(drivers[0].chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"]))
        return browsers[0]

    yield launch
    for b in browsers:
        b.close()
    for p in drivers:
        p.stop()


class _SharedBrowser:
    """Chromium launched at the first `get()`, for the tests of one module."""

    def __init__(self, playwright) -> None:
        self._playwright = playwright
        self._driver = None
        self._browser = None

    def get(self):
        if self._browser is None:
            self._driver = self._playwright.sync_playwright().start()
            self._browser = self._driver.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        return self._browser

    def close(self) -> None:
        if self._browser is not None:
            self._browser.close()
        if self._driver is not None:
            self._driver.stop()


@pytest.fixture(scope="module")
def module_browser(request) -> Iterator[_SharedBrowser]:
    """One Chromium for a module's tests (`new_context` gives each test contexts of its own in it),
    launched by the first test that asks for a context. Sync Playwright runs an event loop in this
    thread while it is open, which an asyncio test could not start its own in: for modules with no
    asyncio test only, and closed with the module's last test."""
    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (Debian's chromium package); Playwright's own download fails here")
    playwright = pytest.importorskip("playwright.sync_api", reason="playwright is in the test extras")
    asyncio_tests = [
        item.name
        for item in request.session.items
        if getattr(item, "module", None) is request.module and inspect.iscoroutinefunction(getattr(item, "obj", None))
    ]
    assert not asyncio_tests, f"a browser shared by the module would hold this thread's event loop: {asyncio_tests}"
    browser = _SharedBrowser(playwright)
    yield browser
    browser.close()


@pytest.fixture
def new_context(module_browser: _SharedBrowser):
    """`new_context()`: a fresh browser context (pages, storage and cache of its own, as a browser of
    its own would have) in the module's one Chromium, which the first call launches (a demo can start
    meanwhile). Every context made closes with its test."""
    contexts = []

    def new():
        contexts.append(module_browser.get().new_context())
        return contexts[-1]

    yield new
    for c in contexts:
        c.close()


class HeldAddress:
    """A loopback port held for a whole test, each connection to it forwarded to the demo behind it
    (`target`, a port; None: a connection waits for one). A page loaded through it finds a demo
    started afresh at the same address, with no window in which another process can take the
    port, as between one demo's stop and the next one's start on the same port."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._target: int | None = None
        self._closed = False
        self._changed = threading.Condition()
        self._open: set[socket.socket] = set()
        threading.Thread(target=self._accept, daemon=True, name="held-address").start()

    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def forward_to(self, target: int | None) -> None:
        with self._changed:
            self._target = target
            self._changed.notify_all()

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()
            for s in self._open:
                _end(s)
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._forward, args=(client,), daemon=True).start()

    def _forward(self, client: socket.socket) -> None:
        with self._changed:
            self._changed.wait_for(lambda: self._target is not None or self._closed)
            target = self._target
        try:
            if target is None:  # the address closed
                raise ConnectionRefusedError
            upstream = socket.create_connection(("127.0.0.1", target))
        except OSError:  # as a port nothing listens on: the demo behind is gone
            client.close()
            return
        with self._changed:
            self._open |= {client, upstream}
        threading.Thread(target=self._pipe, args=(client, upstream), daemon=True).start()
        self._pipe(upstream, client)

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        """Copy src to dst; at src's end (or an error either way) end both, as the demo's close."""
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            _end(s)
        with self._changed:
            self._open -= {src, dst}


def _end(s: socket.socket) -> None:
    # shutdown first: unlike close, it wakes a thread blocked reading the socket.
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    s.close()


@pytest.fixture
def held_address() -> Iterator[HeldAddress]:
    """`held_address.url()`: an address for the page that outlives the demos behind it; point it
    at one with `held_address.forward_to(port)`."""
    held = HeldAddress()
    yield held
    held.close()


def ipv6_loopback() -> bool:
    """Whether this machine can bind ::1 (a container may have no IPv6)."""
    return bind_error("::1", 0) is None


async def live_page(admin_port: int):
    """(the page's server, started on a free loopback port, its live backend), relaying to an admin
    API at 127.0.0.1:`admin_port`; the caller stops both."""
    import argparse

    from wok.demo.cli import LiveDemo
    from wok.demo.load import LoadControl
    from wok.demo.web import DemoWeb, Hub

    args = argparse.Namespace(instances=2, max_batch_size=32, device="cpu", torch_threads=1)
    backend = LiveDemo(LoadControl(0), args, delay_s=0.005, slo_s=0.05)
    backend.admin = ("127.0.0.1", admin_port)
    web = DemoWeb(backend, Hub(), "127.0.0.1", 0)
    await web.start()
    return web, backend


async def exchange(port: int, request: bytes) -> tuple[bytes, bytes]:
    """Send raw bytes to a server on loopback; its answer's status line and body bytes, read to the close."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        raw = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    return head.split(b"\r\n")[0], body
