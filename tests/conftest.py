"""Fixtures shared by every test folder: a real wok server on a loopback port.

`server_process` runs `python -m wok serve` as a child process (what a user runs), for
tests that need a separate process (signals, tritonclient). `serve` starts a WokServer
inside the test's own event loop, for tests that also look at its internals.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest

READY = re.compile(r"wok: serving (.+) on (\S+):(\d+)")
# Small demo sizes keep start-up fast; the defaults are what `wok serve` uses.
SMALL_DEMO = ["--demo-option", "recsys.num_embeddings=20000"]


@dataclass
class ServerProcess:
    proc: subprocess.Popen
    host: str
    port: int
    models: list[str]
    log: list[str] = field(default_factory=list)

    @property
    def target(self) -> str:
        return f"{self.host}:{self.port}"

    def terminate(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)


def start_server_process(*args: str, timeout: float = 120.0) -> ServerProcess:
    """Start `python -m wok serve --port 0 ARGS` and wait for its ready line."""
    cmd = [sys.executable, "-m", "wok", "serve", "--port", "0", *args]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    log: list[str] = []
    found: list[re.Match] = []
    ready = threading.Event()

    def pump() -> None:
        for line in proc.stderr:
            log.append(line.rstrip())
            m = READY.search(line)
            if m and not found:
                found.append(m)
                ready.set()
        ready.set()

    threading.Thread(target=pump, daemon=True).start()
    if not ready.wait(timeout) or not found:
        proc.kill()
        raise RuntimeError(f"server did not start: {' '.join(cmd)}\n" + "\n".join(log[-40:]))
    m = found[0]
    return ServerProcess(proc, m.group(2), int(m.group(3)), m.group(1).split(", "), log)


@pytest.fixture(scope="session")
def server_process() -> Iterator[ServerProcess]:
    """One `wok serve` process with the three demo models, shared by the session."""
    sp = start_server_process(*SMALL_DEMO)
    yield sp
    code = sp.terminate()
    assert code == 0, "\n".join(sp.log[-40:])


@pytest.fixture
def start_server():
    """`start_server(*args)`: a `wok serve` process of the test's own; killed if left running."""
    started: list[ServerProcess] = []

    def start(*args: str) -> ServerProcess:
        sp = start_server_process(*args)
        started.append(sp)
        return sp

    yield start
    for sp in started:
        if sp.proc.poll() is None:
            sp.proc.kill()
            sp.proc.wait()


@asynccontextmanager
async def running_server(models=("mlp", "recsys", "encoder"), repository=None, **settings) -> AsyncIterator:
    """A WokServer on a free loopback port inside the current event loop."""
    from wok.app import WokServer, build_repository
    from wok.config import server_settings

    s = server_settings(grpc_port=0, demo_models=tuple(models), model_repository=repository, **settings)
    if repository is None:
        repo = build_repository(s, {"recsys": {"num_embeddings": 20000}})
    else:
        repo = build_repository(s)
    server = WokServer(s, repo)
    await server.start()
    try:
        yield server
    finally:
        await server.stop(grace=5.0)
        for rt in server.runtimes.values():
            assert rt.batcher.queued == 0 and rt.batcher.inflight == 0, f"{rt.servable.name} left work behind"


@pytest.fixture
def serve():
    """`async with serve(models=..., **settings) as server:` a server in this test's loop."""
    return running_server
