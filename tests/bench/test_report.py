"""The bench's outputs: JSON, CSV, PNG plots, one offline HTML page (rendered by headless Chromium), the table."""

from __future__ import annotations

import base64
import csv
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from wok.bench import report
from wok.bench.analysis import LATENCY_KEYS, ramp_result, step_result

ROOT = Path(__file__).resolve().parents[2]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SLO_MS = 200.0


def synthetic_step(qps: float, capacity: float, rng: np.random.Generator, duration: float = 20.0) -> dict:
    """A server of `capacity` QPS: below it ~5 ms, past it a backlog that grows through the step."""
    intended = np.sort(rng.uniform(0, duration, rng.poisson(qps * duration)))
    sent = intended + rng.exponential(0.0001, intended.size)
    service = rng.lognormal(np.log(0.005), 0.3, intended.size)
    backlog = np.maximum(0.0, intended * (qps - capacity) / capacity)  # seconds of queue ahead
    done = sent + service + backlog
    codes = np.array(["OK"] * intended.size, dtype=object)
    if qps > capacity:
        codes[rng.random(intended.size) < 0.02] = "RESOURCE_EXHAUSTED"
        # What completes within the window is what the server could do.
        late = done > duration + 1.0
        codes[late] = "DEADLINE_EXCEEDED"
        done[late] = np.nan
    server = {
        "queue_ms": {"mean": 1.0 + 1e3 * backlog.mean(), "p99": 2.0 + 1e3 * np.percentile(backlog, 99)},
        "mean_batch_size": min(64.0, qps / 50),
        "flush_reasons": {"size": 10, "delay": 90},
        "stages_ms": {"queue": 1.0, "compute": 3.0},
    }
    return step_result(
        offered_qps=qps,
        duration_s=duration,
        intended_s=intended,
        sent_s=sent,
        done_s=done,
        codes=codes.astype(str),
        server=server,
    )


def synthetic_result(timeline: bool = True) -> dict:
    rng = np.random.default_rng(7)
    offers = [50, 100, 200, 400, 800]
    steps = [synthetic_step(q, 250.0, rng) for q in offers]
    tl = None
    if timeline:
        t = list(range(len(offers) * 20))
        offered = [offers[i // 20] for i in t]
        achieved = [min(o, 250) for o in offered]
        p99 = [5.0 if o <= 250 else 5.0 + 50 * (i % 20) for i, o in zip(t, offered)]
        p99[3] = None  # a second without completions
        tl = {"t_s": t, "offered": offered, "achieved": achieved, "p99_ms": p99}
    config = {
        "target": "127.0.0.1:8001",
        "models": [["mlp", 1.0]],
        "steps": offers,
        "step_duration_s": 20.0,
        "warmup_s": 2.0,
        "arrival": "poisson",
        "sizes": "fixed:16",
        "workers": 2,
        "source": "bench",
    }
    return ramp_result(steps=steps, slo_p99_ms=SLO_MS, config=config, timeline=tl)


@pytest.fixture(scope="module")
def result() -> dict:
    r = synthetic_result()
    # The synthetic server saturates at 250 QPS: 400 offered is both the knee and the first miss.
    assert r["knee_qps"] == 400 and r["max_qps_under_slo"] == 200, [
        (s["offered_qps"], s["achieved_qps"], s["latency_ms"]["p99"]) for s in r["steps"]
    ]
    return r


@pytest.fixture(scope="module")
def html(result) -> str:
    # A render draws every plot (most of a second here): the tests that read the default page share one.
    return report.render_html(result)


# ---------------------------------------------------------------------------- JSON / CSV


def test_json_round_trip_turns_nan_into_null(result, tmp_path):
    r = dict(result)
    empty = step_result(
        offered_qps=1600,
        duration_s=1.0,
        intended_s=np.array([0.1]),
        sent_s=np.array([0.1]),
        done_s=np.array([np.nan]),
        codes=np.array(["UNAVAILABLE"]),
    )
    r["steps"] = [*result["steps"], empty]
    path = tmp_path / "r.json"
    report.write_json(r, path)
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    back = json.loads(text)
    assert back["schema"] == "wok.bench/2"
    assert list(back) == list(r)  # the builder's key order
    assert text.startswith('{\n  "schema": "wok.bench/2",\n')
    last = back["steps"][-1]
    assert all(last["latency_ms"][k] is None for k in LATENCY_KEYS)
    assert last["errors"] == {"UNAVAILABLE": 1} and last["littles_law"]["relative_error"] is None
    first = back["steps"][0]
    assert first["latency_ms"]["p99"] == pytest.approx(result["steps"][0]["latency_ms"]["p99"])
    assert back["knee_qps"] == 400 and back["max_qps_under_slo"] == 200
    # Written twice, the same bytes: a result diffs cleanly.
    report.write_json(json.loads(text), tmp_path / "again.json")
    assert (tmp_path / "again.json").read_text() == text


def test_json_takes_numpy_values():
    text = report.to_json({"a": np.float64("nan"), "b": np.int64(3), "c": np.array([1.5, np.inf]), "d": (1, 2)})
    assert json.loads(text) == {"a": None, "b": 3, "c": [1.5, None], "d": [1, 2]}


def test_csv_has_one_row_per_step(result, tmp_path):
    path = tmp_path / "r.csv"
    report.write_csv(result, path)
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    with open(path, newline="") as f:
        header = next(csv.reader(f))
    assert header[:2] == ["offered_qps", "achieved_qps"]
    for col in ("requests", "ok", "success_rate", "queue_mean_ms", "queue_p99_ms", "mean_batch_size"):
        assert col in header
    assert "dispatch_lag_p99_ms" in header
    assert [f"latency_{k}_ms" for k in ("p50", "p90", "p95", "p99", "p999", "max")] == [
        h for h in header if h.startswith("latency_p") or h == "latency_max_ms"
    ]
    assert [float(r["offered_qps"]) for r in rows] == [50, 100, 200, 400, 800]
    for r, s in zip(rows, result["steps"]):
        assert int(r["requests"]) == s["requests"] and int(r["ok"]) == s["ok"]
        assert float(r["latency_p99_ms"]) == pytest.approx(s["latency_ms"]["p99"])
        assert float(r["mean_batch_size"]) == pytest.approx(s["mean_batch_size"])


def test_csv_leaves_missing_figures_empty(tmp_path):
    step = step_result(
        offered_qps=10,
        duration_s=1,
        intended_s=np.array([0.0]),
        sent_s=np.array([0.0]),
        done_s=np.array([np.nan]),
        codes=np.array(["UNAVAILABLE"]),
    )
    report.write_csv({"steps": [step]}, tmp_path / "e.csv")
    with open(tmp_path / "e.csv", newline="") as f:
        (row,) = list(csv.DictReader(f))
    assert row["latency_p99_ms"] == "" and row["queue_p99_ms"] == "" and row["errors"] == "1"


def test_csv_counts_the_requests_never_sent_in_a_last_column(tmp_path):
    """A step's `not_sent` (docs/bench-schema.md) is appended after the columns a reader already
    knows, so one reading by position keeps working; a step without it sent everything: 0."""
    intended = np.array([0.1, 0.2, 0.3])
    sent = np.array([0.1, np.nan, np.nan])
    codes = np.array(["OK", "NOT_SENT", "NOT_SENT"])
    cut = step_result(offered_qps=3, duration_s=1, intended_s=intended, sent_s=sent, done_s=sent + 0.01, codes=codes)
    whole = step_result(
        offered_qps=1, duration_s=1, intended_s=intended[:1], sent_s=sent[:1], done_s=sent[:1] + 0.01, codes=codes[:1]
    )
    report.write_csv({"steps": [cut, whole]}, tmp_path / "n.csv")
    with open(tmp_path / "n.csv", newline="") as f:
        header, *rows = list(csv.reader(f))
    # The columns of before in their order (a reader by position keeps its own), then the new one.
    assert ",".join(header) == (
        "offered_qps,achieved_qps,phase,requests,ok,errors,success_rate,latency_mean_ms,latency_p50_ms,"
        "latency_p90_ms,latency_p95_ms,latency_p99_ms,latency_p999_ms,latency_max_ms,queue_mean_ms,queue_p99_ms,"
        "loop_lag_p99_ms,mean_batch_size,dispatch_lag_p99_ms,not_sent"
    )
    by_rate = {float(r[0]): dict(zip(header, r)) for r in rows}
    assert (by_rate[3.0]["requests"], by_rate[3.0]["errors"], by_rate[3.0]["not_sent"]) == ("1", "0", "2")
    assert (by_rate[1.0]["requests"], by_rate[1.0]["not_sent"]) == ("1", "0")


def test_every_committed_ramp_csv_has_the_writers_columns(tmp_path):
    """docs/results/ramp-mlp.csv kept the header of 2026-11-29 after CSV_COLUMNS gained `loop_lag_p99_ms` in the
    middle (and `not_sent` at the end): a reader of the committed example by position read `mean_batch_size` where a
    fresh run has `loop_lag_p99_ms`. Every CSV under docs/results whose header starts as a ramp's has the writer's
    header, and one beside its JSON is that JSON as `write_csv` writes it now."""
    ramps = []
    for path in sorted((Path(__file__).parents[2] / "docs" / "results").rglob("*.csv")):
        with open(path, newline="", encoding="utf-8") as f:
            header = next(csv.reader(f), [])
        if header[:2] != ["offered_qps", "achieved_qps"]:
            continue
        ramps.append(path.name)
        assert tuple(header) == report.CSV_COLUMNS, path
        beside = path.with_suffix(".json")
        if beside.exists():
            report.write_csv(report.read_json_object(beside), tmp_path / path.name)
            assert (tmp_path / path.name).read_bytes() == path.read_bytes(), path
    assert "ramp-mlp.csv" in ramps


_PNG_DATA = re.compile(r'src="data:image/png;base64,([^"]*)"')


def test_every_committed_ramp_html_is_its_json_as_rendered_now(tmp_path):
    """docs/results/ramp-mlp.html was a render of 2026-11-29 (no loop p99 column, no verdict note) beside a JSON that
    renders otherwise now. A page under docs/results beside its JSON is that JSON as `write_html` writes it now, but for
    the plots' PNG bytes, which follow the matplotlib installed (its version is in each PNG): each is a PNG, as many."""
    pages = []
    for path in sorted((ROOT / "docs" / "results").rglob("*.html")):
        beside = path.with_suffix(".json")
        if not beside.exists():
            continue
        pages.append(path.name)
        report.write_html(report.read_json_object(beside), tmp_path / path.name)
        committed, fresh = path.read_text(encoding="utf-8"), (tmp_path / path.name).read_text(encoding="utf-8")
        assert _PNG_DATA.sub('src="data:image/png;base64,"', committed) == _PNG_DATA.sub(
            'src="data:image/png;base64,"', fresh
        ), path
        images = _PNG_DATA.findall(committed)
        assert len(images) == len(_PNG_DATA.findall(fresh)), path
        assert all(base64.b64decode(b64)[:8] == PNG_SIGNATURE for b64 in images), path
    assert "ramp-mlp.html" in pages


# ---------------------------------------------------------------------------- plots


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and len(data) > 1000


@pytest.mark.parametrize("plot", [report.plot_latency_vs_offered, report.plot_throughput, report.plot_timeline])
def test_each_plot_writes_a_png(plot, result, tmp_path):
    path = tmp_path / f"{plot.__name__}.png"
    plot(result, path)
    assert_png(path)


@pytest.mark.parametrize("plot", [report.plot_latency_vs_offered, report.plot_throughput, report.plot_timeline])
def test_plots_survive_a_sparse_result(plot, tmp_path):
    """No timeline, no knee, no passing step, nulls from JSON: each still draws a figure."""
    r = json.loads(report.to_json(synthetic_result(timeline=False)))
    r["knee_qps"] = None
    r["max_qps_under_slo"] = None
    r["steps"][0]["latency_ms"] = dict.fromkeys(LATENCY_KEYS)
    plot(r, tmp_path / "p.png")
    assert_png(tmp_path / "p.png")
    plot({"steps": [], "slo_p99_ms": 100}, tmp_path / "empty.png")
    assert_png(tmp_path / "empty.png")


def test_steps_that_answered_nothing_stay_on_the_plots():
    """A step at 0 QPS achieved, or without a latency, vanished: a log axis has no 0, and the
    latency plot's x axis closed around the verdict marks alone."""
    none = dict.fromkeys(LATENCY_KEYS)
    steps = [{"offered_qps": q, "achieved_qps": 0.0, "latency_ms": none} for q in (0.1, 0.2, 100.0)]
    r = {"steps": steps, "slo_p99_ms": 50.0, "knee_qps": 60.0, "max_qps_under_slo": None}
    ax = report.throughput_figure(r).axes[0]
    assert ax.get_yscale() == "linear" and ax.get_ylim()[0] <= 0 <= ax.get_ylim()[1]
    for offers in ((0.1, 0.2, 100.0), (30.0, 60.0)):  # log x, and linear (it closed to 57-63 around the knee)
        r["steps"] = [{**steps[0], "offered_qps": q} for q in offers]
        ax = report.latency_figure(r).axes[0]
        assert ax.get_xlim()[0] <= offers[0] and ax.get_xlim()[1] >= offers[-1], (offers, ax.get_xlim())
    r["steps"] = [{**st, "achieved_qps": st["offered_qps"]} for st in steps]  # all answered: log, as before
    assert report.throughput_figure(r).axes[0].get_yscale() == "log"


def test_a_plot_can_go_to_a_file_object(result):
    buf = io.BytesIO()
    report.plot_throughput(result, buf)
    assert buf.getvalue()[:8] == PNG_SIGNATURE


def test_plotting_leaves_no_pyplot_figures(result, tmp_path):
    report.plot_latency_vs_offered(result, tmp_path / "a.png")
    if "matplotlib.pyplot" in sys.modules:
        import matplotlib.pyplot as plt

        assert plt.get_fignums() == []


# ---------------------------------------------------------------------------- HTML

EXTERNAL = re.compile(
    r"""(src|href|action|poster|data)\s*=\s*["']?\s*(https?:|//|file:)|url\(|@import|<script|<link""", re.I
)


def test_html_is_one_self_contained_file(result, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    report.write_html(result, out / "report.html", title="mlp <ramp> & co")
    assert [p.name for p in out.iterdir()] == ["report.html"]  # no side files
    text = (out / "report.html").read_text()
    assert 'src="http' not in text and 'href="http' not in text
    assert not EXTERNAL.search(text), EXTERNAL.search(text)
    assert text.count('src="data:image/png;base64,') == 3
    for b64 in re.findall(r'src="data:image/png;base64,([^"]+)"', text):
        assert base64.b64decode(b64)[:8] == PNG_SIGNATURE
    assert "<style>" in text and "Content-Security-Policy" in text
    assert "mlp &lt;ramp&gt; &amp; co" in text  # the title is escaped
    # The verdicts.
    assert "max QPS under SLO" in text and ">200<" in text
    assert "knee" in text and "400 QPS" in text
    assert "P99 ≤ 200 ms" in text
    for w in result["warnings"]:
        assert report._e(w) in text
    # The table: one row per step, the failing ones marked.
    table = text[text.index('<table class="steps">') : text.index("</table>", text.index('<table class="steps">'))]
    assert table.count("<tr") == 1 + len(result["steps"])
    assert table.count(">FAIL<") == 2 and table.count(">pass<") == 3
    assert "RESOURCE_EXHAUSTED" in table
    # The config.
    assert "127.0.0.1:8001" in text and "poisson" in text


def _html_steps(text: str) -> tuple[list[str], list[list[str]]]:
    """The HTML report's steps table: its header cells and each row's cells."""
    table = text[text.index('<table class="steps">') : text.index("</table>", text.index('<table class="steps">'))]
    head = re.findall(r"<th[^>]*>([^<]*)</th>", table)
    rows = [re.findall(r"<td[^>]*>([^<]*)</td>", row) for row in re.findall(r"<tr[^>]*>(.*?)</tr>", table)[1:]]
    return head, rows


def test_the_html_steps_table_of_a_simulation_leaves_out_what_a_simulation_has_no_figure_for(html):
    """The text table left out `loop p99` and `lag p99` of a `wok simulate` result; the HTML report showed its
    event-loop lag as "-", its dispatch lag as 0.00 and its late sends as 0 at every step: figures of an event loop
    and a load generator a simulation does not have."""
    from wok.bench.simulate import BatcherModel, SimConfig, simulate_ramp

    model = BatcherModel(alpha_s=1e-3, beta_s=1e-4, max_batch_size=8, max_queue_delay_s=2e-3)
    simulated = simulate_ramp(SimConfig(model=model, steps=[100.0, 200.0], step_duration_s=1.0))
    head, rows = _html_steps(report.render_html(simulated))
    assert not {"loop p99 ms", "lag p99 ms", "late sends"} & set(head), head
    assert head[-5:] == ["queue mean ms", "queue p99 ms", "mean batch", "SLO", "errors"], head
    assert len(rows) == 2 and all(len(row) == len(head) for row in rows)
    # A measured ramp keeps them, in their place.
    head, rows = _html_steps(html)
    assert head[-8:] == ["queue mean ms", "queue p99 ms", "loop p99 ms", "mean batch", "lag p99 ms", "late sends",
                         "SLO", "errors"]  # fmt: skip
    assert all(len(row) == len(head) for row in rows)


def test_html_default_title_names_model_and_target(html):
    assert "<title>wok bench: mlp on 127.0.0.1:8001</title>" in html


def test_html_says_so_when_there_are_no_warnings(result):
    text = report.render_html({**result, "warnings": []})
    assert '<p class="ok-note">No warnings: the generator kept its schedule at every step.</p>' in text


def test_the_html_ok_note_of_a_simulation_names_no_generator():
    """A `wok simulate` result without warnings was told "the generator kept its schedule at every step": a
    simulation has no generator, and sends every request at its scheduled time."""
    from wok.bench.simulate import BatcherModel, SimConfig, simulate_ramp

    model = BatcherModel(alpha_s=1e-3, beta_s=1e-4, max_batch_size=8, max_queue_delay_s=2e-3)
    simulated = simulate_ramp(SimConfig(model=model, steps=[100.0, 200.0], step_duration_s=1.0))
    text = report.render_html({**simulated, "warnings": []})
    notes = re.findall(r'<p class="ok-note">([^<]*)</p>', text)
    assert notes == ["No warnings (a simulation has no load generator: it sends each request at its scheduled time)."]


def test_html_writes_a_lone_surrogate_in_the_config_as_its_backslash_escape(result, tmp_path):
    # Undecodable bytes of a command-line value reach the config as lone surrogates (surrogateescape),
    # which no UTF-8 file can hold: the page shows their escape, as the JSON does, rather than fail.
    config = {**result["config"], "note": "a\udcffb", "sizes": ["fixed:\udcfe"]}
    doc = {**result, "config": config, "warnings": ["w\udcfd"]}
    path = tmp_path / "report.html"
    report.write_html(doc, path, title="t\udcfc")
    text = path.read_bytes().decode("utf-8")  # strict: the file is valid UTF-8
    table = text[text.index('<table class="config">') :]
    assert '<th class="l">note</th><td class="l">a\\udcffb</td>' in table
    assert "fixed:\\udcfe" in table
    assert "<li>w\\udcfd</li>" in text and "<title>t\\udcfc</title>" in text
    # The page as rendered, for a caller that writes it itself, encodes as well.
    report.render_html(doc).encode("utf-8")


def find_chromium() -> str | None:
    for name in ("/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser")):
        if name and os.path.exists(name):
            return name
    return None


def wait_for_apt_install(log: Path = Path("/tmp/apt-chromium.log"), timeout: float = 600.0) -> None:
    """On a development machine chromium may still be installing when this test starts."""
    deadline = time.monotonic() + timeout
    while log.exists() and time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        if re.search(r"^rc=\d+", text, re.M):
            return
        time.sleep(5)


def test_html_renders_in_headless_chromium(html, tmp_path):
    if find_chromium() is None:
        wait_for_apt_install()
    chromium = find_chromium()
    if chromium is None:
        pytest.skip("Debian's chromium package is not installed (.ci/run installs it)")
    html_path = tmp_path / "report.html"
    html_path.write_text(html, encoding="utf-8")
    shot = tmp_path / "report.png"
    cmd = [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--window-size=1280,2400",
        f"--screenshot={shot}",
        html_path.as_uri(),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert shot.exists(), proc.stderr[-3000:]
    data = shot.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    # A blank 1280×2400 page compresses to a few KB; plots and tables make it far larger.
    assert len(data) > 20_000, len(data)
    if os.environ.get("WOK_SAVE_SCREENSHOTS") == "1":
        dest = ROOT / "docs" / "images" / "bench-report-example.png"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, dest)


# ---------------------------------------------------------------------------- table


def test_plain_table_lines_up(result, monkeypatch):
    monkeypatch.setitem(sys.modules, "rich", None)  # the fallback, whether or not rich is installed
    buf = io.StringIO()
    report.print_table(result, file=buf)
    text = buf.getvalue()
    assert "\x1b[" not in text
    lines = text.splitlines()
    header, rule, *rows = lines
    assert header.split()[:2] == ["offered", "achieved"] and set(rule.replace(" ", "")) == {"-"}
    body = rows[: len(result["steps"])]
    assert len({len(line) for line in [header, rule, *body]}) == 1  # fixed width
    assert [line.split()[0] for line in body] == ["50", "100", "200", "400", "800"]
    assert [line.split()[-1] for line in body] == ["pass", "pass", "pass", "FAIL", "FAIL"]
    assert "max QPS under SLO (P99 ≤ 200 ms): 200" in text and "knee: 400 QPS" in text


def test_table_says_none_for_missing_verdicts(result):
    buf = io.StringIO()
    report.print_table({**result, "knee_qps": None, "max_qps_under_slo": None}, file=buf)
    assert "knee: none" in buf.getvalue() and "max QPS under SLO (P99 ≤ 200 ms): none" in buf.getvalue()


def test_the_verdicts_say_none_without_two_colons_in_a_row(result):
    # "knee: none: throughput kept up at every step" read as a label of a label.
    buf = io.StringIO()
    report.print_table({**result, "knee_qps": None, "max_qps_under_slo": None}, file=buf)
    text = buf.getvalue()
    assert "knee: none (throughput kept up at every step)" in text
    assert "max QPS under SLO (P99 ≤ 200 ms): none (no step met it)" in text
    assert ": none:" not in text


@pytest.mark.parametrize("plain", [True, False], ids=["plain", "rich"])
def test_a_legend_under_the_table_says_what_its_columns_hold(result, monkeypatch, plain):
    # "lag p99" (the load generator's) beside "loop p99" (the server's event loop), "batch" and
    # "queue p99" had no unit or legend anywhere.
    if plain:  # rich is a dependency: the other case is the table as the bench prints it
        monkeypatch.setitem(sys.modules, "rich", None)
    buf = io.StringIO()
    report.print_table(result, file=buf)
    lines = buf.getvalue().splitlines()
    end = lines.index("max QPS under SLO (P99 ≤ 200 ms): 200")
    legend = lines[2 + len(result["steps"]) : end]  # between the rows and the verdicts
    assert legend and all(len(line) <= report.LEGEND_WIDTH for line in legend), legend
    entries = "; ".join(legend).split("; ")
    assert "queue p99: ms waited in the server's batching queue" in entries
    assert "loop p99: ms the server's event loop ran late (its lag)" in entries
    assert "lag p99: ms the load generator sent late (its dispatch lag)" in entries
    assert "batch: mean rows per batch the server ran" in entries
    assert "-: no figure" in entries  # the synthetic server has no loop lag
    # With --server-timing, its two columns too; bare steps get the legend without the verdicts.
    rng = np.random.default_rng(3)
    timed = ramp_result(steps=[_timed_step(100, rng)], slo_p99_ms=SLO_MS, config={})
    buf = io.StringIO()
    report.print_table(timed["steps"], file=buf)
    text = buf.getvalue()
    assert "server p99: ms inside the server" in text and "outside p99: ms of latency outside" in text
    assert "-: no figure" in text  # no /metrics: no queue, loop or batch figure


def test_docs_list_every_column_the_table_can_print(result):
    """docs/bench.md, "Reading the table": a row per column of the table, with server timing, a
    refinement and the SLO verdicts, in the order it prints them."""
    rng = np.random.default_rng(3)
    steps = [_timed_step(100, rng), {**_timed_step(150, rng), "phase": "refine"}]
    head, _ = report._table_rows(ramp_result(steps=steps, slo_p99_ms=SLO_MS, config={}))
    text = (ROOT / "docs" / "bench.md").read_text()
    section = text[text.index("### Reading the table") :]
    section = section[: section.index("\n#")]
    listed = re.findall(r"^\| `([^`]+)` \|", section, re.M)
    assert listed == head, (listed, head)


def test_verdicts_say_the_knee_is_at_or_below_a_first_step_that_fell_short():
    # A server of 250 QPS offered 800 then 1,600: the first step already falls short (gain from nothing
    # offered about 0.3). It was reported as "none: throughput kept up at every step".
    rng = np.random.default_rng(5)
    steps = [synthetic_step(q, 250.0, rng, duration=2.0) for q in (800, 1600)]
    doc = json.loads(report.to_json(ramp_result(steps=steps, slo_p99_ms=SLO_MS, config={})))
    assert doc["knee_qps"] == 800 and doc["knee_at_or_below_first_step"] is True, [
        (s["offered_qps"], s["achieved_qps"]) for s in doc["steps"]
    ]
    buf = io.StringIO()
    report.print_table(doc, file=buf)
    assert "knee: at or below 800 QPS (the first step already fell short of its offer)" in buf.getvalue()
    assert "kept up" not in buf.getvalue()
    card = '<div class="v">' + report._e("≤ 800 QPS") + '</div><div class="n">at or below the first step'
    assert card in report.render_html(doc)
    # A soak run copies the capacity ramp's knee_qps alone: its steps, not the soak step's, say where it lies.
    soak = soak_document()
    soak["knee_qps"] = soak["soak"]["capacity"]["steps"][0]["offered_qps"]  # 50: the ramp's first step
    soak["steps"][0]["offered_qps"] = 30.0
    buf = io.StringIO()
    report.print_table(soak, file=buf)
    assert "knee: at or below 50 QPS (the first step already fell short of its offer)" in buf.getvalue()


def test_table_lists_the_results_warnings_under_its_verdicts(result):
    # A run printed without --json or --html lost them: "every step met the SLO", a merge's
    # same-seed parts, a step that measured the generator.
    doc = {**result, "warnings": ["every step met the SLO: the maximum is at least 800 QPS", "part-1: late"]}
    buf = io.StringIO()
    report.print_table(doc, file=buf)
    lines = buf.getvalue().splitlines()
    assert lines[-2:] == ["warning: every step met the SLO: the maximum is at least 800 QPS", "warning: part-1: late"]
    buf = io.StringIO()
    report.print_table({**result, "warnings": []}, file=buf)
    assert "warning" not in buf.getvalue()


def test_a_ramp_stopped_early_by_a_rule_says_at_which_step_of_how_many_and_why(result, html):
    """The result's `stopped_early`, under the verdicts in text and HTML alike: the file said nothing of it."""
    stop = {"reason": "the step's P99 2001 ms is over 10 × the SLO (200 ms)", "rule": "stop_factor"}
    doc = {**result, "stopped_early": {**stop, "at_qps": 800.0, "steps_run": 3, "steps_planned": 8}}
    line = "the ramp stopped early, after step 3 of 8 (800 QPS offered): " + stop["reason"]
    buf = io.StringIO()
    report.print_table(doc, file=buf)
    assert line in buf.getvalue().splitlines()
    assert f'<p class="verdict-note">{report._e(line)}</p>' in report.render_html(doc)
    # Null, or a file written before the key (`result`, whose page is the module's `html`).
    for whole, page in (({**result, "stopped_early": None}, report.render_html), (result, lambda _: html)):
        buf = io.StringIO()
        report.print_table(whole, file=buf)
        assert "stopped early" not in buf.getvalue() and "stopped early" not in page(whole)
    # A soak run's verdicts, and so its stop, are its capacity ramp's.
    soak = {**soak_document(), "stopped_early": {**stop, "at_qps": 100.0, "steps_run": 2, "steps_planned": 3}}
    assert report.stopped_early_note(soak).startswith("the capacity ramp stopped early, after step 2 of 3 (100 QPS")


def test_table_of_bare_steps_has_no_verdicts(result):
    buf = io.StringIO()
    report.print_table(result["steps"], file=buf)
    text = buf.getvalue()
    assert "pass" not in text and "knee" not in text and "\x1b[" not in text
    assert "800" in text


def test_rich_table_is_plain_text_too(result):
    pytest.importorskip("rich")
    buf = io.StringIO()
    report.print_table(result, file=buf)
    text = buf.getvalue()
    assert "\x1b[" not in text
    assert "offered" in text and "FAIL" in text and "knee: 400 QPS" in text
    assert all(len(line) < 240 for line in text.splitlines())
    rows = [line for line in text.splitlines() if line.strip().split(" ")[0] in {"50", "100", "200", "400", "800"}]
    assert len(rows) == 5 and not any(math.isnan(float(r.split()[1])) for r in rows)


def _timed_step(qps: float, rng) -> dict:
    """A step whose every request has a server-timing row: parts drawn at random, latency = their sum."""
    from wok.servertiming import TIMING_PARTS

    n = 200
    parts = {k: rng.uniform(0.0, 2.0, n) for k in ("decode", "queue", "batch", "respond", "encode")}
    rows = np.full((n, len(TIMING_PARTS)), np.nan)
    for k, v in parts.items():
        rows[:, TIMING_PARTS.index(k)] = v
    total = sum(parts.values())
    rows[:, TIMING_PARTS.index("total")] = total
    outside = rng.uniform(0.5, 1.5, n)
    intended = np.sort(rng.uniform(0.0, 1.0, n))
    done = intended + (total + outside) / 1e3
    return step_result(
        offered_qps=qps,
        duration_s=1.0,
        intended_s=intended,
        sent_s=intended,
        done_s=done,
        codes=np.array(["OK"] * n),
        server_timing_ms=rows,
    )


def test_a_ramp_with_server_timing_shows_where_the_time_goes(result, html):
    rng = np.random.default_rng(3)
    timed = ramp_result(steps=[_timed_step(100, rng), _timed_step(200, rng)], slo_p99_ms=SLO_MS, config={})
    fig = report.breakdown_figure(timed)
    mean_view, tail_view = fig.axes
    for ax, key in ((mean_view, "mean"), (tail_view, "tail")):
        heights = np.zeros(2)
        for bar in ax.patches:
            heights[round(bar.get_x() + bar.get_width() / 2)] += bar.get_height()
        for i, step in enumerate(timed["steps"]):
            t = step["server_timing"]
            # The stacked parts are the whole latency: of the mean request, and of the slowest 1 %.
            want = (
                step["latency_ms"]["mean"]
                if key == "mean"
                else t["tail"]["mean_ms"]["total"] + t["tail"]["mean_ms"]["outside"]
            )
            assert heights[i] == pytest.approx(want, rel=1e-9)
    table = io.StringIO()
    report.print_table(timed, file=table)
    head = table.getvalue().splitlines()[0]
    assert "server p99" in head and "outside p99" in head
    p99 = timed["steps"][0]["server_timing"]["stages_ms"]["total"]["p99"]
    assert report._fmt_ms(p99) in table.getvalue()
    assert "Where the time goes per step" in report.render_html(timed)
    assert "Where the time goes per step" not in html  # no trailer, no figure
    placeholder = report.breakdown_figure(result)
    assert len(placeholder.axes) == 1 and not placeholder.axes[0].patches  # a note, no bars


# ---------------------------------------------------------------------------- soak


def soak_document(verdict_from: str = "capacity ramp") -> dict:
    """A `--soak` run's JSON as bench/soak.py writes it: the soak step as `steps`, the ramp's in `soak`."""
    rng = np.random.default_rng(11)
    capacity_steps = [synthetic_step(q, 250.0, rng, duration=2.0) for q in (50, 100)]
    result = ramp_result(steps=[synthetic_step(50, 250.0, rng, duration=3.0)], slo_p99_ms=SLO_MS, config={})
    result["max_qps_under_slo"] = 100.0 if verdict_from == "capacity ramp" else 50.0
    windows = [
        {"t_s": 0.0, "length_s": 1.0, "sent": 40, "ok": 40, "p50_ms": 8.5, "p99_ms": 21.5, "rss_mib": 300.0},
        {"t_s": 1.0, "length_s": 1.0, "sent": 50, "ok": 49, "p50_ms": 9.5, "p99_ms": 27.7, "rss_mib": 305.5},
        {"t_s": 2.0, "length_s": 1.0, "sent": 60, "ok": 60, "p50_ms": 10.5, "p99_ms": 25.8, "rss_mib": 311.3},
    ]
    result["soak"] = {
        "schema": "wok.soak/1",
        "duration_s": 3.0,
        "window_s": 1.0,
        "requests": {"sent": 150, "ok": 149, "errors": 1},
        "errors_by_code": {"UNAVAILABLE": 1},
        "windows": windows,
        "rss": {
            "urls": ["http://127.0.0.1:9/metrics"],
            "samples": [[0.0, [300.0 * 2**20]], [3.0, [311.3 * 2**20]]],
            "first_mib": 300.0,
            "last_mib": 311.3,
            "max_mib": 312.4,
            "growth_mib": 11.3,
            "growth_pct": 3.7667,
            "slope_mib_per_min": 6.78,
            "slope_second_half_mib_per_min": 7.125,
        },
        "p99": {
            "windows": 3,
            "first_ms": 21.5,
            "last_ms": 25.8,
            "drift_ms": 4.3,
            "drift_pct": 20.0,
            "slope_ms_per_min": 51.6,
            "max_ms": 27.7,
        },
        "capacity": {
            "qps": 100.0,
            "source": "measured" if verdict_from == "capacity ramp" else "given",
            "load_share": 0.5,
            "load_qps": 50.0,
            "load_nominal_qps": 50.0,
            "steps": capacity_steps if verdict_from == "capacity ramp" else None,
        },
        "verdict_from": verdict_from,
    }
    return json.loads(report.to_json(result))  # as read back from the file


def test_html_of_a_soak_shows_its_windows_drift_and_where_the_verdicts_come_from():
    doc = soak_document()
    assert [s["offered_qps"] for s in doc["steps"]] == [50] and doc["max_qps_under_slo"] == 100
    text = report.render_html(doc)
    # The verdict is the capacity ramp's, whose 100 QPS step is not in the step table: said so, as the table does.
    note = "(from the capacity ramp's steps; the soak step below held 50 QPS, 50% of it)"
    assert report._e(note) in text
    assert "highest passing step" not in text and "of the capacity ramp (see Soak)" in text
    buf = io.StringIO()
    report.print_table(doc, file=buf)
    assert note.replace("below", "above") in buf.getvalue()
    # The soak section: the load held, the drift figures, one row per window.
    soak = text[text.index("<h2>Soak</h2>") : text.index("<h2>Configuration</h2>")]
    assert "50 QPS offered = 50% of the capacity, 100 QPS (measured)" in soak
    assert "150 sent, 149 ok; errors UNAVAILABLE 1." in soak
    from wok.bench.soak import print_soak

    out = io.StringIO()
    print_soak(doc, out)  # as the HTML words it: the line printed a dict's repr ({'UNAVAILABLE': 1})
    assert "errors UNAVAILABLE 1 of 150" in " ".join(out.getvalue().split())
    drift = soak[soak.index('<table class="soak-drift">') : soak.index("</table>")]
    rss_row, p99_row = re.findall(r'<tr><th class="l">.*?</tr>', drift)
    cells = lambda row: re.findall(r"<td>([^<]*)</td>", row)  # noqa: E731
    assert cells(rss_row) == ["300.0", "311.3", "+11.3", "+3.77", "+6.780", "+7.125", "312.4"]
    assert cells(p99_row) == ["21.5", "25.8", "+4.3", "+20.0", "+51.60", "-", "27.7"]
    table = soak[soak.index('<table class="soak-windows">') :]
    table = table[: table.index("</table>")]
    rows = [cells(r) for r in re.findall(r"<tr>(.*?)</tr>", table) if "<td>" in r]
    assert rows == [
        ["0", "1", "40", "100.00", "8.50", "21.5", "300.0"],
        ["1", "1", "50", "98.00", "9.50", "27.7", "305.5"],
        ["2", "1", "60", "100.00", "10.5", "25.8", "311.3"],
    ]
    # The capacity ramp's steps, on which the verdicts were found.
    ramp = soak[soak.index("Capacity ramp steps") :]
    assert ramp.count("<tr") == 3 and ramp.count(">pass<") == 2


def test_the_throughput_axis_of_one_step_runs_from_zero():
    """Autoscaled around its one point, the axis spanned about 0.4 QPS: a step on target looked like noise."""
    config = synthetic_result(timeline=False)["config"] | {"steps": [100]}
    doc = ramp_result(steps=[synthetic_step(100, 250.0, np.random.default_rng(3))], slo_p99_ms=SLO_MS, config=config)
    achieved = doc["steps"][0]["achieved_qps"]
    low, high = report.throughput_figure(doc).axes[0].get_ylim()
    assert low == 0 and max(achieved, 100) < high <= 1.1 * max(achieved, 100), (low, high, achieved)


@pytest.mark.parametrize("verdict_from", ["capacity ramp", "soak step"])
def test_html_of_a_cut_soak_says_where_it_was_cut_and_points_at_no_step_row(verdict_from):
    doc = soak_document(verdict_from)
    doc["steps"] = []  # the soak step did not finish
    doc["soak"]["cut"] = {"at_s": 2.5, "in_flight": 3, "workers_lost": 0}
    text = report.render_html(doc)
    soak = text[text.index("<h2>Soak</h2>") : text.index("<h2>Configuration</h2>")]
    assert "cut at 2.5 s of " in soak and " s, for " not in soak
    assert "soak step below" not in text and "soak step above" not in text
    assert "the soak, cut at 2.5 s, held 50 QPS" in text


def test_a_cut_soak_says_what_the_cut_left_out_and_why_in_html_as_in_text():
    # The HTML said only where the soak was cut; the text table named what was left out, and a file
    # written before `sent_after` (its cut without it) failed the text with a KeyError.
    from wok.bench.soak import print_soak

    doc = soak_document("soak step")
    doc["steps"] = []
    doc["soak"]["cut"] = {"at_s": 2.5, "in_flight": 3, "sent_after": 7, "workers_lost": 1}
    doc["interrupted"] = {"reason": "soak ended early: KeyboardInterrupt: [SIGINT]", "by_signal": True, "phase": "soak"}
    note = (
        "soak ended early: KeyboardInterrupt: [SIGINT]; left out at the cut: 3 requests in flight, 7 sent after it "
        "(before the workers saw the stop), and all that 1 lost worker(s) sent"
    )
    html = report.render_html(doc)
    soak = html[html.index("<h2>Soak</h2>") : html.index("<h2>Configuration</h2>")]
    assert f"<p>{report._e(note)}.</p>" in soak
    out = io.StringIO()
    print_soak(doc, out)
    assert note in " ".join(out.getvalue().split())
    del doc["soak"]["cut"]["sent_after"]
    out = io.StringIO()
    print_soak(doc, out)
    older = "left out at the cut: 3 requests in flight, and all that 1 lost worker(s) sent"
    assert older in " ".join(out.getvalue().split()) and older in report.render_html(doc)


def test_plots_of_a_soak_name_the_capacity_ramps_verdicts():
    doc = soak_document()
    for fig in (report.latency_figure(doc), report.throughput_figure(doc)):
        (marks,) = [t for t in fig.axes[0].texts if "max under SLO" in t.get_text()]
        assert marks.get_text() == "max under SLO 100 QPS (capacity ramp)"
        assert marks.get_ha() == "right"  # the mark lies past the one step: its label stays inside the axes
    plain = report.latency_figure(synthetic_result(timeline=False))
    assert [t.get_text() for t in plain.axes[0].texts if "max under SLO" in t.get_text()] == ["max under SLO 200 QPS"]


def test_html_of_a_soak_with_a_given_capacity_or_no_rss():
    doc = soak_document("soak step")
    doc["soak"]["rss"] = {"urls": [], "samples": []}  # nothing to scrape: no RSS figures at all
    doc["soak"]["p99"] = {"windows": 0}
    for w in doc["soak"]["windows"]:
        w["rss_mib"] = None
    text = report.render_html(doc)
    assert report._e("(from the soak step below: the capacity, 100 QPS, was given, not measured)") in text
    assert "highest passing step" in text  # the soak step's own verdict, on the table's one row
    soak = text[text.index("<h2>Soak</h2>") : text.index("<h2>Configuration</h2>")]
    assert "RSS was not sampled" in soak and "Capacity ramp steps" not in soak
    assert "P99 ms (0 full windows)" in soak
    # `soak` is null when no soak ran to its end: no section then.
    assert "<h2>Soak</h2>" not in report.render_html({**doc, "soak": None})


FAULT_RUN = ROOT / "docs" / "results" / "faults-server-wok-2026-11-29.json"  # slow, then fail; 3 replicas, wok


def _cells(table: str) -> list[list[str]]:
    """Each body row's cells of one HTML table."""
    return [re.findall(r"<td>([^<]*)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", table) if "<td>" in row]


def _html_table(text: str, cls: str) -> str:
    start = text.index(f'<table class="{cls}">')
    return text[start : text.index("</table>", start)]


def test_html_of_a_fault_run_has_the_fault_section_the_table_and_faults_png_show(html, result):
    """The HTML report drew no fault section (docs/reliability.md, "What is not covered"): a fault run's page had
    its steps and nothing of the faults the text table, the JSON and faults.png hold."""
    doc = report.read_json_object(FAULT_RUN)
    text = report.render_html(doc)
    faults = text[text.index("<h2>Faults</h2>") : text.index("<h2>Configuration</h2>")]
    assert text.index("<h2>Steps</h2>") < text.index("<h2>Faults</h2>")
    # Errors by code as the table words them: the line printed a dict's repr ({'INTERNAL': 30}).
    assert (
        "<p>requests: 13268 sent, 13238 ok, 30 errors, <strong>0 lost</strong> (retries on, balancer wok); "
        "not OK by code: INTERNAL 30</p>"
    ) in faults
    assert "<h3>Faults (SLO P99 100 ms)</h3>" in faults
    assert _cells(_html_table(faults, "faults")) == [
        ["slow:model=mlp,replica=0,delay=50ms,at=20%,until=40%", "8.8", "17.6", "9.6", "26.3", "10.1", "0", "-",
         "never"],
        ["fail:model=mlp,replica=2,at=60%,until=80%", "26.4", "35.2", "9.7", "10.1", "10.5", "0", "INTERNAL 30", "6.6"],
    ]  # fmt: skip
    # faults.png, as --plot writes it, inline: the page's fourth image.
    (png,) = _PNG_DATA.findall(faults)
    assert base64.b64decode(png) == report._png(report.fault_timeline_figure(doc))
    assert len(_PNG_DATA.findall(text)) == 4
    # The windows around the faults, 2 s before the first start to 3 s past the last end (35.2 s).
    windows = _cells(_html_table(faults, "fault-windows"))
    assert [w[0] for w in (windows[0], windows[-1])] == ["7.0", "38.0"] and len(windows) == 63
    by_t = {w[0]: w for w in windows}
    assert by_t["8.5"][-1] == "slow r0" and by_t["17.5"][-1] == "off r0"
    assert by_t["26.0"] == ["26.0", "197", "191", "6", "0", "10.5", "3", "bad", "fail r2"]
    assert by_t["27.0"] == ["27.0", "227", "227", "0", "0", "10.1", "3", "", ""]
    # Each replica's answers, by the balancer's counters: once, in the Replicas section before the faults.
    replicas = text[text.index("<h2>Replicas</h2>") : text.index("<h2>Faults</h2>")]
    assert text.index("<h2>Steps</h2>") < text.index("<h2>Replicas</h2>") and "Replicas" not in faults
    totals = "13268 calls, 13238 ok, 13299 attempts, 31 hedges, 0 retries, 0 budget refusals, 12 ejections"
    assert f"{totals}; hedge after (per worker) 20, 20 ms." in replicas
    assert _cells(_html_table(replicas, "replicas")) == [
        ["0", "127.0.0.1:46619", "1", "4403", "4372", "0", "31", "0", "0", "6"],
        ["1", "127.0.0.1:44353", "1", "5717", "5717", "0", "0", "18", "0", "0"],
        ["2", "127.0.0.1:38279", "1", "3179", "3149", "30", "0", "13", "0", "6"],
    ]
    # The text says the same.
    from wok.bench.faults import print_faults

    out = io.StringIO()
    print_faults(doc, out)
    printed = " ".join(out.getvalue().split())
    assert (
        "requests: 13268 sent, 13238 ok, 30 errors, 0 lost (retries on, balancer wok); not OK by code: INTERNAL 30"
    ) in printed
    assert "fail r2" in printed
    out = io.StringIO()
    report.print_replicas(doc, out)
    printed = out.getvalue()
    assert f"{totals}; hedge after (per worker) 20, 20 ms." in " ".join(printed.split())
    assert re.search(r"│ 2 +│ 127\.0\.0\.1:38279 +│ 1 +│ 3179 +│ 3149 +│ 30 +│ 0 +│ 13 +│ 0 +│ 6 +│", printed)
    # A run without faults has no such section.
    assert "<h2>Faults</h2>" not in html and "Replicas" not in html


def test_html_of_a_fault_run_names_a_fault_that_did_not_run_and_a_replica_restarted_behind_round_robin():
    doc = report.read_json_object(ROOT / "docs" / "results" / "faults-kill-grpc-2026-11-29.json")
    text = report.render_html(doc)
    # A kill and its restart: replica 1 ran as two processes; round robin counted nothing per replica.
    replicas = text[text.index("<h2>Replicas</h2>") : text.index("<h2>Faults</h2>")]
    rows = _cells(_html_table(replicas, "replicas"))
    assert [r[0] for r in rows] == ["0", "1", "2"] and [r[2] for r in rows] == ["1", "2", "1"]
    assert all(len(r) == 3 for r in rows) and "round robin (grpc) counts nothing per replica" in replicas
    # The text prints the table for the balancer's counters alone: behind round robin, nothing.
    out = io.StringIO()
    report.print_replicas(doc, out)
    assert out.getvalue() == ""
    # A fault that never took effect: named in red under the table, no recovery, and no windows to show.
    doc["faults"]["faults"][0].update(start_s=None, end_s=None, recovery_s=None)
    faults = report.render_html(doc).split("<h2>Faults</h2>")[1]
    assert (
        '<p class="problem">fault &#x27;kill:replica=1,at=30%,restart=60%&#x27; did not take effect: '
        "the ramp ended before its time</p>"
    ) in faults
    assert _cells(_html_table(faults, "faults"))[0][1:3] == ["-", "-"]
    assert "fault-windows" not in faults


def test_the_balancers_counters_of_a_ramp_without_faults_are_shown_after_the_steps_in_html_and_text():
    """A ramp over several targets behind the wok balancer (`--target a,b`) records its counters per replica in
    `balancer`; the HTML drew them only inside a fault run's section and the text never printed them."""
    doc = report.read_json_object(FAULT_RUN)
    del doc["faults"]  # as `--target a,b` writes it: the counters, no bench-started replicas
    text = report.render_html(doc)
    assert "<h2>Faults</h2>" not in text
    replicas = text[text.index("<h2>Replicas</h2>") : text.index("<h2>Configuration</h2>")]
    assert text.index("</table>", text.index("<h2>Steps</h2>")) < text.index("<h2>Replicas</h2>")
    assert "<p>wok balancer, over the workers and the whole run: 13268 calls, 13238 ok," in replicas
    head = re.findall(r"<th>([^<]*)</th>", _html_table(replicas, "replicas"))
    assert head == ["address", "attempts", "ok", "failures", "slow", "hedges", "retries", "ejections"]
    assert _cells(_html_table(replicas, "replicas")) == [
        ["127.0.0.1:46619", "4403", "4372", "0", "31", "0", "0", "6"],
        ["127.0.0.1:44353", "5717", "5717", "0", "0", "18", "0", "0"],
        ["127.0.0.1:38279", "3179", "3149", "30", "0", "13", "0", "6"],
    ]
    out = io.StringIO()
    report.print_replicas(doc, out)
    lines = [" ".join(re.sub("[│┃]", " ", line).split()) for line in out.getvalue().splitlines()]
    assert lines[0].startswith("wok balancer, over the workers and the whole run: 13268 calls, 13238 ok,")
    # The totals fit 100 columns, broken between their phrases: on one line they ran to 177, the console
    # wrapping them at 160 inside "(per worker)".
    totals = out.getvalue().splitlines()[:2]
    assert all(len(line) <= 100 for line in totals) and " ".join(totals).split() == report.balancer_line(doc).split()
    assert "address attempts ok failures slow hedges retries ejections" in lines
    assert "127.0.0.1:44353 5717 5717 0 0 18 0 0" in lines
    # A `dns:` name is one target of several addresses: a row per address, not one per target.
    for r in doc["balancer"]["replicas"]:
        r["target"] = "dns:///wok:8001"
    assert len(_cells(_html_table(report.render_html(doc), "replicas"))) == 3
    # Behind round robin (`balancer` null) there is nothing to show, in either.
    doc["balancer"] = None
    assert "Replicas" not in report.render_html(doc)
    out = io.StringIO()
    report.print_replicas(doc, out)
    assert out.getvalue() == ""


def _verdict_step(offered: float, p99: float, success: float = 1.0) -> dict:
    """A step with just the figures the table and the verdicts read."""
    lat = dict.fromkeys(LATENCY_KEYS, p99 / 2)
    lat["p99"] = p99
    return {
        "offered_qps": float(offered),
        "achieved_qps": float(offered),
        "duration_s": 60.0,
        "phase": "ramp",
        "requests": round(offered * 60),
        "ok": round(offered * 60 * success),
        "errors": {},
        "success_rate": success,
        "latency_ms": lat,
        "dispatch_lag_ms": {"p50": 0.05, "p99": 0.1, "max": 0.1},
        "late_sends": 0,
        "littles_law": {"mean_inflight_measured": math.nan, "lambda_w": math.nan, "relative_error": math.nan},
    }


def test_a_cell_the_verdict_reads_is_never_rounded_onto_the_other_side_of_its_limit():
    # P99 200.4 ms against a 200 ms SLO read "200" beside FAIL; 98.996 % OK against the 99 % minimum
    # read "99.00" beside FAIL. Each now shows the decimals that tell, and the rest keeps its width.
    steps = [_verdict_step(100, 20.0), _verdict_step(200, 200.4), _verdict_step(400, 20.0, success=0.98996)]
    doc = ramp_result(steps=steps, slo_p99_ms=SLO_MS, config={})
    buf = io.StringIO()
    report.print_table(doc, file=buf)
    cells = [line.split() for line in buf.getvalue().splitlines()]
    rows = {c[0]: c for c in cells if c[-1:] in (["pass"], ["FAIL"])}
    assert rows["100"][2] == "100.00" and rows["100"][5] == "20.0" and rows["100"][-1] == "pass"
    assert rows["200"][5] == "200.4" and rows["200"][-1] == "FAIL"
    assert rows["400"][2] == "98.996" and rows["400"][-1] == "FAIL"
    html = report.render_html(doc)
    assert "<td>200.4</td>" in html and "<td>98.996</td>" in html
    # A P99 exactly at the SLO passes, and reads as the SLO.
    at = ramp_result(steps=[_verdict_step(100, 200.0)], slo_p99_ms=SLO_MS, config={})
    buf = io.StringIO()
    report.print_table(at, file=buf)
    assert [line.split()[5] for line in buf.getvalue().splitlines() if line.endswith("pass")] == ["200"]


def test_offered_rates_print_in_full_in_the_table_the_verdicts_and_the_warnings():
    # ":g" printed 1,048,576 QPS (2**20, a step of `--steps 1:2000000:2`) as 1.04858e+06, and 0.25 QPS as 0.2.
    steps = [_verdict_step(0.25, 20.0), _verdict_step(1048576, 20.0)]
    doc = ramp_result(steps=steps, slo_p99_ms=SLO_MS, config={})
    buf = io.StringIO()
    report.print_table(doc, file=buf)
    text = buf.getvalue()
    assert "e+06" not in text
    assert [line.split()[0] for line in text.splitlines() if line.endswith("pass")] == ["0.25", "1048576"]
    assert "max QPS under SLO (P99 ≤ 200 ms): 1048576" in text
    assert any("at least 1048576 QPS" in w for w in doc["warnings"])


def test_the_legend_says_why_the_servers_columns_are_blank_when_no_metrics_were_read():
    """A ramp with no /metrics reachable said so once, before its first step; under the table only "-: no
    figure", as for a figure missing from one step, though the server's three columns were blank in every row."""
    done = np.arange(20, dtype=float) * 0.05
    step = step_result(
        offered_qps=20, duration_s=1.0, intended_s=done, sent_s=done, done_s=done + 0.008, codes=np.zeros(20)
    )
    buf = io.StringIO()
    report.print_table(ramp_result(steps=[step], slo_p99_ms=SLO_MS, config={}), file=buf)
    entries = "; ".join(buf.getvalue().splitlines()).split("; ")
    assert "-: no figure (queue p99, loop p99, batch: the server's /metrics was not read: give --metrics-url)" in (
        entries
    )
