"""The roofline of a device: its peak FLOP/s and memory bandwidth, measured or given.

`roofline_for` runs two short micro-benchmarks on the device: a large fp32 matmul
(2·N³ FLOPs per product; the fastest run is the peak) and a large fp32 copy (2·size bytes
per copy: each byte read once and written once; the fastest run is the bandwidth). Each
runs at least 5 times and keeps trying for about a second. On a CPU the copy's
write-allocate traffic (the destination line read before it is written) is not counted,
as STREAM does not count it either.

A kernel of arithmetic intensity I (FLOPs per byte moved) attains at most
min(peak, I·bandwidth) FLOP/s; its predicted time is max(FLOPs/peak, bytes/bandwidth),
and the ridge point peak/bandwidth is the intensity where the two terms are equal.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass

import torch

from ..errors import quoted_name
from ..numerals import underscore_note

# Sizes that take a fraction of a second on the 2-core CI machine and saturate a GPU.
CPU_MATMUL_N = 1536
CUDA_MATMUL_N = 8192
CPU_COPY_BYTES = 128 << 20
CUDA_COPY_BYTES = 1 << 30
BUDGET_S = 1.0  # seconds each micro-benchmark may keep trying for a faster run
MAX_RUNS = 200

# \s under re.ASCII: alone it takes every script's spaces ("\xa0"), which a refusal should show.
_RATE = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKMGTP]?)\s*", re.ASCII)
_PREFIX = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}


def parse_rate(spec: str, what: str) -> float:
    """A positive rate such as "2.5e12", "900G" or "3.35T" (SI prefixes, no unit)."""
    m = _RATE.fullmatch(spec)
    if m is None:
        raise ValueError(
            f"{what}: expected a number with an optional SI prefix (e.g. '900G', '3.35T'); got {quoted_name(spec)}"
            f"{underscore_note(spec)}"
        )
    value = float(m.group(1)) * _PREFIX[m.group(2)]
    if not value > 0 or not math.isfinite(value):
        raise ValueError(f"{what}: expected a finite number > 0; got {quoted_name(spec)}")
    return value


@dataclass(frozen=True)
class Roofline:
    peak_flops: float  # FLOP/s
    bandwidth: float  # bytes/s
    source: dict  # per figure: "measured" (with how) or "given"
    device: str

    @property
    def ridge(self) -> float:
        """The intensity (FLOP/byte) above which a kernel is limited by compute on this device."""
        return self.peak_flops / self.bandwidth

    def predicted_s(self, flops: float, nbytes: float) -> float:
        return max(flops / self.peak_flops, nbytes / self.bandwidth)

    def limit(self, flops: float, nbytes: float) -> str:
        """Which roof the prediction sits on: "compute" or "memory"."""
        return "compute" if flops / self.peak_flops >= nbytes / self.bandwidth else "memory"

    def attainable(self, intensity: float) -> float:
        return min(self.peak_flops, intensity * self.bandwidth)

    def to_dict(self) -> dict:
        return {
            "name": self.device,
            "peak_flops": self.peak_flops,
            "bandwidth_bytes_s": self.bandwidth,
            "ridge_flop_per_byte": self.ridge,
            "source": self.source,
        }


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({torch.get_num_threads()} torch threads)"


def _best_seconds(fn, device: torch.device, repeats: int, budget_s: float) -> tuple[float, int]:
    """The fastest of at least `repeats` runs, more while `budget_s` lasts (at most MAX_RUNS):
    on a shared machine, many short runs are likelier to catch a quiet moment than a few."""

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    fn()  # warm-up: allocation, kernel selection, page faults
    sync()
    best = float("inf")
    runs = 0
    start = time.perf_counter()
    while runs < repeats or (time.perf_counter() - start < budget_s and runs < MAX_RUNS):
        t0 = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t0)
        runs += 1
    return best, runs


def measure_peak_flops(
    device: torch.device, n: int | None = None, repeats: int = 5, budget_s: float = BUDGET_S
) -> tuple[float, dict]:
    """fp32 FLOP/s of the fastest N×N matmul (2·N³ FLOPs each) of `repeats` or more."""
    n = n or (CUDA_MATMUL_N if device.type == "cuda" else CPU_MATMUL_N)
    with torch.inference_mode():
        a = torch.randn(n, n, device=device)
        b = torch.randn(n, n, device=device)
        c = torch.empty(n, n, device=device)
        best, runs = _best_seconds(lambda: torch.mm(a, b, out=c), device, repeats, budget_s)
    return 2.0 * n**3 / best, {"method": f"fastest of {runs} fp32 matmuls {n}x{n}", "seconds": best}


def measure_bandwidth(
    device: torch.device, nbytes: int | None = None, repeats: int = 5, budget_s: float = BUDGET_S
) -> tuple[float, dict]:
    """Bytes/s of the fastest copy of an fp32 buffer (read once, written once) of `repeats` or more."""
    nbytes = nbytes or (CUDA_COPY_BYTES if device.type == "cuda" else CPU_COPY_BYTES)
    with torch.inference_mode():
        src = torch.ones(nbytes // 4, device=device)
        dst = torch.empty_like(src)
        best, runs = _best_seconds(lambda: dst.copy_(src), device, repeats, budget_s)
    moved = 2 * src.numel() * src.element_size()
    return moved / best, {"method": f"fastest of {runs} copies of {nbytes >> 20} MiB (read + write)", "seconds": best}


def roofline_for(device: torch.device, peak_flops: float | None = None, bandwidth: float | None = None) -> Roofline:
    """The device's roofline: each figure given, or measured when it is None."""
    source = {}
    if peak_flops is None:
        peak_flops, how = measure_peak_flops(device)
        source["peak_flops"] = {"measured": True, **how}
    else:
        source["peak_flops"] = {"measured": False, "method": "given (--peak-flops)"}
    if bandwidth is None:
        bandwidth, how = measure_bandwidth(device)
        source["bandwidth"] = {"measured": True, **how}
    else:
        source["bandwidth"] = {"measured": False, "method": "given (--bandwidth)"}
    return Roofline(peak_flops, bandwidth, source, device_name(device))
