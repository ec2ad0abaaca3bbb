"""A Ctrl-C (or SIGTERM, SIGHUP) after a soak's measured window, as its RSS watch takes its last sample or its report
is made: the soak is whole, written and printed, and the status is the run's, as for a signal after a ramp's last step
(tests/bench/test_signal_after_ramp.py). Raised there, it cost the soak: with --capacity the whole run (exit 130, no
table, no JSON: 9 of 9 SIGINTs 0.05-0.2 s after the soak's last line), with a measured capacity the soak's section
(`soak ended early`, though every request of it was answered)."""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys

import pytest

from wok.bench import soak
from wok.bench.cli import _restore_signals, _signals_interrupt
from wok.bench.runner import RampConfig

from .conftest import serving

pytestmark = pytest.mark.timeout(120)
RSS = b"# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes 1e8\n"
# The GETs of --metrics-url in a soak of one 1 s step whose RSS watch ticks every 60 s: the CLI's check of the URL,
# the step's scrapes as its window begins and ends, the RSS watch's first sample (at the first send), then its last,
# as it stops once the window has ended and the step's figures are made.
LAST_SAMPLE = 5


def test_a_ctrl_c_as_the_rss_watch_stops_keeps_the_soak_the_table_the_json_and_the_status(bench_server, tmp_path):
    """Gated on the RSS watch's last scrape: the signal comes while the bench waits for its answer."""
    out = tmp_path / "soak.json"
    procs: list[subprocess.Popen] = []

    def interrupt(n: int) -> None:
        if n == LAST_SAMPLE:
            procs[0].send_signal(signal.SIGINT)

    with serving(RSS, "text/plain; version=0.0.4", before_answer=interrupt) as url:
        cmd = [sys.executable, "-m", "wok", "bench", "ramp", "--target", bench_server.target, "--metrics-url", url]
        cmd += ["--workers", "1", "--capacity", "100", "--soak-load", "50%", "--soak", "1s", "--soak-window", "0.5s"]
        cmd += ["--rss-every", "60s", "--json", str(out)]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        try:
            stdout, err = procs[0].communicate(timeout=60)
        finally:
            if procs[0].poll() is None:
                procs[0].kill()
                procs[0].communicate()
    status = procs[0].returncode
    assert status == 0 and "Traceback" not in err and "interrupted" not in err, (status, err[-3000:])
    said = [line for line in err.splitlines() if "SIGINT" in line]
    assert said == ["KeyboardInterrupt: SIGINT as the RSS watch stopped: the soak measured is the result"], err[-3000:]
    assert "RSS: 95.4 → 95.4 MiB" in stdout and "P99: first window" in stdout, stdout[-3000:]
    result = json.loads(out.read_text())
    section = result["soak"]
    assert result["interrupted"] is None and section["cut"] is None
    # Its first sample and the last, the one the signal came in: both read.
    assert [vs for _, vs in section["rss"]["samples"]] == [[1e8], [1e8]]
    # Every request of the step is in the soak's windows: none left out as in flight or sent after a cut.
    assert len(section["windows"]) == 2 and section["requests"]["sent"] == result["steps"][0]["requests"] > 0


def test_a_signal_as_the_soaks_report_is_made_keeps_the_soak(bench_server, monkeypatch):
    """A real SIGINT raised as the report's figures are done (the rest of the report still to make), to the CLI's
    handlers: held until the report is whole, then said."""
    report = soak.soak_report

    def report_then_ctrl_c(*args, **kwargs) -> dict:
        section = report(*args, **kwargs)
        signal.raise_signal(signal.SIGINT)
        return section

    monkeypatch.setattr(soak, "soak_report", report_then_ctrl_c)
    args = argparse.Namespace(
        capacity=100.0, soak="1s", soak_window=None, rss_every=None, soak_load="20%", replicas=None
    )
    cfg = RampConfig(target=bench_server.target, models=[("mlp", 1.0)], steps=[20], step_duration_s=1.0, workers=1)
    said: list[str] = []
    interrupts = _signals_interrupt()  # the CLI's handlers: the signal read as `wok bench ramp --soak` reads it
    try:
        result = soak.run_soak(args, cfg, say=said.append)
    except KeyboardInterrupt as exc:  # pytest would take it as its own Ctrl-C, and stop the session
        pytest.fail(f"the signal was raised out of the soak: {exc!r}")
    finally:
        _restore_signals(interrupts)
    assert result["interrupted"] is None and result["soak"]["cut"] is None, result["interrupted"]
    assert result["soak"]["capacity"]["qps"] == 100.0 and result["soak"]["requests"]["errors"] == 0
    assert said[-1] == "KeyboardInterrupt: SIGINT as the soak's report was made: the soak measured is the result", said
