"""`wok bench ramp --soak` against a real server: a long step shows progress off a terminal, an RSS
that no scrape read says why, and a --rows the model cannot take is refused before the run."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, start_http_server

from wok.bench.runner import plain_progress_every, plain_progress_line
from wok.bench.soak import RSS, RssSampler

from .conftest import WEB_PAGE, serving

pytestmark = pytest.mark.timeout(60)


# `wok` as `python -m wok` runs it, with the floor of the plain progress lines' period set to
# sys.argv[1] seconds: the schedule itself is tested as a function (test_the_plain_progress_schedule).
WOK_WITH_PROGRESS_FLOOR = """
import sys

from wok.bench import runner
from wok.entry import main

runner.PLAIN_PROGRESS_MIN_S = float(sys.argv.pop(1))
sys.exit(main())
"""


def _start(tmp_path, target: str, *args: str, progress_floor_s: float | None = None) -> subprocess.Popen:
    """`wok bench ramp` in a child, its stderr a file: not a terminal, as under nohup or in CI.
    `progress_floor_s`: PLAIN_PROGRESS_MIN_S in the child (WOK_WITH_PROGRESS_FLOOR)."""
    wok = [sys.executable, "-m", "wok"]
    if progress_floor_s is not None:
        wok = [sys.executable, "-c", WOK_WITH_PROGRESS_FLOOR, str(progress_floor_s)]
    cmd = [*wok, "bench", "ramp", "--target", target, "--workers", "1", *args]
    with open(tmp_path / "stdout", "w") as out, open(tmp_path / "stderr", "w") as err:
        return subprocess.Popen(cmd, stdout=out, stderr=err)


def _ended(proc: subprocess.Popen, tmp_path) -> tuple[int, str, str]:
    """Its exit status, stdout and stderr once it has ended (killed, and the test failed, 50 s on)."""
    try:
        status = proc.wait(timeout=50)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"still running 50 s on:\n{(tmp_path / 'stderr').read_text()[-3000:]}") from None
    return status, (tmp_path / "stdout").read_text(), (tmp_path / "stderr").read_text()


def _bench(tmp_path, target: str, *args: str) -> tuple[int, str, str]:
    return _ended(_start(tmp_path, target, *args), tmp_path)


LONG_STEP_TEST = "test_a_long_step_off_a_terminal_prints_a_bounded_number_of_progress_lines"
# The long step's soak and the floor of its progress lines' period in its child: as the product's
# 10 s floor in an 11 s soak, one line is due, but 2 s before the end rather than 1 s (a tick late
# on a slow host).
LONG_STEP_S, LONG_STEP_FLOOR_S = 4, 2.0


@pytest.fixture(scope="module", autouse=True)
def long_step(request, tmp_path_factory):
    """The soak of LONG_STEP_TEST, started as the module starts when that test is selected: its
    progress line cannot come before LONG_STEP_FLOOR_S, and the module's other runs start in that
    wait (its test is the module's last). It offers 10 QPS, theirs 16 QPS for 1 s or nothing to this
    server, and none of their checks counts the server's requests."""
    selected = {item.originalname for item in request.session.items if getattr(item, "module", None) is request.module}
    if LONG_STEP_TEST not in selected:
        yield None
        return
    server = request.getfixturevalue("bench_server")
    d = tmp_path_factory.mktemp("long_step")
    args = ["--metrics-url", "none", "--capacity", "10", "--soak", f"{LONG_STEP_S}s", "--soak-load", "100%"]
    proc = _start(d, server.target, *args, progress_floor_s=LONG_STEP_FLOOR_S)
    try:
        yield proc, d
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_soak_whose_metrics_url_never_answers_says_so_once(bench_server, tmp_path):
    """A wrong --metrics-url: the report read "RSS: - → -" with no word of why. A wrong path on the
    right server answers 404, which is said (it was "no answer", as if the server were down)."""
    url = bench_server.http_url() + "/no-such-path"
    args = ["--metrics-url", url, "--capacity", "20", "--soak", "1s", "--soak-window", "0.5s", "--rss-every", "0.2s"]
    status, out, err = _bench(tmp_path, bench_server.target, *args, "--json", str(tmp_path / "soak.json"))
    assert status == 0, err
    (warning,) = [w for w in json.loads((tmp_path / "soak.json").read_text())["warnings"] if "RSS" in w]
    assert warning.startswith(f"RSS was not read from {url} ({RSS}): answered HTTP 404 to each of its ")
    assert (out + err).count(warning) == 1


@pytest.fixture
def metrics_without_rss():
    """A real Prometheus endpoint whose registry has no process collector."""
    registry = CollectorRegistry()
    Counter("unrelated", "a metric that is not the RSS", registry=registry).inc()
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    yield f"http://127.0.0.1:{server.server_port}/metrics"
    server.shutdown()
    thread.join(5)


def test_a_server_without_the_rss_metric_is_named_with_the_metric(metrics_without_rss, bench_server):
    answering = bench_server.http_url() + "/metrics"
    sampler = RssSampler([metrics_without_rss, answering], every_s=1.0)
    sampler.sample()
    sampler.sample()
    assert sampler.unread() == [
        f"RSS was not read from {metrics_without_rss} ({RSS}): its answers had no {RSS} "
        "(a server that does not export process metrics?)"
    ]


def test_a_url_that_answers_no_prometheus_text_or_nothing_is_said_as_such():
    """A web page at --metrics-url read "no answer to any of its scrapes": the operator looked for a
    server down, not for a wrong URL. Nothing listening still reads "no answer"."""

    with serving(*WEB_PAGE) as page_url, socket.socket() as held:  # bound, never listening: nothing answers there
        held.bind(("127.0.0.1", 0))
        nothing = f"http://127.0.0.1:{held.getsockname()[1]}/metrics"
        sampler = RssSampler([page_url, nothing], every_s=1.0)
        sampler.sample()
        sampler.sample()
    assert sampler.unread() == [
        f"RSS was not read from {page_url} ({RSS}): answered, but not Prometheus text to each of its 2 scrapes "
        "(a wrong --metrics-url?)",
        f"RSS was not read from {nothing} ({RSS}): no answer to any of its 2 scrapes (a wrong --metrics-url?)",
    ]


def test_rows_above_the_models_max_batch_size_are_refused_before_the_run(bench_server, tmp_path):
    """mlp takes 32 rows: --rows 33 ran the capacity ramp's first step, every request refused, and
    only then exited 2 (with --capacity, a whole soak of refusals)."""
    out = tmp_path / "soak.json"
    args = ["--metrics-url", "none", "--model", "mlp", "--rows", "33", "--steps", "10", "--step-duration", "0.5s"]
    status, _, err = _bench(tmp_path, bench_server.target, *args, "--soak", "60s", "--json", str(out))
    assert status == 2, err
    assert err.endswith(
        "wok bench: --rows 33: model 'mlp' takes at most 32 rows per request (its max_batch_size); the server would "
        "refuse every request\n"
    )
    assert "step 1/1" not in err and not out.exists()


@pytest.fixture
def bare_target():
    """bench/peers/bare_server.py: a real gRPC server with ModelMetadata but no ModelConfig (UNIMPLEMENTED)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    bare = Path(__file__).resolve().parents[2] / "bench" / "peers" / "bare_server.py"
    server = subprocess.Popen([sys.executable, str(bare), str(port)], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline() == "BARE_READY\n"
        yield f"127.0.0.1:{port}"
    finally:
        server.kill()
        server.communicate()


def test_rows_unchecked_for_a_server_without_model_config_is_said_and_the_ramp_runs(bare_target, tmp_path):
    """A ModelConfig answered UNIMPLEMENTED skips the --rows check: the ramp ran with no word of it
    (then with one on stderr alone)."""
    out = tmp_path / "ramp.json"
    args = ["--metrics-url", "none", "--model", "mlp", "--rows", "40", "--steps", "20", "--step-duration", "0.3s"]
    status, _, err = _bench(tmp_path, bare_target, *args, "--warmup", "0.1s", "--json", str(out))
    assert status == 0, err
    assert err.startswith(
        "wok bench: planned: 1 step × (0.1 s warm-up + 0.3 s) = 0.4 s (less if a step ends the ramp: --stop-factor, "
        "or no request OK)\n"
        "--rows 40: not checked against model 'mlp''s max_batch_size (the server answers ModelConfig "
        "UNIMPLEMENTED); above it, the first step's requests are refused\n"
    ), err
    doc = json.loads(out.read_text())
    (step,) = doc["steps"]
    assert step["ok"] > 0 and not step["errors"]
    # In the result too, where a reader of the JSON alone finds it.
    assert err.splitlines()[1] in doc["warnings"]


def test_the_plain_progress_schedule():
    """Off a terminal, a step's lines come every tenth of the step, no oftener than every 10 s and no
    rarer than every 60 s, none at or after its end (ticks every 0.2 s, as WorkerPool.finish's)."""
    assert [plain_progress_every(t) for t in (0.5, 11, 100, 200, 600, 601, 86400)] == [10, 10, 10, 20, 60, 60, 60]

    def lines(total_s: float, ticks_s: list[float]) -> list[str]:
        due, out = 0.0, []
        for t in ticks_s:
            line, due = plain_progress_line("step 1/1", t, total_s, due)
            out += [line] if line is not None else []
        return out

    def every_tick(total_s: float) -> list[float]:
        return [i / 5 for i in range(int(total_s * 5) + 3)]  # to past the end

    assert lines(9.9, every_tick(9.9)) == []
    assert lines(11, every_tick(11)) == ["step 1/1: 10 s of 11 s (91%)"]
    assert lines(200, every_tick(200)) == [f"step 1/1: {t} s of 200 s ({t // 2}%)" for t in range(20, 200, 20)]
    assert len(lines(3600, every_tick(3600))) == 59 and lines(3600, [60.1])[0] == "step 1/1: 60 s of 3600 s (2%)"
    # A tick late by more than a period shows the latest one alone, and the next is a period after it.
    assert lines(200, [19.9, 61.0, 79.9, 80.0]) == ["step 1/1: 61 s of 200 s (30%)", "step 1/1: 80 s of 200 s (40%)"]


# Last in the module: its run started with the module and ran beside the others' (`long_step`).
def test_a_long_step_off_a_terminal_prints_a_bounded_number_of_progress_lines(long_step):
    """An 11 s soak printed nothing between its start line and its end: one line comes at 10 s (a
    tenth of the step, but no oftener than every 10 s, test_the_plain_progress_schedule). Here the
    same, scaled down in its child: a 4 s soak, a floor of 2 s, one line at 2 s or later."""
    status, _, err = _ended(*long_step)
    assert status == 0, err
    lines = err.splitlines()
    start = lines.index(f"step 1/1: 10 QPS offered for {LONG_STEP_S} s (+0 s warm-up)")
    end = next(i for i, line in enumerate(lines) if line.startswith("step 1/1: achieved "))
    progress = [m for line in lines if (m := re.fullmatch(rf"step 1/1: (\d+) s of {LONG_STEP_S} s \(\d+%\)", line))]
    assert len(progress) == 1, err
    assert start < lines.index(progress[0].group(0)) < end
    assert int(progress[0].group(1)) >= LONG_STEP_FLOOR_S, err
