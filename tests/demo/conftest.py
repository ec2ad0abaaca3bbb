"""`wok demo` as a child process, and headless Chromium (the system's) driven by Playwright."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from wok.demo.cli import spawn_wok

CHROMIUM = Path("/usr/bin/chromium")
PAGE = re.compile(r"wok demo: page at (http://\S+)")


class DemoProcess:
    def __init__(self, *args: str, timeout: float = 120.0) -> None:
        cmd = [sys.executable, "-m", "wok", "demo", "--port", "0", *args]
        self.proc, found, self.log = spawn_wok(cmd, {"page": PAGE}, timeout)
        self.url = found["page"].group(1)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


@pytest.fixture
def start_demo() -> Iterator:
    """`start_demo(*args)`: a `wok demo --port 0 ARGS` process, stopped (SIGTERM) at the end."""
    started: list[DemoProcess] = []

    def start(*args: str) -> DemoProcess:
        d = DemoProcess(*args)
        started.append(d)
        return d

    yield start
    for d in started:
        d.stop()


@pytest.fixture
def browser():
    """Chromium for one test: sync Playwright runs an event loop in this thread while it is open,
    which asyncio tests after it could not start theirs in, so it closes with its test."""
    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (Debian's chromium package); Playwright's own download fails here")
    playwright = pytest.importorskip("playwright.sync_api", reason="playwright is in the test extras")
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        yield b
        b.close()
