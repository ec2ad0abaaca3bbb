"""The demo mlp's forward as a CPU instance runs it, served as each platform, and torch.export's per-call checks.

    .venv/bin/python docs/results/export-checks-2026-12-05/checks.py > checks.txt

The demo mlp (256 -> 1024 -> 1024 -> 256, fp32) saved as a python model (a factory and its state dict),
a TorchScript file and a torch.export program (batch Dim 1-32), each loaded by wok's repository and
run through an Instance's own call path (`_forward_cpu`: inference_mode, the Servable's forward, its
outputs named) with `--cpu-linear torch`, so every platform runs torch's own linear layers, its intra-op
threads sized per batch as the worker sizes them. Beside them, `export_checked`: the same program as
`program.module()` gives it, torch's per-call checks on (how wok served every torch_export model before).
The ways alternate within each round; medians (nearest-rank) in µs, and each way's ratio to python's.
"""

import os
import sys
import tempfile
import textwrap
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as `wok serve` sets it, before torch loads

import torch
from safetensors.torch import save_file

from wok.bench.analysis import latency_summary
from wok.config import load_model_config
from wok.executor import Instance
from wok.models.mlp import MLP, SEED
from wok.repository import load_servable
from wok.servable import Servable

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 600
ROWS = (1, 2, 8, 32)
CONFIG = """
platform = "{platform}"
max_batch_size = 32
inputs = [{{ name = "INPUT0", datatype = "FP32", dims = [256] }}]
outputs = [{{ name = "OUTPUT0", datatype = "FP32", dims = [256] }}]
{extra}
"""
FACTORY = "from wok.models.mlp import MLP\n\n\ndef build():\n    return MLP(256, 1024, 256, 2)\n"


def model_dir(root: Path, platform: str, extra: str) -> Path:
    d = root / platform
    d.mkdir()
    (d / "config.toml").write_text(textwrap.dedent(CONFIG.format(platform=platform, extra=extra)))
    return d


def instance(servable: Servable) -> Instance:
    inst = Instance(servable, 0, torch.device("cpu"), 1, cpu_linear="torch")
    inst.max_threads = inst.threads = torch.get_num_threads()  # as its worker thread sets them as it starts
    return inst


def medians(
    ways: dict[str, Instance], rows: tuple[int, ...], ref: torch.nn.Module, rounds: int
) -> dict[tuple[str, int], float]:
    """Each way's forward of each row count (one input of 256, as the mlp takes), its answer checked against
    `ref` after five to warm up, then timed in `rounds` rounds, the ways alternating within each: medians
    (nearest-rank) in µs, by (way, rows)."""
    inputs = {n: {"INPUT0": torch.randn(n, 256)} for n in rows}
    for inst in ways.values():
        for n in rows:
            for _ in range(5):
                got = inst._forward_cpu(inputs[n])["OUTPUT0"]
            torch.testing.assert_close(got, ref(inputs[n]["INPUT0"]).detach())
    samples = {(k, n): [] for k in ways for n in rows}
    for _ in range(rounds):
        for n in rows:
            for k, inst in ways.items():
                inst._size_threads(n)
                t = time.perf_counter()
                inst._forward_cpu(inputs[n])
                samples[(k, n)].append(time.perf_counter() - t)
    return {key: latency_summary(s)["p50"] * 1e6 for key, s in samples.items()}


def main(root: Path) -> None:
    torch.manual_seed(SEED)
    ref = MLP(256, 1024, 256, 2).eval()
    d = model_dir(root, "python", 'factory = "mlpfactory:build"\nweights = "weights.safetensors"')
    (d / "mlpfactory.py").write_text(FACTORY)
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(d / "weights.safetensors"))
    d = model_dir(root, "torchscript", 'model_file = "model.pt"')
    torch.jit.script(ref).save(str(d / "model.pt"))
    d = model_dir(root, "torch_export", 'model_file = "model.pt2"')
    batch = torch.export.Dim("batch", min=1, max=32)
    program = torch.export.export(ref, (torch.randn(3, 256),), dynamic_shapes=({0: batch},))
    torch.export.save(program, str(d / "model.pt2"))
    checked = torch.export.load(str(d / "model.pt2")).module()
    for attr in ("train", "eval"):
        checked.__dict__.pop(attr, None)
    ways = {
        "python": instance(load_servable(root / "python")),
        "torchscript": instance(load_servable(root / "torchscript")),
        "export_checked": instance(Servable(load_model_config(d), checked)),
        "torch_export": instance(load_servable(d)),
    }
    med = medians(ways, ROWS, ref, ROUNDS)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads at most; µs per forward, medians of {ROUNDS}")
    print(f"{'rows':>4} " + " ".join(f"{k:>22}" for k in ways))
    for rows in ROWS:
        line = " ".join(f"{med[k, rows]:9.1f} ({med[k, rows] / med['python', rows]:.2f} ×)".rjust(22) for k in ways)
        print(f"{rows:>4} {line}")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        sys.path.insert(0, str(Path(tmp) / "python"))
        main(Path(tmp))
