"""bench/gpu_check.py is what runs on a GPU host; its CPU dry run keeps it from rotting here."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from ..server.conftest import gated_servable, until

ROOT = Path(__file__).resolve().parents[2]
CPU_DRY_RUN = "--device cpu --hidden 512 --layers 1 --rows 64 --batches 10"
# `auto` resolved to the CPU started the GPU's sizes there: half an hour, checking no CUDA path. (A constant: in a
# test's marks, the words torch's check is called by would mark it a CUDA test for tests/deploy/test_setup_docs.py.)
AUTO_WITHOUT_CUDA = (
    "--device auto: no CUDA device (torch.cuda.is_available() is False); this script checks the CUDA path: "
    f"run it on a GPU machine (or `{CPU_DRY_RUN}` for a dry run)"
)


def _gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "bench" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_gpu_check_dry_run_on_cpu_writes_its_figures(tmp_path):
    mod = _gpu_check()
    out = tmp_path / "gc.json"
    args = ["--device", "cpu", "--batches", "3", "--rows", "16", "--hidden", "512", "--layers", "1"]
    assert mod.main([*args, "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["schema"] == "wok.gpu_check/2"
    assert report["device"] == "cpu" and report["device_index"] is None
    assert report["server"]["equal_to_cpu"] is True
    assert report["server"]["mean_batch_size"] > 1
    assert report["checks"]["pinned host buffers"] is None  # not applicable without CUDA
    assert report["overlap_model"]["hidden"] == 512 and report["overlap_model"]["layers"] == 1


async def _serve_a_model_stuck_in_a_batch(gpu_check) -> None:
    servable, module = gated_servable(max_batch_size=1, name="stuck", enter_when_closed=True)
    loop = asyncio.get_running_loop()
    try:
        with pytest.raises(gpu_check.LeftRunning) as raised:
            async with gpu_check.serving(servable, grace=0.2) as server:
                module.gate.clear()
                pending = server.runtime("stuck").batcher.submit({"INPUT0": np.ones((1, 4), np.float32)}, 1, None, None)
                assert await loop.run_in_executor(None, module.entered.wait, 10), "the batch never reached the model"
        assert str(raised.value) == "the server gave model 'stuck' up, still running on its thread, as it stopped"
        pending.future.exception()  # read: answered UNAVAILABLE by the stop
    finally:
        module.gate.set()
        await _join("wok-stuck-shutdown")


async def _cancel_a_start_stuck_in_its_warm_up(gpu_check) -> None:
    servable, module = gated_servable(name="stuck")
    module.gate.clear()
    loop = asyncio.get_running_loop()

    async def serve() -> None:
        async with gpu_check.serving(servable):
            raise AssertionError("the start ended")

    serving = asyncio.ensure_future(serve())
    try:
        assert await loop.run_in_executor(None, module.entered.wait, 10), "the warm-up never reached the model"
        serving.cancel()  # asyncio.run's on a Ctrl-C
        await asyncio.wait({serving})
        # Not the cancellation (Ctrl-C's KeyboardInterrupt out of asyncio.run, then an exit that waits for the
        # warm-up's thread): what main leaves on through os._exit, saying so.
        assert isinstance(serving.exception(), gpu_check.LeftRunning), serving
    finally:
        module.gate.set()
        await _join("wok-stuck-shutdown")


async def _cancel_a_stop_draining_a_stuck_batch(gpu_check) -> None:
    servable, module = gated_servable(max_batch_size=1, name="stuck", enter_when_closed=True)
    loop = asyncio.get_running_loop()
    held = {}

    async def serve() -> None:
        async with gpu_check.serving(servable, grace=30.0) as server:
            held["server"] = server
            module.gate.clear()
            held["pending"] = server.runtime("stuck").batcher.submit(
                {"INPUT0": np.ones((1, 4), np.float32)}, 1, None, None
            )
            assert await loop.run_in_executor(None, module.entered.wait, 10), "the batch never reached the model"

    serving = asyncio.ensure_future(serve())
    try:
        # The block ended: its stop's drain has begun, which waits for the batch.
        await until(lambda: "server" in held and held["server"].runtime("stuck").batcher._stopping)
        serving.cancel()  # asyncio.run's on a Ctrl-C
        await asyncio.wait({serving})
        # Not the cancellation (Ctrl-C's KeyboardInterrupt out of asyncio.run, then an exit that waits for the
        # model's thread, which the cancelled stop never shut down): what main leaves on through os._exit.
        assert isinstance(serving.exception(), gpu_check.LeftRunning), serving
        # Said as what happened: it said the server gave the model up "as it stopped", of a stop that was cancelled.
        said = "the server's stop was cancelled with model 'stuck' still running on its thread"
        assert str(serving.exception()) == said
        held["pending"].future.exception()  # read: answered UNAVAILABLE by the cancelled drain
    finally:
        module.gate.set()
        if "server" in held:
            await held["server"].stop(grace=5.0)


async def _stop_raising_as_it_gives_a_model_up(gpu_check, monkeypatch) -> None:
    servable, module = gated_servable(max_batch_size=1, name="stuck", enter_when_closed=True)
    loop = asyncio.get_running_loop()
    refused = RuntimeError("test: the failure log's stop failed")

    def refuse() -> None:
        raise refused

    try:
        with pytest.raises(gpu_check.LeftRunning) as raised:
            async with gpu_check.serving(servable, grace=0.2) as server:
                monkeypatch.setattr(server.runtime("stuck").batcher.failures, "stop", refuse)
                module.gate.clear()
                pending = server.runtime("stuck").batcher.submit({"INPUT0": np.ones((1, 4), np.float32)}, 1, None, None)
                assert await loop.run_in_executor(None, module.entered.wait, 10), "the batch never reached the model"
        # The stop's error is what the LeftRunning was raised over, which main prints with it.
        assert raised.value.__context__ is refused
        pending.future.exception()
    finally:
        module.gate.set()
        await _join("wok-stuck-shutdown")


def test_a_stop_that_raises_as_it_gives_a_model_up_is_told_not_reported_on(monkeypatch):
    """The stop gives the stuck model up (abandoned_work), then raises a failure of another of its steps: that
    error came out of serving, abandoned_work unread, and main went on to Python's exit, which waited for the
    model's thread. Now LeftRunning, raised over the stop's error."""
    asyncio.run(_stop_raising_as_it_gives_a_model_up(_gpu_check(), monkeypatch))


async def _join(name: str) -> None:
    for t in threading.enumerate():
        if t.name == name:
            await asyncio.get_running_loop().run_in_executor(None, t.join, 10)
            assert not t.is_alive(), f"{t.name} did not end"


@pytest.mark.parametrize(
    "leaves",
    [_serve_a_model_stuck_in_a_batch, _cancel_a_start_stuck_in_its_warm_up, _cancel_a_stop_draining_a_stuck_batch],
)
def test_a_server_that_leaves_a_model_running_is_told_not_reported_on(leaves):
    """The server check's server gave a model thread up as it stopped (its `abandoned_work`: a batch past the
    grace period, a start cancelled in the warm-up, a stop cancelled in its drain of a stuck batch): the script read
    none of it, reported on that server, and Python's exit then waited for the thread. Now LeftRunning, which main
    says and leaves on through os._exit."""
    asyncio.run(leaves(_gpu_check()))


def test_gpu_session_script_parses():
    # bench/gpu_session.sh runs only on a lent GPU machine; a syntax error there costs device time.
    import subprocess

    subprocess.run(["bash", "-n", str(ROOT / "bench" / "gpu_session.sh")], check=True)


FREE_PORTS = "test_the_gpu_session_serves_on_free_ports_into_a_folder_of_its_own_and_removes_its_copy_of_wok"


@pytest.fixture(scope="module", autouse=True)
def free_ports_session(request, tmp_path_factory):
    """FREE_PORTS's run of bench/gpu_session.sh, started as the module starts (where that test is selected), the
    test last in the module: the run is mostly waiting (a process's imports at a time, the step's 1 s of paced sends),
    and the module's other tests run meanwhile, where after them it added its whole run (18-23 s in CI) to the
    worker's. Ports 8011 and 8012 are held for it (as by another server on the machine: the variant's fixed ones once)
    until the module ends. `free_ports_session()`: the run, ended, as subprocess.run gives it."""
    import os
    import shutil
    import socket
    import subprocess
    import sys

    if not any(item.originalname == FREE_PORTS and item.module is request.module for item in request.session.items):
        yield None
        return
    held = []
    for port in (8011, 8012):
        sock = socket.socket()
        try:
            sock.bind(("127.0.0.1", port))
            sock.listen()
            held.append(sock)
        except OSError:  # taken already, by another process: as the test means it
            sock.close()
    env = {k: v for k, v in os.environ.items() if k not in ("OUT", "WOK_SITE", "WOK_GPU_TUNE_CHECK")}
    # The lent machine's python3 has wok's dependencies; here the environment's does.
    env |= {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}", "WOK_GPU_DEVICE": "cpu"}
    # One step of 1 s (5 s on a GPU): the step's length is no part of what the test checks.
    env |= {"WOK_GPU_ONLY": "ramp_unary_accept0", "WOK_GPU_STEPS": "50", "WOK_GPU_STEP_S": "1"}
    d = tmp_path_factory.mktemp("free_ports")
    cmd = ["bash", "bench/gpu_session.sh"]
    # Files, not pipes: a run not yet waited on must not block on a full pipe.
    with open(d / "stdout", "w") as out, open(d / "stderr", "w") as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=err, text=True)

    def ended() -> subprocess.CompletedProcess:
        proc.wait(timeout=220)
        return subprocess.CompletedProcess(cmd, proc.returncode, (d / "stdout").read_text(), (d / "stderr").read_text())

    try:
        yield ended
    finally:
        if proc.poll() is None:  # its test failed or never ran: the script's trap stops what it started
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for sock in held:
            sock.close()
        for line in (d / "stdout").read_text().splitlines():  # its folder, where its test did not remove it
            if line.startswith("figures and logs under "):
                shutil.rmtree(line.split(" under ", 1)[1], ignore_errors=True)


def _naming(text: str) -> list[int]:
    """The processes whose command line holds `text` (zombies have none: only the living)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and text.encode() in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
        except OSError:  # gone meanwhile
            pass
    return pids


@pytest.mark.timeout(240)
@pytest.mark.parametrize("step", ["ramp_unary_accept0", "ramp_stream"])
def test_a_gpu_session_terminated_mid_step_stops_the_server_and_the_step_it_started(step):
    """A SIGTERM in a serving step (a lent machine's limit, a Ctrl-C's kill) ended the script and left its background
    `wok serve` running, and the step's ramp with it (timeout runs it in a process group of its own): the EXIT trap
    removed the copy of wok alone. The stream step's scrape under load (a subshell's `sleep 14`, then the scrape)
    outlived the kill of its subshell. The script's output says when the server serves and the step starts; the
    signal goes to the script alone, as a limit's kill sends it."""
    import os
    import shutil
    import signal
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("OUT", "WOK_SITE", "WOK_GPU_TUNE_CHECK")}
    env |= {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}", "WOK_GPU_DEVICE": "cpu"}
    # Steps enough that the ramp is still running when the signal comes: 10 × 5 s.
    env |= {"WOK_GPU_ONLY": step, "WOK_GPU_STEPS": ",".join(["20"] * 10)}
    proc = subprocess.Popen(
        ["bash", "bench/gpu_session.sh"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    said, out = [], None
    try:
        for line in proc.stdout:
            said.append(line)
            if line.startswith("figures and logs under "):
                out = line.split(" under ", 1)[1].strip()
            if line.startswith(f"== {step}"):
                break
        assert out is not None and said[-1].startswith(f"== {step}"), "".join(said)
        # "wok serve (pid N) serving on 127.0.0.1:PORT", said once it serves, before the step's line.
        (server,) = (int(line.split()[3].rstrip(")")) for line in said if line.startswith("wok serve (pid "))
        assert _naming(f"{out}/repo") == [server], "".join(said)
        # Its ports are the ones it binds (0: a free one, said in its log): free ones found first and released
        # before it started could be taken by then.
        words = Path(f"/proc/{server}/cmdline").read_bytes().split(b"\0")
        assert words[words.index(b"--port") + 1] == b"0" and words[words.index(b"--metrics-port") + 1] == b"0"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 143
        # As the script ends, before its output's end, which a process of its group left holds open.
        with pytest.raises(ProcessLookupError):  # the script's own group: the server's, the steps' helpers
            os.killpg(proc.pid, 0)
        rest, _ = proc.communicate(timeout=60)
        said.append(rest)
        # Nothing that names this run's folder lives on: the server (its repository) nor the ramp (its --json).
        left = _naming(out)
        assert left == [], "".join(said)
        with pytest.raises(ProcessLookupError):
            os.kill(server, 0)
    finally:
        if proc.poll() is None:  # a failure before the signal: the script's trap stops what it started
            proc.terminate()
            try:
                proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if out is not None:
            for pid in _naming(out):  # a failure's leftovers: this run's folder names them
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            shutil.rmtree(out, ignore_errors=True)


def test_the_gpu_sessions_stop_of_its_server_is_bounded(tmp_path):
    """stop_server waited for wok serve's drain without a bound: a server that did not stop (a hung device) held the
    script past a lent machine's limit, its finish too. A process that ignores SIGINT stands for it here, run by the
    script's own stop_server: killed once DRAIN_S (1 s here) has passed."""
    import os
    import re
    import signal
    import subprocess
    import sys

    session = (ROOT / "bench" / "gpu_session.sh").read_text()
    (stop,) = re.findall(r"^stop_server\(\) \{.*?^\}$", session, re.MULTILINE | re.DOTALL)
    ready = tmp_path / "ready"
    hung = (
        f"import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); open({str(ready)!r}, 'w'); time.sleep(600)"
    )
    script = f"""set -u
DRAIN_S=1
{stop}
{sys.executable} -c "{hung}" &
server=$!
until [ -e {ready} ]; do sleep 0.05; done
echo "pid $server"
stop_server
echo "exit $? [$server]"
"""
    proc = subprocess.Popen(["bash", "-c", script], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        said, _ = proc.communicate(timeout=60)
    finally:  # a stop that never ends (as it did) leaves the stand-in: its group goes
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    lines = said.splitlines()
    pid = int(lines[0].split()[1])
    assert lines[1:] == [f"!! wok serve (pid {pid}): still running 1 s after SIGINT, killed", "exit 137 []"], lines
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_every_background_process_of_the_gpu_session_is_started_with_the_signals_held():
    """A signal's trap runs between two commands: one landing between `cmd &` and `pid=$!` ran `exit` before the
    pid was kept, and finish left that process (a step's timeout, wok serve, the scrape) running. Each is started
    between hold_signals and release_signals, its pid kept before the release."""
    import re

    lines = (ROOT / "bench" / "gpu_session.sh").read_text().replace("\\\n", " ").splitlines()
    started = [i for i, line in enumerate(lines) if re.search(r"[^&]&$", line.strip())]
    assert len(started) == 3, started  # a step, wok serve, the scrape under load
    for i in started:
        held = [line.strip() for line in (lines[i - 1], lines[i + 1], lines[i + 2])]
        assert held[0] == "hold_signals" and re.fullmatch(r"\w+=\$!", held[1]) and held[2] == "release_signals", lines[
            i - 1 : i + 3
        ]


def test_without_cuda_the_hint_names_a_cpu_dry_run_that_takes_seconds(monkeypatch, capsys):
    # The default sizes take over half an hour on a CPU: the hint gives the small ones.
    from wok.bench import gpu_check

    monkeypatch.setattr(gpu_check.torch.cuda, "is_available", lambda: False)
    assert gpu_check.main(["--device", "cuda:0"]) == 2
    assert CPU_DRY_RUN in capsys.readouterr().err
    assert CPU_DRY_RUN in gpu_check.__doc__


def test_stage_medians_are_nearest_rank():
    # A stage's median over one run's batches is a time some batch took, the ⌈n/2⌉-th smallest, as every
    # percentile of one run's samples; statistics.median took the mean of the middle two (2.5 ms here).
    from types import SimpleNamespace

    from wok.bench.gpu_check import stage_medians

    seconds = [0.004, 0.001, 0.003, 0.002]
    results = [SimpleNamespace(times=SimpleNamespace(assemble=s, h2d=s / 2, compute=2 * s, d2h=s)) for s in seconds]
    assert stage_medians(results) == pytest.approx({"assemble": 2.0, "h2d": 1.0, "compute": 4.0, "d2h": 2.0})
    assert stage_medians(results[:3]) == pytest.approx({"assemble": 3.0, "h2d": 1.5, "compute": 6.0, "d2h": 3.0})


@pytest.mark.parametrize("device", ["bogus", "cuda:128"])
def test_a_device_the_server_would_refuse_is_refused_before_the_model_is_built(device, capsys):
    """A pydantic traceback came from InstanceConfig once the model was built ("bogus"), or torch's
    cuda:-128 ("cuda:128") went on to the executor."""
    from wok.bench import gpu_check
    from wok.config import DEVICE_FORMS

    with pytest.raises(SystemExit) as info:
        gpu_check.main(["--device", device])
    assert info.value.code == 2
    assert capsys.readouterr().err.endswith(f"--device: expected {DEVICE_FORMS}; got '{device}'\n")


@pytest.mark.parametrize(
    ("spec", "cuda_available", "device"),
    [
        ("auto", True, "cuda:0"),  # was reported and checked as the CPU while the executor ran it on the GPU
        ("cuda", True, "cuda:0"),
        ("cuda:1", True, "cuda:1"),  # its report named GPU 0
        ("cpu", True, "cpu"),
        ("cpu", False, "cpu"),
    ],
)
def test_the_device_reported_is_the_one_the_server_resolves(spec, cuda_available, device, monkeypatch):
    # This machine's CUDA, as torch reports it, is what both readings consult: two devices, or none.
    from wok.bench import gpu_check
    from wok.executor import resolve_devices

    monkeypatch.setattr(gpu_check.torch.cuda, "is_available", lambda: cuda_available)
    monkeypatch.setattr(gpu_check.torch.cuda, "device_count", lambda: 2 if cuda_available else 0)
    assert str(gpu_check.resolve_device(spec)) == device
    assert gpu_check.resolve_device(spec) == resolve_devices([spec])[0]


@pytest.mark.parametrize(
    ("spec", "cuda_available", "message"),
    [
        ("cuda:0", False, f"no CUDA device; run it on a GPU machine (or `{CPU_DRY_RUN}` for a dry run)"),
        ("cuda", False, f"no CUDA device; run it on a GPU machine (or `{CPU_DRY_RUN}` for a dry run)"),
        ("auto", False, AUTO_WITHOUT_CUDA),
        ("cuda:2", True, "--device cuda:2: this machine has 2 CUDA device(s), cuda:0 to cuda:1"),
        ("cuda:12", True, "--device cuda:12: this machine has 2 CUDA device(s), cuda:0 to cuda:1"),
    ],
)
def test_a_device_this_machine_lacks_is_refused_in_the_scripts_words(
    spec, cuda_available, message, monkeypatch, capsys
):
    # The executor refuses them too (resolve_devices), in its words, but only once the model is built.
    from wok.bench import gpu_check

    monkeypatch.setattr(gpu_check.torch.cuda, "is_available", lambda: cuda_available)
    monkeypatch.setattr(gpu_check.torch.cuda, "device_count", lambda: 2 if cuda_available else 0)
    with pytest.raises(ValueError) as info:
        gpu_check.resolve_device(spec)
    assert str(info.value) == message
    assert gpu_check.main(["--device", spec]) == 2
    assert capsys.readouterr().err == f"gpu_check: {message}\n"


def test_the_sessions_mlp_repository_is_the_demo_model_on_the_device_it_names(tmp_path):
    """bench/gpu_session.sh served `--models mlp` on `auto`, the CPU where CUDA is broken: it now serves the demo's
    mlp from a repository naming the device, which must stay the demo's model (config, weights) as the demo changes."""
    import subprocess
    import sys

    from wok.models import build_demo
    from wok.repository import load_servable

    session = (ROOT / "bench" / "gpu_session.sh").read_text()
    writer = session.split("<<'EOF'\n", 1)[1].split("\nEOF\n", 1)[0]
    subprocess.run([sys.executable, "-c", writer, str(tmp_path), "cuda"], check=True, timeout=120)
    served = load_servable(tmp_path / "mlp")
    demo = build_demo("mlp")
    assert served.config.instances.devices == ("cuda",)
    left = {"factory", "parameters", "weights", "instances", "source"}
    assert served.config.model_dump(exclude=left) == demo.config.model_dump(exclude=left)
    x = torch.randn(3, 256)
    cpu = torch.device("cpu")
    assert torch.equal(served.module_for(cpu)(x), demo.module_for(cpu)(x))


# Runs gpu_check's main on the CPU with the server check's model stuck (its load, or its warm-up batch) for STUCK_S,
# saying so, for the test to Ctrl-C it then (SIGINT from outside: a kill from the model's own thread went to that
# thread at times, which left the loop's thread asleep in its poll until the model's step ended).
STUCK_MAIN = """
import importlib.util, logging, signal, sys, threading, torch
spec = importlib.util.spec_from_file_location("gpu_check", sys.argv[1])
gpu_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_check)
where, stuck_s, ctrl_c = sys.argv[2], float(sys.argv[3]), sys.argv[4]


class Stuck(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.stuck = True

    def hold(self, step):
        if step == where and self.stuck:
            self.stuck = False
            print("stuck", file=sys.stderr, flush=True)
            threading.Event().wait(stuck_s)

    def to(self, *args, **kwargs):
        self.hold("load")
        return super().to(*args, **kwargs)

    def forward(self, x):
        self.hold("warm-up")
        return self.inner(x)


def build_demo(name, **options):
    servable = demo(name, **options)
    if not options:  # the server check's
        servable._module = Stuck(servable._module)
    return servable


# Says each of wok's log lines, as Python's last-resort handler does, and on the one saying the start gave the model
# up, Ctrl-Cs the process again, there on the loop's thread (raise_signal: to the calling thread).
class SecondCtrlC(logging.Handler):
    def emit(self, record):
        print(record.getMessage(), file=sys.stderr, flush=True)
        if record.getMessage().endswith(" as the start ended"):
            signal.raise_signal(signal.SIGINT)


demo, gpu_check.build_demo = gpu_check.build_demo, build_demo
if ctrl_c == "twice":
    logging.getLogger("wok").addHandler(SecondCtrlC())
sys.exit(gpu_check.main(sys.argv[5:]))
"""
STUCK_S = 30.0


@pytest.mark.parametrize("ctrl_c", ["once", "twice"])
@pytest.mark.parametrize("where", ["load", "warm-up"])
def test_a_ctrl_c_in_the_server_checks_start_leaves_at_once(tmp_path, where, ctrl_c):
    """A Ctrl-C while the server check's model loads or warms up: the start gives the model up after a second
    (LeftRunning), and main's os._exit came only after asyncio.run had ended, whose end waits for the loop's pool
    threads, that load's or warm-up's among them: the script left when the model's step did, however long (here
    STUCK_S), not at once as it says. Now left inside the loop.

    `twice`: a second Ctrl-C as the start gives the model up. asyncio.run's handler raised KeyboardInterrupt out of
    the loop, past that os._exit, and asyncio.run's end then waited for the model's step again. Now it leaves at
    once, as `wok serve` on a second signal."""
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "stuck_main.py"
    script.write_text(STUCK_MAIN)
    out = tmp_path / "gc.json"
    args = [str(ROOT / "bench" / "gpu_check.py"), where, str(STUCK_S), ctrl_c, *CPU_DRY_RUN.split(), "--json", str(out)]
    proc = subprocess.Popen([sys.executable, str(script), *args], stderr=subprocess.PIPE, text=True)
    try:
        said = []
        for line in proc.stderr:
            said.append(line)
            if line == "stuck\n":
                break
        assert said[-1:] == ["stuck\n"], "".join(said)[-3000:]
        proc.send_signal(signal.SIGINT)
        interrupted = time.monotonic()
        said += proc.stderr.readlines()
        took = time.monotonic() - interrupted
        assert proc.wait(timeout=10) == 1, "".join(said)[-3000:]
    finally:
        proc.kill()
        proc.wait()
    assert took < 10.0, f"gpu_check left {took:.1f} s after its Ctrl-C (the model stuck for {STUCK_S:.0f} s)"
    step = "loading" if where == "load" else "running a batch"
    left = {
        "once": "gpu_check: the server's start was cancelled with model 'mlp' still loading or warming up on its "
        "thread; exiting without a report\n",
        "twice": "gpu_check: a second Ctrl-C; exiting at once, without a report\n",
    }
    assert said[-2:] == [f"model 'mlp' is still {step} as the start ended\n", left[ctrl_c]], "".join(said)[-3000:]
    assert not out.exists()


# Runs a server check of the script's own (`_exit_if_left_running` of a block in `serving`, as main's) whose model is
# stuck in a batch for STUCK_S, and whose block then raises: the stop gives the model up.
STUCK_CHECK = """
import asyncio, importlib.util, sys, threading, numpy as np, torch
spec = importlib.util.spec_from_file_location("gpu_check", sys.argv[1])
gpu_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_check)
stuck_s = float(sys.argv[2])
entered = threading.Event()


class Stuck(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        if x.any():  # a request's ones, not the warm-up's zeros
            entered.set()
            threading.Event().wait(stuck_s)
        return self.inner(x)


servable = gpu_check.build_demo("mlp")
servable._module = Stuck(servable._module)


async def check():
    loop = asyncio.get_running_loop()
    async with gpu_check.serving(servable, grace=0.2) as server:
        server.runtime("mlp").batcher.submit({"INPUT0": np.ones((1, 256), np.float32)}, 1, None, None)
        assert await loop.run_in_executor(None, entered.wait, 10), "the batch never reached the model"
        raise ValueError("test: the check's own failure")


asyncio.run(gpu_check._exit_if_left_running(check()))
"""


def test_the_error_that_ended_the_server_check_is_said_when_a_model_is_given_up(tmp_path):
    """The server check raised, and the stop after it gave a model up: LeftRunning was raised over the check's error,
    and only its line was printed, the failure that ended the check unsaid. Now printed first, with its traceback."""
    import subprocess
    import sys

    script = tmp_path / "stuck_check.py"
    script.write_text(STUCK_CHECK)
    args = [str(ROOT / "bench" / "gpu_check.py"), str(STUCK_S)]
    proc = subprocess.run([sys.executable, str(script), *args], stderr=subprocess.PIPE, text=True, timeout=STUCK_S)
    said = proc.stderr.splitlines()
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert said[-1] == (
        "gpu_check: the server gave model 'mlp' up, still running on its thread, as it stopped; exiting without a "
        "report"
    ), proc.stderr[-3000:]
    assert "ValueError: test: the check's own failure" in said, proc.stderr[-3000:]
    assert said.index("ValueError: test: the check's own failure") < len(said) - 1


@pytest.mark.timeout(240)
def test_the_gpu_session_serves_on_free_ports_into_a_folder_of_its_own_and_removes_its_copy_of_wok(free_ports_session):
    """bench/gpu_session.sh served on fixed ports (8011 and 8012 for this variant: held here, as by another server on
    the machine), wrote under a fixed /tmp/wok-gpu, and left its mktemp'd copy of wok behind. Its one serving step
    WOK_GPU_ONLY names, on the CPU: about 30 s, run by `free_ports_session`."""
    import shutil

    run = free_ports_session()
    said = dict(line.split(" under ", 1) for line in run.stdout.splitlines() if line.startswith("figures and logs"))
    out = Path(said["figures and logs"])
    try:
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
        assert out.parent == Path("/tmp") and out.name.startswith("wok-gpu.") and out.name != "wok-gpu.XXXXXX"
        (site,) = (line.split()[3].rstrip(",") for line in run.stdout.splitlines() if line.startswith("wok installed"))
        assert site.startswith("/tmp/wok-site.") and not Path(site).exists(), run.stdout
        # Only the step named ran; its server's ports were free ones, its metrics scraped where they were.
        assert sorted(p.name for p in out.iterdir() if p.suffix == ".json") == ["ramp_unary_accept0.json"]
        config = json.loads((out / "ramp_unary_accept0.json").read_text())["config"]
        grpc_port, metrics_port = int(config["target"].rsplit(":", 1)[1]), int(config["metrics_url"].split(":")[2][:-8])
        assert {grpc_port, metrics_port}.isdisjoint({8011, 8012}) and grpc_port != metrics_port, config
        assert config["metrics_url"] == f"http://127.0.0.1:{metrics_port}/metrics"
        assert (config["steps"], config["step_duration_s"]) == ([50], 1), config
    finally:
        shutil.rmtree(out, ignore_errors=True)
