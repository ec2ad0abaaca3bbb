"""bench/queue_memory.py against a real `wok serve`: the demo mlp's bound set from the command
line holds, the calls past it are refused at once, and nothing is answered while stalled."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the server's RSS from Linux's /proc")
def test_a_bound_of_50_queues_50_and_refuses_the_rest_but_the_stalled_batches(tmp_path):
    out = tmp_path / "qm.json"
    cmd = [sys.executable, str(ROOT / "bench" / "queue_memory.py"), "--requests", "300",
           "--max-queue-size", "50", "--json", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["schema"] == "wok.queue_memory/1"
    (run,) = doc["runs"]
    assert run["max_queue_size"] == 50 and run["queued"] == 50
    refused = run["answered_at_once"].get("RESOURCE_EXHAUSTED", 0)
    assert set(run["answered_at_once"]) <= {"RESOURCE_EXHAUSTED"}, run  # the stalled instance answers none
    # The rest are in the stalled instance's batches: at most two (pipeline depth 2) of 32.
    assert 300 - 50 - 64 <= refused < 300 - 50, run
    assert run["rss_backlog_mib"] > 0 and run["rss_idle_mib"] > 0
    assert "RESOURCE_EXHAUSTED" in proc.stdout
