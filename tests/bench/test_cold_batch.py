"""bench/cold_batch.py runs the model's worker and reads its thread's CPU from /proc."""

from __future__ import annotations

import json
import os
import runpy
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads thread CPU time from Linux's /proc")
def test_smoke_writes_both_measurements_per_size(tmp_path, monkeypatch, capsys):
    # Run in this process (as tests/bench/test_latency_breakdown.py runs its scripts): a child
    # would spend seconds importing torch for a run of ten batches.
    out = tmp_path / "cold.json"
    script = str(ROOT / "bench" / "cold_batch.py")
    argv = [script, "--sizes", "1,2", "--batches", "5", "--gap", "1ms", "--json", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    # The script sets this for its torch; the value it leaves must not outlive the test.
    monkeypatch.setenv("OMP_WAIT_POLICY", os.environ.get("OMP_WAIT_POLICY", "PASSIVE"))
    with pytest.raises(SystemExit) as exited:
        runpy.run_path(script, run_name="__main__")
    stdout, stderr = capsys.readouterr()
    assert exited.value.code == 0, stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["schema"] == "wok.cold_batch/1"
    assert [s["batch_size"] for s in doc["sizes"]] == [1, 2]
    for s in doc["sizes"]:
        assert s["back_to_back"]["gap_s"] == 0 and s["spaced"]["gap_s"] == pytest.approx(0.001)
        assert s["spaced"]["batch_time_us"] > 0 and s["back_to_back"]["batches"] == 5
    assert "spaced 1 ms" in stdout
