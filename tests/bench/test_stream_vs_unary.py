"""bench/stream_vs_unary.py: a short run answers every request both ways and writes its figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the server's CPU time from Linux's /proc")
def test_smoke_both_ways(tmp_path):
    out = tmp_path / "s.json"
    cmd = [sys.executable, str(ROOT / "bench" / "stream_vs_unary.py"), "--requests", "300", "--inflight", "8",
           "--streams", "3", "--rounds", "1", "--json", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["schema"] == "wok.stream_vs_unary/1"
    assert sorted(r["kind"] for r in doc["runs"]) == ["stream", "unary"]
    assert all(r["requests"] == 300 and r["server_cpu_s"] > 0 for r in doc["runs"])
    assert doc["stream_over_unary_cpu"] > 0


def test_bad_options_exit_2():
    cmd = [sys.executable, str(ROOT / "bench" / "stream_vs_unary.py"), "--inflight", "2", "--streams", "3"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 2 and "--streams" in proc.stderr
