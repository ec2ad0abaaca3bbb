"""Which model platforms get oneDNN's linear layers, and the demo mlp's forward each way.

    .venv/bin/python docs/results/platforms-onednn-2026-12-05/platforms.py > platforms.txt

First, the demo mlp as each platform loads it (the nn.Module a `python` factory returns; torch.jit.script
and torch.jit.trace files as `torchscript` loads them; a torch.export program as `torch_export` loads it)
through `with_onednn_linear`, as a CPU instance does: the linear layers it rewrote. Then the forward, one
thread, in torch.inference_mode, back to back and after a 5 ms sleep, the ways alternating within each
round: torch's own layers, wok's oneDNN view, the scripted module after torch.jit.optimize_for_inference
(frozen, weights stored transposed), and the torch.export module. Medians (nearest-rank) of 150 rounds,
µs, and the largest difference from torch's output.
"""

import io
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as `wok serve` sets it, before torch loads

import torch

from wok.bench.analysis import latency_summary
from wok.cpulinear import with_onednn_linear
from wok.models import build_demo

ROUNDS = 150
GAP_S = 0.005


def loaded(plain: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The module each platform serves, saved and loaded as wok's repository loads it."""
    out = {"python": plain}
    for how, module in (("script", torch.jit.script(plain)), ("trace", torch.jit.trace(plain, torch.zeros(8, 256)))):
        buf = io.BytesIO()
        torch.jit.save(module, buf)
        buf.seek(0)
        out[f"torchscript ({how})"] = torch.jit.load(buf, map_location="cpu")
    batch = torch.export.Dim("batch", min=1, max=512)
    ep = torch.export.export(plain, (torch.randn(8, 256),), dynamic_shapes=({0: batch},))
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "model.pt2"
        torch.export.save(ep, str(path))
        out["torch_export"] = torch.export.load(str(path)).module()
    return out


def median_us(samples: list[float]) -> float:
    return latency_summary(samples)["p50"] * 1e6  # nearest-rank, as the bench's


def main() -> None:
    torch.set_num_threads(1)
    plain = build_demo("mlp").module_for(torch.device("cpu")).eval()
    platforms = loaded(plain)
    print(f"torch {torch.__version__}; linear layers with_onednn_linear rewrote (with their ReLU):")
    for name, module in platforms.items():
        _, layers, fused = with_onednn_linear(module)
        print(f"  {name}: {layers} ({fused})")
    ways = {
        "torch": plain,
        "wok_onednn": with_onednn_linear(plain)[0],
        "ts_optimized": torch.jit.optimize_for_inference(torch.jit.script(plain).eval()),
        "torch_export": platforms["torch_export"],
    }
    print(f"µs per forward, medians of {ROUNDS}; ratio = ts_optimized / torch and / wok_onednn")
    with torch.inference_mode():
        for rows in (1, 4, 8, 16, 32, 64):
            x = torch.randn(rows, 256)
            want = plain(x)
            for m in ways.values():
                for _ in range(5):  # build oneDNN's kernels, run the TorchScript profiling passes
                    m(x)
            diffs = " ".join(f"{k} {(m(x) - want).abs().max().item():.1e}" for k, m in ways.items() if k != "torch")
            for label, gap in (("back to back", 0.0), ("5 ms apart", GAP_S)):
                samples = {k: [] for k in ways}
                for _ in range(ROUNDS):
                    for k, m in ways.items():
                        if gap:
                            time.sleep(gap)
                        t0 = time.perf_counter()
                        m(x)
                        samples[k].append(time.perf_counter() - t0)
                med = {k: median_us(v) for k, v in samples.items()}
                cells = " ".join(f"{k} {v:6.0f}" for k, v in med.items())
                ratios = f"{med['ts_optimized'] / med['torch']:.2f} {med['ts_optimized'] / med['wok_onednn']:.2f}"
                print(f"rows {rows:2d} {label:12s}: {cells}  ratio {ratios}")
            print(f"rows {rows:2d} max |diff| from torch: {diffs}")


if __name__ == "__main__":
    main()
