"""bench/queue_memory.py against a real `wok serve`: the demo mlp's bound set from the command
line holds, the calls past it are refused at once, and nothing is answered while stalled."""

from __future__ import annotations

import functools
import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load_queue_memory():
    spec = importlib.util.spec_from_file_location("queue_memory", ROOT / "bench" / "queue_memory.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the server's RSS from Linux's /proc")
def test_a_bound_of_50_queues_50_and_refuses_the_rest_but_the_stalled_batches(tmp_path, monkeypatch, capsys):
    queue_memory = _load_queue_memory()
    # Its settle time steadies the RSS readings of a real measurement (a second each); the
    # refusals of 300 calls on loopback land well within the 0.5 s before the first queue reading.
    monkeypatch.setattr(queue_memory, "measure", functools.partial(queue_memory.measure, settle_s=0.3))
    out = tmp_path / "qm.json"
    assert queue_memory.main(["--requests", "300", "--max-queue-size", "50", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["schema"] == "wok.queue_memory/1"
    (run,) = doc["runs"]
    assert run["max_queue_size"] == 50 and run["queued"] == 50
    refused = run["answered_at_once"].get("RESOURCE_EXHAUSTED", 0)
    assert set(run["answered_at_once"]) <= {"RESOURCE_EXHAUSTED"}, run  # the stalled instance answers none
    # The rest are in the stalled instance's batches: at most two (pipeline depth 2) of 32.
    assert 300 - 50 - 64 <= refused < 300 - 50, run
    assert run["rss_backlog_mib"] > 0 and run["rss_idle_mib"] > 0
    assert "RESOURCE_EXHAUSTED" in capsys.readouterr().out
