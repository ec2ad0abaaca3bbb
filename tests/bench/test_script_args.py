"""The standalone scripts of bench/ refuse a bad option as argparse refuses one: a line that names
the option, exit 2, before any server starts or any measurement runs (not a traceback minutes in,
nor a run that measures nonsense and exits 0)."""

from __future__ import annotations

import importlib
import io
import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


class Started(BaseException):
    """A process started by a script that should have stopped at its arguments; a BaseException,
    so that a script's own `except Exception` around a server does not swallow it."""


@pytest.fixture
def nothing_started(monkeypatch):
    """Every process start fails the test, but git's (wok@REV names are resolved up front)."""
    real = subprocess.Popen
    # matplotlib's first import on a new machine lists its fonts with fc-list (a subprocess) to build
    # its cache: done before Popen is refused (the scripts import wok.bench.report, which imports it).
    importlib.import_module("matplotlib.font_manager")

    def popen(args, *a, **kw):
        argv = [args] if isinstance(args, str) else list(args)
        if Path(str(argv[0])).name != "git":
            raise Started(f"started {argv}")
        return real(args, *a, **kw)

    monkeypatch.setattr(subprocess, "Popen", popen)


@pytest.fixture
def bad_files(tmp_path) -> dict[str, str]:
    files = {
        "missing": tmp_path / "missing.json",
        "list": tmp_path / "list.json",
        "no_fit": tmp_path / "no_fit.json",
        "not_json": tmp_path / "not_json.json",
    }
    files["list"].write_text("[1, 2]\n")
    files["no_fit"].write_text(json.dumps({"schema": "wok.profile/1"}))
    files["not_json"].write_text("{nope\n")
    return {k: str(v) for k, v in files.items()}


COMPARE = ["--servers", "wok", "--steps", "100", "--reps", "1", "--host-probe", "0"]

# (script, arguments, what the message must hold); {name} is a path from `bad_files`.
CASES = [
    ("compare", [*COMPARE, "--step-duration=-1s"], "--step-duration: invalid duration '-1s'"),
    ("compare", [*COMPARE, "--step-duration", "1x"], "--step-duration: invalid duration '1x'"),
    ("compare", [*COMPARE, "--step-duration", "0"], "--step-duration: expected a duration > 0; got '0'"),
    ("compare", [*COMPARE, "--warmup", "soon"], "--warmup: invalid duration 'soon'"),
    ("compare", [*COMPARE, "--steps", "100,abc"], "--steps: QPS steps '100,abc': 'abc' is not a number"),
    ("compare", [*COMPARE, "--steps", "-100"], "--steps: QPS steps '-100': step 1: expected a number > 0; got -100"),
    ("compare", [*COMPARE, "--report-at", "x"], "--report-at: QPS steps 'x'"),
    ("compare", [*COMPARE, "--reps", "0"], "--reps: expected an integer >= 1; got 0"),
    ("compare", [*COMPARE, "--workers", "0"], "--workers: expected an integer >= 1; got 0"),
    ("compare", [*COMPARE, "--stop-factor", "0"], "--stop-factor: expected a number > 0; got 0"),
    ("compare", [*COMPARE, "--servers", "wok,wok"], "--servers: expected each server once; got wok more than once"),
    ("refusal_cost", ["--servers", "nosuch"], "--servers: expected wok, bare or wok@REV; got 'nosuch'"),
    ("refusal_cost", ["--servers", "wok,wok@no-such-rev"], "git does not know revision 'no-such-rev'"),
    ("refusal_cost", ["--servers", "bare,bare"], "--servers: expected each server once; got bare"),
    ("refusal_cost", ["--rows", "1,x"], "--rows: expected positive integers, comma-separated; got '1,x'"),
    ("refusal_cost", ["--reps", "0"], "--reps: expected an integer >= 1; got 0"),
    ("tune_check", ["--step-duration=-1s"], "--step-duration: invalid duration '-1s'"),
    ("tune_check", ["--steps=-100"], "--steps: QPS steps '-100': step 1: expected a number > 0"),
    ("tune_check", ["--reps", "0"], "--reps: expected an integer >= 1; got 0"),
    ("tune_check", ["--default", "32"], "--default: expected MAX_BATCH_SIZE,DELAY (e.g. 32,5ms); got '32'"),
    ("tune_check", ["--max-batch-sizes", "4,x"], "--max-batch-sizes: expected positive integers"),
    ("tune_check", ["--profile", "{missing}"], "--profile: {missing}: [Errno 2]"),
    ("tune_check", ["--profile", "{no_fit}"], "--profile: {no_fit}: not a readable wok.profile/1 document"),
    ("tune_check", ["--profile", "{list}"], "--profile: {list}: expected a JSON object; got list"),
    ("tune_check", ["--markdown", "{missing}"], "--markdown {missing}: [Errno 2]"),
    ("tune_check", ["--markdown", "{not_json}"], "--markdown {not_json}: Expecting property name"),
    ("tune_check", ["--markdown", "{no_fit}"], "--markdown {no_fit}: expected schema one of"),
    ("slo_compare", ["--profile", "{missing}"], "--profile: cannot read profile {missing}"),
    ("slo_compare", ["--profile", "{no_fit}"], "--profile: profile {no_fit}: no numeric fit.alpha_s"),
    ("slo_compare", ["--replot", "{missing}"], "--replot {missing}: [Errno 2]"),
    ("slo_compare", ["--replot", "{no_fit}"], "--replot {no_fit}: expected schema"),
    ("latency_breakdown", ["--duration=-1s"], "--duration: invalid duration '-1s'"),
    ("latency_breakdown", ["--duration", "0"], "--duration: expected a duration > 0; got '0'"),
    ("latency_breakdown", ["--qps", "-5"], "--qps: expected a rate > 0; got -5"),
    ("thread_sizing", ["--reps", "-1"], "--reps: expected an integer >= 1; got -1"),
    ("thread_sizing", ["--touch-lead-ms", "9"], "--touch-lead-ms: expected milliseconds > 0 and <= --gap-ms (5)"),
    ("cold_batch", ["--model", "nosuch"], "--model: expected a demo model with one FP32 input (mlp); got 'nosuch'"),
    ("cold_batch", ["--model", "encoder"], "--model encoder: expected a demo model with one FP32 input"),
    ("cold_batch", ["--batches", "-1"], "--batches: expected an integer >= 1; got -1"),
    ("cold_batch", ["--sizes", "0"], "--sizes: expected positive integers, comma-separated; got '0'"),
    ("cold_batch", ["--torch-threads", "0"], "--torch-threads: expected an integer >= 1; got 0"),
    ("metrics_overhead", ["--seconds", "-1", "--reps", "1"], "--seconds: expected a number > 0; got -1"),
    ("metrics_overhead", ["--reps", "0"], "--reps: expected an integer >= 1; got 0"),
    ("accept_rate", ["--duration", "-1"], "--duration: expected seconds > 0; got -1"),
    ("accept_rate", ["--drain", "0,2"], "--drain: expected 0 or 1, comma-separated; got '0,2'"),
    ("queue_memory", ["--requests", "-1"], "--requests: expected an integer >= 1; got -1"),
    ("queue_memory", ["--max-queue-size", "-1"], "--max-queue-size: expected integers >= 0 (0: none); got [-1]"),
    ("chaos", ["--seconds", "0"], "--seconds: expected a number > 0; got 0"),
    ("chaos", ["--rate=-5"], "--rate: expected requests/s > 0; got -5"),
    ("chaos", ["--streams=-1"], "--streams: expected an integer >= 0; got -1"),
    # Numbers in ASCII alone (wok.numerals): int() and float() read every script's digits ("٣" as 3).
    ("compare", [*COMPARE, "--reps", "٣"], "--reps: expected an integer; got '٣' (numbers are read in ASCII"),
    ("chaos", ["--seconds", "３.５"], "--seconds: expected a number; got '３.５' (numbers are read in ASCII"),
    ("tune_check", ["--cores", "٢"], "--cores: expected a number; got '٢' (numbers are read in ASCII"),
    ("refusal_cost", ["--rows", "١,٢"], "--rows: expected positive integers, comma-separated; got '١,٢'"),
    ("cold_batch", ["--sizes", "١"], "--sizes: expected positive integers, comma-separated; got '١'"),
    ("slo_compare", ["--request-sizes", "١,٢"], "--request-sizes: expected whole numbers >= 1 like 1,2,4,8; got '١,٢'"),
    ("slo_compare", ["--fixed", "٤,5ms"], "--fixed: expected MAX_BATCH_SIZE_IN_REQUESTS,DELAY, a whole number"),
    # A '_' between digits: tune_check's int() read "1_6" as 16 (and "٣" as 3), the others refused it with no reason.
    ("tune_check", ["--max-batch-sizes", "4,1_6"], "got '4,1_6' (numbers are read without '_': 1000, not 1_000)"),
    ("tune_check", ["--profile-sizes", "٣"], "got '٣' (numbers are read in ASCII: the digits 0-9)"),
    ("tune_check", ["--default", "3_2,5ms"], "got '3_2,5ms' (numbers are read without '_': 1000, not 1_000)"),
    ("refusal_cost", ["--rows", "1_0"], "got '1_0' (numbers are read without '_': 1000, not 1_000)"),
    ("cold_batch", ["--sizes", "1_6"], "got '1_6' (numbers are read without '_': 1000, not 1_000)"),
    ("slo_compare", ["--request-sizes", "1_6"], "got '1_6' (numbers are read without '_': 1000, not 1_000)"),
    ("slo_compare", ["--fixed", "1_6,5ms"], "got '1_6,5ms' (numbers are read without '_': 1000, not 1_000)"),
    # A size below 1 started servers (0: max_batch_size 0; -3: a server that exited 2, then a traceback).
    ("slo_compare", ["--fixed", "0,5ms"], "--fixed: expected MAX_BATCH_SIZE_IN_REQUESTS,DELAY, a whole number >= 1"),
    ("slo_compare", ["--fixed=-3,5ms"], "got '-3,5ms'"),
    ("slo_compare", ["--fixed", "8,5ms,3"], "got '8,5ms,3'"),
    ("slo_compare", ["--fixed", "8"], "got '8'"),
    ("slo_compare", ["--request-sizes", "0,1"], "--request-sizes: expected whole numbers >= 1 like 1,2,4,8; got '0,1'"),
    ("slo_compare", ["--request-sizes=-1,2"], "got '-1,2'"),
    ("slo_compare", ["--rows", "0"], "--rows: expected an integer >= 1; got 0"),
    ("slo_compare", ["--reps", "0"], "--reps: expected an integer >= 1; got 0"),
    ("slo_compare", ["--base-qps=-1.5"], "--base-qps: expected a finite number > 0; got -1.5"),
    ("slo_compare", ["--base-qps", "nan"], "--base-qps: expected a finite number > 0; got nan"),
    # One message named all four limits whichever was wrong, and not the value.
    ("linear_kernels", ["--reps", "0"], "--reps: expected an integer >= 1; got 0"),
    ("linear_kernels", ["--gap-ms=-1"], "--gap-ms: expected milliseconds >= 0; got -1"),
    ("linear_kernels", ["--max-rows-rss", "3"], "--max-rows-rss: expected an integer >= 4; got 3"),
    ("linear_kernels", ["--threads", "0"], "--threads: expected an integer >= 1; got 0"),
    # NaN passed `< 0`; time.sleep refused it once the first series had run.
    ("linear_kernels", ["--gap-ms", "nan"], "--gap-ms: expected milliseconds >= 0; got nan"),
    # One line named every option whichever was wrong, and not the value.
    ("stream_vs_unary", ["--requests", "0"], "--requests: expected an integer >= 1; got 0"),
    ("stream_vs_unary", ["--inflight", "0"], "--inflight: expected an integer >= 1; got 0"),
    (
        "stream_vs_unary",
        ["--inflight", "8", "--streams", "9"],
        "--streams: expected an integer from 1 to 8 (the streams share --inflight's requests); got 9",
    ),
    # Taken: the server started and warmed up, then the median of no runs failed (StatisticsError).
    ("stream_vs_unary", ["--rounds", "0"], "--rounds: expected an integer >= 1; got 0"),
    ("balancer_overhead", ["--servers", "0"], "--servers: expected an integer >= 1; got 0"),
    ("balancer_overhead", ["--rounds", "-1"], "--rounds: expected an integer >= 1; got -1"),
    # A duration's refusal named no option ("invalid duration 'xs'"): which of six?
    ("slo_compare", ["--warmup", "xs"], "--warmup: invalid duration 'xs'"),
    ("slo_compare", ["--delays", "1ms,x"], "--delays: invalid duration 'x'"),
    ("slo_compare", ["--fixed", "8,x"], "--fixed: invalid duration 'x'"),
]


@pytest.mark.parametrize(
    ("script", "argv", "message"),
    CASES,
    ids=[f"{s} {' '.join(a[len(COMPARE) :] if s == 'compare' else a)}" for s, a, _ in CASES],
)
def test_a_bad_option_exits_2_naming_it_before_anything_starts(
    script, argv, message, nothing_started, bad_files, capsys
):
    _exits_2_naming_it(importlib.import_module(f"wok.bench.{script}"), argv, message, bad_files, capsys)


def _exits_2_naming_it(mod, argv: list[str], message: str, bad_files: dict, capsys) -> None:
    argv = [a.format(**bad_files) for a in argv]
    with pytest.raises(SystemExit) as exc:
        mod.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert ": error: " in err[-1] and message.format(**bad_files) in err[-1]
    assert "Traceback" not in "\n".join(err)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("out", [io.StringIO, _Terminal], ids=["pipe", "terminal"])
def test_tune_check_report_prints_every_header_and_value_whole(out):
    from wok.bench import tune_check

    doc = json.loads((ROOT / "docs" / "results" / "tune-check-50ms-run8-cpu.json").read_text())
    file = out()
    tune_check.print_report(doc, file=file)
    text = file.getvalue()
    assert "…" not in text
    header = next(line for line in text.splitlines() if line.lstrip().startswith("offered"))
    for h in ("offered", "achieved", "P50 meas", "P50 sim", "P99 meas", "P99 sim", "error", "P99 steady",
              "P99 fixed", "error·f", "server P99", "outside P99", "overhead P99 sim", "below knee",
              "batch meas", "batch sim", "loop cores meas", "loop util sim", "other cores"):  # fmt: skip
        assert h in header
    # A data row is 19 cells without spaces in them; the titles and the verdict have more words.
    rows = [cells for cells in map(str.split, text.splitlines()) if len(cells) == 19 and cells[0].isdigit()]
    want = [r for run in doc["runs"] for r in run["comparison"]]
    assert len(rows) == len(want)
    for cells, r in zip(rows, want):
        assert cells[0] == f"{r['offered_qps']:g}"
        assert cells[6] == tune_check._pct(r["relative_error"])
        assert cells[13] == ("yes" if r["below_knee"] else "no")
        assert cells[18] == tune_check._num2(r["other_cores"])


# -- options checked since: compare's --arrival, gpu_check's counts ---------------------------------

BATCHES_EXPECTED = "expected an integer >= 2 (the overlap check needs a pair of batches)"
LATER_CASES = [
    ("compare", [*COMPARE, "--arrival", "nosuch"], "--arrival: arrivals 'nosuch': unknown process 'nosuch'"),
    (
        "compare",
        [*COMPARE, "--arrival", "burst:sigma=0"],
        "--arrival: arrivals 'burst:sigma=0': sigma: expected a duration > 0 s; got 0",
    ),
    ("compare", [*COMPARE, "--arrival", "poisson:x=1"], "--arrival: arrivals 'poisson:x=1': poisson takes no options"),
    ("compare", [*COMPARE, "--arrival", "trace:{missing}"], "--arrival: [Errno 2] No such file or directory"),
    ("gpu_check", ["--device", "cpu", "--rows", "0"], "--rows: expected an integer >= 1; got 0"),
    ("gpu_check", ["--device", "cpu", "--hidden", "-1"], "--hidden: expected an integer >= 1; got -1"),
    ("gpu_check", ["--device", "cpu", "--layers", "0"], "--layers: expected an integer >= 1; got 0"),
    *(
        # One batch left the overlap check no pair to judge: 0/0 pairs, the check FAIL on a GPU.
        ("gpu_check", ["--device", "cpu", "--batches", n], f"--batches: {BATCHES_EXPECTED}; got {n}")
        for n in ("0", "1")
    ),
]


@pytest.mark.parametrize(
    ("script", "argv", "message"),
    LATER_CASES,
    ids=[f"{s} {' '.join(a[len(COMPARE) :] if s == 'compare' else a)}" for s, a, _ in LATER_CASES],
)
def test_a_bad_arrival_or_count_exits_2_naming_it_before_anything_starts(
    script, argv, message, nothing_started, bad_files, capsys, monkeypatch
):
    mod = importlib.import_module(f"wok.bench.{script}")
    if script == "gpu_check":  # no process to start: the model built (on the device) is the start

        def build_demo(*a, **kw):
            raise Started("built the model")

        monkeypatch.setattr(mod, "build_demo", build_demo)
    _exits_2_naming_it(mod, argv, message, bad_files, capsys)


# -- values shown as user text is everywhere (errors.quoted_name: quoted, escaped, cut) ----------------

LONG = "x" * 100_000
LONG_SHOWN = f"'{'x' * 200}'… (100,000 characters in all)"
SHOWN_CASES = [
    # argparse's own refusals showed the value whole.
    ("compare", [*COMPARE, "--reps", LONG], f"--reps: expected an integer; got {LONG_SHOWN}"),
    ("chaos", ["--seconds", LONG], f"--seconds: expected a number; got {LONG_SHOWN}"),
    ("cold_batch", ["--gap", LONG], f"--gap: invalid parse_duration value: {LONG_SHOWN}"),
    ("gpu_check", ["--json", ""], "--json: expected a path; got ''"),
    ("thread_sizing", ["a\nb"], r"unrecognized arguments: a\nb"),
    # The scripts' own, through repr.
    ("compare", [*COMPARE, "--servers", LONG], f"unknown server(s) {LONG_SHOWN}; known: "),
    ("compare", [*COMPARE, "--step-duration", "0" * 100_000], "--step-duration: expected a duration > 0; got '000"),
    ("refusal_cost", ["--rows", LONG], f"--rows: expected positive integers, comma-separated; got {LONG_SHOWN}"),
    ("accept_rate", ["--drain", LONG], f"--drain: expected 0 or 1, comma-separated; got {LONG_SHOWN}"),
    (
        "batcher_loop_cost",
        ["--rev", LONG],
        f"--rev: git does not know revision {LONG_SHOWN}",
    ),
    ("latency_breakdown", ["--duration", "0" * 100_000], "--duration: expected a duration > 0; got '000"),
    # shlex's refusal came alone: "No closing quotation".
    ("compare", [*COMPARE, "--wok-variant", "wok-x='--torch-threads"], "--wok-variant 'wok-x='--torch-threads': No"),
]


@pytest.mark.parametrize(
    ("script", "argv", "message"),
    SHOWN_CASES,
    ids=[f"{s} {' '.join(a[len(COMPARE) :] if s == 'compare' else a)[:30]}" for s, a, _ in SHOWN_CASES],
)
def test_a_refused_value_is_one_short_line_quoted_as_names_are(script, argv, message, nothing_started, capsys):
    with pytest.raises(SystemExit) as exc:
        importlib.import_module(f"wok.bench.{script}").main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    last = err.splitlines()[-1]
    assert ": error: " in last and message in last, last[:400]
    assert len(last) < 600 and "\x1b" not in err, len(last)
