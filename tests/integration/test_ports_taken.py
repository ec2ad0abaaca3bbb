"""A port the server cannot have fails its start before any model loads, naming the address and the cause.

It took its ports only after loading and warming every model (minutes for a large one), then said
"the port is in use, or the address is not one of this machine's". The model here leaves a marker
file when it is built and another when it runs (its warm-up): a start that fails on its port must
leave neither (`wok serve` loads the models; a WokServer, given them loaded, warms them up).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from wok.app import WokServer
from wok.config import server_settings
from wok.ports import bind_error
from wok.repository import ModelRepository

from ..conftest import cancel_after, core_servers, write_python_model

MARKS_ITS_BUILD = textwrap.dedent(
    """
    import os
    from pathlib import Path

    from torch import nn


    class Marks(nn.Module):
        def forward(self, x):
            Path(os.environ["WOK_TEST_MARKS"], "warmed").write_text("warmed")
            return x


    def build():
        Path(os.environ["WOK_TEST_MARKS"], "built").write_text("built")
        return Marks()
    """
)
# TEST-NET-1 (RFC 5737): documentation only, on no machine's interface.
NOT_HERE = "192.0.2.1"


@pytest.fixture
def repo(tmp_path, monkeypatch) -> Path:
    write_python_model(tmp_path / "repo" / "marks", MARKS_ITS_BUILD)
    (tmp_path / "marks").mkdir()
    monkeypatch.setenv("WOK_TEST_MARKS", str(tmp_path / "marks"))
    return tmp_path / "repo"


def marks() -> list[str]:
    return sorted(p.name for p in Path(os.environ["WOK_TEST_MARKS"]).iterdir())


@pytest.fixture
def held_port() -> Iterator[int]:
    """A loopback port another socket listens on."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        yield busy.getsockname()[1]


def _here(address: str) -> bool:
    try:
        with socket.socket() as sock:
            sock.bind((address, 0))
        return True
    except OSError:
        return False


def test_wok_serve_with_its_port_taken_exits_before_loading_a_model(repo, held_port):
    cmd = [sys.executable, "-m", "wok", "serve", "--model-repository", str(repo), "--port", str(held_port)]
    done = subprocess.run([*cmd, "--metrics-port", "-1"], capture_output=True, text=True, timeout=120)
    assert marks() == [], done.stderr
    assert done.returncode == 1, done.stderr
    said = (
        f"wok: cannot start: cannot bind the gRPC port to 127.0.0.1:{held_port}: the port is in use by another "
        f"socket (EADDRINUSE; `ss -ltnp 'sport = :{held_port}'` names its process)"
    )
    assert said in done.stderr.splitlines(), done.stderr
    # Nothing was started, so nothing is drained: the error is the only line about the stop.
    assert "stopping: draining" not in done.stderr, done.stderr


@pytest.mark.parametrize("case", ["gRPC not here", "health taken", "metrics taken", "metrics not here"])
async def test_a_port_the_server_cannot_have_fails_its_start_before_any_model_loads(repo, held_port, case):
    if "not here" in case and _here(NOT_HERE):
        pytest.skip(f"{NOT_HERE} is an address of this machine")
    values, said = {
        "gRPC not here": (
            {"host": NOT_HERE},
            f"cannot bind the gRPC port to {NOT_HERE}:0: {NOT_HERE} is not one of this machine's addresses "
            "(EADDRNOTAVAIL)",
        ),
        "health taken": (
            {"health_port": held_port},
            f"cannot bind the health port to 127.0.0.1:{held_port}: the port is in use by another socket (EADDRINUSE",
        ),
        "metrics taken": (
            {"metrics_port": held_port},
            f"cannot bind the metrics port to 127.0.0.1:{held_port}: the port is in use by another socket (EADDRINUSE",
        ),
        "metrics not here": (
            {"metrics_host": NOT_HERE},
            f"cannot bind the metrics port to {NOT_HERE}:0: {NOT_HERE} is not one of this machine's addresses "
            "(EADDRNOTAVAIL)",
        ),
    }[case]
    settings = server_settings(grpc_port=0, **{"metrics_port": 0, **values}, model_repository=repo)
    server = WokServer(settings, ModelRepository.from_directory(repo))
    assert marks() == ["built"]
    try:
        with pytest.raises(OSError) as info:
            await server.start()
    finally:
        await server.stop(grace=0)
    assert marks() == ["built"]  # not warmed up
    assert server.runtimes == {}
    assert str(info.value).startswith(said), str(info.value)


TAKES_A_PORT = textwrap.dedent(
    """
    import os
    import socket

    from torch import nn


    class TakesAPort(nn.Module):
        held = None

        def forward(self, x):
            if self.held is None:  # as another process would, while the server warms its model up
                self.held = socket.create_server(("127.0.0.1", int(os.environ["WOK_TEST_TAKE_PORT"])))
            return x


    def build():
        return TakesAPort()
    """
)


@pytest.mark.parametrize("taken", ["gRPC port", "health port", "metrics port"])
async def test_a_port_taken_after_the_check_leaves_none_of_the_ports_opened_before_it_bound(
    tmp_path, monkeypatch, taken
):
    # A guard: grpc.aio's stop does nothing to a server whose port was added but that never started (its
    # port stays bound until the process ends). wok starts each gRPC server as soon as its port is added,
    # so the ports a start that failed later had opened are free as soon as its stop returns.
    # Nor did it free a server whose bind failed: its core server lived until the process ended.
    write_python_model(tmp_path / "repo" / "takes", TAKES_A_PORT)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("WOK_TEST_TAKE_PORT", str(port))
    ports = {"grpc_port": 0, "health_port": 0, "metrics_port": 0, taken.lower().replace(" ", "_"): port}
    repository = ModelRepository.from_directory(tmp_path / "repo")
    server = WokServer(server_settings(**ports, model_repository=tmp_path / "repo"), repository)
    alive = core_servers()
    try:
        with pytest.raises(OSError, match=f"cannot bind the {taken} to 127.0.0.1:{port}: the port is in use"):
            await server.start()
    finally:
        await server.stop(grace=0)
        held = repository.models["takes"].module_for(torch.device("cpu")).held
        if held is not None:
            held.close()
    opened = {"gRPC port": server.port, "health port": server.health_port}
    assert all(opened.values()) == (taken == "metrics port"), opened
    for what, at in opened.items():
        if at:
            assert bind_error("127.0.0.1", at) is None, f"the {what} ({at}) is still bound after the stop"
    assert core_servers() == alive, f"a gRPC server of the failed start is still alive after its stop ({taken} taken)"


async def test_a_start_cancelled_at_any_step_once_its_grpc_port_is_bound_leaves_nothing_after_the_stop(
    tmp_path, caplog
):
    # `wok serve` cancels the start at a signal that comes once the gRPC port serves, then stops the server
    # (the health and metrics ports open after it). A metrics port whose start was cancelled in its last
    # step stayed bound: asyncio's start_server serves, then yields once, before it returns the server.
    # And a gRPC server's start cancelled while it waited for its serving task failed that task
    # (InvalidStateError, an ERROR), whose crash handler's stop failed too ("never retrieved").
    write_python_model(tmp_path / "repo" / "same", "from torch import nn\n\n\ndef build():\n    return nn.Identity()\n")
    repository = ModelRepository.from_directory(tmp_path / "repo")
    with socket.socket() as probe:  # a port of its own: one whose listener was lost is not known to the server
        probe.bind(("127.0.0.1", 0))
        metrics_port = probe.getsockname()[1]
    repo = tmp_path / "repo"
    settings = server_settings(grpc_port=0, health_port=0, metrics_port=metrics_port, model_repository=repo)
    steps, started = 0, False
    while not started:  # cancelled 0, 1, 2... loop iterations after the bind, until a start finishes first
        server = WokServer(settings, repository)
        alive = core_servers()
        start = asyncio.ensure_future(server.start())
        while not server.port and not start.done():
            await asyncio.sleep(0)
        started = await cancel_after(start, steps)
        await server.stop()
        opened = {"gRPC port": server.port, "health port": server.health_port, "metrics port": metrics_port}
        for what, at in opened.items():
            if at:
                assert bind_error("127.0.0.1", at) is None, f"cancelled {steps} step(s) after the bind: {what} bound"
        assert core_servers() == alive, f"cancelled {steps} step(s) after the bind: a gRPC server is still alive"
        gc.collect()  # a task's error never retrieved is logged as the task goes
        errors = [f"{r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= logging.ERROR]
        assert not errors, f"cancelled {steps} step(s) after the bind: {errors}"
        steps += 1
