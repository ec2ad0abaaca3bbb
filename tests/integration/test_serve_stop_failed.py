"""`wok serve` whose stop fails (a stage raised: `WokServer._stop_stages` logs it and raises the first once all ran):
one line `wok: the stop failed: ...`, exit status 1, and the exit checks after the stop still run. Uncaught, Python
printed the logged traceback a second time, and a model thread still running held the exit until its batch ended.
A start that failed, its stop failing too, says the start's error and exits with its status all the same; one whose
stop left a model thread running (a request the gRPC port took) exits at once, as a failed stop does."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import grpc
import numpy as np
import pytest

from wok.codec import encode_request
from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

from ..conftest import write_python_model

# The server offers no hook to fail a stop stage, and should not: the model's module is test code that the server
# imports, so it makes the metrics' close (a stage of the stop) raise.
FAILING_STOP_MODEL = """
import sys
import time

from torch import nn

import wok.metrics


def _refuse(self):
    raise RuntimeError("test: the metrics' close failed")


wok.metrics.WokMetrics.close = _refuse


class Held(nn.Module):
    # A batch other than the warm-up's (zeros) says so on stderr, then holds its thread for `sleep_ms`.
    def __init__(self, sleep_ms):
        super().__init__()
        self.sleep_s = sleep_ms / 1e3

    def forward(self, x):
        if x.flatten()[0].item() != 0:
            print("test: running", file=sys.stderr, flush=True)
            time.sleep(self.sleep_s)
        return x * 2


def build(sleep_ms):
    return Held(sleep_ms)
"""

STOP_FAILED = "wok: the stop failed: RuntimeError: test: the metrics' close failed"
# Far past the test's wait for the exit: only the os._exit after a stuck model's stop ends the process in time.
HELD_MS = 120_000


@pytest.fixture(scope="module")
def servers(tmp_path_factory, start_server_module, at_once):
    args = {}
    for key in ("idle", "stuck"):
        repo = tmp_path_factory.mktemp(key) / "repo"
        write_python_model(repo / "held", FAILING_STOP_MODEL, parameters={"sleep_ms": HELD_MS}, devices=None)
        args[key] = ("--model-repository", str(repo), "--grace-period", "1")
    with at_once(start_server_module, args) as started:
        yield started


def stopped(sp, timeout: float = 30.0) -> tuple[int, str]:
    try:
        sp.proc.send_signal(signal.SIGTERM)
        code = sp.proc.wait(timeout)
    finally:
        if sp.proc.poll() is None:
            sp.proc.kill()
            sp.proc.wait()
    assert sp.log_read.wait(30), "\n".join(sp.log[-30:])
    return code, "\n".join(sp.log)


def test_a_failed_stop_says_one_line_and_exits_1(servers):
    code, log = stopped(servers["idle"])
    assert code == 1, log
    assert log.count(STOP_FAILED) == 1, log
    assert "stopping: the metrics' close failed; the stop goes on" in log, log
    # The stage's traceback, logged once: not printed again by Python as the exception left the CLI.
    assert log.count("Traceback (most recent call last)") == 1, log


def test_a_failed_stop_with_a_model_still_running_exits_at_once(servers):
    sp = servers["stuck"]
    with grpc.insecure_channel(sp.target) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        call = stub.ModelInfer.future(encode_request("held", {"INPUT0": np.ones((1, 4), np.float32)}), timeout=60)
        sp.wait_for_line("test: running")
        # The grace period (1 s), the answers' second and the executors' wait: seconds, not the batch's 120.
        code, log = stopped(sp, timeout=30)
        assert call.exception() is not None and call.exception().code() == grpc.StatusCode.UNAVAILABLE, log
    assert code == 1, log
    assert STOP_FAILED in log, log
    assert "wok: a model was still running after the grace period; exiting" in log, log


# As FAILING_STOP_MODEL's, the metrics' close raises; and the start fails: in the model's warm-up, or on the metrics
# port, which the warm-up takes after the server checked it (as another process would meanwhile).
FAILING_START_MODEL = """
import os
import socket

from torch import nn

import wok.metrics


def _refuse(self):
    raise RuntimeError("test: the metrics' close failed")


wok.metrics.WokMetrics.close = _refuse


class Fails(nn.Module):
    held = None

    def forward(self, x):
        if os.environ["WOK_TEST_FAIL"] == "warm-up":
            raise RuntimeError("test: the warm-up failed")
        if self.held is None:
            self.held = socket.create_server(("127.0.0.1", int(os.environ["WOK_TEST_TAKE_PORT"])))
        return x


def build():
    return Fails()
"""


@pytest.mark.parametrize(
    ("fail", "code", "said"),
    [
        ("warm-up", 2, "wok: model 'fails' failed: RuntimeError: test: the warm-up failed; in the start-up warm-up"),
        ("metrics port", 1, "wok: cannot start: cannot bind the metrics port to 127.0.0.1:{port}: the port is in use"),
    ],
    ids=["warm-up", "metrics port"],
)
def test_a_failed_start_whose_stop_fails_too_says_the_start_error_and_exits_with_its_status(tmp_path, fail, code, said):
    # The stop after the failed start raised its own error in place of the start's: Python's traceback of the
    # metrics' close and exit 1, never the line saying why the start failed.
    write_python_model(tmp_path / "repo" / "fails", FAILING_START_MODEL, devices=None)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "WOK_TEST_FAIL": fail, "WOK_TEST_TAKE_PORT": str(port)}
    cmd = [sys.executable, "-m", "wok", "serve", "--model-repository", str(tmp_path / "repo"), "--port", "0"]
    done = subprocess.run([*cmd, "--metrics-port", str(port)], capture_output=True, text=True, timeout=120, env=env)
    lines = done.stderr.splitlines()
    assert done.returncode == code, done.stderr
    assert any(line.startswith(said.format(port=port)) for line in lines), done.stderr
    assert lines.count(STOP_FAILED) == 1, done.stderr
    assert "stopping: the metrics' close failed; the stop goes on" in done.stderr, done.stderr
    # The stage's traceback, logged once: not printed again by Python with the error out of the CLI.
    assert done.stderr.count("""raise RuntimeError("test: the metrics' close failed")""") == 1, done.stderr


# The start fails on the metrics port, which the model takes (as another process would) once a request the gRPC port
# took is in it; the start is held at that port until then (the module's test code, as above: the server offers no
# hook). That batch holds its model thread far past the stop after the failed start.
HELD_AT_START_MODEL = """
import asyncio
import os
import socket
import sys
import threading
import time

from torch import nn

import wok.http

entered = threading.Event()
_start = wok.http.MetricsHTTPServer.start


async def _start_once_entered(self):
    await asyncio.get_running_loop().run_in_executor(None, entered.wait, 60)
    await _start(self)


wok.http.MetricsHTTPServer.start = _start_once_entered


class Held(nn.Module):
    held = None

    def forward(self, x):
        if x.flatten()[0].item() != 0:
            self.held = socket.create_server(("127.0.0.1", int(os.environ["WOK_TEST_TAKE_PORT"])))
            print("test: running", file=sys.stderr, flush=True)
            entered.set()
            time.sleep(float(os.environ["WOK_TEST_HELD_S"]))
        return x * 2


def build():
    return Held()
"""


def test_a_failed_start_with_a_model_still_running_exits_at_once(tmp_path):
    # The stop after a failed start gave up on the model thread (the server's abandoned_work), but the exit took
    # Python's way: it waited for that thread, here the batch's 120 s.
    write_python_model(tmp_path / "repo" / "held", HELD_AT_START_MODEL, devices=None)
    with socket.socket() as a, socket.socket() as b:
        a.bind(("127.0.0.1", 0))
        b.bind(("127.0.0.1", 0))
        grpc_port, metrics_port = a.getsockname()[1], b.getsockname()[1]
    env = {**os.environ, "WOK_TEST_TAKE_PORT": str(metrics_port), "WOK_TEST_HELD_S": str(HELD_MS / 1e3)}
    cmd = [sys.executable, "-m", "wok", "serve", "--model-repository", str(tmp_path / "repo")]
    cmd += ["--port", str(grpc_port), "--metrics-port", str(metrics_port), "--grace-period", "1"]
    # Tried again within 0.5 s while the server loads (gRPC's default backoff grows to minutes).
    backoff = [("grpc.initial_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 500)]
    with open(tmp_path / "stderr", "w+") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env)
        try:
            with grpc.insecure_channel(f"127.0.0.1:{grpc_port}", options=backoff) as channel:
                grpc.channel_ready_future(channel).result(timeout=120)
                stub = pb_grpc.GRPCInferenceServiceStub(channel)
                x = {"INPUT0": np.ones((1, 4), np.float32)}
                call = stub.ModelInfer.future(encode_request("held", x), timeout=60)
                # The stop after a failed start has no grace: the answers' second and the executors' wait, seconds.
                code = proc.wait(30)
                assert call.exception() is not None and call.exception().code() == grpc.StatusCode.UNAVAILABLE
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            err.seek(0)
            log = err.read()
    assert code == 1, log
    lines = log.splitlines()
    assert "test: running" in lines, log
    # The start's line, which `main` says after the loop, then the stuck model's os._exit.
    assert lines[-2].startswith(
        f"wok: cannot start: cannot bind the metrics port to 127.0.0.1:{metrics_port}: the port is in use"
    ), log
    assert lines[-1] == "wok: a model was still running after the grace period; exiting", log
    assert "Traceback" not in log, log
