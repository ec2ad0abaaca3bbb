"""bench/refusal_cost.py against a real `wok serve` and the bare transport: every call to the
full queue is refused, every call to the bare server answered, and each has a CPU cost."""

from __future__ import annotations

import json
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the servers' CPU time from Linux's /proc")
def test_calls_to_a_full_queue_are_all_refused_and_the_bare_server_answers_them_all(tmp_path, monkeypatch, capsys):
    # The script runs in this process (its servers are children either way): a child of its own
    # would spend a second importing what this process has loaded already.
    out = tmp_path / "rc.json"
    script = str(ROOT / "bench" / "refusal_cost.py")
    argv = [script, "--servers", "wok,bare", "--rows", "1,4", "--calls", "100", "--reps", "1", "--json", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exited:
        runpy.run_path(script, run_name="__main__")
    stdout, stderr = capsys.readouterr()
    assert exited.value.code == 0, stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["schema"] == "wok.refusal_cost/1" and doc["max_queue_size"] == 64
    runs = {r["server"]: r for r in doc["runs"]}
    for rows in ("1", "4"):
        assert runs["wok"]["rows"][rows]["codes"] == {"RESOURCE_EXHAUSTED": 100}
        assert runs["bare"]["rows"][rows]["codes"] == {"OK": 100}
    assert [(s["server"], s["rows"]) for s in doc["summary"]] == [("wok", 1), ("wok", 4), ("bare", 1), ("bare", 4)]
    assert all(s["server_cpu_us_per_call"] > 0 and s["answers_per_s"] > 0 for s in doc["summary"])
    assert "server CPU µs/call" in stdout


def test_a_wok_at_rev_server_is_resolved_to_its_commit_up_front():
    # Every rep serves the commit REV named when the run began, under the name as given.
    import argparse

    from wok.bench import refusal_cost

    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    args = argparse.Namespace(servers="wok, wok@HEAD ,bare", rows="1,32", calls=1, concurrency=1, reps=1)
    revs, rows = refusal_cost._check_args(argparse.ArgumentParser(), args)
    assert revs == {"wok": None, "wok@HEAD": head.stdout.strip(), "bare": None}
    assert rows == [1, 32]
