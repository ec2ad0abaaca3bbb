"""GIL acquisitions per forward of the mlp's three oneDNN layers at hidden 1024, 8 rows, one
torch thread: a Python thread spins (holding the GIL whenever it can) while the forward runs in
a loop, with the switch interval at 20 ms, so that each time the forward's thread takes the GIL
back it waits about 20 ms. Calls per second then count the acquisitions per call.

Variants: the three ops called from Python (as wok's Chain does); the same three in one
TorchScript function (`torch.jit.script`), its weights passed in from Python; and in a scripted
module whose weights are C++-side views made inside TorchScript (no Python object to drop).
One op alone is the reference (one acquisition: the call's return).

    .venv/bin/python docs/results/ceiling-2026-11-30-worker/gil_per_forward.py
"""

from __future__ import annotations

import sys
import threading
import time
from typing import List, Optional, Union  # noqa: UP035 (TorchScript reads these annotations)

import torch
from torch import nn

Scalars = List[Optional[Union[int, float, complex]]]  # noqa: UP006,UP007,UP045 (the op's Scalar?[] in TorchScript)
op = torch.ops.mkldnn._linear_pointwise


class Scripted(nn.Module):
    def __init__(self, w1, b1, w2, b2, w3, b3):
        super().__init__()
        self.w1, self.b1, self.w2, self.b2, self.w3, self.b3 = w1, b1, w2, b2, w3, b3
        e = torch.empty(0)
        self.c1, self.d1, self.c2, self.d2, self.c3, self.d3 = e, e, e, e, e, e

    @torch.jit.export
    def own(self):
        self.c1, self.d1 = self.w1.detach(), self.b1.detach()
        self.c2, self.d2 = self.w2.detach(), self.b2.detach()
        self.c3, self.d3 = self.w3.detach(), self.b3.detach()

    @torch.jit.export
    def python_weights(self, x: torch.Tensor) -> torch.Tensor:
        s: Scalars = []
        x = torch.ops.mkldnn._linear_pointwise(x, self.w1, self.b1, "relu", s, "")
        x = torch.ops.mkldnn._linear_pointwise(x, self.w2, self.b2, "relu", s, "")
        return torch.ops.mkldnn._linear_pointwise(x, self.w3, self.b3, "none", s, "")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s: Scalars = []
        x = torch.ops.mkldnn._linear_pointwise(x, self.c1, self.d1, "relu", s, "")
        x = torch.ops.mkldnn._linear_pointwise(x, self.c2, self.d2, "relu", s, "")
        return torch.ops.mkldnn._linear_pointwise(x, self.c3, self.d3, "none", s, "")


def waits_per_call(f, x, seconds=1.5, interval=0.02) -> float:
    stop = False

    def spin():
        while not stop:
            pass

    th = threading.Thread(target=spin)
    th.start()
    time.sleep(0.1)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        f(x)
        n += 1
    elapsed = time.perf_counter() - t0
    stop = True
    th.join()
    return elapsed / n / interval


def main() -> None:
    torch.manual_seed(0)
    layers = [nn.Linear(256, 1024), nn.Linear(1024, 1024), nn.Linear(1024, 256)]
    w = [t.detach() for layer in layers for t in (layer.weight, layer.bias)]
    m = torch.jit.script(Scripted(*w))
    m.own()

    def chain(x):
        x = op(x, w[0], w[1], "relu", [], "")
        x = op(x, w[2], w[3], "relu", [], "")
        return op(x, w[4], w[5], "none", [], "")

    variants = {
        "one op from Python": lambda x: op(x, w[0], w[1], "relu", [], ""),
        "three ops from Python (wok's Chain)": chain,
        "TorchScript, weights from Python": m.python_weights,
        "TorchScript, C++-side weight views": m.forward,
    }
    torch.set_num_threads(1)
    with torch.inference_mode():
        x = torch.randn(8, 256)
        assert torch.equal(chain(x), m(x)) and torch.equal(chain(x), m.python_weights(x))
        for f in variants.values():
            for _ in range(50):
                f(x)
        sys.setswitchinterval(0.02)
        print(f"torch {torch.__version__}; GIL waits of ~20 ms per call, 1.5 s each, two rounds")
        for rnd in (1, 2):
            for name, f in variants.items():
                print(f"round {rnd}  {name:<38} {waits_per_call(f, x):.2f}")


if __name__ == "__main__":
    main()
