"""bench/stream_vs_unary.py: a short run answers every request both ways and writes its figures."""

from __future__ import annotations

import json
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the server's CPU time from Linux's /proc")
def test_smoke_both_ways(tmp_path, monkeypatch, capsys):
    # The script runs in this process (its server is a child either way): a child of its own
    # would spend a second importing what this process has loaded already.
    out = tmp_path / "s.json"
    script = str(ROOT / "bench" / "stream_vs_unary.py")
    argv = [script, "--requests", "100", "--inflight", "8", "--streams", "3", "--rounds", "1", "--json", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exited:
        runpy.run_path(script, run_name="__main__")
    assert exited.value.code == 0, capsys.readouterr().err[-2000:]
    doc = json.loads(out.read_text())
    assert doc["schema"] == "wok.stream_vs_unary/1"
    assert sorted(r["kind"] for r in doc["runs"]) == ["stream", "unary"]
    assert all(r["requests"] == 100 and r["server_cpu_s"] > 0 for r in doc["runs"])
    assert doc["stream_over_unary_cpu"] > 0


@pytest.fixture(scope="module", autouse=True)
def bad_options_run():
    # Started as the module begins, so that its second of imports runs beside the smoke run.
    cmd = [sys.executable, str(ROOT / "bench" / "stream_vs_unary.py"), "--inflight", "2", "--streams", "3"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    yield proc
    if proc.returncode is None:
        proc.kill()
        proc.communicate()


def test_bad_options_exit_2(bad_options_run):
    _, stderr = bad_options_run.communicate(timeout=60)
    assert bad_options_run.returncode == 2 and "--streams" in stderr
