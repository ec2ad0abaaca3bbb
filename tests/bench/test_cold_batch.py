"""bench/cold_batch.py runs the model's worker and reads its thread's CPU from /proc."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads thread CPU time from Linux's /proc")
def test_smoke_writes_both_measurements_per_size(tmp_path):
    out = tmp_path / "cold.json"
    cmd = [sys.executable, str(ROOT / "bench" / "cold_batch.py"), "--sizes", "1,2", "--batches", "5",
           "--gap", "1ms", "--json", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["schema"] == "wok.cold_batch/1"
    assert [s["batch_size"] for s in doc["sizes"]] == [1, 2]
    for s in doc["sizes"]:
        assert s["back_to_back"]["gap_s"] == 0 and s["spaced"]["gap_s"] == pytest.approx(0.001)
        assert s["spaced"]["batch_time_us"] > 0 and s["back_to_back"]["batches"] == 5
    assert "spaced 1 ms" in proc.stdout
