"""`wok demo` as a child process, and headless Chromium (the system's) driven by Playwright."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from wok.demo.cli import popen_wok, wait_for_patterns

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
