"""bench/accept_rate.py: a smoke run of the harness, and that its counts add up."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("accept_rate", ROOT / "bench" / "accept_rate.py")
accept_rate = importlib.util.module_from_spec(spec)
spec.loader.exec_module(accept_rate)


def test_a_short_run_writes_every_setting_and_its_counts_add_up(tmp_path):
    out = tmp_path / "ar.json"
    argv = ["--loops", "1,2", "--hog-us", "0,2000", "--duration", "0.2", "--warmup", "0.05", "--reps", "1"]
    assert accept_rate.main([*argv, "--channels", "2", "--inflight", "2", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["schema"] == "wok.acceptrate/2"
    assert {(r["loops"], r["hog_us"]) for r in doc["runs"]} == {(1, 0.0), (2, 0.0), (1, 2000.0), (2, 2000.0)}
    assert {(r["accept_tasks"], r["drain"], r["wakeups_per_call"]) for r in doc["runs"]} == {(0, 0, None)}
    for r in doc["runs"]:
        assert len(r["per_server_calls"]) == r["loops"]
        assert sum(r["per_server_calls"]) == round(r["calls_per_s"] * r["window_s"])
        if r["hog_us"]:
            # A pass lasts at least the hog's 2 ms: at most 500 passes a second, and some calls in them.
            assert 0 < r["passes_per_s"] <= 500 and r["calls_per_pass"] > 0
        else:
            assert r["passes_per_s"] is None and r["calls_per_s"] > 0
    assert len(doc["summary"]) == 4


def test_wok_accept_tasks_and_wakeup_drain_run_in_the_harness(tmp_path):
    out = tmp_path / "ar.json"
    argv = ["--loops", "1", "--hog-us", "2000", "--accept-tasks", "2", "--drain", "1", "--duration", "0.2"]
    assert accept_rate.main([*argv, "--warmup", "0.05", "--reps", "1", "--channels", "2", "--json", str(out)]) == 0
    (run,) = json.loads(out.read_text())["runs"]
    assert (run["accept_tasks"], run["drain"]) == (2, 1)
    assert sum(run["per_server_calls"]) == round(run["calls_per_s"] * run["window_s"]) > 0
    # With the drain on its wake-ups are counted: at most a few per call (one per finished operation).
    assert 0 < run["wakeups_per_call"] <= 5
