"""bench/latency_breakdown.py, bench/thread_sizing.py and bench/linear_kernels.py: short runs, their documents
and invariants."""

from __future__ import annotations

import json
import os
import runpy
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def run_script(name: str, monkeypatch, *argv: str) -> None:
    """Run the script in this process. What it sets for its torch (the intra-op threads, linear_kernels' 1 by default;
    OMP_WAIT_POLICY for the children) must not outlive the test: the files that follow on the same pytest-xdist
    worker would run with it."""
    import torch

    script = str(BENCH / name)
    monkeypatch.setattr(sys, "argv", [script, *argv])
    monkeypatch.setenv("OMP_WAIT_POLICY", os.environ.get("OMP_WAIT_POLICY", "PASSIVE"))
    threads = torch.get_num_threads()
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        assert exc.code == 0
    finally:
        torch.set_num_threads(threads)


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


# docs/bench-schema.md: percentiles are nearest-rank, the ⌈p·n⌉-th smallest (wok.bench.analysis.latency_summary).
# numpy's default interpolated: the median of 1, 2, 3, 4 ms read 2.5 ms, a time no request took.
@pytest.mark.parametrize(
    ("ms", "p50", "p90", "p99"),
    [
        ([4, 1, 3, 2], 2, 4, 4),  # even count: the 2nd of 4 (numpy: 2.5, 3.7, 3.97)
        ([1, 1, 5, 5], 1, 5, 5),  # ties: the lower pair (numpy: 3, a time no request took)
        ([9, 9, 9, 9, 9, 7, 7, 7, 7, 7], 7, 9, 9),  # ties: the 5th of 10, 7 (numpy: 8, between the two)
        ([3, 1, 2], 2, 3, 3),  # odd count: the middle one, as numpy (its P90 2.8, P99 2.98)
    ],
)
def test_the_breakdowns_percentiles_are_nearest_rank(ms, p50, p90, p99):
    from wok.bench.latency_breakdown import percentiles

    got = percentiles([1e-3 * x for x in ms])
    expected = {"mean": sum(ms) / len(ms), "min": min(ms), "p50": p50, "p90": p90, "p99": p99, "max": max(ms)}
    assert got == pytest.approx(expected, rel=1e-12)
    assert percentiles([]) == dict.fromkeys(("mean", "min", "p50", "p90", "p99", "max"))


class _PairedClock:
    """time for thread_sizing: perf_counter's readings in (start, end) pairs, the k-th pair `durations[k]`
    apart (an exact binary fraction, so µs come out exact); sleeping takes no time."""

    def __init__(self, durations: list[float]) -> None:
        self.durations, self.calls = durations, 0

    def perf_counter(self) -> float:
        k, end = divmod(self.calls, 2)
        self.calls += 1
        return 10.0 * k + (self.durations[k] if end else 0.0)

    def sleep(self, seconds: float) -> None:
        pass


class _Module:
    """The demo model's place: a forward that computes nothing, no weights."""

    def module_for(self, device):
        return self

    def parameters(self):
        return []

    def __call__(self, x):
        return x


def test_thread_sizings_p50_and_p99_are_nearest_rank(tmp_path, monkeypatch):
    """Every cell times 4 forwards (after 10 untimed ones of 9 s) by a scripted clock; the touch series
    times its read of the weights before each of its forwards."""
    import torch

    from wok import models
    from wok.bench import thread_sizing

    reps, warm = 4, [9.0] * 10
    cells = 2 * 6 * len({1, torch.get_num_threads()})  # gap 0 and --gap-ms, six sizes, 1 and T threads
    forwards, reads = [0.25, 1.0, 0.75, 0.5], [0.125, 0.5, 0.25, 0.375]
    touch = [d for r, f in zip(warm + reads, warm + forwards) for d in (r, f)]  # read, then its forward
    monkeypatch.setattr(thread_sizing, "time", _PairedClock(cells * (warm + forwards) + touch))
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # this test process's, not the script's
    monkeypatch.setattr(models, "build_demo", lambda name: _Module())
    out = tmp_path / "t.json"
    argv = ["--reps", str(reps), "--gap-ms", "1", "--touch-lead-ms", "0.5", "--cpu-linear", "torch"]
    assert thread_sizing.main([*argv, "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert len(doc["rows"]) == cells
    # 0.25, 0.5, 0.75, 1 s: the 2nd of 4 is 0.5 s (numpy: 0.625); the 4th is P99 (numpy: 0.9925).
    assert {(r["p50_us"], r["p99_us"]) for r in doc["rows"]} == {(5e5, 1e6)}
    t = doc["touch"]
    # The reads 0.125, 0.25, 0.375, 0.5 s: the 2nd, 0.25 s (numpy: 0.3125).
    assert (t["p50_us"], t["p99_us"], t["touch_p50_us"]) == (5e5, 1e6, 2.5e5)


def test_linear_kernels_medians_are_nearest_rank(tmp_path, monkeypatch):
    """Each cell's figure is the ⌈reps/2⌉-th smallest of its forwards, as every percentile of one
    run's samples; statistics.median took the mean of the middle two, a time no forward took. By a
    scripted clock, every way's first forward of a cell takes 0.25 s and its second 0.75 s."""
    from types import SimpleNamespace

    import torch

    from wok import cpulinear, models
    from wok.bench import linear_kernels

    rows = (1, cpulinear.MIN_ROWS)  # the ways timed: torch and wok's oneDNN; from MIN_ROWS oneDNN's exact too
    forwards = [d for n in rows for _ in ("warm", "gap") for d in (0.25, 0.75) for _ in range(3 if n >= 4 else 2)]
    monkeypatch.setattr(linear_kernels, "time", _PairedClock(forwards))
    monkeypatch.setattr(linear_kernels, "ROWS", rows)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # this test process's, not the script's
    monkeypatch.setattr(models, "build_demo", lambda name: _Module())
    monkeypatch.setattr(cpulinear, "onednn_available", lambda: True)
    monkeypatch.setattr(cpulinear, "with_onednn_linear", lambda module: (_Module(), 3, 2))
    monkeypatch.setattr(cpulinear, "chains", lambda module: [SimpleNamespace(layers=[], kernel=None)])
    out = tmp_path / "k.json"
    assert linear_kernels.main(["--reps", "2", "--gap-ms", "0", "--max-rows-rss", "4", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    cells = [(r["rows"], k, v) for r in doc["rows"] for k, v in r.items() if k.endswith("_us")]
    assert len(cells) == 10 and {v for _, _, v in cells} == {2.5e5}, cells  # statistics.median: 5e5
