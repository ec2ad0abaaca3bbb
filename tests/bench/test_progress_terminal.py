"""The progress bars of `wok bench ramp` and `wok profile` with stderr a terminal (a pty) and stdout a file: the bar
is drawn on stderr where the terminal can draw it, and stdout holds the table alone. Off a terminal (a pipe),
`wok profile`'s plain progress lines, and no bar where FORCE_COLOR makes rich take the pipe for a terminal."""

from __future__ import annotations

import io
import itertools
import os
import pty
import re
import subprocess
import sys
import threading

import pytest
import torch

from wok.config import model_config_from_dict
from wok.servable import Servable

from ..conftest import write_python_model
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
    gets the plain lines (none for a step this short). One step: its empty line stood before the table as well."""
    cmd = [sys.executable, "-m", "wok", "bench", "ramp", "--target", bench_server.target, "--model", "mlp"]
    cmd += ["--steps", "10", "--step-duration", "1s", "--warmup", "0.2s", "--workers", "1"]
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
    # A phase's line where no batch is counted (since 2026-12-06, said on time by a thread of its own), else the count.
    phases = "loading model 'mlp'|start-up warm-up|drawing requests|measuring the roofline|counting FLOPs and bytes"
    phase = rf"profiling mlp: ({phases}), \d+ s"
    count = rf"profiling mlp: (\d+)/{batches} batches \((\d+)%\), (\d+) s"
    lines = [re.fullmatch(count, line) for line in err.splitlines() if not re.fullmatch(phase, line)]
    assert lines and all(lines), err[-3000:]
    done = [int(m.group(1)) for m in lines]
    assert done == sorted(done) and done[-1] < batches, done  # none for the last batch
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
    """A count's line is due a step's period after the last one was due (every tenth of the whole as the pace so far
    foretells it, 10 to 60 s apart; runner.plain_due, the ramp's rule), none for a run over before the first period
    nor once its last item is done."""
    from wok.bench.runner import plain_count_line

    def lines(total: int, per_item_s: float, before_s: float = 0.0) -> list[str]:
        out, due = [], 0.0
        for done in range(total + 1):
            elapsed = before_s + done * per_item_s
            line, due = plain_count_line("profiling m", done, total, "batches", elapsed, due)
            out += [line] if line is not None else []
        return out

    assert lines(120, 0.08) == []  # 9.6 s in all: none
    assert lines(120, 1.0) == [f"profiling m: {d}/120 batches ({round(d / 1.2)}%), {d} s" for d in range(12, 120, 12)]
    # 3 h: a line a minute, each the first item past the minute (6 batches: 64.8 s, 12: 129.6 s). Timed from the
    # last line shown, as until 2026-12-06, the lines drifted a batch late each, 166 of them.
    hours = lines(1000, 10.8)
    assert len(hours) == 179 and hours[:2] == [
        "profiling m: 6/1000 batches (1%), 65 s",
        "profiling m: 12/1000 batches (1%), 130 s",
    ]
    # 30 s before the first item (a warm-up): a line for its last period passed, at 30 s; then a tenth of the whole
    # as the pace foretells it (26 batches in 56 s: 258 s) after that, the next ones closer as the pace shows.
    slow = lines(120, 1.0, before_s=30.0)
    assert slow[:2] == ["profiling m: 0/120 batches (0%), 30 s", "profiling m: 26/120 batches (22%), 56 s"], slow
    seconds = [int(line.rpartition(", ")[2].removesuffix(" s")) for line in slow]
    assert [b - a for a, b in itertools.pairwise(seconds)] == [26, 20, 18, 16, 16, 15], slow


def test_plain_progress_says_a_phase_and_a_stuck_count_on_time_and_no_oftener():
    """Off a terminal the profile said a line only as a batch ended: a start-up warm-up, a roofline's measurement, or
    one batch slower than the period said nothing meanwhile. Now a line is due by the one rule (runner.plain_due)
    whether a batch ends or not: a phase's line every period of a whole at least as long as the time so far, a
    count's every tenth of the whole its pace foretells, 10 to 60 s; looked at every 0.05 s of an injected clock."""
    from wok.bench.runner import PlainProgress

    now = [0.0]
    progress = PlainProgress("profiling m", 100, "batches", say=None, clock=lambda: now[0])
    said: list[tuple[float, str]] = []

    def until(end_s: float) -> None:
        for i in range(round(now[0] * 20) + 1, round(end_s * 20) + 1):
            now[0] = i / 20
            if (line := progress.line()) is not None:
                said.append((now[0], line))

    progress.phase("start-up warm-up")
    until(35)
    progress.phase(None)
    progress(1)  # a batch in 35 s foretells a whole of 3,500 s: a line a minute while the next batch runs
    until(200)
    progress.phase("counting FLOPs and bytes")
    until(240)
    assert said == [
        (10.0, "profiling m: start-up warm-up, 10 s"),
        (20.0, "profiling m: start-up warm-up, 20 s"),
        (30.0, "profiling m: start-up warm-up, 30 s"),
        (90.0, "profiling m: 1/100 batches (1%), 90 s"),
        (150.0, "profiling m: 1/100 batches (1%), 150 s"),
        # A whole of at least 200 s: a period of 20 s at once, the line for 190 s (on the grid from 150 s) said at the
        # first look, late, so that the grid starts again there: a tenth of the time so far after it, at
        # t = 200.05 + t/10, t = 222.3 s (on the grid from 190 s it came at 211.1 s, 11 s after the line at 200 s).
        (200.05, "profiling m: counting FLOPs and bytes, 200 s"),
        (222.3, "profiling m: counting FLOPs and bytes, 222 s"),
    ], said


def test_plain_progress_after_a_pause_says_one_line_and_the_next_a_period_later():
    """A process paused and resumed (Ctrl-Z then fg, a suspended VM) finds a line late at its first look: it is said,
    and the next one a period after it. On the grid of the lines due before the pause (runner.plain_due), the line
    for 90 s was said at 99.95 s and the one for 100 s at the next look, 0.05 s later, where until d50d5e0 a count's
    next line was timed from the last one shown."""
    from wok.bench.runner import PlainProgress

    now = [0.0]
    progress = PlainProgress("profiling m", 100, "batches", say=None, clock=lambda: now[0])
    progress.phase("start-up warm-up")
    said: list[tuple[float, str]] = []
    # Looked at every 0.05 s, as the thread does every 0.2 s, but for the pause from 50 s to 99.95 s.
    for look in [*(i / 20 for i in range(1, 1001)), *(i / 20 for i in range(1999, 2701))]:
        now[0] = look
        if (line := progress.line()) is not None:
            said.append((look, line))
    assert said == [
        (10, "profiling m: start-up warm-up, 10 s"),
        (20, "profiling m: start-up warm-up, 20 s"),
        (30, "profiling m: start-up warm-up, 30 s"),
        (40, "profiling m: start-up warm-up, 40 s"),
        (50, "profiling m: start-up warm-up, 50 s"),
        (99.95, "profiling m: start-up warm-up, 100 s"),
        # A tenth of the time so far after it, at t = 99.95 + t/10: 111.06 s; on that grid (a look late, kept), then
        # t = 111.06 + t/10: 123.4 s.
        (111.1, "profiling m: start-up warm-up, 111 s"),
        (123.4, "profiling m: start-up warm-up, 123 s"),
    ], said


def test_a_due_line_moves_the_grid_on_however_the_floats_round():
    """runner.plain_due said a line due at 4 periods of 38.93... s where the last was due at 3, and then stood for
    the old one, as (155.7 - 116.8) / 38.9 rounds below 1: the next look, a moment later, said the same line again
    (a ramp's step of 389.3 s: `156 s of 389.337 s (40%)` twice); at 5 periods past 3 it stood for 4, and the next
    look said 5's. The time a due line stands for is the latest its own check finds passed, past the last."""
    from wok.bench.runner import plain_due, plain_progress_line

    every = 38.93367347649403
    due, now = 3 * every, 3 * every + every
    assert plain_due(now, due, every) == now
    line, due = plain_progress_line("step 1/1", now, 10 * every, due)
    assert line == "step 1/1: 156 s of 389.337 s (40%)"
    assert plain_progress_line("step 1/1", now + 1e-9, 10 * every, due) == (None, due)
    cases = [(every, 3 * every, 5 * every), *((10 / 3, k * 10 / 3, k * 10 / 3 + 10 / 3) for k in range(1, 10))]
    for every_s, due_s, elapsed_s in cases:
        stood = plain_due(elapsed_s, due_s, every_s)
        assert stood is not None and stood > due_s and plain_due(elapsed_s, stood, every_s) is None, (due_s, stood)


class _Watched(io.StringIO):
    """A stderr that is no terminal, whose writes set `wrote`."""

    def __init__(self) -> None:
        super().__init__()
        self.wrote = threading.Event()

    def write(self, text: str) -> int:
        n = super().write(text)
        self.wrote.set()
        return n


class Blocking(Servable):
    """Linear(4, 2) whose `block_at`-th forward of nonzero inputs (0: its first forward at all, a batch of zeros of
    the start-up warm-up) waits up to 20 s for a line on `stderr`, and keeps what was said meanwhile (`during`)."""

    def __init__(self, stderr: _Watched, block_at: int) -> None:
        config = model_config_from_dict(
            {
                "name": "blocking",
                "platform": "python",
                "factory": f"{__name__}:Blocking",
                "inputs": [{"name": "x", "datatype": "FP32", "dims": [4]}],
                "outputs": [{"name": "y", "datatype": "FP32", "dims": [2]}],
                "max_batch_size": 4,
            },
            source="test",
        )
        super().__init__(config, torch.nn.Linear(4, 2))
        self.stderr, self.block_at, self.nonzero, self.during = stderr, block_at, 0, None

    def forward(self, module, tensors):
        if self.during is None and (self.block_at == 0 or self.nonzero == self.block_at):
            mark = len(self.stderr.getvalue())
            self.stderr.wrote.clear()
            self.stderr.wrote.wait(20)
            self.during = self.stderr.getvalue()[mark:]
        self.nonzero += bool(tensors["x"].any())
        return super().forward(module, tensors)


@pytest.mark.parametrize(
    ("block_at", "said"),
    [(0, r"profiling blocking: start-up warm-up, \d+ s"), (3, r"profiling blocking: 3/8 batches \(38%\), \d+ s")],
    ids=["start-up warm-up", "a timed batch"],
)
def test_wok_profile_says_its_progress_while_the_model_runs_a_batch(monkeypatch, block_at, said):
    """A model that blocks in a batch (the server's start-up warm-up's first, or the fourth batch timed) until a
    progress line comes: the lines were said only as batches ended, by the thread that waits for them, so none came
    (the model's wait ran out). Here the period's floor is 0.05 s, not 10."""
    from wok.bench import cli, profiler, runner
    from wok.bench.roofline import roofline_for

    monkeypatch.setattr(runner, "PLAIN_PROGRESS_MIN_S", 0.05)
    stderr = _Watched()
    monkeypatch.setattr(sys, "stderr", stderr)
    model = Blocking(stderr, block_at)
    cfg = profiler.ProfileConfig(batch_sizes=[1, 2], warmup=0, repeats=4)
    with cli._profile_progress("profiling blocking", 8) as progress:
        profiler.profile(model, cfg, lambda device: roofline_for(device, 1e12, 1e11), progress=progress)
    lines = (model.during or "").splitlines()
    assert lines and all(re.fullmatch(said, line) for line in lines), (model.during, stderr.getvalue()[-3000:])


# A python model whose load (its build) waits up to 10 s for a line on stderr (a tests' _Watched), keeping what was
# said meanwhile: a load that takes as long as the profile's first lines.
SLOW_LOAD_MODEL = """
import sys

from torch import nn


def build():
    stderr = sys.stderr
    mark = len(stderr.getvalue())
    stderr.wrote.clear()
    stderr.wrote.wait(10)
    stderr.during_load = stderr.getvalue()[mark:]
    return nn.Identity()
"""


def test_wok_profile_says_it_loads_the_model(tmp_path, monkeypatch):
    """The model was loaded before the progress began: a load of seconds (a large TorchScript file) said nothing, and
    the profile looked hung. Now a phase of the progress, said as the others (here with the period's floor at
    0.05 s, not 10): the model's, from its repository (until 2026-12-07 the repository's, every model of it built)."""
    from wok.__main__ import main
    from wok.bench import runner

    repo = tmp_path / "repo"
    write_python_model(repo / "slow", SLOW_LOAD_MODEL, 4)
    monkeypatch.setattr(runner, "PLAIN_PROGRESS_MIN_S", 0.05)
    stderr = _Watched()
    monkeypatch.setattr(sys, "stderr", stderr)
    argv = ["profile", "slow", "--model-repository", str(repo), "--batch-sizes", "1,2", "--warmup", "0"]
    assert main([*argv, "--repeats", "2", "--peak-flops", "1T", "--bandwidth", "1T"]) == 0, stderr.getvalue()
    lines = stderr.during_load.splitlines()
    said = rf"profiling slow: loading model 'slow' from model repository {re.escape(str(repo))}, \d+ s"
    assert lines and all(re.fullmatch(said, line) for line in lines), stderr.getvalue()[-3000:]


def test_wok_profile_says_a_long_name_cut_in_its_lines(tmp_path, monkeypatch):
    """The label held the model's name as typed: a name of 100,000 characters (a config may set one) was all of each
    line. Now cut as a refusal cuts a name (NAME_CHARS), its length after it; the phase's quoted name too."""
    from wok.__main__ import main
    from wok.bench import runner
    from wok.errors import NAME_CHARS

    name = "m" * 100_000
    repo = tmp_path / "repo"
    folder = write_python_model(repo / "long", SLOW_LOAD_MODEL, 4)
    (folder / "config.toml").write_text(f'name = "{name}"\n' + (folder / "config.toml").read_text())
    monkeypatch.setattr(runner, "PLAIN_PROGRESS_MIN_S", 0.05)
    stderr = _Watched()
    monkeypatch.setattr(sys, "stderr", stderr)
    argv = ["profile", name, "--model-repository", str(repo), "--batch-sizes", "1,2", "--warmup", "0"]
    assert main([*argv, "--repeats", "2", "--peak-flops", "1T", "--bandwidth", "1T"]) == 0, stderr.getvalue()[-3000:]
    lines = stderr.during_load.splitlines()
    cut, note = "m" * NAME_CHARS, re.escape("… (100,000 characters in all)")
    said = rf"profiling {cut}{note}: loading model '{cut}'{note} from model repository {re.escape(str(repo))}, \d+ s"
    assert lines and all(re.fullmatch(said, line) for line in lines), stderr.getvalue()[-3000:]


def test_wok_profiles_label_escapes_what_is_not_printable():
    """As a refusal shows a typed name: a newline split a line in two, a terminal's escape reached the terminal."""
    from wok.bench import cli

    assert cli._label_name("a\nb\x1b[2Jc") == "a\\nb\\x1b[2Jc"
    assert cli._label_name("mlp") == "mlp"


# A python model whose build keeps what stderr (a tests' _Watched) holds as it begins: the frames drawn before the load.
# While the bar is drawn rich stands a proxy of its own in sys.stderr (its redirect_stderr), the file behind it.
FRAMES_MODEL = """
import sys

from torch import nn


def build():
    stderr = sys.stderr.rich_proxied_file
    stderr.before_load = stderr.getvalue()
    return nn.Identity()
"""


def test_wok_profiles_bar_says_the_load_from_its_first_frame(tmp_path, monkeypatch):
    """The bar was begun with the label alone and the load's phase set after: its first frame said `profiling slow`,
    as if the profile ran. Now every frame drawn before the load says it. Drawn on a terminal's console writing to
    stderr (a buffer), as a pty would show it."""
    from rich.console import Console

    from wok.__main__ import main
    from wok.bench import runner

    repo = tmp_path / "repo"
    write_python_model(repo / "slow", FRAMES_MODEL, 4)
    stderr = _Watched()
    monkeypatch.setattr(sys, "stderr", stderr)
    console = Console(file=stderr, force_terminal=True, force_interactive=True, width=400)
    monkeypatch.setattr(runner, "live_bar_console", lambda: console)
    argv = ["profile", "slow", "--model-repository", str(repo), "--batch-sizes", "1,2", "--warmup", "0"]
    assert main([*argv, "--repeats", "2", "--peak-flops", "1T", "--bandwidth", "1T"]) == 0, stderr.getvalue()[-3000:]
    frames = stderr.before_load
    said = f"profiling slow: loading model 'slow' from model repository {repo} "
    assert frames.count("profiling slow") == frames.count(said) > 0, repr(frames)


def test_wok_profiles_bar_shows_the_model_and_the_repository_as_typed(monkeypatch):
    """Since the load is a phase, the bar's label and phase hold what the user typed: read as rich's markup, a `[/]`
    in the model's name raised MarkupError as the bar began (a traceback, exit 1, before the name was refused), and a
    `[bold]` in the repository's path was taken for a style and left out of it. Drawn here on a terminal's console
    writing to a buffer."""
    from rich.console import Console

    from wok.bench import cli, runner

    drawn = io.StringIO()
    console = Console(file=drawn, force_terminal=True, force_interactive=True, width=200)
    monkeypatch.setattr(runner, "live_bar_console", lambda: console)
    with cli._profile_progress("profiling m[/]", None) as progress:
        progress.phase("loading model repository /models/[bold]/x")
        progress.bar.refresh()
        assert "profiling m[/]: loading model repository /models/[bold]/x " in drawn.getvalue(), drawn.getvalue()
