"""bench/latency_breakdown.py, bench/thread_sizing.py and bench/linear_kernels.py: short runs, their documents
and invariants."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def run_script(name: str, monkeypatch, *argv: str) -> None:
    script = str(BENCH / name)
    monkeypatch.setattr(sys, "argv", [script, *argv])
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        assert exc.code == 0


def test_a_short_run_writes_a_consistent_breakdown(tmp_path, monkeypatch):
    out = tmp_path / "b.json"
    run_script("latency_breakdown.py", monkeypatch, "--qps", "400", "--duration", "0.5s", "--json", str(out))
    doc = json.loads(out.read_text())
    assert doc["schema"] == "wok.latency_breakdown/1"
    n = doc["requests"]
    assert 100 <= n <= 300  # Poisson, 400/s for 0.5 s
    assert 1 <= doc["batches"] <= n and doc["mean_batch_size"] == n / doc["batches"]
    assert sum(doc["flushes"].values()) == doc["batches"]
    st = doc["stages_ms"]
    assert tuple(st) == (
        "lag",
        "queue",
        "flush_late",
        "hop_to_worker",
        "assemble",
        "compute",
        "split",
        "hop_back",
        "total",
    )
    # A flush never leaves before its window ends, and a request's total holds its queue wait.
    assert st["flush_late"]["min"] >= 0  # at 400/s some batches leave on the delay
    assert st["total"]["mean"] >= st["queue"]["mean"] > 0
    assert doc["paced_with"] == "wok.timers.PreciseSleeper"


def test_every_batch_size_thread_count_and_gap_is_measured(tmp_path, monkeypatch):
    out = tmp_path / "t.json"
    run_script(
        "thread_sizing.py", monkeypatch, "--reps", "2", "--gap-ms", "1", "--touch-lead-ms", "0.5", "--json", str(out)
    )
    doc = json.loads(out.read_text())
    assert doc["schema"] == "wok.thread_sizing/1"
    assert doc["config"]["cpu_linear"] == "onednn" and doc["onednn_layers"] == 3
    threads = sorted({1, doc["threads_default"]})
    cells = {(r["gap_ms"], r["n"], r["threads"]) for r in doc["rows"]}
    assert cells == {(g, n, t) for g in (0.0, 1.0) for n in (1, 2, 4, 8, 16, 32) for t in threads}
    assert all(0 < r["p50_us"] <= r["p99_us"] for r in doc["rows"])
    assert doc["touch"]["n"] == 1 and doc["touch"]["touch_lead_ms"] == 0.5 and doc["touch"]["touch_p50_us"] > 0


def test_thread_sizing_runs_the_linear_layers_the_way_it_is_told(tmp_path, monkeypatch):
    out = tmp_path / "t.json"
    run_script(
        "thread_sizing.py", monkeypatch, "--reps", "1", "--gap-ms", "0", "--cpu-linear", "torch", "--json", str(out)
    )
    doc = json.loads(out.read_text())
    assert doc["config"]["cpu_linear"] == "torch" and doc["onednn_layers"] == 0


def test_linear_kernels_times_both_ways_at_every_row_count(tmp_path, monkeypatch, capsys):
    out = tmp_path / "k.json"
    run_script(
        "linear_kernels.py", monkeypatch, "--reps", "2", "--gap-ms", "0.5", "--max-rows-rss", "8", "--json", str(out)
    )
    doc = json.loads(out.read_text())
    assert doc["schema"] == "wok.linear_kernels/1"
    assert (doc["min_rows"], doc["layers"], doc["fused"]) == (4, 3, 2)
    rows = doc["rows"]
    assert [r["rows"] for r in rows] == [1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 64, 128, 256, 512]
    assert [r["padded_rows"] for r in rows[:9]] == [1, 2, 3, 4, 6, 6, 8, 8, 12]
    for r in rows:
        for way in ("torch", "onednn"):
            assert r[f"{way}_warm_us"] > 0 and r[f"{way}_gap_us"] > 0
        assert r["speedup_warm"] == r["torch_warm_us"] / r["onednn_warm_us"]
        assert r["speedup_gap"] == r["torch_gap_us"] / r["onednn_gap_us"]
        assert ("onednn_exact_warm_us" in r) == ("onednn_exact_gap_us" in r) == (r["rows"] >= 4)
    rss = doc["rss_mib"]
    assert rss["max_rows"] == 8 and rss["after"] > 0 and rss["before"] > 0
    assert "RSS" in capsys.readouterr().out
