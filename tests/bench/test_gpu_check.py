"""bench/gpu_check.py is what runs on a GPU host; its CPU dry run keeps it from rotting here."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_dry_run_on_cpu_writes_its_figures(tmp_path):
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "bench" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "gc.json"
    args = ["--device", "cpu", "--batches", "3", "--rows", "16", "--hidden", "512", "--layers", "1"]
    assert mod.main([*args, "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["schema"] == "wok.gpu_check/2"
    assert report["server"]["equal_to_cpu"] is True
    assert report["server"]["mean_batch_size"] > 1
    assert report["checks"]["pinned host buffers"] is None  # not applicable without CUDA
    assert report["overlap_model"]["hidden"] == 512 and report["overlap_model"]["layers"] == 1


def test_gpu_session_script_parses():
    # bench/gpu_session.sh runs only on a lent GPU machine; a syntax error there costs device time.
    import subprocess

    subprocess.run(["bash", "-n", str(ROOT / "bench" / "gpu_session.sh")], check=True)


def test_without_cuda_the_hint_names_a_cpu_dry_run_that_takes_seconds(monkeypatch, capsys):
    # The default sizes take over half an hour on a CPU: the hint gives the small ones.
    from wok.bench import gpu_check

    monkeypatch.setattr(gpu_check.torch.cuda, "is_available", lambda: False)
    assert gpu_check.main(["--device", "cuda:0"]) == 2
    small = "--device cpu --hidden 512 --layers 1 --rows 64 --batches 10"
    assert small in capsys.readouterr().err
    assert small in gpu_check.__doc__
