"""A Ctrl-C (or SIGTERM, SIGHUP) after a ramp's last step, as its result is built, written and printed, or as the
process exits: every step run is the result, written and printed whole, and the status is the run's (docs/bench.md,
"Exit status"). Raised as the table printed, it cost the table (exit 130, "wok bench: interrupted"), before the JSON
was written the JSON too; in the interpreter's exit it ended the process by the signal (status -2, no word)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from wok.bench.cli import _restore_signals, _signals_interrupt
from wok.bench.workers import run_held, signals_held

pytestmark = pytest.mark.timeout(120)


def _ramp_args(target: list[str], out) -> list[str]:
    """`wok`'s arguments for a `wok bench ramp` of two short steps whose SLO every step meets, its JSON to `out`."""
    args = ["bench", "ramp", *target, "--metrics-url", "none", "--steps", "20,40", "--step-duration", "0.3s"]
    return [*args, "--warmup", "0s", "--workers", "1", "--slo-p99", "10s", "--json", str(out)]


def _ramp(target: list[str], out, gate: tuple[str, str], signals: int) -> tuple[int, str, str]:
    """`wok bench ramp` of two short steps, sent `signals` SIGINTs as soon as the line `gate` names (its stream,
    the start of the line) is read: the status, stdout and stderr."""
    cmd = [sys.executable, "-m", "wok", *_ramp_args(target, out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stream, start = gate
    seen = []
    try:
        for line in getattr(proc, stream):
            seen.append(line)
            if line.startswith(start):
                break
        else:
            raise AssertionError(f"no {start!r} on {stream}:\n{''.join(seen)[-3000:]}")
        for _ in range(signals):
            proc.send_signal(signal.SIGINT)
        # Through the streams, not communicate(), which reads the pipes past what the loop above holds buffered.
        # Both are short: neither fills its pipe as the other is read to its end.
        rest = {name: "".join(seen) if name == stream else "" for name in ("stdout", "stderr")}
        for name in rest:
            rest[name] += getattr(proc, name).read()
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, rest["stdout"], rest["stderr"]


def _check_whole(status: int, out: str, err: str, path) -> None:
    assert status == 0 and "Traceback" not in err and "interrupted" not in err, (status, err[-3000:])
    assert "max QPS under SLO" in out and "knee:" in out, out[-3000:]
    result = json.loads(path.read_text())
    assert [s["nominal_qps"] for s in result["steps"]] == [20, 40] and result["interrupted"] is None


# As the JSON is said written (the table is printed next), as the table's verdict is read (its last lines, the
# exit and the interpreter's teardown come next), and as its last warning is (the SLO is one every step meets; next
# the bench's handlers go to the exit's, ~0.1 ms, and the teardown, ~0.3 s: the case below hits the first).
GATES = [
    ("stderr", "wok bench: wrote "),
    ("stdout", "max QPS under SLO"),
    ("stdout", "warning: every step met the SLO"),
]


@pytest.mark.parametrize("gate", GATES, ids=["table", "verdict", "exit"])
def test_a_ctrl_c_after_the_last_step_keeps_the_table_the_json_and_the_status(bench_server, tmp_path, gate):
    out = tmp_path / "r.json"
    _check_whole(*_ramp(["--target", bench_server.target], out, gate, 1), out)


# `wok` as its console script runs it, the signal raised as soon as the bench's run has put its handlers back (or left
# them), before the command's return reaches wok.entry's exit, which arms its own.
_SIGNALLED_AS_THE_RUN_RETURNS = """
import signal, sys
import wok.bench.cli as cli
from wok.entry import main

restore = cli._restore_signals
sig = getattr(signal, sys.argv.pop(1))


def restore_then_signal(*args, **kwargs):
    restore(*args, **kwargs)
    signal.raise_signal(sig)


cli._restore_signals = restore_then_signal
sys.argv = ["wok", *sys.argv[1:]]
sys.exit(main())
"""


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_as_the_run_returns_to_the_exit_keeps_the_table_the_json_and_the_status(bench_server, tmp_path, sig):
    """The [exit] case above, its SIGINT sent 40-80 us after the line, failed 18 of 40 runs: Python's default handler,
    put back, raised a KeyboardInterrupt on the way out of the command ("wok bench: interrupted", 130); SIGTERM there
    met its default action (killed, -15)."""
    out = tmp_path / "r.json"
    ramp = _ramp_args(["--target", bench_server.target], out)
    cmd = [sys.executable, "-c", _SIGNALLED_AS_THE_RUN_RETURNS, sig, *ramp]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    _check_whole(proc.returncode, proc.stdout, proc.stderr, out)
    assert f"wok bench: {sig} after the run: its result is written first\n" in proc.stderr, proc.stderr[-3000:]


def test_two_ctrl_cs_after_the_last_step_of_replicas_keep_the_result(tmp_path):
    """With --replicas 1, two Ctrl-Cs ~0.3 s after the last step gave "interrupted" and no table."""
    out = tmp_path / "r.json"
    status, stdout, err = _ramp(["--replicas", "1", "--model", "mlp"], out, GATES[0], 2)
    _check_whole(status, stdout, err, out)


def test_a_signal_held_is_raised_to_the_handler_once_the_work_is_whole(capfd):
    interrupts = _signals_interrupt()
    try:
        with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
            with signals_held():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.05)  # the handler would run here, at the next bytecode, were it not held
                done = True
        assert done
        # The bench's handler raised once: a signal after it is said, as the run stops.
        value, came = run_held(lambda: os.kill(os.getpid(), signal.SIGINT) or "figures")
        assert (value, came) == ("figures", None)
    finally:
        _restore_signals(interrupts)
    assert "wok bench: SIGINT while stopping after SIGTERM" in capfd.readouterr().err


def test_run_held_hands_back_the_value_and_the_signal_that_came(capfd):
    interrupts = _signals_interrupt()
    try:
        value, came = run_held(lambda: os.kill(os.getpid(), signal.SIGHUP) or "figures")
        assert value == "figures" and isinstance(came, KeyboardInterrupt) and str(came) == "SIGHUP"
    finally:
        _restore_signals(interrupts)


def test_a_signal_once_the_run_has_its_result_is_said_not_raised(capfd):
    interrupts = _signals_interrupt()
    try:
        interrupts.measured()
        for s in (signal.SIGTERM, signal.SIGINT):
            os.kill(os.getpid(), s)
            time.sleep(0.01)  # a raise would come at the next bytecode: none does
    finally:
        _restore_signals(interrupts)
    err = capfd.readouterr().err
    assert "wok bench: SIGTERM after the run: its result is written first" in err, err
    assert "wok bench: SIGINT while stopping after SIGTERM" in err, err


def test_a_signal_held_as_long_work_runs_is_said_at_once_and_a_second_too(capfd):
    """The replicas' stop after the last step (`run_faults`) waits up to their grace period and 10 s (40 s by
    default): a Ctrl-C there was held without a word until it ended, a second one said nothing at all."""
    doing = "the replicas stop (up to 40 s)"

    def stop() -> list[str]:
        said = []
        for _ in range(2):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # the handler runs here, at the next bytecode
            said.append(capfd.readouterr().err)
        return said

    interrupts = _signals_interrupt()
    try:
        said, came = run_held(stop, doing=doing)
    finally:
        _restore_signals(interrupts)
    assert said == [
        f"wok bench: SIGINT as {doing}: waited for, then the steps run are the result\n",
        f"wok bench: SIGINT as {doing}: the result is written first\n",
    ]
    # Raised to the bench's handler once the stop is whole, as before: the caller keeps the result.
    assert isinstance(came, KeyboardInterrupt) and str(came) == "SIGINT"
    assert capfd.readouterr().err == ""
