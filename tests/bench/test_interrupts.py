"""`wok bench ramp` stopped by SIGTERM or SIGHUP: the same clean end as Ctrl-C (faults turned
off, workers and replicas stopped), not the default death that left a server's fault on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
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


def test_the_handlers_raise_keyboard_interrupt_and_are_put_back():
    from wok.bench.cli import _restore_signals, _signals_interrupt

    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    previous = _signals_interrupt()
    try:
        for s in before:
            with pytest.raises(KeyboardInterrupt, match=signal.Signals(s).name):
                os.kill(os.getpid(), s)
                time.sleep(5)  # the handler runs at the next bytecode; this is never reached
    finally:
        _restore_signals(previous)
    assert {s: signal.getsignal(s) for s in before} == before
