"""`wok bench ramp` stopped by SIGTERM or SIGHUP: the same clean end as Ctrl-C (faults turned
off, workers and replicas stopped), not the default death that left a server's fault on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from wok.bench.faults import get_faults

pytestmark = pytest.mark.timeout(120)


def test_sigterm_mid_step_turns_the_servers_fault_off_and_exits_at_once(start_server):
    server = start_server("--models", "mlp", "--admin", "--torch-threads", "1")
    admin = server.http_url()
    cmd = [sys.executable, "-m", "wok", "bench", "ramp", "--target", server.target, "--metrics-url", "none"]
    cmd += ["--steps", "20", "--step-duration", "60s", "--warmup", "0s", "--workers", "1"]
    cmd += ["--admin-url", admin, "--fault", "fail:model=mlp,at=0.2s"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if line.startswith("fault: fail"):
            break
    else:
        raise AssertionError("".join(seen)[-3000:])
    assert [f["mode"] for f in get_faults(admin)] == ["fail"]
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        # Until stderr closes: a worker left running (as SIGTERM's default left it) holds it open.
        _, rest = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        rest = "(stderr still open 20 s after SIGTERM)"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    took = time.monotonic() - t0
    assert get_faults(admin) == []  # the schedule's stop posted `off`
    # Before any step finished, as Ctrl-C: nothing measured to keep.
    assert proc.returncode == 130 and "wok bench: interrupted" in rest and "Traceback" not in rest, rest[-3000:]
    assert took < 10, f"{took:.1f} s to exit after SIGTERM"


SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def test_the_handlers_raise_keyboard_interrupt_and_are_put_back():
    from wok.bench.cli import _restore_signals, _signals_interrupt

    before = {s: signal.getsignal(s) for s in SIGNALS}
    for s in before:
        previous = _signals_interrupt()
        try:
            with pytest.raises(KeyboardInterrupt, match=signal.Signals(s).name):
                os.kill(os.getpid(), s)
                time.sleep(5)  # the handler runs at the next bytecode; this is never reached
        finally:
            _restore_signals(previous)
        assert {s: signal.getsignal(s) for s in before} == before


def test_a_second_signal_while_stopping_is_ignored_until_the_result_is_written(capfd):
    """A second SIGTERM or Ctrl-C used to raise inside the first one's cleanup (waiting for a
    restarting replica): exit 130 and no result, though a step had finished."""
    from wok.bench.cli import _restore_signals, _signals_interrupt

    previous = _signals_interrupt()
    try:
        with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # never reached
        for s in SIGNALS:  # during the cleanup: each is said, none raises
            os.kill(os.getpid(), s)
    finally:
        _restore_signals(previous)
    err = capfd.readouterr().err
    for s in SIGNALS:
        assert f"wok bench: {signal.Signals(s).name} while stopping after SIGTERM" in err, err


# -- the exit status of a run whose result was written, on canned results (no server) -------


def _canned(interrupted: dict | None) -> dict:
    """A ramp's result of one step (the simulator's, of the same schema), ended as `interrupted` says."""
    from wok.bench.simulate import BatcherModel, SimConfig, simulate_ramp

    result = simulate_ramp(SimConfig(BatcherModel(1e-3, 1e-3, 8, 2e-3), steps=[50.0], step_duration_s=1.0))
    result["interrupted"] = interrupted
    return result


@pytest.fixture
def no_target(monkeypatch):
    """A Ramp built without a server: its request pool is not fetched (its run is the test's)."""
    from wok.bench import runner

    monkeypatch.setattr(
        runner, "build_pool", lambda cfg, say=None, notes=None, devices=None, drawn=None: ([], [], None)
    )
    return runner.Ramp


RAMP = ("bench", "ramp", "--target", "127.0.0.1:1", "--metrics-url", "none")


@pytest.mark.parametrize("soak", [False, True])
def test_a_worker_that_died_after_a_step_exits_1_with_the_steps_written(
    soak, no_target, monkeypatch, wok_cli, tmp_path
):
    """It exited 0: the JSON said `interrupted` (not by a signal), the status that the run was whole."""
    from wok.bench import soak as soak_module

    died = "RuntimeError: bench worker 4242 died (exit code -9)"
    reason = f"soak ended early: {died}" if soak else f"ramp ended early at 100 QPS: {died}"
    result = _canned({"reason": reason, "by_signal": False})
    if soak:
        result["soak"] = None  # as run_soak leaves it: the capacity ramp is the result
        monkeypatch.setattr(soak_module, "run_soak", lambda args, cfg: result)
    else:
        monkeypatch.setattr(no_target, "run", lambda self: result)
    out = tmp_path / "r.json"
    status, _, err = wok_cli(*RAMP, "--json", str(out), *(["--soak", "60s"] if soak else []))
    assert status == 1, err
    assert f"wok bench: the run failed (the steps before it are the result): {reason}" in err
    assert json.loads(out.read_text())["interrupted"] == {"reason": reason, "by_signal": False}


@pytest.mark.parametrize("due_before", [False, True])
def test_faults_planned_after_a_signal_cut_the_run_do_not_count(due_before, no_target, monkeypatch, wok_cli, tmp_path):
    """Ctrl-C after a step, before a fault's time: the status is as for a whole run. It was 4
    ("did not take effect: the ramp ended before its time"), so it hung on when the user pressed
    Ctrl-C. A fault due before the cut whose action failed still counts."""
    from wok.bench import faults

    refused = threading.Event()
    say = faults.say

    def said(msg: str) -> None:
        say(msg)
        if "failed" in msg:
            refused.set()

    def run(self) -> dict:
        self.started(time.monotonic())
        if due_before:
            assert refused.wait(20), "the fault at 0 s was not tried"
        return _canned({"reason": "ramp ended early at 100 QPS: KeyboardInterrupt: SIGINT", "by_signal": True})

    monkeypatch.setattr(faults, "say", said)
    monkeypatch.setattr(no_target, "run", run)
    later = "slow:model=mlp,delay=5ms,at=90%"  # 18 s into a planned 20 s
    due = ["--fault", "fail:model=mlp,at=0s,until=1s"] if due_before else []
    out = tmp_path / "r.json"
    args = ["--steps", "50,100", "--step-duration", "10s", "--warmup", "0s", "--json", str(out)]
    # Nothing listens on port 9 of the loopback: a fault posted there is refused at once.
    status, stdout, err = wok_cli(*RAMP, *args, "--admin-url", "http://127.0.0.1:9", "--fault", later, *due)
    section = json.loads(out.read_text())["faults"]
    assert 0 <= section["cut_s"] < 18 and section["faults"][0]["start_s"] is None
    if due_before:
        assert status == 4, err
        assert "wok bench: fault(s) not run as asked: fail:model=mlp,at=0s,until=1s (see above)" in err
    else:
        assert status == 0, err
        assert "not run as asked" not in err and "did not take effect" not in stdout


def test_sigterm_in_the_host_probe_after_the_ramp_keeps_the_result(bench_server, tmp_path):
    out = tmp_path / "r.json"
    cmd = [sys.executable, "-m", "wok", "bench", "ramp", "--target", bench_server.target, "--metrics-url", "none"]
    cmd += ["--steps", "20", "--step-duration", "0.5s", "--warmup", "0.1s", "--workers", "1"]
    # 1 s before the ramp too (4 s cost 3 s more there). The signal goes as soon as the probe after the ramp
    # is said and has that probe's whole second to land in; it takes a few ms.
    cmd += ["--host-probe", "1s", "--json", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen = []
    try:
        for line in proc.stderr:
            seen.append(line)
            if "after the ramp (--host-probe)" in line:
                break
        else:
            raise AssertionError("".join(seen)[-3000:])
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    # The ramp was measured whole: the signal cuts the probe, not the result (it was exit 130, no JSON).
    assert proc.returncode == 0 and "Traceback" not in rest, rest[-3000:]
    assert "host probe after the ramp cut short by KeyboardInterrupt: SIGTERM" in rest, rest[-3000:]
    result = json.loads(out.read_text())
    assert [s["nominal_qps"] for s in result["steps"]] == [20] and result["interrupted"] is None
    assert result["host_probe"]["after"] == {
        "schema": "wok.hostprobe/2",
        "error": "cut short: KeyboardInterrupt: SIGTERM",
    }
    assert "cold_forward_us" in result["host_probe"]["before"]
