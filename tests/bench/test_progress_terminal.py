"""The progress bars of `wok bench ramp` and `wok profile` with stderr a terminal (a pty) and stdout a file: the bar
is drawn on stderr where the terminal can draw it, and stdout holds the table alone. Off a terminal (a pipe),
`wok profile`'s plain progress lines, and no bar where FORCE_COLOR makes rich take the pipe for a terminal."""

from __future__ import annotations

import itertools
import os
import pty
import re
import subprocess
import sys
import threading

import pytest

from .test_soak_checks import WOK_WITH_PROGRESS_FLOOR

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


PROFILE = [sys.executable, "-m", "wok", "profile", "mlp", "--peak-flops", "1T", "--bandwidth", "1T"]


def _off_a_terminal(cmd: list[str], force_color: bool) -> tuple[int, str, str]:
    """`cmd` in a child whose stdout and stderr are pipes (a log's, CI's), with FORCE_COLOR set or not and none of
    the other variables that force rich's view of a terminal: (exit status, stdout, stderr)."""
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE")}
    env = {**env, "TERM": "xterm-256color", **({"FORCE_COLOR": "1"} if force_color else {})}
    done = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL, env=env, timeout=90)
    return done.returncode, done.stdout, done.stderr


@pytest.mark.parametrize("force_color", [False, True], ids=["plain", "FORCE_COLOR"])
def test_wok_profile_off_a_terminal_says_its_progress_in_plain_lines(force_color):
    """Off a terminal the profile's bar was off (9904d3c), and nothing replaced it: a long profile in a log said
    nothing until its table. Now plain lines, on the ramp's schedule (test_soak_checks), here with its floor of 10 s
    set to 0.1 s in the child so that a profile of a second or two shows some. With FORCE_COLOR, rich took the pipe
    for a terminal and the profile drew its bar into it."""
    batches = (1 + 400) * 2
    cmd = [sys.executable, "-c", WOK_WITH_PROGRESS_FLOOR, "0.1", *PROFILE[3:], "--batch-sizes", "1,32"]
    status, out, err = _off_a_terminal([*cmd, "--warmup", "1", "--repeats", "400"], force_color)
    assert status == 0, err[-3000:]
    assert out.startswith("wok profile mlp on cpu\n"), repr(out[:300])
    assert BAR not in err and "\x1b" not in err, repr(err[-3000:])
    lines = [
        re.fullmatch(rf"profiling mlp: (\d+)/{batches} batches \((\d+)%\), (\d+) s", line) for line in err.splitlines()
    ]
    assert lines and all(lines), err[-3000:]
    done = [int(m.group(1)) for m in lines]
    assert done == sorted(set(done)) and done[0] > 0 and done[-1] < batches, done  # none for the last batch
    assert [int(m.group(2)) for m in lines] == [round(100 * d / batches) for d in done], err[-3000:]


@pytest.mark.parametrize("force_color", [False, True], ids=["plain", "FORCE_COLOR"])
def test_a_short_wok_profile_off_a_terminal_says_nothing(force_color):
    """A profile over before the first line is due (10 s at the least) leaves stderr empty: no bar, no empty line
    where a refusal's one line would stand (tests/bench/test_profiler_edges.py)."""
    status, out, err = _off_a_terminal(
        [*PROFILE, "--batch-sizes", "1,2", "--warmup", "1", "--repeats", "20"], force_color
    )
    assert status == 0, err[-3000:]
    assert out.startswith("wok profile mlp on cpu\n"), repr(out[:300])
    assert err == "", repr(err[-3000:])


def test_the_plain_count_schedule():
    """A count's line is due a step's period after the last (every tenth of the whole as the pace so far foretells
    it, 10 to 60 s apart), none before its first item nor for its last."""
    from wok.bench.runner import plain_count_line

    def lines(total: int, per_item_s: float, before_s: float = 0.0) -> list[str]:
        out, last = [], 0.0
        for done in range(total + 1):
            elapsed = before_s + done * per_item_s
            if (line := plain_count_line("profiling m", done, total, "batches", elapsed, last)) is not None:
                out.append(line)
                last = elapsed
        return out

    assert lines(120, 0.08) == []  # 9.6 s in all: none
    assert lines(120, 1.0) == [f"profiling m: {d}/120 batches ({round(d / 1.2)}%), {d} s" for d in range(12, 120, 12)]
    hours = lines(1000, 10.8)  # 3 h: a line a minute
    assert len(hours) == 1000 // 6 and hours[0] == "profiling m: 6/1000 batches (1%), 65 s"  # 6 batches: 64.8 s
    # A slow start (the warm-up before the first batch, 30 s) foretells a longer whole: the first line comes when
    # it is a tenth of the whole so foretold (12 batches in 42 s: 420 s), the next ones closer as the pace shows.
    slow = lines(120, 1.0, before_s=30.0)
    assert slow[0] == "profiling m: 12/120 batches (10%), 42 s", slow
    seconds = [int(line.rpartition(", ")[2].removesuffix(" s")) for line in slow]
    assert [b - a for a, b in itertools.pairwise(seconds)] == [23, 19, 18, 17, 16], slow
