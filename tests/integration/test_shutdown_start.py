"""A signal before the server is ready stops the start, and the process exits 0.

As PID 1 (a container's entrypoint) a signal with no handler is dropped by the kernel, so wok
must hold its handlers from the start; and a warm-up cannot be interrupted, so the start is
abandoned rather than awaited: no port is bound yet. Each model here tells the test on stderr which
stage it is in, then blocks for a minute: a server that does not stop at the signal fails the test's
wait. Once the gRPC port serves (the health and metrics ports open after it, before SERVING), the
start ends there and the stop is the staged one: the calls the port took are answered.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from wok.codec import decode_response, encode_request
from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

from ..conftest import write_python_model

STUCK_BUILD = textwrap.dedent(
    """
    import sys, time

    from torch import nn


    def build():
        print("test: building the model", file=sys.stderr, flush=True)
        time.sleep(60)
        return nn.Identity()
    """
)

STUCK_WARMUP = textwrap.dedent(
    """
    import sys, time

    from torch import nn


    class StuckFirst(nn.Module):
        def forward(self, x):
            print("test: warming up", file=sys.stderr, flush=True)
            time.sleep(60)
            return x * 2


    def build():
        return StuckFirst()
    """
)

# The start held where the gRPC port serves and the health port is not open yet: a hold of the test's own,
# the gap being a few milliseconds. The model's batches (not its warm-up) take 0.5 s.
HELD_IN_THE_GAP = textwrap.dedent(
    """
    import asyncio, sys, time

    from torch import nn

    import wok.app

    _start_health_port = wok.app.WokServer._start_health_port


    async def _held(self):
        print(f"test: in the gap, gRPC port {self.port}", file=sys.stderr, flush=True)
        await asyncio.get_running_loop().create_future()  # until the stop cancels the start
        await _start_health_port(self)


    wok.app.WokServer._start_health_port = _held


    class SlowAfterWarmup(nn.Module):
        calls = 0

        def forward(self, x):
            self.calls += 1
            if self.calls > 1:  # a request's batch
                print("test: running a batch", file=sys.stderr, flush=True)
                time.sleep(0.5)
            return x * 2


    def build():
        return SlowAfterWarmup()
    """
)

SLOW_EXIT = textwrap.dedent(
    """
    import os, sys, time, types

    from torch import nn


    class _Teardown:
        # Holds the process in the interpreter's finalization, as torch's teardown can: after
        # Python has put its signal handlers back to the default action.
        def __del__(self):
            os.write(2, b"test: exiting\\n")  # sys.stderr may be gone by then
            time.sleep(1.5)


    def build():
        # In a module of sys.modules: freed as finalization clears the modules, whatever holds
        # this factory's own module (the server froze its objects out of the collector's sight).
        held = types.ModuleType("wok_test_teardown")
        held.teardown = _Teardown()
        sys.modules[held.__name__] = held
        return nn.Identity()
    """
)

# SLOW_EXIT's model, failing its warm-up: the start fails (exit 2), then finalization holds.
FAILED_START_SLOW_EXIT = SLOW_EXIT.replace(
    "return nn.Identity()",
    "class Broken(nn.Module):\n        def forward(self, x):\n            raise RuntimeError('test: broken')\n\n"
    "    return Broken()",
)
assert FAILED_START_SLOW_EXIT != SLOW_EXIT


def write_repo(root: Path, model_py: str) -> Path:
    write_python_model(root / "repo" / "stuck", model_py)
    return root / "repo"


class Serve:
    """`wok serve` started, not waited for (the fixtures wait for the ready line): its stderr lines
    are collected as they come."""

    def __init__(self, repo: Path, prefix: tuple[str, ...] = (), options: tuple[str, ...] = ()) -> None:
        cmd = [*prefix, sys.executable, "-m", "wok", "serve", "--port", "0", "--metrics-port", "-1"]
        cmd += ["--model-repository", str(repo), "--grace-period", "5", *options]
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.log: list[str] = []
        self.lines = threading.Condition()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stderr:
            with self.lines:
                self.log.append(line.rstrip())
                self.lines.notify_all()

    def wait_for_line(self, prefix: str, timeout: float = 60.0) -> str:
        """The first line starting with `prefix`, once there."""
        with self.lines:
            if not self.lines.wait_for(lambda: any(x.startswith(prefix) for x in self.log), timeout):
                raise AssertionError(f"no line starting with {prefix!r} within {timeout} s:\n" + "\n".join(self.log))
            return next(x for x in self.log if x.startswith(prefix))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def check_stopped_before_serving(server: Serve, code: int, waited: float) -> None:
    log = "\n".join(server.log)
    assert code == 0, log
    assert waited < 10, f"the start went on for {waited:.1f} s after the signal:\n{log}"
    assert "wok: stopped by a signal before serving" in server.log, log
    assert not any("serving" in line and "stopped" not in line for line in server.log), log


def _unshare_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    try:
        return subprocess.run(["unshare", "--pid", "--fork", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


UNSHARE = _unshare_works()


@pytest.fixture(scope="module")
def servers(tmp_path_factory) -> Iterator[dict[str, Serve]]:
    """A `wok serve` for each test below, all started at once (each start is mostly a process's
    imports); each waits in its stuck stage, for a minute, for its test's signal."""

    def repo(model_py: str) -> Path:
        return write_repo(tmp_path_factory.mktemp("stuck"), model_py)

    started = {
        "SIGTERM": Serve(repo(STUCK_BUILD)),
        "SIGINT": Serve(repo(STUCK_BUILD)),
        "warm-up": Serve(repo(STUCK_WARMUP)),
        "gap": Serve(repo(HELD_IN_THE_GAP), options=("--health-port", "0")),
        "slow exit": Serve(repo(SLOW_EXIT)),
        "failed start": Serve(repo(FAILED_START_SLOW_EXIT)),
    }
    if UNSHARE:
        # unshare forks wok as PID 1 of a new PID namespace, as a container runs its entrypoint.
        started["pid 1"] = Serve(repo(STUCK_BUILD), prefix=("unshare", "--pid", "--fork", "--kill-child"))
    yield started
    for server in started.values():
        server.stop()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_while_a_model_loads_stops_the_start_and_exits_0(servers, sig):
    server = servers[sig.name]
    try:
        server.wait_for_line("test: building the model")
        sent = time.monotonic()
        server.proc.send_signal(sig)
        code = server.proc.wait(15)
        check_stopped_before_serving(server, code, time.monotonic() - sent)
    finally:
        server.stop()


def test_a_signal_during_the_warm_up_abandons_the_start_before_any_port_is_bound(servers):
    server = servers["warm-up"]
    try:
        server.wait_for_line("test: warming up")
        sent = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        code = server.proc.wait(15)
        check_stopped_before_serving(server, code, time.monotonic() - sent)
    finally:
        server.stop()


def test_a_signal_once_the_grpc_port_serves_answers_the_calls_it_took_then_frees_the_port(servers):
    # The process exited at once (os._exit): the call running in the model got UNAVAILABLE "Socket closed".
    server = servers["gap"]
    try:
        port = int(server.wait_for_line("test: in the gap, gRPC port ").rsplit(" ", 1)[1])
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            x = np.arange(4, dtype=np.float32).reshape(1, 4)
            call = stub.ModelInfer.future(encode_request("stuck", {"INPUT0": x}), timeout=30)
            server.wait_for_line("test: running a batch")
            sent = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)
            np.testing.assert_array_equal(decode_response(call.result())["OUTPUT0"], x * 2)
        # Said once the stop has returned, whether or not the process is still tearing down.
        server.wait_for_line("wok: stopped by a signal before serving", timeout=15)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
        code = server.proc.wait(15)
        check_stopped_before_serving(server, code, time.monotonic() - sent)
    finally:
        server.stop()


@pytest.mark.skipif(not UNSHARE, reason="needs `unshare --pid` (root, or user namespaces)")
def test_sigterm_to_wok_as_pid_1_while_a_model_loads_is_not_dropped(servers, proc_tree):
    server = servers["pid 1"]
    try:
        server.wait_for_line("test: building the model")
        (wok,) = proc_tree.children(server.proc.pid)
        sent = time.monotonic()
        os.kill(wok, signal.SIGTERM)
        code = server.proc.wait(15)  # unshare exits with its child's status
        check_stopped_before_serving(server, code, time.monotonic() - sent)
    finally:
        server.stop()


def test_a_second_signal_after_the_drain_leaves_the_exit_status_the_drains(servers):
    # The loop's close put the signals back to their default action: a second SIGTERM while the
    # process tore down killed it by the signal (status -15), with no word, where the drain had
    # finished and said 0.
    server = servers["slow exit"]
    try:
        server.wait_for_line("wok: serving")
        server.proc.send_signal(signal.SIGTERM)
        server.wait_for_line("test: exiting", timeout=15)
        server.proc.send_signal(signal.SIGTERM)
        code = server.proc.wait(15)
        log = "\n".join(server.log)
        assert code == 0, log
        assert "wok: second signal, exiting without draining" not in server.log, log
    finally:
        server.stop()


def test_a_signal_after_a_failed_start_leaves_its_exit_status(servers):
    # Only a start that served set the signals to be ignored for the teardown: after a failed
    # one (warm-up, a port taken) a SIGTERM while the interpreter and torch tore down killed the
    # process by the signal (status -15), and a process manager read "killed" for "config error".
    server = servers["failed start"]
    try:
        server.wait_for_line("test: exiting", timeout=30)
        server.proc.send_signal(signal.SIGTERM)
        code = server.proc.wait(15)
        log = "\n".join(server.log)
        assert code == 2, log
        assert any(line.startswith("wok: ") and "test: broken" in line for line in server.log), log
    finally:
        server.stop()
