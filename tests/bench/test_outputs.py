"""bench/outputs.py: the standalone scripts of bench/ check their --json path before measuring, as the
`wok` commands do (tests/bench/test_cli.py)."""

from __future__ import annotations

import asyncio
import importlib
import re
import subprocess
from pathlib import Path

import pytest
import uvloop

BENCH = Path(__file__).resolve().parents[2] / "bench"

# Each script with a --json output, and the options it needs besides: compare's default peers
# would build their venvs first (that was the measurement's start, not the check's).
SCRIPTS = {
    "accept_rate": [],
    "balancer_overhead": [],
    "ceiling": [],
    "cold_batch": [],
    "compare": ["--servers", "wok"],
    "fuzz": [],
    "gpu_check": [],
    "latency_breakdown": [],
    "linear_kernels": [],
    "metrics_overhead": [],
    "queue_memory": [],
    "refusal_cost": [],
    "slo_compare": [],
    "stream_vs_unary": [],
    "thread_sizing": [],
    "tune_check": [],
}


def test_every_script_with_a_json_output_is_listed():
    found = {
        p.stem
        for p in BENCH.glob("*.py")
        if re.search(r'add_argument\(\s*"--json"', (text := p.read_text())) and re.search(r"^def main\(", text, re.M)
    }
    assert found == set(SCRIPTS)


@pytest.fixture
def no_load(monkeypatch):
    """What starts a script's measurement (a server, a load generator, an event loop) fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("the script started measuring before it checked --json")

    for module, name in ((subprocess, "Popen"), (asyncio, "run"), (asyncio, "Runner"), (uvloop, "run")):
        monkeypatch.setattr(module, name, refuse)


@pytest.mark.parametrize("where", ["a folder", "under a file"])
@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_a_script_refuses_an_unwritable_json_before_measuring(name, where, tmp_path, capsys, no_load):
    """Each wrote its --json unchecked at the end: a bad path was found after the whole measurement
    (minutes of a ramp, a comparison of servers), as a traceback."""
    (tmp_path / "file").write_text("")
    path, why = {
        "a folder": (tmp_path, "is a folder; expected a file name"),
        "under a file": (tmp_path / "file" / "out.json", f"{tmp_path / 'file'} is not a folder"),
    }[where]
    module = importlib.import_module(f"wok.bench.{name}")
    with pytest.raises(SystemExit) as exited:
        module.main([*SCRIPTS[name], "--json", str(path)])
    assert exited.value.code == 2
    assert f"error: --json {path}: {why}\n" in capsys.readouterr().err


def test_a_file_whose_writer_makes_its_folder_may_lie_in_a_missing_one(tmp_path):
    """compare, latency_breakdown and thread_sizing make --json's folder when they write: a missing
    one is no reason to refuse them; for the others it is."""
    from wok.bench.outputs import output_problem

    assert output_problem(tmp_path / "new" / "deeper" / "out.json", folder=False, parents_made=True) is None
    assert output_problem(tmp_path / "new" / "out.json", folder=False) == f"folder {tmp_path / 'new'} does not exist"
