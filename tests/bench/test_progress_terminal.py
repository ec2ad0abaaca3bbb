"""The progress bars of `wok bench ramp` and `wok profile` with stderr a terminal (a pty) and stdout a file: the bar
is drawn on stderr where the terminal can draw it, and stdout holds the table alone."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import threading

import pytest

pytestmark = pytest.mark.timeout(120)

# BarColumn's line: what a drawn bar writes.
BAR = "━"


def _on_a_terminal(cmd: list[str], tmp_path, term: str) -> tuple[int, str, str]:
    """`cmd` in a child whose stderr is a pty and stdout a file, with TERM=`term` and none of the variables that
    force rich's view of a terminal: (exit status, stdout, what the pty showed)."""
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE")}
    master, slave = pty.openpty()
    shown: list[bytes] = []

    def read() -> None:  # the pty's buffer is a few KB: read as the child writes, or it blocks on a full one
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child's side is closed
                return
            if not chunk:
                return
            shown.append(chunk)

    reader = threading.Thread(target=read)
    try:
        with open(tmp_path / "stdout", "w") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=slave, stdin=subprocess.DEVNULL, env={**env, "TERM": term})
        os.close(slave)
        slave = -1
        reader.start()
        try:
            status = proc.wait(90)
        finally:
            proc.kill()
            proc.wait()
        reader.join(10)
    finally:
        if slave != -1:
            os.close(slave)
        os.close(master)
    return status, (tmp_path / "stdout").read_text(), b"".join(shown).decode(errors="replace")


@pytest.mark.parametrize("term", ["xterm-256color", "dumb"])
def test_a_ramps_bar_is_drawn_on_stderr_and_stdout_holds_the_table_alone(bench_server, tmp_path, term):
    """The step's bar was on stdout: with stdout a file, none was drawn anywhere, and its stop wrote an empty line a
    step to the file, before the table. Now on stderr, drawn where stderr is a terminal that draws one; a dumb one
    gets the plain lines (none for a step this short)."""
    cmd = [sys.executable, "-m", "wok", "bench", "ramp", "--target", bench_server.target, "--model", "mlp"]
    cmd += ["--steps", "10,20", "--step-duration", "1s", "--warmup", "0.2s", "--workers", "1"]
    status, out, shown = _on_a_terminal(cmd, tmp_path, term)
    assert status == 0, shown[-3000:]
    assert out.startswith("offered "), repr(out[:300])
    assert (BAR in shown) == (term != "dumb"), shown[-3000:]


@pytest.mark.parametrize("term", ["xterm-256color", "dumb"])
def test_wok_profiles_bar_is_drawn_on_a_terminal_that_draws_one(tmp_path, term):
    """9904d3c turned the bar off where stderr draws none (`Console.is_interactive`): still drawn on a terminal, and
    off on a dumb one, whose stderr then holds nothing but what wok says (no empty line)."""
    cmd = [sys.executable, "-m", "wok", "profile", "mlp", "--batch-sizes", "1,2", "--warmup", "1", "--repeats", "20"]
    cmd += ["--peak-flops", "1T", "--bandwidth", "1T"]
    status, out, shown = _on_a_terminal(cmd, tmp_path, term)
    assert status == 0, shown[-3000:]
    assert out.startswith("wok profile mlp on cpu\n"), repr(out[:300])
    if term == "dumb":
        assert shown == "", repr(shown[-3000:])
    else:
        assert "profiling mlp" in shown and BAR in shown, repr(shown[-3000:])
