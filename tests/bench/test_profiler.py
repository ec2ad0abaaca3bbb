"""`wok profile`: FLOPs and bytes against hand-derived formulas, the fit, the classes, the CLI."""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from wok.__main__ import main
from wok.bench import analysis, profiler
from wok.bench.profiler import (
    Fit,
    ProfileConfig,
    WorkCount,
    classify,
    count_work,
    default_batch_sizes,
    fit_linear,
    request_pool,
)
from wok.bench.roofline import Roofline, measure_bandwidth, measure_peak_flops, parse_rate, roofline_for
from wok.config import DEVICE_FORMS, model_config_from_dict
from wok.cpulinear import onednn_available
from wok.errors import InvalidInput
from wok.models import build_demo
from wok.models.encoder import length_bucket
from wok.repository import load_servable
from wok.servable import HostBuffers, Servable

from ..conftest import write_python_model

CPU = torch.device("cpu")
ROOT = Path(__file__).resolve().parents[2]
FP32, INT64 = 4, 8


def _pool(servable, n: int, sizes: str = "fixed:16") -> list[dict[str, np.ndarray]]:
    return request_pool(servable, ProfileConfig(batch_sizes=[1, 2], sizes=sizes), n)


def _timed(servable, cfg: ProfileConfig, pool) -> profiler.BatchTimes:
    """`time_batches` on the executor the profile times on: past the server's start-up warm-up, on the CPU."""
    with profiler.warmed_executor(servable, CPU, cfg) as executor:
        return profiler.time_batches(executor, cfg, pool)


# ---------------------------------------------------------------------------- mlp


@pytest.mark.parametrize("n", [1, 7, 32])
def test_mlp_flops_and_bytes_match_the_layer_shapes(n):
    # mlp: Linear(256, 1024), ReLU, Linear(1024, 1024), ReLU, Linear(1024, 256), fp32.
    i, h, o = 256, 1024, 256
    mlp = build_demo("mlp")
    work = count_work(mlp, CPU, _pool(mlp, n))
    # 2 FLOPs per multiply-add of each matmul; bias adds and ReLUs are not counted.
    assert work.flops == 2 * n * (i * h + h * h + h * o)
    params = (i * h + h) + (h * h + h) + (h * o + o)
    # addmm 1 reads x (n·i) writes n·h; relu reads and writes n·h; addmm 2 reads n·h writes
    # n·h; relu n·h and n·h; addmm 3 reads n·h writes n·o. Weights and biases once each.
    reads = n * (i + h + h + h + h)
    writes = n * (h + h + h + h + o)
    assert work.param_bytes == FP32 * params
    assert (work.activation_read_bytes, work.activation_write_bytes) == (FP32 * reads, FP32 * writes)
    assert work.bytes == FP32 * (params + reads + writes)
    assert work.embedding_row_bytes == 0 and work.flops_added == {}
    assert work.uncounted_ops == {"aten.relu"}


def test_mlp_is_compute_bound_at_batch_32_and_memory_bound_alone():
    mlp = build_demo("mlp")
    pool = _pool(mlp, 32)
    at = {n: count_work(mlp, CPU, pool[:n]) for n in (1, 32)}
    # 100.7 MFLOP over 7.41 MB at 32; 3.1 MFLOP over 6.3 MB (mostly weights) alone.
    assert at[32].flops / at[32].bytes == pytest.approx(13.576, abs=1e-3)
    assert classify(at[32].flops / at[32].bytes) == "compute-bound"
    assert classify(at[1].flops / at[1].bytes) == "memory-bound"


# ---------------------------------------------------------------------------- recsys


def _recsys_request(rng, ids: int) -> dict[str, np.ndarray]:
    return {
        "dense": rng.standard_normal((1, 13), dtype=np.float32),
        "ids": rng.integers(0, 200_000, (1, ids), dtype=np.int64),
    }


def test_recsys_flops_and_bytes_match_the_layer_shapes():
    # recsys: EmbeddingBag(200000, D, sum) over each sample's k ids; bottom Linear(F, D) +
    # ReLU; cat → top Linear(2D, H), ReLU, Linear(H, 1), sigmoid. Bags of 0, 1, 5 and 16 ids.
    f, d, hid = 13, 64, 8
    counts = [0, 1, 5, 16, 16]
    n, k_total = len(counts), sum(counts)
    recsys = build_demo("recsys")
    rng = np.random.default_rng(3)
    work = count_work(recsys, CPU, [_recsys_request(rng, k) for k in counts])
    matmuls = 2 * n * (f * d + 2 * d * hid + hid * 1)
    pooling = sum(max(k - 1, 0) for k in counts) * d  # k rows summed: k-1 adds per element
    assert work.flops_counter == matmuls
    assert work.flops_added == {"embedding_bag": pooling}
    assert work.flops == matmuls + pooling
    params = (f * d + d) + (2 * d * hid + hid) + (hid + 1)  # the table is not read whole
    assert work.param_bytes == FP32 * params
    # The rows gathered, one per id, never the 200000 x 64 table.
    assert (work.embedding_rows, work.embedding_row_bytes) == (k_total, FP32 * k_total * d)
    # Reads: ids (int64) and offsets (int64, one per bag); dense n·F; relu n·D; cat 2·n·D;
    # top addmm 2·n·D; relu n·H; last addmm n·H; sigmoid n.
    reads = INT64 * (k_total + n) + FP32 * n * (f + d + 2 * d + 2 * d + hid + hid + 1)
    # Writes: pooled n·D; bottom n·D; relu n·D; cat 2·n·D; top n·H; relu n·H; last n; sigmoid n.
    writes = FP32 * n * (d + d + d + 2 * d + hid + hid + 1 + 1)
    assert (work.activation_read_bytes, work.activation_write_bytes) == (reads, writes)
    assert work.bytes == FP32 * params + FP32 * k_total * d + reads + writes
    assert work.uncounted_ops == {"aten.relu", "aten.cat", "aten.sigmoid"}


@pytest.mark.parametrize("sizes", ["fixed:16", "fixed:4", "uniform:4:64"])
def test_recsys_is_memory_bound_at_every_batch_size(sizes):
    recsys = build_demo("recsys")
    pool = _pool(recsys, 64, sizes)
    for n in default_batch_sizes(recsys.config.max_batch_size):
        work = count_work(recsys, CPU, pool[:n])
        assert classify(work.flops / work.bytes) == "memory-bound", (n, work)


# Counted in a fresh interpreter (`_fresh_counts`): the demo models' counts with torch._dynamo not loaded, whether
# counting them loaded it, the counts of a model whose forward loads it (an eager torch.cond), then, dynamo loaded,
# both again: with the modes as torch wraps them.
FRESH_COUNTS = """
import json, sys
from pathlib import Path
from tests.bench.test_profiler import _demo_counts, _work
from wok.repository import load_servable
import numpy as np
cond = load_servable(Path(sys.argv[1]))
requests = [{"INPUT0": np.full((1, 4), v, np.float32)} for v in (1.0, -2.0)]
got = {"quiet": _demo_counts()}
got["dynamo_loaded_by_counting"] = "torch._dynamo" in sys.modules
got["cond_loading_dynamo"] = _work(cond, requests)
got["dynamo_loaded_by_cond"] = "torch._dynamo" in sys.modules
got["torchs"], got["cond"] = _demo_counts(), _work(cond, requests)
print(json.dumps(got))
"""

COND_MODEL = """
import torch
from torch import nn


class Branches(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        # An eager torch.cond compiles its branches (torch.compile), importing torch._dynamo at its first call.
        return torch.cond(x.sum() > 0, lambda t: self.lin(t), lambda t: self.lin(self.lin(t)), (x,))


def build(**parameters):
    return Branches()
"""


def _work(servable, requests) -> dict:
    work = asdict(count_work(servable, CPU, requests))
    return {**work, "uncounted_ops": sorted(work["uncounted_ops"])}


def _demo_counts() -> dict[str, dict]:
    out = {}
    for name, sizes in [("mlp", "fixed:16"), ("recsys", "uniform:1:40"), ("encoder", "uniform:8:64")]:
        servable = build_demo(name)
        pool = request_pool(servable, ProfileConfig(batch_sizes=[1, 2], sizes=sizes, seed=5), 5)
        for n in (1, 5):
            out[f"{name} {sizes} {n}"] = _work(servable, pool[:n])
    return out


def test_counting_imports_no_dynamo_and_counts_as_torchs_flop_counter(tmp_path):
    """FlopCounterMode's __torch_dispatch__ (and any TorchDispatchMode's, _WorkMode's too) is wrapped in
    torch._disable_dynamo, whose first call imported torch._dynamo: ~1.2 s of every `wok profile` (4.6 s → 3.2 s for
    a short one). Without dynamo loaded the pass runs the same modes unwrapped; its counts are those of the modes as
    torch wraps them, which count once dynamo is loaded (as where a model compiles). A model that loads dynamo in the
    pass had dynamo trace the unwrapped modes: an eager torch.cond failed ("Unsupported: missing tp_iter"); such a
    pass is counted again with torch's modes. All in a fresh interpreter: importing dynamo here would leave this
    worker's later tests counting with torch's modes only."""
    import subprocess
    import sys

    folder = write_python_model(tmp_path / "cond", COND_MODEL, 4)
    run = subprocess.run([sys.executable, "-c", FRESH_COUNTS, str(folder)], capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout)
    assert (got["dynamo_loaded_by_counting"], got["dynamo_loaded_by_cond"]) == (False, True)
    assert len(got["quiet"]) == 6 and all(w["flops_counter"] > 0 for w in got["quiet"].values())
    assert got["quiet"] == got["torchs"]
    # FlopCounterMode counts a cond's larger branch: the false one's two Linear(4, 4) on 2 rows, 2·2·4·4 FLOPs each.
    assert got["cond_loading_dynamo"] == got["cond"] and got["cond"]["flops_counter"] == 2 * 2 * 2 * 4 * 4


# ---------------------------------------------------------------------------- sizes that vary

WIDTH = 8  # PaddedLinear's output features


class PaddedLinear(Servable):
    """Sequences of L floats, padded to the batch's longest (as encoder pads), each value through a bias-free
    Linear(1, WIDTH): a batch of n padded to L is one (n·L × 1) @ (1 × WIDTH) matmul, 2·n·L·WIDTH FLOPs."""

    def __init__(self) -> None:
        config = model_config_from_dict(
            {
                "name": "padded",
                "platform": "python",
                "factory": f"{__name__}:PaddedLinear",
                "inputs": [{"name": "x", "datatype": "FP32", "dims": [-1]}],
                "outputs": [{"name": "y", "datatype": "FP32", "dims": [WIDTH]}],
                "max_batch_size": 4,
            },
            source="test",
        )
        super().__init__(config, torch.nn.Linear(1, WIDTH, bias=False))

    def assemble(self, requests, rows, buffers):
        longest = max(r["x"].shape[1] for r in requests)
        x = buffers.get("x", (rows, longest), torch.float32)
        x.zero_()
        for i, r in enumerate(requests):
            x[i, : r["x"].shape[1]] = torch.from_numpy(r["x"][0])
        return {"x": x}

    def forward(self, module, tensors):
        return self.name_outputs(module(tensors["x"].unsqueeze(-1)).sum(dim=1))


def _padded_flops(batch: list[dict[str, np.ndarray]]) -> int:
    return 2 * len(batch) * max(r["x"].shape[1] for r in batch) * WIDTH


def test_flops_with_two_sizes_are_the_mean_of_the_timed_batches(tmp_path):
    """Sequences of 2 or 6 values: a batch of one costs 32 or 96 FLOPs. Counted on `pool[:n]` alone, each
    size's figure was one of those (that of the pool's first draw), whatever mix of the two was timed."""
    sizes = tmp_path / "sizes.txt"
    sizes.write_text("2\n6\n")
    model, repeats = PaddedLinear(), 16
    cfg = ProfileConfig(batch_sizes=[1, 2], warmup=0, repeats=repeats, sizes=f"empirical:{sizes}")
    doc = profiler.profile(model, cfg, lambda device: roofline_for(device, 1e12, 1e11))
    for b in doc["batches"]:
        n = b["batch_size"]
        # R timed batches, a of them padded to 2 and R - a to 6: FLOPs per batch 2·n·WIDTH·(2a + 6(R - a))/R.
        a = (6 * repeats - repeats * b["flops"] / (2 * n * WIDTH)) / 4
        assert a == pytest.approx(round(a), abs=1e-9) and 0 < round(a) < repeats, (n, b["flops"])
        assert b["flops_per_inference"] == pytest.approx(b["flops"] / n)
        assert b["counted_batches"] == 2  # two shapes of batch: each counted once, weighted by how often timed
    # The default payload sizes stay one pass per batch size, with no counted_batches in the document.
    fixed = profiler.profile(
        model, ProfileConfig(batch_sizes=[1, 2], warmup=0, repeats=2), lambda d: roofline_for(d, 1e12, 1e11)
    )
    assert [(b["flops"], "counted_batches" in b) for b in fixed["batches"]] == [
        (2 * 16 * WIDTH, False),
        (4 * 16 * WIDTH, False),
    ]


def test_count_timed_weights_each_timed_batch_as_timed():
    """The mean over the batches time_batches ran, by hand from their padded lengths; uniform:1:30 draws
    more shapes than COUNTED_BATCHES at n = 1, so there the counted figure is a stratified estimate."""
    model = PaddedLinear()
    cfg = ProfileConfig(batch_sizes=[1, 3], warmup=0, repeats=20, sizes="uniform:2:4")
    pool = profiler.keyed_pool(model, cfg, 256, 3)
    times = _timed(model, cfg, pool)
    for n in (1, 3):
        batches = times[n]["requests"]
        assert len(batches) == 20
        work, counted = profiler.count_timed(model, CPU, pool.requests, batches)
        assert counted == 3  # padded to 2, 3 or 4
        exact = np.mean([_padded_flops([pool.requests[i] for i in b]) for b in batches])
        assert work.flops == pytest.approx(exact)
    cfg = ProfileConfig(batch_sizes=[1, 3], warmup=0, repeats=40, sizes="uniform:1:30")
    pool = profiler.keyed_pool(model, cfg, 256, 3)
    batches = _timed(model, cfg, pool)[1]["requests"]
    work, counted = profiler.count_timed(model, CPU, pool.requests, batches)
    exact = np.mean([_padded_flops([pool.requests[i] for i in b]) for b in batches])
    assert counted == profiler.COUNTED_BATCHES
    assert work.flops == pytest.approx(exact, rel=0.05)
    assert abs(_padded_flops(pool.requests[:1]) - exact) > 0.05 * exact  # what one batch said: off by more


class BucketedLinear(PaddedLinear):
    """PaddedLinear batched as encoder batches: by length bucket (encoder's own `length_bucket`: 8 for 1-8
    values, 16 for 9-16), each batch padded to its longest sequence."""

    def batch_key(self, inputs):
        return length_bucket(inputs["x"].shape[1], 16)


def _lengths(pool, batch) -> list[int]:
    return [pool.requests[i]["x"].shape[1] for i in batch]


def test_timed_batches_are_of_one_bucket_each_padded_to_its_longest(tmp_path):
    """Sequences of 3, 5 or 12 values: buckets 8 (3, 5) and 16 (12). A batch of bucket 8 pads to 5, or to 3
    when all its sequences are 3; one of bucket 16 to 12. Timed batches were n consecutive requests of the
    pool whatever their bucket: a 3 and a 12 padded to 12 together, a batch the server never runs."""
    sizes = tmp_path / "sizes.txt"
    sizes.write_text("3\n5\n12\n")
    model = BucketedLinear()
    cfg = ProfileConfig(batch_sizes=[1, 4], warmup=0, repeats=30, sizes=f"empirical:{sizes}")
    pool = profiler.keyed_pool(model, cfg, 256, 4)
    times = _timed(model, cfg, pool)
    for n in (1, 4):
        batches = times[n]["requests"]
        padded = []
        for b in batches:
            lengths = _lengths(pool, b)
            assert len({length_bucket(length, 16) for length in lengths}) == 1, lengths
            padded.append(12 if lengths[0] == 12 else 3 if set(lengths) == {3} else 5)
        work, counted = profiler.count_timed(model, CPU, pool.requests, batches)
        assert work.flops == pytest.approx(np.mean([2 * n * p * WIDTH for p in padded]))
        assert counted == len(set(padded))


def test_buckets_are_taken_in_proportion_to_the_payloads(tmp_path):
    """Sequences of 3 or 12 values, equally likely: bucket 8 pads to 3, bucket 16 to 12, so a batch of n costs
    2·n·WIDTH·(3 or 12) FLOPs, and their mean over the timed batches is 2·n·WIDTH·(3·q + 12·(1 - q)), q the
    share of bucket 8 among the pool's draws (near 1/2), to within one batch of R. Mixed, a batch of n padded
    to 12 unless all n were 3: at n = 4 the mean was 2·n·WIDTH·(3/16·3 + 15/16·12) = 2·n·WIDTH·11.4."""
    sizes = tmp_path / "sizes.txt"
    sizes.write_text("3\n12\n")
    model, repeats = BucketedLinear(), 50
    cfg = ProfileConfig(batch_sizes=[1, 4], warmup=0, repeats=repeats, sizes=f"empirical:{sizes}")
    doc = profiler.profile(model, cfg, lambda device: roofline_for(device, 1e12, 1e11))
    q = np.mean([r["x"].shape[1] == 3 for r in request_pool(model, cfg, 256)])
    for b in doc["batches"]:
        n = b["batch_size"]
        assert b["flops"] / (2 * n * WIDTH) == pytest.approx(3 * q + 12 * (1 - q), abs=9 / repeats), n
        assert b["counted_batches"] == 2 and "keys_left_out" not in b


def test_each_size_times_the_keys_in_the_pools_proportions(tmp_path):
    """Drawn batch by batch, a key's share of 100 batches strays by about 5 points either way; planned, every
    key is timed as often as its share of the pool's draws says, to within one batch, at every size."""
    model = BucketedLinear()
    cfg = ProfileConfig(batch_sizes=[1, 4], warmup=0, repeats=37, sizes="uniform:1:16")
    pool = profiler.keyed_pool(model, cfg, 256, 4, most_draws=0)
    share = {key: pool.keys.count(key) / 256 for key in pool.groups}
    assert share.keys() == {8, 16}
    times = _timed(model, cfg, pool)
    for n in (1, 4):
        timed = [length_bucket(_lengths(pool, b)[0], 16) for b in times[n]["requests"]]
        for key in (8, 16):
            assert abs(timed.count(key) - 37 * share[key]) < 1, (n, key, timed.count(key))
    # One key: no plan and no draw for it, so the batches are those a pool without keys gave.
    assert profiler.keyed_pool(PaddedLinear(), ProfileConfig(batch_sizes=[1, 2]), 256, 2).plan(None, 2, 10) is None


def test_a_key_short_of_requests_gets_more_drawn_and_else_none_of_its_batches(monkeypatch, capsys):
    """Sequences of 1-40 values batched by their exact shape (the default key): 256 draws give a length 6.4
    requests on average, some fewer than 4. More draws fill every key to 4; with none allowed, batches of
    4 take only the keys that have 4, and the document and the table say how many keys were left out."""
    model = PaddedLinear()
    cfg = ProfileConfig(batch_sizes=[1, 4], warmup=0, repeats=20, sizes="uniform:1:40")
    bare = profiler.keyed_pool(model, cfg, 256, 4, most_draws=0)
    lengths = [r["x"].shape[1] for r in bare.requests]
    assert len(bare.requests) == 256 and bare.extra_draws == 0
    counts = {length: lengths.count(length) for length in set(lengths)}
    few = {length for length, k in counts.items() if k < 4}
    assert few  # the case at hand: some keys short of 4
    assert bare.short(4) == (len(few), sum(counts[length] for length in few) / 256)
    assert bare.short(1) == (0, 0.0)
    rng = np.random.default_rng(0)
    for _ in range(50):
        batch = bare.batch(rng, 4)
        assert len(set(_lengths(bare, batch))) == 1 and _lengths(bare, batch)[0] not in few
    filled = profiler.keyed_pool(model, cfg, 256, 4)
    # The pool's own draws first, the same: they alone set how often a key is taken.
    assert all(np.array_equal(a["x"], b["x"]) for a, b in zip(filled.requests[:256], bare.requests, strict=False))
    assert filled.short(4) == (0, 0.0) and filled.extra_draws > 0
    for key, members in filled.groups.items():
        assert len(members) >= 4 and {((length,),) for length in _lengths(filled, members)} == {key}
    monkeypatch.setattr(profiler, "FILL_DRAWS", 0)
    doc = profiler.profile(model, cfg, lambda device: roofline_for(device, 1e12, 1e11))
    assert "keys_left_out" not in doc["batches"][0]
    assert doc["batches"][1]["keys_left_out"] == {"keys": len(few), "share": bare.short(4)[1], "draws": 256}
    profiler.print_table(doc)
    assert f"n = 4: {len(few)} (" in capsys.readouterr().out


def test_the_tables_header_shows_a_typed_name_as_the_label_does(capsys):
    """`wok profile NAME on cpu` printed the name whole: a typed one of 100,000 characters, its newline and its
    terminal escape as they were. Now as the progress label shows it (errors.unquoted): escaped, cut past
    NAME_CHARS, its length said."""
    cfg = ProfileConfig(batch_sizes=[1, 2], warmup=0, repeats=3)
    doc = profiler.profile(build_demo("mlp"), cfg, lambda device: roofline_for(device, 1e12, 1e11))
    doc["model"]["name"] = "a\nb\x1b[2J" + "m" * 100_000
    profiler.print_table(doc)
    head = capsys.readouterr().out.splitlines()[0]
    assert head == "wok profile a\\nb\\x1b[2J" + "m" * 193 + "… (100,007 characters in all) on cpu"


def test_a_tiny_pools_counts_by_hand():
    """Five own draws of keys a, b, a, c, a, and two requests of the extra draws kept (one a, one b) out of 9:
    a has 4 requests, b 2, c 1. A batch of 2 takes its key from the draws of a or b (4 of 5), c's one draw (1/5)
    left out; of 3, a's alone (b and c left out, 2/5 of the draws); of 5, none, and the most any key has is 4.
    Planned over 4 batches of 2, a is the key of 3 and b of 1, as their 3 and 1 draws among the 4 allowed."""
    groups = {"a": [0, 2, 4, 5], "b": [1, 6], "c": [3]}
    pool = profiler.KeyedPool([{}] * 7, ["a", "b", "a", "c", "a"], groups, extra_draws=9)
    assert pool.most == 4
    assert (pool.allowed(2), pool.short(2)) == ([0, 1, 2, 4], (1, pytest.approx(1 / 5)))
    assert (pool.allowed(3), pool.short(3)) == ([0, 2, 4], (2, pytest.approx(2 / 5)))
    assert pool.short(5) == (3, 1.0)
    with pytest.raises(ValueError, match=r"a batch of 5 needs a key with 5 requests; the most any has: 4"):
        pool.batch(np.random.default_rng(0), 5)
    assert sorted(pool.plan(np.random.default_rng(0), 2, 4)) == ["a", "a", "a", "b"]
    assert [pool.key_of(m) for m in ([5, 0], [6], [3])] == ["a", "b", "c"]


class SleepyBuckets(BucketedLinear):
    """A batch of n of bucket 8 (sequences of 3) takes 5·n ms and one of bucket 16 (of 12) 20·n ms, slept, beside
    a forward of microseconds."""

    def forward(self, module, tensors):
        x = tensors["x"]
        time.sleep(1e-3 * x.shape[0] * (5 if x.shape[1] <= 8 else 20))
        return super().forward(module, tensors)


def test_with_two_keys_the_fit_is_on_the_mean_of_their_medians_not_the_mixtures_median(tmp_path):
    """Sequences of 3 twice as likely as of 12 (the sizes file lists 3 twice): batches of n of the two buckets
    take 5·n and 20·n ms (and the executor's overhead), about 2/3 and 1/3 of them. Their mean, what an
    instance's busy time counts, is (10/3 + 20/3)·n = 10·n ms: β = 10 ms. The mixture's median is the bucket
    of 3's, 5·n ms: β = 5 ms, the fit the profile made before. By hand from the document's own samples and the
    keys the profile timed (the same seed's pool and plan): a key's share q and median m, per size
    q·m₈ + (1 − q)·m₁₆."""
    sizes = tmp_path / "sizes.txt"
    sizes.write_text("3\n3\n12\n")
    model = SleepyBuckets()
    cfg = ProfileConfig(batch_sizes=[1, 3], warmup=1, repeats=15, sizes=f"empirical:{sizes}")
    doc = profiler.profile(model, cfg, lambda device: roofline_for(device, 1e12, 1e11))
    rng = np.random.default_rng(cfg.seed)
    pool = profiler.keyed_pool(model, cfg, 256, 3)
    plans = {n: pool.plan(rng, n, cfg.repeats) for n in cfg.batch_sizes}  # as time_batches plans, before all else
    points = []
    for b in doc["batches"]:
        n, t = b["batch_size"], np.asarray(b["samples_s"])
        fast = np.asarray(plans[n]) == 8
        q = fast.mean()
        assert 0.4 < q < 0.9, (n, q)  # both keys timed, the bucket of 3 the more often
        point = q * analysis.latency_summary(t[fast])["p50"] + (1 - q) * analysis.latency_summary(t[~fast])["p50"]
        assert b["fitted_on_s"] == pytest.approx(point, rel=1e-12)
        assert b["median_s"] <= t[fast].max()  # the mixture's median: a batch of 3s
        points.append(point)
    line = fit_linear([1, 3], points)
    assert (doc["fit"]["alpha_s"], doc["fit"]["beta_s"]) == (pytest.approx(line.alpha_s), pytest.approx(line.beta_s))
    assert doc["fit"]["on"] == profiler.KEYED_FIT_ON
    # β nearer the mean's 10 ms than the median's 5 ms (the shares are the pool's, near 2/3).
    assert doc["fit"]["beta_s"] > 7.5e-3
    # The table's residuals and QPS are against the point the fit is on, not the mixture's median (a bucket-of-3
    # time, whose QPS the table showed: above what an instance keeps up), and the document has that QPS too.
    head, rows = profiler.table_rows(doc)
    assert head[1:7] == ["median ms", "p99 ms", "fitted on ms", "fit ms", "QPS", "fit QPS"]
    for b, row in zip(doc["batches"], rows, strict=True):
        assert b["fitted_on_throughput_qps"] == b["batch_size"] / b["fitted_on_s"]
        assert row[3] == profiler._ms(b["fitted_on_s"]) and row[5] == f"{b['fitted_on_throughput_qps']:.0f}"
        # Not ordered against the fitted-on QPS: the mixture's median (8th of 15) is the second slowest of the 9
        # batches of bucket 8, and two of those held up ~6 ms by a busy host put it past the fitted-on point at n = 1
        # (2 in 40 runs beside 10 CPU hogs). The table's QPS is the fitted-on one (the row, above) either way.
        assert b["throughput_qps"] == b["batch_size"] / b["median_s"]
    assert any(line.startswith("fitted on ms: each batching key's median") for line in profiler.summary_lines(doc))


class KeyedByValue(PaddedLinear):
    """A request's key is its values: no two requests of standard normal draws share a batch."""

    def batch_key(self, inputs):
        return inputs["x"].tobytes()


def test_sizes_that_give_no_key_a_batch_are_refused():
    cfg = ProfileConfig(batch_sizes=[1, 2], warmup=0, repeats=1, sizes="fixed:2")
    with pytest.raises(
        ValueError, match=r"none of the 256 keys .* had 2 requests after 65536 draws more \(the most: 1\)"
    ):
        profiler.profile(KeyedByValue(), cfg, lambda device: roofline_for(device, 1e12, 1e11))


class FixedKeyedByValue(Servable):
    """Four floats, a Linear(4, 2), keyed by its values as KeyedByValue: fixed dims, so no --sizes shapes a request."""

    def __init__(self) -> None:
        config = model_config_from_dict(
            {
                "name": "fixed",
                "platform": "python",
                "factory": f"{__name__}:FixedKeyedByValue",
                "inputs": [{"name": "x", "datatype": "FP32", "dims": [4]}],
                "outputs": [{"name": "y", "datatype": "FP32", "dims": [2]}],
                "max_batch_size": 4,
            },
            source="test",
        )
        super().__init__(config, torch.nn.Linear(4, 2))

    def batch_key(self, inputs):
        return inputs["x"].tobytes()


def test_a_fixed_dims_model_whose_keys_give_no_batch_is_refused_in_its_own_words():
    """A model of fixed dims reaches this refusal only by a batch_key of its own: it said the requests were "drawn
    with --sizes fixed:16" and advised "--sizes with fewer distinct sizes", an option that shaped nothing there."""
    cfg = ProfileConfig(batch_sizes=[1, 2], warmup=0, repeats=1)
    with pytest.raises(ValueError) as info:
        profiler.profile(FixedKeyedByValue(), cfg, lambda device: roofline_for(device, 1e12, 1e11))
    assert str(info.value) == (
        "model 'fixed': the server batches only requests of one batching key, and none of the 256 keys of the 256 "
        "requests made at the model's fixed dims had 2 requests after 65536 draws more (the most: 1): batches of 2 "
        "would hardly ever form; give smaller --batch-sizes (its batch_key keys them by their values)"
    )


def test_the_extra_draws_counted_are_the_draws_made(monkeypatch):
    """`extra_draws` (the refusal's "draws more", `keys_left_out.draws`) counts every request drawn past the pool's
    own, kept or not: drawn FILL_CHUNK at a time, the chunk that fills the last key is drawn whole (its rest dropped),
    and the last chunk is cut to `most_draws`. Counted against the generator's own calls: its sizes drawn a chunk at
    once, each request then made alone (so that one dropped is not held while the next is made)."""
    from wok.bench.payloads import PayloadGenerator

    made, chunks = [], []
    make = PayloadGenerator.make
    monkeypatch.setattr(
        PayloadGenerator, "make", lambda self, rng=None, size=None: made.append(size) or make(self, rng, size)
    )
    generator = profiler._generator
    monkeypatch.setattr(profiler, "_generator", lambda *a: _counting_sizes(generator(*a), chunks))
    filled = profiler.keyed_pool(PaddedLinear(), ProfileConfig(batch_sizes=[1, 4], sizes="uniform:1:40"), 256, 4)
    assert chunks[0] == 256 and filled.extra_draws == sum(chunks[1:]) == profiler.FILL_CHUNK * len(chunks[1:]) > 0
    assert len(made) == 256 + filled.extra_draws
    assert filled.short(4) == (0, 0.0) and len(filled.requests) - 256 < filled.extra_draws
    made.clear()
    chunks.clear()
    cfg = ProfileConfig(batch_sizes=[1, 2], sizes="fixed:2")
    never = profiler.keyed_pool(KeyedByValue(), cfg, 256, 2, most_draws=300)
    assert chunks == [256, profiler.FILL_CHUNK, 300 - profiler.FILL_CHUNK] and never.extra_draws == 300
    assert len(made) == 556
    assert len(never.requests) == 256  # no draw had a key of the pool's


def _counting_sizes(gen, chunks: list):
    """`gen` whose sizes' draws append how many each drew to `chunks`."""
    sample = gen.sizes.sample

    class Counted:
        def sample(self, rng, n):
            chunks.append(n)
            return sample(rng, n)

    gen.sizes = Counted()
    return gen


VARIABLE_DOUBLE = """
from torch import nn


class Double(nn.Module):
    def forward(self, x):
        return x * 2


def build(**parameters):
    return Double()
"""


def test_a_repository_model_with_a_variable_dimension_profiles(tmp_path):
    """dims [-1] and the default assemble, which copies rows of one width: batches of requests of different
    lengths failed in it ("could not broadcast input array from shape (1,4) into shape (1,6)"). The server
    batches by shape (the default key), and so does the profile now. x * 2 of a batch of n of length L reads
    and writes 4·n·L bytes, so the bytes per batch over 8·n are the mean length of the timed batches."""
    repo = tmp_path / "repo"
    write_python_model(repo / "var", VARIABLE_DOUBLE, 4, dims=-1)
    out = tmp_path / "var.json"
    argv = ["profile", "var", "--model-repository", str(repo), "--sizes", "uniform:2:6", "--repeats", "20"]
    assert main([*argv, "--warmup", "0", "--peak-flops", "1T", "--bandwidth", "1T", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert [b["batch_size"] for b in doc["batches"]] == [1, 2, 4]
    for b in doc["batches"]:
        mean_length = b["bytes"] / (8 * b["batch_size"])
        assert 2 <= mean_length <= 6 and b["counted_batches"] <= 5, b
        assert b["flops"] == 0 and "keys_left_out" not in b


class _Bags(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bag = torch.nn.EmbeddingBag(10, 4, mode="sum")

    def forward(self, ids):
        return self.bag(ids)


def test_a_torchscript_embedding_bag_model_is_counted(tmp_path):
    """Counted under inference_mode, TorchScript's aten::numel, which nn.EmbeddingBag's forward calls on a 2-D
    input, raised a RuntimeError with no message under FlopCounterMode (torch 2.13): `wok profile` of such a
    model (recsys saved with torch.jit.script) crashed with a traceback ending "RuntimeError: ". Two bags of
    three ids, summed: 6 rows read, (3 - 1)·4 adds per bag."""
    folder = tmp_path / "bags"
    folder.mkdir()
    torch.jit.script(_Bags().eval()).save(str(folder / "model.pt"))
    (folder / "config.toml").write_text(
        'platform = "torchscript"\nmodel_file = "model.pt"\nmax_batch_size = 4\n\n'
        '[[inputs]]\nname = "ids"\ndatatype = "INT64"\ndims = [-1]\n\n'
        '[[outputs]]\nname = "out"\ndatatype = "FP32"\ndims = [4]\n'
    )
    servable = load_servable(folder)
    work = count_work(servable, CPU, [{"ids": np.array([[1, 2, 3]])}, {"ids": np.array([[4, 5, 6]])}])
    assert work.embedding_rows == 6
    assert work.flops_added == {"embedding_bag": 2 * 2 * 4}


@pytest.mark.parametrize("platform", ["torchscript", "torch_export"])
def test_ids_stay_within_a_saved_models_table(tmp_path, platform):
    """The default --int-high is the smallest embedding table's rows; it was found in an nn.Module only, so a
    TorchScript or torch.export model's 10-row table got ids up to 50, and `wok profile` of it failed
    ("index out of range in self") where the same model as platform python ran."""
    folder = tmp_path / "repo" / "bags"
    _save_model(folder, _Bags(), platform, torch.zeros(2, 3, dtype=torch.long), IDS, ("out", "FP32", [4]))
    assert profiler.id_range(load_servable(folder)) == 10
    assert _profiled(folder)["config"]["int_high"] == 10


IDS = ("ids", "INT64", [3])


def _save_model(folder: Path, module, platform: str, example, input_, output, *, decompose: bool = False) -> None:
    """`module` saved in `folder` as `platform` (torchscript, or torch_export traced on `example`, after
    run_decompositions with `decompose`) for batches of 1 to 4, with a config of one input and one output, each
    (name, datatype, dims)."""
    folder.mkdir(parents=True)
    if platform == "torchscript":
        model_file = "model.pt"
        torch.jit.script(module.eval()).save(str(folder / model_file))
    else:
        model_file = "model.pt2"
        batch = torch.export.Dim("batch", min=1, max=4)
        program = torch.export.export(module.eval(), (example,), dynamic_shapes=({0: batch},))
        torch.export.save(program.run_decompositions() if decompose else program, str(folder / model_file))
    text = f'platform = "{platform}"\nmodel_file = "{model_file}"\nmax_batch_size = 4\n'
    for table, (name, datatype, dims) in (("inputs", input_), ("outputs", output)):
        text += f'\n[[{table}]]\nname = "{name}"\ndatatype = "{datatype}"\ndims = {dims}\n'
    (folder / "config.toml").write_text(text)


def _profiled(folder: Path, *options: str) -> dict:
    """The document of `wok profile` of the model in `folder`: batches of 1 and 4 (or as `options` say), 2 each."""
    out = folder.parent.parent / f"{folder.name}.json"
    argv = ["profile", folder.name, "--model-repository", str(folder.parent), "--batch-sizes", "1,4", "--repeats", "2"]
    assert main([*argv, "--warmup", "0", "--peak-flops", "1T", "--bandwidth", "1T", *options, "--json", str(out)]) == 0
    return json.loads(out.read_text())


LINEAR_MODEL = """
from torch import nn


def build(**parameters):
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU())
"""


def _saved_linear(folder: Path, platform: str) -> None:
    """A Linear(4, 4) and its ReLU on one FP32 input of 4 values, as `platform` serves it, in `folder`."""
    if platform == "python":
        write_python_model(folder, LINEAR_MODEL, 4)
        return
    module = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    _save_model(folder, module, platform, torch.zeros(2, 4), ("INPUT0", "FP32", [4]), ("OUTPUT0", "FP32", [4]))


@pytest.mark.parametrize(
    ("platform", "cpu_linear", "ran"),
    [
        pytest.param(
            "python", "onednn", "onednn", marks=pytest.mark.skipif(not onednn_available(), reason="no oneDNN")
        ),
        ("python", "torch", "torch"),
        ("torchscript", "onednn", "torch"),
        ("torch_export", "onednn", "torch"),
    ],
)
def test_the_profile_records_how_the_linear_layers_ran(tmp_path, platform, cpu_linear, ran):
    """`config.cpu_linear` said `onednn` (the option's default) for a TorchScript or torch.export model, whose
    layers the server leaves to torch whatever --cpu-linear says (server/cpulinear.py, `with_onednn_linear`): a
    reader took its times for oneDNN's. The same Linear and ReLU, served as an nn.Module, does run through
    oneDNN at the batch of 4 rows."""
    _saved_linear(tmp_path / "repo" / "lin", platform)
    doc = _profiled(tmp_path / "repo" / "lin", "--cpu-linear", cpu_linear)
    assert (doc["model"]["platform"], doc["config"]["cpu_linear"]) == (platform, ran)


def test_a_profile_of_batches_under_4_rows_records_torchs_layers(tmp_path):
    """oneDNN takes a batch from 4 rows (`cpulinear.MIN_ROWS`): batches of 1 and 2 ran torch's layers, though the
    server's start-up warm-up, which the profile runs first, ran its batches of 4 rows and more through oneDNN (with
    max_batch_size 64 those run on one thread, which the warm-up builds kernels for)."""
    from wok.cpulinear import onednn_counts
    from wok.executor import Executor

    folder = write_python_model(tmp_path / "repo" / "lin", LINEAR_MODEL, 64)
    if onednn_available():
        servable = load_servable(folder)
        executor = Executor(servable, servable.config.instances, cpu_linear="onednn")
        try:
            executor.warmup()
            assert onednn_counts(executor.instances[0].module, ran=True)[0] == 1  # the warm-up took oneDNN
        finally:
            executor.shutdown()
    assert _profiled(folder, "--batch-sizes", "1,2")["config"]["cpu_linear"] == "torch"


TAPPED_MODEL = """
from torch import nn


class Tapped(nn.Module):
    # Reads its input as each forward runs, through a hook registered for that call alone (a common way to keep an
    # intermediate activation): any hook registered makes a OneDNNSequential plan its chains anew at its next call.
    def __init__(self):
        super().__init__()
        self.tap = nn.Identity()
        self.body = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))

    def forward(self, x):
        handle = self.tap.register_forward_hook(lambda module, args, out: None)
        try:
            return self.body(self.tap(x))
        finally:
            handle.remove()


def build(**parameters):
    return Tapped()
"""


@pytest.mark.skipif(not onednn_available(), reason="no oneDNN")
def test_a_model_whose_chains_are_planned_anew_at_each_call_records_onednn(tmp_path):
    """Its batches of 4 and 8 rows ran through oneDNN, each on chains planned for that call. The chains after the
    start-up warm-up were matched by their place in the list with those after the profile: the last warm-up batch's
    chain (1 call) against the last timed batch's (1 call), and `config.cpu_linear` said torch."""
    folder = write_python_model(tmp_path / "repo" / "tapped", TAPPED_MODEL, 8)
    assert _profiled(folder, "--batch-sizes", "4,8")["config"]["cpu_linear"] == "onednn"


class _ScriptedTable(torch.nn.Module):
    """Ids looked up in a parameter with F.embedding, no nn.Embedding; and a table of positions, indexed by
    arange, not by the ids: its 5 rows bound no id."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(9, 4))
        self.pos = torch.nn.Parameter(torch.randn(5, 4))

    def forward(self, ids):
        return F.embedding(ids, self.table).sum(1) + F.embedding(torch.arange(ids.shape[1]), self.pos).sum(0)


class _SelectedRows(torch.nn.Module):
    """The same lookups as index_select of buffers, the ids flattened first."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("table", torch.randn(9, 4))
        self.register_buffer("pos", torch.randn(5, 4))

    def forward(self, ids):
        rows = self.table.index_select(0, ids.reshape(-1)).view(ids.shape[0], -1, 4)
        return rows.sum(1) + self.pos.index_select(0, torch.arange(ids.shape[1])).sum(0)


class _IndexedRows(torch.nn.Module):
    """The same lookup as `table[ids]`, the ids cast first; and a table of 5 rows indexed by ids % 5, which any
    ids stay within."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("table", torch.randn(9, 4))
        self.register_buffer("hashed", torch.randn(5, 4))

    def forward(self, ids):
        return self.table[ids.long()].sum(1) + self.hashed[ids % 5].sum(1)


@pytest.mark.parametrize(
    ("platform", "model", "decompose"),
    [
        ("torchscript", _ScriptedTable, False),
        ("torchscript", _SelectedRows, False),
        ("torchscript", _IndexedRows, False),
        ("torch_export", _SelectedRows, False),
        ("torch_export", _IndexedRows, False),
        ("torch_export", _SelectedRows, True),
        ("torch_export", _IndexedRows, True),
    ],
)
def test_ids_stay_within_a_table_a_saved_model_gathers_from_without_nn_embedding(tmp_path, platform, model, decompose):
    """The default --int-high: a table that is no nn.Embedding, a scripted F.embedding of a parameter or an
    index_select or `table[ids]` of a buffer (in a torch.export program, core ATen's after run_decompositions too),
    was not found, and the ids went up to 50 where the table has 9 rows: `wok profile` of it failed ("index out of
    range in self"). A table indexed by other ids than the input's (positions, ids % 5) bounds no id."""
    folder = tmp_path / "repo" / "gather"
    example = torch.zeros(2, 3, dtype=torch.long)
    _save_model(folder, model(), platform, example, IDS, ("out", "FP32", [4]), decompose=decompose)
    assert profiler.id_range(load_servable(folder)) == 9
    assert _profiled(folder)["config"]["int_high"] == 9


def test_representatives_by_hand():
    keys = [3, 1, 3, 2, 1, 3]
    # Three distinct keys: each once, at its first batch, weighted by its count.
    assert profiler.representatives(keys, 3) == [(1, 2), (3, 1), (0, 3)]
    # Two runs of the batches sorted by key, [1 4 3] and [0 2 5]: their middle batches, 3 each.
    assert profiler.representatives(keys, 2) == [(4, 3), (2, 3)]
    with pytest.raises(ValueError) as refused:
        profiler.representatives(keys, 0)
    assert str(refused.value) == "most: expected an integer >= 1; got 0"  # was "representatives: most must be >= 1"


def test_batch_shapes_follow_the_padding():
    model, buffers = PaddedLinear(), HostBuffers(pinned=False)
    short, long = {"x": np.zeros((1, 2), np.float32)}, {"x": np.zeros((1, 6), np.float32)}
    assert profiler.batch_shapes(model, [short, long], buffers) == (12, (("x", (2, 6)),))
    assert profiler.batch_shapes(model, [short], buffers) == (2, (("x", (1, 2)),))


def _count(fn) -> WorkCount:
    work = WorkCount()
    with torch.inference_mode(), profiler._WorkMode({}, work):
        fn()
    return work


def test_embedding_bag_mean_with_weights_and_padding_by_hand():
    table = torch.randn(10, 4)
    ids = torch.tensor([0, 3, 4, 0, 5, 6, 7])  # bags [0 3 4] [0] [5 6 7]; id 0 is padding
    offsets = torch.tensor([0, 3, 4])
    work = _count(lambda: F.embedding_bag(ids, table, offsets, mode="mean", padding_idx=0))
    # Rows read: 2 + 0 + 3 (padding skipped). Mean: (k-1)·D adds + D divides per non-empty bag.
    assert work.embedding_rows == 5
    assert work.flops_added == {"embedding_bag": (1 + 0 + 2) * 4 + 2 * 4}
    weights = torch.ones(7)
    work = _count(lambda: F.embedding_bag(ids, table, offsets, mode="sum", per_sample_weights=weights))
    # No padding: 7 rows; sum: (2 + 0 + 2)·D adds, and 7·D multiplies by the weights.
    assert work.embedding_rows == 7
    assert work.flops_added == {"embedding_bag": 4 * 4 + 7 * 4}
    assert work.activation_read_bytes == INT64 * (7 + 3) + FP32 * 7
    assert work.activation_write_bytes == FP32 * 3 * 4


def test_shape_only_and_out_arguments_are_not_read():
    """empty_like(x) was counted as reading all of x (and zeros_like, new_zeros too), and
    mm(a, b, out=c) as reading c: bytes no op moves."""
    x, c = torch.randn(10, 10), torch.empty(10, 10)
    for make, written in [
        (lambda: torch.empty_like(x), 0),
        (lambda: torch.zeros_like(x), FP32 * 100),
        (lambda: x.new_zeros(10, 10), FP32 * 100),
    ]:
        work = _count(make)
        assert (work.activation_read_bytes, work.activation_write_bytes) == (0, written)
    work = _count(lambda: torch.mm(x, x, out=c))
    assert (work.activation_read_bytes, work.activation_write_bytes) == (FP32 * 200, FP32 * 100)


def test_views_move_nothing_and_parameters_are_read_once():
    w = torch.randn(8, 8)
    x = torch.randn(2, 8)
    work = WorkCount()
    with torch.inference_mode(), profiler._WorkMode({profiler._storage(w): w.untyped_storage().nbytes()}, work):
        y = (x @ w.t()) @ w  # w read by two matmuls, once per batch; t() is a view
        y.view(16)
    assert work.param_bytes == FP32 * 64
    assert work.activation_read_bytes == FP32 * (16 + 16)
    assert work.activation_write_bytes == FP32 * (16 + 16)


# ---------------------------------------------------------------------------- fit


def test_the_fit_recovers_alpha_and_beta_exactly():
    n = np.array([1, 2, 4, 8, 16, 32])
    fit = fit_linear(n, 0.0021 + 0.00037 * n)
    assert fit.alpha_s == pytest.approx(0.0021, rel=1e-12)
    assert fit.beta_s == pytest.approx(0.00037, rel=1e-12)
    assert fit.r2 == pytest.approx(1.0, abs=1e-12)


def test_r2_on_a_hand_case():
    # x = 1, 2, 3 and y = 1, 3, 2: β = Σ(x-x̄)(y-ȳ)/Σ(x-x̄)² = 1/2, α = ȳ - β·x̄ = 1; fitted
    # 1.5, 2, 2.5; SS_res = 0.25 + 1 + 0.25 = 1.5, SS_tot = 1 + 1 + 0 = 2, R² = 1 - 1.5/2.
    fit = fit_linear([1, 2, 3], [1, 3, 2])
    assert (fit.alpha_s, fit.beta_s) == pytest.approx((1.0, 0.5))
    assert fit.r2 == pytest.approx(0.25)


@pytest.mark.parametrize(("sizes", "t"), [([1, 2, 4], 0.1), ([1, 2, 4, 8, 16, 32], 7e-5)])
def test_equal_times_fit_a_flat_line_exactly(sizes, t):
    fit = fit_linear(sizes, [t] * len(sizes))
    assert (fit.alpha_s, fit.beta_s, fit.r2) == (t, 0.0, 1.0)
    assert math.isnan(fit.ceiling)  # no ceiling seen, not 1/1e-33


def test_throughput_and_ceiling():
    fit = Fit(alpha_s=0.002, beta_s=0.0005, r2=1.0)
    assert fit.throughput(4) == pytest.approx(4 / 0.004)
    assert fit.ceiling == pytest.approx(2000)
    assert math.isnan(Fit(0.002, 0.0, 1.0).ceiling)


def test_a_negative_alpha_is_said_and_its_nan_throughput_is_a_dash():
    """T(n) bending upwards fits α < 0: the fitted time at n = 1 is negative and its fitted
    throughput NaN, which the table printed as "nan", with no word on why."""
    doc = json.loads((Path(__file__).parents[2] / "docs" / "results" / "profile-mlp.json").read_text())
    ns = [b["batch_size"] for b in doc["batches"]]
    fit = fit_linear(ns, [1e-5 + 2e-6 * n**1.5 for n in ns])
    assert fit.alpha_s < 0 and fit.time_s(1) < 0
    doc["fit"].update(alpha_s=fit.alpha_s, beta_s=fit.beta_s, r2=fit.r2, ceiling_qps=fit.ceiling)
    for b in doc["batches"]:
        b["fit_s"], b["fit_throughput_qps"] = fit.time_s(b["batch_size"]), fit.throughput(b["batch_size"])
    head, rows = profiler.table_rows(doc)
    assert dict(zip(head, rows[0]))["fit QPS"] == "-"
    assert any(line.startswith("α < 0: the line does not hold") for line in profiler.summary_lines(doc))


def test_the_summary_says_what_class_and_roof_are_and_why_they_differ():
    """mlp's batches of 4 to 16 are "in between" under the "compute" roof, and the summary explained
    "class" alone: the two columns read as contradicting each other."""
    root = Path(__file__).parents[2]
    doc = json.loads((root / "docs" / "results" / "profile-mlp.json").read_text())
    head, rows = profiler.table_rows(doc)
    assert ("in between", "compute") in {(r[head.index("class")], r[head.index("roof")]) for r in rows}
    lines = profiler.summary_lines(doc)
    assert (
        "class: I against fixed thresholds, the same on every device: compute-bound I > 10, memory-bound I < 1, "
        "in between otherwise"
    ) in lines
    roof = next(line for line in lines if line.startswith("roof: "))
    assert "compute from its ridge up (I ≥ 1.8 FLOP/B), memory below; class ignores the ridge" in roof
    # The rule the line states is the one the rows follow.
    ridge = doc["device"]["ridge_flop_per_byte"]
    limits = [b["roofline_limit"] for b in doc["batches"]]
    assert limits == ["compute" if b["intensity_flop_per_byte"] >= ridge else "memory" for b in doc["batches"]]
    # docs/profile.md shows these documents as wok profile prints them now.
    text = (root / "docs" / "profile.md").read_text()
    for name in ("mlp", "recsys"):
        stored = json.loads((root / "docs" / "results" / f"profile-{name}.json").read_text())
        assert "\n".join(profiler.summary_lines(stored)) in text, name


def test_times_exactly_through_the_origin_fit_alpha_zero_and_are_not_said_negative():
    """Times exactly 0.1 ms·n at n = 1, 4, 16, 64 fitted α = -4.3e-19 s, and the summary said "α < 0: the line
    does not hold at small batch sizes" of a line that holds at every size: α is 0 but for the fit's rounding."""
    doc = json.loads((Path(__file__).parents[2] / "docs" / "results" / "profile-mlp.json").read_text())
    ns = [1, 4, 16, 64]
    fit = fit_linear(ns, [1e-4 * n for n in ns])
    assert fit.alpha_s == 0.0 and fit.beta_s == pytest.approx(1e-4, rel=1e-12)
    doc["fit"].update(alpha_s=fit.alpha_s, beta_s=fit.beta_s, r2=fit.r2, ceiling_qps=fit.ceiling)
    assert not any(line.startswith("α < 0") for line in profiler.summary_lines(doc))


def test_a_fit_needs_two_batch_sizes():
    with pytest.raises(ValueError, match="two or more"):
        fit_linear([4, 4], [1.0, 2.0])
    with pytest.raises(ValueError, match="two or more"):
        ProfileConfig(batch_sizes=[8, 8])


def test_classes_at_the_thresholds():
    assert [classify(x) for x in (0.99, 1.0, 10.0, 10.01)] == [
        "memory-bound",
        "in between",
        "in between",
        "compute-bound",
    ]


ECHO_MODEL = """
from torch import nn


class Echo(nn.Module):
    def forward(self, x):
        return x


def build(**parameters):  # the slow model's config, its sleep_ms unused
    return Echo()
"""


def test_a_model_that_does_nothing_has_no_class(tmp_path, slow_repository, capsys):
    """0 FLOPs over 0 bytes is I = NaN: it was classed "in between" (1 <= I <= 10) on the "compute" roof."""
    assert classify(math.nan) is None
    repo = slow_repository()
    (repo / "slow" / "model.py").write_text(ECHO_MODEL)  # the slow model's config, a model that returns its input
    out = tmp_path / "echo.json"
    argv = ["profile", "slow", "--model-repository", str(repo), "--warmup", "0", "--repeats", "1"]
    assert main([*argv, "--peak-flops", "1T", "--bandwidth", "1T", "--json", str(out)]) == 0
    for b in json.loads(out.read_text())["batches"]:
        assert (b["flops"], b["bytes"]) == (0, 0)
        assert (b["intensity_flop_per_byte"], b["bound"], b["roofline_limit"]) == (None, None, None)
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.split()[:1] == ["1"]]
    assert rows[0][-3:] == ["-", "-", "-"]  # I, class, roof


def test_default_batch_sizes_end_at_max_batch_size():
    assert default_batch_sizes(32) == [1, 2, 4, 8, 16, 32]
    assert default_batch_sizes(48) == [1, 2, 4, 8, 16, 32, 48]


# ---------------------------------------------------------------------------- roofline


def test_roofline_prediction_by_hand():
    roof = Roofline(peak_flops=1e12, bandwidth=1e11, source={}, device="x")
    assert roof.ridge == 10
    assert roof.predicted_s(2e9, 1e8) == pytest.approx(2e-3)  # compute: 2 ms > 1 ms
    assert roof.limit(2e9, 1e8) == "compute"
    assert roof.predicted_s(1e9, 5e8) == pytest.approx(5e-3)  # memory: 5 ms > 1 ms
    assert roof.limit(1e9, 5e8) == "memory"
    assert roof.attainable(2.0) == 2e11 and roof.attainable(50.0) == 1e12


def test_micro_benchmarks_report_what_they_timed():
    flops, how = measure_peak_flops(CPU, n=128, repeats=2, budget_s=0.0)
    assert flops == pytest.approx(2 * 128**3 / how["seconds"])
    bw, how = measure_bandwidth(CPU, nbytes=1 << 20, repeats=2, budget_s=0.0)
    assert bw == pytest.approx(2 * (1 << 20) / how["seconds"])


def test_rates_parse_with_si_prefixes():
    assert parse_rate("900G", "x") == 9e11
    assert parse_rate("3.35T", "x") == pytest.approx(3.35e12)
    with pytest.raises(ValueError, match=r"^--peak-flops: expected a finite number > 0; got '1e400'$"):
        parse_rate("1e400", "--peak-flops")  # inf: the ridge and the verdicts would be nonsense
    assert parse_rate("2.5e12", "x") == 2.5e12
    for bad in ("fast", "0", "1Q"):
        with pytest.raises(ValueError):
            parse_rate(bad, "--peak-flops")


# ---------------------------------------------------------------------------- the command


DOCUMENTED_BATCH_KEYS = (
    "batch_size",
    "median_s",
    "p99_s",
    "mean_s",
    "max_s",
    "samples_s",
    "fitted_on_s",
    "fitted_on_throughput_qps",
    "fit_s",
    "fit_throughput_qps",
    "throughput_qps",
    "stages_median_s",
    "flops",
    "flops_per_inference",
    "flops_detail",
    "bytes",
    "bytes_per_inference",
    "bytes_detail",
    "intensity_flop_per_byte",
    "bound",
    "predicted_s",
    "roofline_limit",
    "attained_fraction",
)


def test_cli_writes_the_documented_json(tmp_path, capsys):
    out, png = tmp_path / "profile.json", tmp_path / "roofline.png"
    argv = ["profile", "mlp", "--batch-sizes", "1,4,8", "--warmup", "1", "--repeats", "3"]
    argv += ["--peak-flops", "100G", "--bandwidth", "20G", "--json", str(out), "--plot", str(png)]
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "fit on per-size medians: T(n) = α + β·n" in table
    assert "peak 100 GFLOP/s (given), bandwidth 20 GB/s (given)" in table
    doc = json.loads(out.read_text())
    assert doc["schema"] == "wok.profile/1"
    # Every key docs/profile.md documents, under the names other commands read.
    assert set(doc) == {"schema", "model", "config", "device", "fit", "counting", "batches"}
    assert {"alpha_s", "beta_s", "r2", "on", "ceiling_qps"} <= set(doc["fit"])
    assert set(doc["batches"][0]) == set(DOCUMENTED_BATCH_KEYS)
    assert [b["batch_size"] for b in doc["batches"]] == [1, 4, 8]
    for b in doc["batches"]:
        samples = sorted(b["samples_s"])
        assert len(samples) == 3
        assert b["median_s"] == samples[1]  # nearest rank: the ⌈0.5·3⌉ = 2nd smallest
        assert b["p99_s"] == samples[2]
        # One batching key: the fit is on the median, and n over it is the one QPS.
        assert b["fitted_on_s"] == b["median_s"] and b["fitted_on_throughput_qps"] == b["throughput_qps"]
        n = b["batch_size"]
        assert b["flops"] == 2 * n * (256 * 1024 + 1024 * 1024 + 1024 * 256)
        assert b["predicted_s"] == pytest.approx(max(b["flops"] / 1e11, b["bytes"] / 2e10))
        assert b["intensity_flop_per_byte"] == pytest.approx(b["flops"] / b["bytes"])
    fit = fit_linear([b["batch_size"] for b in doc["batches"]], [b["median_s"] for b in doc["batches"]])
    assert (doc["fit"]["alpha_s"], doc["fit"]["beta_s"], doc["fit"]["r2"]) == pytest.approx(
        (fit.alpha_s, fit.beta_s, fit.r2)
    )
    assert doc["device"]["peak_flops"] == 1e11 and doc["device"]["source"]["bandwidth"]["measured"] is False
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_model_that_batches_one_row_has_no_fit_and_says_so(slow_repository, capsys):
    """max_batch_size 1: the default sizes are [1]; the refusal named --batch-sizes, which was not given
    and could not help (any size above 1 exceeds max_batch_size)."""
    repo = slow_repository(sleep_ms=0.1, max_batch_size=1)
    assert main(["profile", "slow", "--model-repository", str(repo), "--warmup", "0", "--repeats", "1"]) == 2
    assert "model 'slow' has max_batch_size 1: T(n) = α + β·n needs batches of two or more sizes" in (
        capsys.readouterr().err
    )


def test_cli_profiles_a_repository_model(tmp_path, slow_repository):
    repo = slow_repository(sleep_ms=2.0, max_batch_size=4)
    out = tmp_path / "slow.json"
    argv = ["profile", "slow", "--model-repository", str(repo), "--warmup", "0", "--repeats", "2"]
    assert main([*argv, "--peak-flops", "1T", "--bandwidth", "1T", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert [b["batch_size"] for b in doc["batches"]] == [1, 2, 4]  # powers of two up to max_batch_size
    assert doc["model"]["source"] == str(repo)
    # x * 2 is elementwise: no FLOPs counted, and the op is named as uncounted.
    assert all(b["flops"] == 0 and b["bound"] == "memory-bound" for b in doc["batches"])
    assert "aten.mul" in doc["counting"]["uncounted_ops"]
    assert all(min(b["samples_s"]) >= 0.002 for b in doc["batches"])  # each batch sleeps 2 ms


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["profile", "mlp", "--batch-sizes", "16,64"], "exceed model 'mlp''s max_batch_size"),
        (["profile", "mlp", "--batch-sizes", "1,2.5"], "--batch-sizes: expected whole numbers; got '1,2.5'"),
        (["profile", "mlp", "--batch-sizes", "0,4"], "--batch-sizes '0,4': size 1: expected a number > 0; got 0"),
        (["profile", "mlp", "--batch-sizes", "1,x"], "--batch-sizes '1,x': 'x' is not a number"),
        (
            ["profile", "mlp", "--peak-flops", "lots"],
            "--peak-flops: expected a number with an optional SI prefix (e.g. '900G', '3.35T'); got 'lots'",
        ),
        (["profile", "nope"], "unknown demo model"),
        (["profile", "mlp", "--device", "tpu"], f"--device: expected {DEVICE_FORMS}; got 'tpu'"),
        # \d took every script's digits: "cuda:٣" passed, as the server's config refuses it.
        (["profile", "mlp", "--device", "cuda:٣"], f"--device: expected {DEVICE_FORMS}; got 'cuda:٣'"),
        # Passed, and torch read it as cuda:-128, which resolve_devices' count check let by.
        (["profile", "mlp", "--device", "cuda:128"], f"--device: expected {DEVICE_FORMS}; got 'cuda:128'"),
        (["profile", "mlp", "--device", "cuda:99"], "--device: device 'cuda:99' requested but"),
        (["profile", "mlp", "--seed", "-1"], "--seed: expected an integer >= 0; got -1"),
        # These said "--warmup must be >= 0 and --repeats >= 1; got -1 and 2", and "--torch-threads must be >= 1".
        (["profile", "mlp", "--warmup", "-1"], "--warmup: expected an integer >= 0; got -1"),
        (["profile", "mlp", "--repeats", "0"], "--repeats: expected an integer >= 1; got 0"),
        (["profile", "mlp", "--torch-threads", "0"], "--torch-threads: expected an integer >= 1; got 0"),
        # `wok bench ramp --int-high 0` says it in these words (one check): this said "--int-high must be >= 1".
        (["profile", "mlp", "--int-high", "0"], "--int-high: expected an integer >= 1; got 0"),
        (["profile", "mlp", "--batch-sizes", ""], "--batch-sizes '': expected a list like '1,2,4,8'"),
        (["profile", "recsys", "--sizes", "bogus"], "--sizes: sizes 'bogus': unknown distribution"),
    ],
)
def test_cli_refuses_bad_options(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


# A model whose load fails: an option refused after the load was refused as the load's failure instead.
UNLOADABLE = """
def build():
    raise RuntimeError("the model was loaded")
"""


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--repeats", "0"], "--repeats: expected an integer >= 1; got 0"),
        (["--warmup", "-1"], "--warmup: expected an integer >= 0; got -1"),
        (["--seed", "-1"], "--seed: expected an integer >= 0; got -1"),
        (["--int-high", "0"], "--int-high: expected an integer >= 1; got 0"),
        (["--device", "tpu"], f"--device: expected {DEVICE_FORMS}; got 'tpu'"),
        (["--device", "cuda:99"], "--device: device 'cuda:99' requested but"),
        (["--batch-sizes", "4,4"], "--batch-sizes: expected two or more different sizes (to fit α and β); got [4, 4]"),
    ],
)
def test_wok_profile_refuses_its_options_before_it_loads_the_model(option, message, tmp_path, capsys):
    """The comment said the options were refused before the model's load (seconds for a large one), but these were
    refused after it (ProfileConfig, the device's resolution): a typo waited for the load. Only --batch-sizes past
    the model's max_batch_size needs the model."""
    write_python_model(tmp_path / "repo" / "unloadable", UNLOADABLE, 4)
    assert main(["profile", "unloadable", "--model-repository", str(tmp_path / "repo"), *option]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"wok profile: {message}") and "loaded" not in err, err


IDENTITY = """
from torch import nn


def build():
    return nn.Identity()
"""

# A model whose build leaves a file where its parameter `mark` says: whether it was built.
MARKED = """
from pathlib import Path

from torch import nn


def build(mark):
    Path(mark).write_text("built")
    return nn.Identity()
"""


def _repository_of_siblings(repo: Path, mark: Path) -> None:
    """A model 'm', and beside it one whose build fails, one that marks its build, one whose config is refused."""
    write_python_model(repo / "m", IDENTITY, 4)
    write_python_model(repo / "broken", UNLOADABLE, 4)
    write_python_model(repo / "marked", MARKED, 4, parameters={"mark": str(mark)})
    write_python_model(repo / "torn", IDENTITY, 4)
    (repo / "torn" / "config.toml").write_text('platform = "onnx"\n')


def test_wok_profile_builds_the_model_of_its_repository_alone(tmp_path, capsys):
    """Every model of the repository was built to profile one, as `wok serve` builds them: a sibling whose build
    failed failed the profile, a slow one's build was part of the load, one calling torch.compile loaded dynamo (and
    the counting pass then ran through torch's slower modes). Now only the model's own folder is built; its
    siblings' configs are read for their names, one refused left out."""
    repo, mark = tmp_path / "repo", tmp_path / "marked-was-built"
    _repository_of_siblings(repo, mark)
    fast = ["--batch-sizes", "1,2", "--warmup", "0", "--repeats", "2", "--peak-flops", "1T", "--bandwidth", "1T"]
    assert main(["profile", "m", "--model-repository", str(repo), *fast]) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.startswith("wok profile m on cpu\n")
    assert not mark.exists()


def test_wok_profile_refuses_a_name_its_repository_lacks_naming_the_models_there(tmp_path, capsys):
    """A missing name is refused naming the models found (and the folders whose config is refused, whose models'
    names are not known); until 2026-12-07 the broken sibling's build failed the profile first. The folder of the
    name asked, its config refused, is refused for it."""
    repo, mark = tmp_path / "repo", tmp_path / "marked-was-built"
    _repository_of_siblings(repo, mark)
    assert main(["profile", "nope", "--model-repository", str(repo)]) == 2
    assert capsys.readouterr().err == (
        f"wok profile: unknown model 'nope'; model repository {repo} holds: broken, m, marked (and the folders whose "
        "config is refused: torn)\n"
    )
    assert main(["profile", "torn", "--model-repository", str(repo)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"wok profile: {repo / 'torn' / 'config.toml'}: platform: ") and "onnx" in err, err
    assert not mark.exists()


@pytest.mark.parametrize(
    ("sizes", "message"),
    [
        ([4, 4], "--batch-sizes: expected two or more different sizes (to fit α and β); got [4, 4]"),
        # It said "--batch-sizes: sizes must be >= 1".
        ([0, 2], "--batch-sizes: expected sizes >= 1; got [0, 2]"),
    ],
)
def test_profile_config_refuses_batch_sizes_in_the_options_words(sizes, message):
    with pytest.raises(ValueError) as info:
        ProfileConfig(batch_sizes=sizes)
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        # Cut at its first ": ", parse_steps' message kept the spec's tail: "--batch-sizes '1: 2': 2': expected ...".
        # The forms shown are batch sizes': parse_steps' are QPS ('50:800:2', '50,100,200'), until 2026-12-06.
        ("1: 2", "--batch-sizes '1: 2': expected start:stop:factor (e.g. '1:32:2'); got 2 parts"),
        ("1:x: 2", "--batch-sizes '1:x: 2': stop 'x' is not a number"),
        ("1, 2: 4", "--batch-sizes '1, 2: 4': expected start:stop:factor (e.g. '1:32:2'); got 2 parts"),
        ("1:2:4:8", "--batch-sizes '1:2:4:8': expected start:stop:factor (e.g. '1:32:2'); got 4 parts"),
        ("1,x", "--batch-sizes '1,x': 'x' is not a number"),
        (" ", "--batch-sizes ' ': expected a list like '1,2,4,8' or a range start:stop:factor like '1:32:2'"),
        # parse_steps counts QPS steps: "13823 steps; at most 1000".
        ("1:1000000:1.001", "--batch-sizes '1:1000000:1.001': 13823 sizes; at most 1000"),
    ],
)
def test_batch_sizes_refused_by_the_step_parser_name_the_option_once(spec, message):
    with pytest.raises(ValueError) as info:
        profiler.parse_batch_sizes(spec)
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["recsys", "--int-high", "2000000"],
            "--int-high 2000000: served, model 'recsys' answers such a request INVALID_ARGUMENT before it is batched: "
            "input 'ids': expected ids in [0, 200000); got values from ",
        ),
        (
            ["encoder", "--sizes", "fixed:300"],
            "--sizes fixed:300 and input 'tokens' below 256 (it has no id bound of its own: the rows of the model's "
            "smallest embedding table; where the model changes ids before a lookup, --int-high below 256 draws them "
            "lower): served, model 'encoder' answers such a request INVALID_ARGUMENT before it is batched: input "
            "'tokens': expected a sequence length of at most 256; got 300",
        ),
    ],
)
def test_inputs_the_model_refuses_are_the_options_error(argv, message, capsys):
    """Ids past recsys's 200,000-row table, or 300 tokens for encoder's 256 positions: the model
    failed in the executor and `wok profile` ended in a traceback (exit 1); then the profile said the model's
    failure (`model 'recsys' failed: RuntimeError: Index ...`), where the server refuses such a request before
    it is batched, by the model's own check, in that refusal's words."""
    fast = ["--batch-sizes", "1,2", "--warmup", "0", "--repeats", "1", "--peak-flops", "1T", "--bandwidth", "1T"]
    assert main(["profile", *argv, *fast]) == 2
    assert message in capsys.readouterr().err


class RefusesLong(PaddedLinear):
    """PaddedLinear whose own assemble refuses a batch holding a sequence of more than 8 values, as a servable's
    assemble may refuse a request's values: the executor answers that request INVALID_ARGUMENT, as raised."""

    def assemble(self, requests, rows, buffers):
        longest = max(r["x"].shape[1] for r in requests)
        if longest > 8:
            raise InvalidInput(f"input 'x': expected sequences of at most 8 values; got {longest}")
        return super().assemble(requests, rows, buffers)


@pytest.mark.parametrize(("sizes", "got"), [("fixed:16", "16"), ("uniform:4:12", "(9|10|11|12)")])
def test_requests_the_models_assemble_refuses_are_the_options_error(sizes, got):
    """`profile` caught the model's failures only: an InvalidInput of its assemble, raised by the timing (a batch
    of 1 at once, a larger one as its failure after the reruns), left `wok profile` in a traceback, exit 1."""
    cfg = ProfileConfig(batch_sizes=[1, 2], warmup=0, repeats=8, sizes=sizes)
    with pytest.raises(ValueError) as refused:
        profiler.profile(RefusesLong(), cfg, lambda device: roofline_for(device, 1e12, 1e11))
    said = (
        f"the inputs made with --sizes {sizes}: a batch of 1 failed: served, model 'padded' answers such a request "
        f"INVALID_ARGUMENT as its batch is assembled: input 'x': expected sequences of at most 8 values; got {got}"
    )
    assert re.fullmatch(re.escape(said).replace(re.escape(got), got), str(refused.value)), str(refused.value)


CHECKED_DOUBLE = (
    VARIABLE_DOUBLE
    + """

def check(inputs):
    length = inputs["INPUT0"].shape[1]
    if length > 8:
        raise ValueError(f"input 'INPUT0': expected at most 8 values; got {length}")


def broken(inputs):
    return inputs["INPUT1"]
"""
)


def test_requests_the_server_refuses_are_refused_not_timed(tmp_path, capsys):
    """A model's check refuses a request before it is batched (INVALID_ARGUMENT), but the model itself runs it:
    `wok profile` timed and fitted batches of such requests, which the server never runs (exit 0)."""
    repo = tmp_path / "repo"
    folder = write_python_model(repo / "checked", CHECKED_DOUBLE, 4, dims=-1)
    config = folder / "config.toml"
    config.write_text(
        config.read_text().replace('factory = "model:build"', 'factory = "model:build"\ncheck = "model:check"')
    )
    fast = ["--batch-sizes", "1,2", "--warmup", "0", "--repeats", "2", "--peak-flops", "1T", "--bandwidth", "1T"]
    argv = ["profile", "checked", "--model-repository", str(repo), *fast]
    assert main([*argv, "--sizes", "uniform:4:12"]) == 2
    err = capsys.readouterr().err
    # It named the model twice: "served, model 'checked' answers such a request INVALID_ARGUMENT before it is
    # batched: model 'checked' refused the request: ...".
    said = (
        "wok profile: the inputs made with --sizes uniform:4:12: served, such a request is answered INVALID_ARGUMENT "
        "before it is batched: model 'checked' refused the request: input 'INPUT0': expected at most 8 values; got "
    )
    assert said in err and err.count("'checked'") == 1 and "Traceback" not in err, err
    # Requests it takes are profiled.
    assert main([*argv, "--sizes", "uniform:4:8"]) == 0
    capsys.readouterr()
    # A check that fails is the server's INTERNAL answer, said as such.
    config.write_text(config.read_text().replace('check = "model:check"', 'check = "model:broken"'))
    assert main([*argv, "--sizes", "uniform:4:8"]) == 2
    err = capsys.readouterr().err
    said = (
        "wok profile: the inputs made with --sizes uniform:4:8: served, such a request is answered INTERNAL before it "
        "is batched: model 'checked': its check (model:broken) failed: KeyError: 'INPUT1'\n"
    )
    assert err.endswith(said) and err.count("'checked'") == 1, err


CHECK_RAISES = {
    "ValueError": ValueError("input 'x': expected at most 8 values; got 12"),
    "RuntimeError": RuntimeError("the check's table is not loaded"),
    "KeyError": KeyError("lengths"),
    # Details past 4 KiB, which the server cuts (service.short_details): the profile printed them whole.
    "long ValueError": ValueError("input 'x': expected at most 8 values; got " + ", ".join(["12"] * 2000)),
}


class ChecksRaising(PaddedLinear):
    """PaddedLinear whose own `check` raises `error` (a Servable's check is not wrapped as a config's is)."""

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error

    def check(self, inputs):
        raise self.error


CHECK_RAISING_DOUBLE = (
    VARIABLE_DOUBLE
    + """

def check(inputs):
    raise ERROR
"""
)


async def _served_answer(servable, port_of) -> tuple[str, str]:
    """The status and message tritonclient gets for a request of 4 values to a real server of `servable`."""
    import tritonclient.grpc.aio as aioclient
    from tritonclient.utils import InferenceServerException

    name, inp = servable.name, servable.config.inputs[0].name
    async with port_of() as port, aioclient.InferenceServerClient(f"127.0.0.1:{port}") as client:
        tensor = aioclient.InferInput(inp, [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
        with pytest.raises(InferenceServerException) as info:
            await client.infer(name, [tensor])
    return info.value.status().removeprefix("StatusCode."), info.value.message()


@pytest.mark.parametrize("raised", list(CHECK_RAISES))
@pytest.mark.parametrize("form", ["servable", "config"])
async def test_a_check_raising_anything_is_refused_as_the_server_answers_it(tmp_path, serve, raised, form):
    """A model's check that raises: the server answers each such request (a Servable's own check: a ValueError or any
    other error is INTERNAL "internal error: ValueError: ...", to_status's words; a config's check: a ValueError
    refuses it, INVALID_ARGUMENT, anything else INTERNAL) and the profile's refusal says exactly that answer. A
    Servable's check raising a ValueError refused the profile in its bare words, as an options error; any other
    error ended it in a traceback."""
    from contextlib import asynccontextmanager

    from wok.app import WokServer
    from wok.config import server_settings
    from wok.repository import ModelRepository

    if form == "servable":
        servable = ChecksRaising(CHECK_RAISES[raised])

        @asynccontextmanager
        async def port_of():
            server = WokServer(server_settings(grpc_port=0, metrics_port=None), ModelRepository([servable], "test"))
            await server.start()
            try:
                yield server.port
            finally:
                await server.stop(grace=5)

    else:
        repo = tmp_path / "repo"
        folder = write_python_model(
            repo / "checked", CHECK_RAISING_DOUBLE.replace("ERROR", repr(CHECK_RAISES[raised])), 4, dims=-1
        )
        config = folder / "config.toml"
        config.write_text(
            config.read_text().replace('factory = "model:build"', 'factory = "model:build"\ncheck = "model:check"')
        )
        servable = load_servable(folder)

        @asynccontextmanager
        async def port_of():
            async with serve(models=(), repository=repo) as server:
                yield server.port

    code, details = await _served_answer(servable, port_of)
    expected = "INVALID_ARGUMENT" if form == "config" and type(CHECK_RAISES[raised]) is ValueError else "INTERNAL"
    assert code == expected, (code, details)
    if raised.startswith("long"):
        assert details.endswith(" characters in all)") and len(details) < 4096, details  # the client's, cut
    cfg = ProfileConfig(batch_sizes=[1, 2], warmup=0, repeats=2, sizes="fixed:4")
    with pytest.raises(ValueError) as refused:
        profiler.profile(servable, cfg, lambda device: roofline_for(device, 1e12, 1e11))
    # The model named once: by the server's details where they name it (a config's check), else by the refusal.
    whom = "such a request is answered" if form == "config" else "model 'padded' answers such a request"
    said = f"the inputs made with --sizes fixed:4: served, {whom} {code} before it is batched: {details}"
    assert str(refused.value) == said
    assert str(refused.value).count(f"'{servable.name}'") == 1


@pytest.mark.parametrize(
    ("message", "named"),
    [
        ("model 'padded' takes at most 8 values; got 12", True),
        # Another model's name that holds this one's: the quotes end a name (a model's name holds none).
        ("the upstream model 'padded-v2' takes at most 8 values; got 12", False),
        ("the upstream model 'p' takes at most 8 values; got 12", False),
        # A word ending in "model": no model named (it was taken for one, and the refusal named the model nowhere).
        ("its submodel 'padded' takes at most 8 values; got 12", False),
        ("its sub-model 'padded' takes at most 8 values; got 12", False),
    ],
)
def test_the_model_is_named_once_only_where_the_servers_details_name_it(message, named):
    cfg = ProfileConfig(batch_sizes=[1, 2], warmup=0, repeats=2, sizes="fixed:4")
    with pytest.raises(ValueError) as refused:
        profiler.profile(ChecksRaising(ValueError(message)), cfg, lambda device: roofline_for(device, 1e12, 1e11))
    whom = "such a request is answered" if named else "model 'padded' answers such a request"
    said = f"the inputs made with --sizes fixed:4: served, {whom} INTERNAL before it is batched: internal error: "
    assert str(refused.value) == f"{said}ValueError: {message}"


def test_the_table_shows_sub_ms_times_and_small_percentages_with_significant_digits():
    """A µs-scale prediction read 0.000 or 0.001 to 3 decimals, and attained 0.82% read 1%."""
    seconds = (0.0, 3.32e-7, 1.43e-6, 4.04e-5, 2.17e-4, 9.994e-4, 9.996e-4, 0.001605, 0.0299)
    assert [profiler._ms(x) for x in seconds] == [
        "0.000", "0.000332", "0.00143", "0.0404", "0.217", "0.999", "1.000", "1.605", "29.900",
    ]  # fmt: skip
    assert [profiler._pct(x) for x in (0.0, 0.0082, 0.012, 0.0994, 0.0996, 0.77, 1.2, None)] == [
        "0%", "0.82%", "1.2%", "9.9%", "10%", "77%", "120%", "-",
    ]  # fmt: skip
    assert profiler._ms(float("nan")) == "-"
    # The stored recsys profile (docs/profile.md): batch 1's row.
    doc = json.loads((Path(__file__).parents[2] / "docs" / "results" / "profile-recsys.json").read_text())
    head, rows = profiler.table_rows(doc)
    row = dict(zip(head, rows[0]))
    assert (row["median ms"], row["forward ms"], row["predicted ms"], row["attained"]) == (
        "0.0683", "0.0404", "0.000332", "0.82%",
    )  # fmt: skip
    # The JSON is untouched: seconds and fractions as measured.
    assert doc["batches"][0]["predicted_s"] == pytest.approx(3.32e-7, rel=1e-2)


def test_the_plot_draws_a_model_with_no_flops_counted(tmp_path):
    """An elementwise model (x * 2: flops 0, I = 0, as test_cli_profiles_a_repository_model
    profiles) has no place on a log axis: --plot failed with numpy's "Geometric sequence
    cannot include zero" after the whole run."""
    doc = json.loads((Path(__file__).parents[2] / "docs" / "results" / "profile-mlp.json").read_text())
    for b in doc["batches"]:
        b["flops"] = b["flops_per_inference"] = 0
        b["intensity_flop_per_byte"] = 0.0
    out = tmp_path / "zero.png"
    profiler.plot_profile(doc, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    doc["batches"][0]["intensity_flop_per_byte"] = math.nan  # no bytes counted either: 0 / 0
    profiler.plot_profile(doc, out)


class _TwoTables(torch.nn.Module):
    """Two integer inputs, each gathering from a table of its own: `a` from 9 rows, `b` from 5 (`table[ids]`)."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(9, 4))
        self.register_buffer("small", torch.randn(5, 4))

    def forward(self, a, b):
        return F.embedding(a, self.table).sum(1) + self.small[b].sum(1)


def _two_inputs_config(folder: Path, platform: str, source: str) -> None:
    text = f'platform = "{platform}"\n{source}\nmax_batch_size = 4\n'
    for name in ("a", "b"):
        text += f'\n[[inputs]]\nname = "{name}"\ndatatype = "INT64"\ndims = [3]\n'
    (folder / "config.toml").write_text(text + '\n[[outputs]]\nname = "out"\ndatatype = "FP32"\ndims = [4]\n')


def test_each_integer_input_is_drawn_below_its_own_table(tmp_path):
    """Every integer input was drawn below the model's smallest table: `a`, looked up in 9 rows, got ids below 5
    alone (the rows of `b`'s table), and a profile of recsys-like lookups read a part of its table. Each input
    known to reach tables now has its own bound (config.int_high_by_input); --int-high still sets every one."""
    folder = tmp_path / "repo" / "two"
    folder.mkdir(parents=True)
    torch.jit.script(_TwoTables().eval()).save(str(folder / "model.pt"))
    _two_inputs_config(folder, "torchscript", 'model_file = "model.pt"')
    servable = load_servable(folder)
    pool = profiler.request_pool(servable, ProfileConfig(batch_sizes=[1, 4]), 256)
    assert max(int(r["a"].max()) for r in pool) == 8 and max(int(r["b"].max()) for r in pool) == 4
    config = _profiled(folder)["config"]
    assert (config["int_high"], config["int_high_by_input"]) == (5, {"a": 9, "b": 5})
    config = _profiled(folder, "--int-high", "3")["config"]
    assert (config["int_high"], config["int_high_by_input"]) == (3, {})


class _Counted(torch.nn.Module):
    def forward(self, ids):
        return ids.float().sum(1, keepdim=True).expand(-1, 4)


class _TableAndHashed(torch.nn.Module):
    """`a` looked up in 9 rows; `b` hashed into an nn.Embedding of 12 (arithmetic: bounded by no table of its own)."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(9, 4))
        self.hashed = torch.nn.Embedding(12, 4)

    def forward(self, a, b):
        return F.embedding(a, self.table).sum(1) + self.hashed(b % 12).sum(1)


def _int_high_line(doc: dict) -> list[str]:
    return [line for line in profiler.summary_lines(doc) if line.startswith("integer inputs")]


def test_the_summary_says_which_ids_the_profile_drew_and_why(tmp_path):
    """`wok profile` of a model with a 10-row table drew ids below 10 and said so in its JSON alone: the printed
    table gave no bound, and the ramp's default of 50, past that table, was nowhere said to differ. Each input's own
    bound is said, and the one --int-high of the ramp that keeps every id within its tables where they differ."""
    example = torch.zeros(2, 3, dtype=torch.long)
    bags, counted, linear = tmp_path / "a" / "bags", tmp_path / "b" / "counted", tmp_path / "c" / "lin"
    _save_model(bags, _Bags(), "torchscript", example, IDS, ("out", "FP32", [4]))
    _save_model(counted, _Counted(), "torchscript", example, IDS, ("out", "FP32", [4]))
    _saved_linear(linear, "torchscript")
    two, mixed = tmp_path / "d" / "two", tmp_path / "e" / "mixed"
    for folder, module in ((two, _TwoTables()), (mixed, _TableAndHashed())):
        folder.mkdir(parents=True)
        torch.jit.script(module.eval()).save(str(folder / "model.pt"))
        _two_inputs_config(folder, "torchscript", 'model_file = "model.pt"')
    change, own = " (--int-high to change)", "the rows of the smallest embedding table"
    same = profiler.SAME_WITHOUT_INT_HIGH
    cases = [
        (bags, (), 10, None, f"by input: input 'ids' in [0, 10), {own} its ids reach{change}; {same}"),
        (bags, ("--int-high", "7"), 7, "given", "in [0, 7): given by --int-high; to send the same, give wok bench "
         "ramp --int-high 7"),
        (counted, (), 50, "default", f"in [0, 50): the default: no embedding table was found in the model{change}"),
        # A model of float inputs alone draws no integer: nothing is said, and the source is null.
        (linear, (), 50, None, None),
        (two, (), 5, None, f"by input: input 'a' in [0, 9), input 'b' in [0, 5), {own} each one's ids reach{change}; "
         f"{same}"),
        (mixed, (), 9, "table", f"by input: input 'a' in [0, 9), {own} its ids reach; the others in [0, 9): the rows "
         f"of the model's smallest embedding table{change}; to send the same, give wok bench ramp --int-high 9"),
    ]  # fmt: skip
    for folder, options, high, source, said in cases:
        doc = _profiled(folder, *options)
        assert (doc["config"]["int_high"], doc["config"]["int_high_source"]) == (high, source), folder
        assert _int_high_line(doc) == ([] if said is None else [f"integer inputs uniform {said}"]), folder
    # A document written before int_high_source says nothing it cannot know.
    del doc["config"]["int_high_source"]
    assert _int_high_line(doc) == []


def test_a_ramp_with_no_int_high_draws_what_the_profile_drew_by_input(tmp_path, serve_in_thread):
    """The line told a ramp to give --int-high to send what the profile drew, or that none could (tables of 9 and 5
    rows): a ramp with no --int-high draws each input below the bound the server publishes, which are the profile's
    bounds by input (an input hashed into a table, as `b` of the second model, in neither)."""
    from wok.bench.runner import RampConfig, build_pool

    repo = tmp_path / "repo"
    for name, module in (("two", _TwoTables()), ("mixed", _TableAndHashed())):
        (repo / name).mkdir(parents=True)
        torch.jit.script(module.eval()).save(str(repo / name / "model.pt"))
        _two_inputs_config(repo / name, "torchscript", 'model_file = "model.pt"')
    docs = {name: _profiled(repo / name) for name in ("two", "mixed")}
    assert _int_high_line(docs["two"])[0].endswith(f"; {profiler.SAME_WITHOUT_INT_HIGH}")
    assert "--int-high 9" in _int_high_line(docs["mixed"])[0]  # `b` drawn below 9 by the profile, 50 by the ramp
    server = serve_in_thread(models=(), repository=repo)
    published: dict = {}
    cfg = RampConfig(target=server.target, models=[("two", 1.0), ("mixed", 1.0)], steps=[10], step_duration_s=1)
    build_pool(cfg, lambda _: None, None, None, published)
    assert published == {name: doc["config"]["int_high_by_input"] for name, doc in docs.items()}


PYTHON_TABLE = """
import torch
import torch.nn.functional as F
from torch import nn


class Table(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(9, 4))

    def forward(self, ids):
        return F.embedding(ids, self.table).sum(1)
"""


class _ScriptedBag(torch.nn.Module):
    """F.embedding_bag of a parameter, no nn.EmbeddingBag: its inlined code swaps ids and table in a branch taken
    only for a long table and float ids, which the old finder could not rule out."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(9, 4))

    def forward(self, ids):
        return F.embedding_bag(ids, self.table, mode="sum")


@pytest.mark.parametrize("platform", ["python", "torchscript"])
def test_ids_stay_within_a_table_the_server_finds(tmp_path, platform):
    """Tables the server's finder found and wok profile's did not: a python model's F.embedding of a parameter
    (only nn.Embedding modules were read in a python model), a TorchScript module's own F.embedding_bag of a
    parameter (not frozen). The ids went up to 50 where the table has 9 rows: the profile failed."""
    folder = tmp_path / "repo" / "table"
    if platform == "python":
        folder.mkdir(parents=True)
        (folder / "model.py").write_text(PYTHON_TABLE)
        text = 'platform = "python"\nfactory = "model:Table"\nmax_batch_size = 4\n'
        for table, (name, datatype, dims) in (("inputs", IDS), ("outputs", ("out", "FP32", [4]))):
            text += f'\n[[{table}]]\nname = "{name}"\ndatatype = "{datatype}"\ndims = {dims}\n'
        (folder / "config.toml").write_text(text)
    else:
        _save_model(folder, _ScriptedBag(), platform, None, IDS, ("out", "FP32", [4]))
    servable = load_servable(folder)
    assert profiler.id_range(servable) == 9
    assert profiler.id_highs(servable) == {"ids": 9}
    assert _profiled(folder)["config"]["int_high"] == 9


class _NarrowedIds(torch.nn.Module):
    """Ids cast to int8 before a lookup in 300 rows: ids from 128 on become negative ones."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(300, 4))

    def forward(self, ids):
        return F.embedding(ids.to(torch.int8).long(), self.table).sum(1)


def test_a_cast_that_loses_values_bounds_no_input(tmp_path):
    """wok profile took any cast as keeping the ids: ids up to 300 were drawn, those from 128 wrapped to negative
    ones and the profile failed ("index out of range in self"). The cast bounds nothing now, and the ids are
    drawn below 50 (DEFAULT_INT_HIGH), which it keeps."""
    folder = tmp_path / "repo" / "narrowed"
    _save_model(folder, _NarrowedIds(), "torchscript", None, IDS, ("out", "FP32", [4]))
    servable = load_servable(folder)
    assert profiler.id_range(servable) == 50
    assert profiler.id_highs(servable) == {}
    assert _profiled(folder)["config"]["int_high"] == 50


class _WidenedIds(torch.nn.Module):
    """Ids of a narrow integer input, widened (a cast that keeps them) before a lookup in `rows` rows."""

    def __init__(self, rows: int = 300) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(rows, 4))

    def forward(self, ids):
        return F.embedding(ids.long(), self.table).sum(1)


@pytest.mark.parametrize(("datatype", "cap"), [("INT8", 128), ("UINT8", 256)])
def test_the_summary_says_where_an_inputs_datatype_caps_its_ids(tmp_path, datatype, cap):
    """The payloads draw an integer input below its datatype's largest value + 1 whatever its bound: an INT8 input
    whose ids reach 300 rows drew ids below 128, and the line said `input 'ids' in [0, 300)`."""
    folder = tmp_path / "repo" / "narrow"
    _save_model(folder, _WidenedIds(), "torchscript", None, ("ids", datatype, [3]), ("out", "FP32", [4]))
    doc = _profiled(folder)
    assert (doc["config"]["int_high_by_input"], doc["config"]["int_high_capped"]) == ({"ids": 300}, {"ids": cap})
    assert _int_high_line(doc) == [
        "integer inputs uniform by input: input 'ids' in [0, 300), the rows of the smallest embedding table its ids "
        f"reach (--int-high to change); but input 'ids' in [0, {cap}): its datatype holds no larger id; "
        f"{profiler.SAME_WITHOUT_INT_HIGH}"
    ]
    # --int-high past the type's range alike; one within it caps nothing.
    assert _profiled(folder, "--int-high", "1000")["config"]["int_high_capped"] == {"ids": cap}
    assert _profiled(folder, "--int-high", "100")["config"]["int_high_capped"] == {}


def _refused(folder: Path, capsys, *options: str) -> str:
    """What `wok profile` of the model in `folder` (batches of 1 and 4, 2 each) printed as it refused (exit 2)."""
    fast = ["--batch-sizes", "1,4", "--warmup", "0", "--repeats", "2", "--peak-flops", "1T", "--bandwidth", "1T"]
    assert main(["profile", folder.name, "--model-repository", str(folder.parent), *fast, *options]) == 2
    return capsys.readouterr().err


def test_inputs_refused_past_a_table_say_where_a_datatype_capped_them(tmp_path, capsys):
    """--int-high 1000 on an INT8 input drew its ids below 128, the type's cap, and ids from 100 on were refused:
    the message said `--int-high 1000` alone, a bound no id came near. Refused by the server's id check, before the
    request is batched, as the server refuses them (the profile said the model's failure of the batch it ran)."""
    folder = tmp_path / "repo" / "short"
    # A lookup in 100 rows: the INT8 input's ids up to 127 pass it.
    _save_model(folder, _WidenedIds(100), "torchscript", None, ("ids", "INT8", [3]), ("out", "FP32", [4]))
    err = _refused(folder, capsys, "--int-high", "1000")
    said = (
        "--int-high 1000, input 'ids' below 128 (its datatype holds no larger id): served, such a request is answered "
        "INVALID_ARGUMENT before it is batched: input 'ids': expected ids in [0, 100) (the rows of the embedding table "
        "model 'short' looks them up in); got values from "
    )
    assert said in err and err.count("'short'") == 1, err


class _UnseenTable(torch.nn.Module):
    """Ids looked up in 10 rows made in forward, no parameter: no table the finder sees; ids drawn below 50."""

    def forward(self, ids):
        return torch.zeros(10, 4).index_select(0, ids.flatten()).reshape(ids.shape[0], -1)[:, :4]


def test_inputs_refused_say_where_the_bound_came_from_when_not_from_int_high(tmp_path, capsys):
    """The refusal said `--int-high 50`, an option nobody gave: the bound was the default (or a table's rows)."""
    folder = tmp_path / "repo" / "unseen"
    _save_model(folder, _UnseenTable(), "torchscript", None, IDS, ("out", "FP32", [4]))
    err = _refused(folder, capsys)
    said = (
        "and input 'ids' below 50 (the default: no embedding table was found in the model; --int-high to change): "
        "a batch of 1 failed: model 'unseen' failed"
    )
    assert said in err and "--int-high 50" not in err, err


class _DoubledIds(torch.nn.Module):
    """`ids` reaches `a` (100 rows) as it is and `b` (150) doubled: the load finds no bound of its own, so it is
    drawn below the smallest table's 100, and its ids from 75 on fail `b`. `other` reaches `a` alone: bound 100."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Embedding(100, 4)
        self.b = torch.nn.Embedding(150, 4)

    def forward(self, ids, other):
        return (self.a(ids) + self.b(ids * 2) + self.a(other)).sum(1)


def _doubled_ids(tmp_path: Path) -> Path:
    folder = tmp_path / "repo" / "doubled"
    _save_model(folder, _DoubledIds(), "torchscript", None, IDS, ("out", "FP32", [4]))
    other = '[[inputs]]\nname = "other"\ndatatype = "INT64"\ndims = [3]\n\n[[outputs]]'
    (folder / "config.toml").write_text((folder / "config.toml").read_text().replace("[[outputs]]", other))
    assert load_servable(folder).id_bounds == {"other": 100}
    return folder


def test_inputs_refused_past_the_smallest_table_name_the_input_and_what_to_give(tmp_path, capsys):
    """The smallest table's rows, the bound of an input with none of its own, fail a model that doubles its ids:
    the refusal said "and ids below 100 (the rows of the model's smallest embedding table; --int-high to change)",
    as if of every input ('other' has its own), naming none and not which way to change it (before that the
    timing took the failed batches' reruns for their time, and the counting ended in a traceback). Of dims fixed by
    the model, the inputs were said made `with --sizes fixed:16` too, an option that shaped nothing there."""
    folder = _doubled_ids(tmp_path)
    err = _refused(folder, capsys)
    said = (
        "the inputs made at the model's fixed dims and input 'ids' below 100 (it has no id bound of its own: the "
        "rows of the model's smallest embedding table; where the model changes ids before a lookup, --int-high "
        "below 100 draws every integer input lower), input 'other' below 100: a batch of 1 failed: model "
        "'doubled' failed: RuntimeError: index out of range in self"
    )
    assert said in err and "Traceback" not in err, err
    # What it says to do does it: ids below 75, doubled, stay within b's 150 rows.
    assert _profiled(folder, "--int-high", "75")["config"]["int_high"] == 75


def test_a_batch_the_model_failed_is_no_timed_batch(tmp_path):
    """The executor reruns a failed batch of two or more in parts, as it does for the server's callers, and answers
    each request; the profile took that for the batch's time, and went on to fit the reruns. The failure names the
    batch's size, and that a request of it failed alone too (not `answered`: the inputs, not the size)."""
    from wok.errors import ModelExecutionError

    servable = load_servable(_doubled_ids(tmp_path))
    cfg = ProfileConfig(batch_sizes=[2, 4], warmup=0, repeats=2, int_high=100)
    pool = profiler.keyed_pool(servable, cfg, 256, 4)
    failing = [r for r in pool.requests if r["ids"].max() >= 75]
    assert failing and len(failing) < len(pool.requests)  # a timed batch of 2 holds one, most likely
    with pytest.raises(profiler.BatchFailed) as refused:
        _timed(servable, cfg, pool)
    failed = refused.value
    assert isinstance(failed.error, ModelExecutionError) and (failed.size, failed.warmup, failed.answered) == (
        2,
        False,
        False,
    )
    assert str(failed.error) == "model 'doubled' failed: RuntimeError: index out of range in self"


def test_counting_requests_the_model_fails_is_told_as_the_models_failure(tmp_path):
    """The counting pass runs requests the timing may not have run: the model's error came out as a traceback, and
    its line, under the counting's dispatch mode, had no message ("RuntimeError: ")."""
    from wok.errors import ModelExecutionError

    servable = load_servable(_doubled_ids(tmp_path))
    ids = np.array([[99, 0, 0]], np.int64)
    with pytest.raises(ModelExecutionError) as refused:
        profiler.count_work(servable, CPU, [{"ids": ids, "other": ids * 0}])
    assert str(refused.value) == "model 'doubled' failed: IndexError: index out of range in self"


CAUGHT_MODEL = """
import torch
from torch import nn


class Caught(nn.Module):
    def forward(self, x):
        try:  # an op's error the model catches, taking another way
            x[:, torch.tensor([99])]
        except IndexError as exc:
            if WAY == "chained":
                raise ValueError("the model's own refusal") from exc
        if WAY == "ops after":
            x = x * 2
        raise ValueError("the model's own refusal")


def build(**parameters):
    return Caught()
"""


@pytest.mark.parametrize("way", ["ops after", "none after", "chained"])
def test_counting_tells_the_models_own_error_not_an_op_error_it_caught(tmp_path, way):
    """The counting told the last op's error kept under its dispatch mode, whatever the model raised after it: a
    model that caught an op's error and then raised its own was told as failing with the op's (IndexError: index 99
    is out of bounds ...), where the executor tells its own ("ValueError: the model's own refusal")."""
    from wok.errors import ModelExecutionError

    folder = write_python_model(tmp_path / "caught", CAUGHT_MODEL.replace("WAY", repr(way)), 4)
    servable = load_servable(folder)
    with pytest.raises(ModelExecutionError) as refused:
        profiler.count_work(servable, CPU, [{"INPUT0": np.zeros((1, 4), np.float32)}])
    assert str(refused.value) == "model 'caught' failed: ValueError: the model's own refusal"


class _Summed(torch.nn.Module):
    def forward(self, x):
        return x.sum(1, keepdim=True)


def test_sizes_a_program_was_not_exported_for_are_refused_as_the_server_refuses_them(tmp_path, capsys):
    """A torch.export program for sequences of 2 to 8 values: the server refuses a request of 16 before it is
    batched (the dim's range, Servable.dim_ranges); the profile said the program's own failure of the batch."""
    folder = tmp_path / "repo" / "ranged"
    folder.mkdir(parents=True)
    dims = ({0: torch.export.Dim("batch", min=1, max=4), 1: torch.export.Dim("length", min=2, max=8)},)
    program = torch.export.export(_Summed(), (torch.ones(2, 4),), dynamic_shapes=dims)
    torch.export.save(program, str(folder / "model.pt2"))
    (folder / "config.toml").write_text(
        'platform = "torch_export"\nmodel_file = "model.pt2"\nmax_batch_size = 4\n\n[[inputs]]\nname = "x"\n'
        'datatype = "FP32"\ndims = [-1]\n\n[[outputs]]\nname = "y"\ndatatype = "FP32"\ndims = [1]\n'
    )
    err = _refused(folder, capsys, "--sizes", "fixed:16")
    said = (
        "wok profile: the inputs made with --sizes fixed:16: served, such a request is answered INVALID_ARGUMENT "
        "before it is batched: input 'x': expected dim 1 of "
    )
    assert said in err and "(the sizes model 'ranged' was exported for); got 16 in shape [1, 16]" in err, err
    assert err.count("'ranged'") == 1, err
    assert _profiled(folder, "--sizes", "fixed:8")["batches"][1]["batch_size"] == 4


class _WideAndNarrow(torch.nn.Module):
    """`a` (INT64) gathers from 200 rows; `b` (INT8), widened, from 300: its ids stop at 127, its datatype's cap."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(200, 4))
        self.wide = torch.nn.Parameter(torch.randn(300, 4))

    def forward(self, a, b):
        return F.embedding(a, self.table).sum(1) + F.embedding(b.long(), self.wide).sum(1)


def test_the_ramps_int_high_is_one_that_sends_the_same_where_a_datatype_caps_an_input(tmp_path):
    """Bounds 200 and 300, the 300 capped at 128 by INT8: --int-high 200 sends what the profile drew (b's ids stop
    at 127 either way), but the line said the ramp draws every input below one --int-high, as if none could."""
    folder = tmp_path / "repo" / "mixed"
    folder.mkdir(parents=True)
    torch.jit.script(_WideAndNarrow().eval()).save(str(folder / "model.pt"))
    text = 'platform = "torchscript"\nmodel_file = "model.pt"\nmax_batch_size = 4\n'
    for name, datatype in (("a", "INT64"), ("b", "INT8")):
        text += f'\n[[inputs]]\nname = "{name}"\ndatatype = "{datatype}"\ndims = [3]\n'
    (folder / "config.toml").write_text(text + '\n[[outputs]]\nname = "out"\ndatatype = "FP32"\ndims = [4]\n')
    doc = _profiled(folder)
    assert (doc["config"]["int_high_by_input"], doc["config"]["int_high_capped"]) == ({"a": 200, "b": 300}, {"b": 128})
    assert _int_high_line(doc) == [
        "integer inputs uniform by input: input 'a' in [0, 200), input 'b' in [0, 300), the rows of the smallest "
        "embedding table each one's ids reach (--int-high to change); but input 'b' in [0, 128): its datatype holds "
        f"no larger id; {profiler.SAME_WITHOUT_INT_HIGH}"
    ]
    line = profiler.int_high_line  # the document's cases no model here has
    # Other inputs drawn below the smallest table's 200 rows, which a ramp with no --int-high draws below 50: one
    # --int-high is what sends the same. Both capped at 128: any from 128 on does; the bound 200 is one.
    config = {"int_high": 200, "int_high_source": "table", "int_high_by_input": {"a": 300, "b": 200}}
    assert line({**config, "int_high_capped": {"a": 128, "b": 128}}).endswith(
        "; to send the same, give wok bench ramp --int-high 200"
    )
    # 9 and the cap 128 want different --int-high: none sends the same, 9 keeps every id within its table.
    config = {**config, "int_high": 9, "int_high_by_input": {"a": 9, "b": 300}, "int_high_capped": {"b": 128}}
    assert line(config).endswith(
        "; wok bench ramp draws every integer input below one --int-high: --int-high 9 keeps each within its tables"
    )
    # The others drawn below 50, as the ramp draws them: it sends the same with no --int-high, as with none left.
    assert line({**config, "int_high": 50}).endswith(f"; {profiler.SAME_WITHOUT_INT_HIGH}")
    assert line({**config, "int_high_source": None}).endswith(f"; {profiler.SAME_WITHOUT_INT_HIGH}")


ROOMY_MODEL = """
import torch
from torch import nn


class Roomy(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Embedding(100, 4)
        self.register_buffer("workspace", torch.zeros(3, 4))  # room for 3 rows: a batch of 4 does not fit

    def forward(self, ids):
        rows = self.table(ids.clamp(0, 99)).sum(1)  # clamped: no id bound of its own, the smallest table's
        self.workspace[: rows.shape[0]] = rows
        return self.workspace[: rows.shape[0]] * 2


def build(**parameters):
    return Roomy()
"""


def _roomy(tmp_path: Path) -> Path:
    folder = write_python_model(tmp_path / "repo" / "roomy", ROOMY_MODEL, 4)
    config = folder / "config.toml"
    config.write_text(
        config.read_text().replace('"INPUT0"\ndatatype = "FP32"\ndims = [4]', '"ids"\ndatatype = "INT64"\ndims = [3]')
    )
    return folder


@pytest.mark.parametrize("warmup", ["0", "1"])
def test_a_batch_failed_for_its_size_is_refused_naming_the_size_not_the_inputs(tmp_path, capsys, warmup):
    """A model whose workspace holds 3 rows fails a batch of 4, whose every request it answers rerun in parts: the
    refusal blamed the inputs (`the inputs made with --sizes fixed:16 and input 'ids' below 100 (... --int-high below
    100 draws them lower): model 'roomy' failed: ...`), named no batch size, and advised a lower --int-high, which
    changes nothing. A warm-up batch that failed so passes (its size's timed batches meet the failure again)."""
    folder = _roomy(tmp_path)
    fast = ["--batch-sizes", "1,2,4", "--warmup", warmup, "--repeats", "2", "--peak-flops", "1T", "--bandwidth", "1T"]
    assert main(["profile", "roomy", "--model-repository", str(folder.parent), *fast]) == 2
    err = capsys.readouterr().err
    said = (
        "wok profile: a batch of 4 failed, though the model answered each of its requests rerun in smaller parts (as "
        "the server reruns a failed batch): the batch's size failed it, not the inputs made at the model's fixed "
        "dims; the server reruns every such batch (a max_batch_size below 4 keeps it from forming them, "
        "--batch-sizes below 4 profile the sizes that run): model 'roomy' failed: RuntimeError: The expanded size of "
        "the tensor (3) must match the existing size (4)"
    )
    assert said in err and "--int-high" not in err and "Traceback" not in err, err
    # The sizes that run are profiled.
    assert _profiled(folder, "--batch-sizes", "1,2,3")["batches"][2]["batch_size"] == 3


class AssemblesThree(PaddedLinear):
    """PaddedLinear whose own assemble refuses a batch of more than 3 rows (its buffers' size, say): each request of a
    batch of 4 is answered rerun in parts. `said`: its refusal's start (naming the model, or not)."""

    said = ""

    def assemble(self, requests, rows, buffers):
        if rows > 3:
            raise InvalidInput(f"{self.said}expected batches of at most 3 rows; got {rows}")
        return super().assemble(requests, rows, buffers)


@pytest.mark.parametrize(
    ("said", "told"),
    [
        ("", "model 'padded' refused it as it was assembled (INVALID_ARGUMENT): "),
        # It named the model twice: "model 'padded' refused it as it was assembled (...): model 'padded': ".
        ("model 'padded': ", "refused as it was assembled (INVALID_ARGUMENT): model 'padded': "),
    ],
)
def test_a_batch_its_assemble_refuses_for_its_size_is_refused_naming_the_size(said, told):
    """The size of the batch refused it, not a request (`answers such a request INVALID_ARGUMENT`: none gets that
    answer, each is answered in parts). The model is named once, where the assemble's own text names it too. With
    --cpu-linear torch, as a server that serves it runs it: with oneDNN the start-up warm-up runs a batch of 4 too,
    and `wok serve` refuses the model (as the profile then does)."""
    cfg = ProfileConfig(batch_sizes=[1, 4], warmup=0, repeats=2, sizes="fixed:2", cpu_linear="torch")
    model = AssemblesThree()
    model.said = said
    with pytest.raises(ValueError) as refused:
        profiler.profile(model, cfg, lambda device: roofline_for(device, 1e12, 1e11))
    expected = (
        "a batch of 4 failed, though the model answered each of its requests rerun in smaller parts (as the server "
        "reruns a failed batch): the batch's size failed it, not the inputs made with --sizes fixed:2; the server "
        "reruns every such batch (a max_batch_size below 4 keeps it from forming them, --batch-sizes below 4 profile "
        f"the sizes that run): {told}expected batches of at most 3 rows; got 4"
    )
    assert str(refused.value) == expected


COLD_MODEL = """
from torch import nn


class Cold(nn.Module):
    def __init__(self):
        super().__init__()
        self.failing = FAILING  # forwards it fails first: a lazy set-up that fails until it is done

    def forward(self, x):
        if self.failing and ON_ZEROS_TOO:
            self.failing -= 1
            raise RuntimeError("not set up yet")
        return x * 2


def build(**parameters):
    return Cold()
"""


def _cold(tmp_path: Path, failing: int, on_zeros: bool) -> Path:
    """The model of COLD_MODEL failing its first `failing` forwards: of any input (`on_zeros`), else of data only, so
    that the server's start-up warm-up (a batch of zeros) passes and the profile's own batches meet the failures."""
    model = COLD_MODEL.replace("FAILING", str(failing)).replace("ON_ZEROS_TOO", "True" if on_zeros else "x.any()")
    return write_python_model(tmp_path / "repo" / "cold", model, 4)


@pytest.mark.parametrize("failing", [1, 2])
def test_a_warm_up_batch_with_a_request_failing_alone_refuses_the_profile(tmp_path, capsys, failing):
    """A warm-up batch of 2 the model failed, rerun in parts, passed silently (only the timed batches' failures
    were looked at), a request of it failing alone too: the timed batches, drawn as it was, passed. One whose
    requests were all answered in parts (a first batch of its size failing) still passes: that is the warm-up's use."""
    folder = _cold(tmp_path, failing, on_zeros=False)
    fast = ["--batch-sizes", "2,4", "--warmup", "1", "--repeats", "2", "--peak-flops", "1T", "--bandwidth", "1T"]
    code = main(["profile", "cold", "--model-repository", str(folder.parent), *fast])
    err = capsys.readouterr().err
    if failing == 1:
        assert code == 0, err
        return
    said = (
        "wok profile: the inputs made at the model's fixed dims: a warm-up batch of 2 failed (some of its requests "
        "alone too): model 'cold' failed: RuntimeError: not set up yet\n"
    )
    assert code == 2 and err.endswith(said), err


def test_a_warm_up_batch_of_1_that_fails_refuses_the_profile(tmp_path):
    """A model whose first forward of data fails, and no later one: a warm-up batch of 1 has no parts to rerun, and
    the server answers its request with the failure. Kept refused (a larger warm-up batch whose every request was
    answered in parts passes). Its first batch absorbed by a warm-up batch of 2 (its requests answered in parts), the
    model profiles."""
    cfg = ProfileConfig(batch_sizes=[1, 2], warmup=1, repeats=2, sizes="fixed:4")
    with pytest.raises(ValueError) as refused:
        profiler.profile(load_servable(_cold(tmp_path, 1, on_zeros=False)), cfg, lambda d: roofline_for(d, 1e12, 1e11))
    assert str(refused.value) == (
        "the inputs made at the model's fixed dims: a warm-up batch of 1 failed: model 'cold' failed: RuntimeError: "
        "not set up yet"
    )
    cfg = ProfileConfig(batch_sizes=[2, 4], warmup=1, repeats=2, sizes="fixed:4")
    doc = profiler.profile(load_servable(tmp_path / "repo" / "cold"), cfg, lambda d: roofline_for(d, 1e12, 1e11))
    assert [b["batch_size"] for b in doc["batches"]] == [2, 4]


def _warm_up_refusal(folder) -> str:
    """What `wok serve` says of the model at `folder` as its start-up warm-up fails (the WarmupError's text)."""
    from wok.errors import WarmupError
    from wok.executor import Executor

    servable = load_servable(folder)
    executor = Executor(servable, servable.config.instances)
    try:
        with pytest.raises(WarmupError) as failed:
            executor.warmup()
    finally:
        executor.shutdown()
    return str(failed.value)


@pytest.mark.parametrize("sizes", ["1,2", "2,4"])
def test_a_model_wok_serve_refuses_at_its_start_is_refused_in_the_servers_words(tmp_path, capsys, sizes):
    """A model whose first forward fails, of zeros too, fails the server's start-up warm-up (a batch of 1 of zeros,
    Executor.warmup), and `wok serve` refuses it (exit 2). Its first batch absorbed by the profile's warm-up batch of 2
    (its requests answered in parts), `--batch-sizes 2,4` profiled it (exit 0), and `1,2` was refused as the inputs'
    failure. The profile runs the server's warm-up, and refuses the model in the server's words."""
    folder = _cold(tmp_path, 1, on_zeros=True)
    served = _warm_up_refusal(folder)
    assert served == (
        "model 'cold' failed: RuntimeError: not set up yet; in the start-up warm-up, on a batch of zeros with input "
        f"shapes 'INPUT0' [1, 4] on cpu (config: {folder / 'config.toml'})"
    )
    fast = ["--batch-sizes", sizes, "--warmup", "1", "--repeats", "2", "--peak-flops", "1T", "--bandwidth", "1T"]
    assert main(["profile", "cold", "--model-repository", str(folder.parent), *fast]) == 2
    err = capsys.readouterr().err
    assert err == f"wok profile: wok serve refuses the model at its start: {served}\n"


IDENTITY_MODEL = """
from torch import nn


def build(**parameters):
    return nn.Identity()
"""


def test_dims_no_sample_of_which_fits_in_memory_are_refused_in_the_servers_words(tmp_path, capsys):
    """An input of 10^12 x 10^12 values: `wok serve` refuses the model at its start, its warm-up unable to make a
    sample of zeros of it (exit 2); the profile drew its request pool first, and numpy's error ended it in a traceback
    (exit 1). It runs the server's warm-up before it draws a request, and refuses the model in the server's words. Too
    big for any machine: numpy refuses it without asking the system for memory, which may overcommit."""
    folder = write_python_model(tmp_path / "repo" / "huge", IDENTITY_MODEL, 4, dims="1000000000000, 1000000000000")
    served = _warm_up_refusal(folder)
    assert "cannot make a sample of zeros for input 'INPUT0', shape [1, 1000000000000, 1000000000000]" in served
    fast = ["--batch-sizes", "1,2", "--warmup", "1", "--repeats", "2", "--peak-flops", "1T", "--bandwidth", "1T"]
    assert main(["profile", "huge", "--model-repository", str(folder.parent), *fast]) == 2
    err = capsys.readouterr().err
    assert err == f"wok profile: wok serve refuses the model at its start: {served}\n"


def test_requests_too_big_for_memory_are_refused_not_a_traceback(tmp_path, capsys):
    """Requests that the server's warm-up passes (a variable dim warmed as 1) but whose pool cannot be made: drawing the
    pool ended `wok profile` in numpy's MemoryError traceback (exit 1). Refused, naming the option that made them and
    the allocation that failed. 10^17 FP32 values a request: past any machine's address space, refused by the
    allocation itself, never a page of it touched."""
    folder = write_python_model(tmp_path / "repo" / "wide", IDENTITY_MODEL, 4, dims="-1")
    fast = ["--batch-sizes", "1,2", "--warmup", "1", "--repeats", "2", "--peak-flops", "1T", "--bandwidth", "1T"]
    argv = ["profile", "wide", "--model-repository", str(folder.parent), "--sizes", "fixed:100000000000000000"]
    assert main([*argv, *fast]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    said = (
        "wok profile: --sizes fixed:100000000000000000: expected requests of model 'wide' that fit in memory (the "
        "profile draws 256 and holds up to 64 MiB of them, one of each batching key at least, before it times a "
        "batch); got Unable to allocate "
    )
    assert err.startswith(said) and err.count("\n") == 1, err


def test_requests_of_more_elements_than_numpy_counts_are_refused_naming_the_option(tmp_path, capsys):
    """2^62 FP32 values a request: the warm-up's sample (the variable dim at 1) fits, and numpy refuses the request's
    array before any allocation, its 2^64 bytes past what it counts (a ValueError, not a MemoryError). Its bare words
    were the profile's refusal ("wok profile: array is too big; ..."), no option named; refused now as a pool that
    does not fit in memory is (REV57D), naming --sizes and its value."""
    folder = write_python_model(tmp_path / "repo" / "wide", IDENTITY_MODEL, 4, dims="-1")
    fast = ["--batch-sizes", "1,2", "--warmup", "1", "--repeats", "2", "--peak-flops", "1T", "--bandwidth", "1T"]
    argv = ["profile", "wide", "--model-repository", str(folder.parent), "--sizes", f"fixed:{2**62}"]
    assert main([*argv, *fast]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"wok profile: --sizes fixed:{2**62}: expected requests of model 'wide' that fit in memory (the profile draws "
        "256 and holds up to 64 MiB of them, one of each batching key at least, before it times a batch); got array "
        "is too big; `arr.size * arr.dtype.itemsize` is larger than the maximum possible size\n"
    )


LOUD_MODEL = """
import torch
from torch import nn


class Loud(nn.Module):
    def forward(self, x):
        if FAILS and x.any():  # data only: the start-up warm-up's zeros pass
            raise RuntimeError("the model's own refusal, " + "x" * 1_000_000)
        return x * 2


def build(**parameters):
    return Loud()
"""


@pytest.mark.parametrize(
    ("fails", "said"),
    [
        ("True", "the inputs made at the model's fixed dims: a batch of 1 failed: "),
        ("x.shape[0] >= 2", "a batch of 2 failed, though the model answered each of its requests rerun in smaller"),
        # Under the counting's no_grad, not the executor's inference_mode: the timing passes, the counting fails.
        ("not torch.is_inference_mode_enabled()", "counting the FLOPs and bytes of a batch of 1 failed, a batch the "),
    ],
    ids=["alone", "its-size", "counting"],
)
async def test_a_models_long_message_is_cut_as_a_clients_details_are(tmp_path, serve, fails, said):
    """A model failing a batch with a message of 1 MB: the profile's refusal printed it whole (a batch of 1 failing,
    a batch failing for its size, the counting failing), where the server cuts what its client gets of that message
    (`service.short_details`). The refusal ends in the client's details, the same cut."""
    import tritonclient.grpc.aio as aioclient
    from tritonclient.utils import InferenceServerException

    write_python_model(tmp_path / "served" / "loud", LOUD_MODEL.replace("FAILS", "True"), 4)
    async with (
        serve(models=(), repository=tmp_path / "served") as server,
        aioclient.InferenceServerClient(f"127.0.0.1:{server.port}") as client,
    ):
        tensor = aioclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
        with pytest.raises(InferenceServerException) as info:
            await client.infer("loud", [tensor])
    details = info.value.message()
    assert details.startswith("model 'loud' failed: RuntimeError: the model's own refusal, xxx"), details[:100]
    assert details.endswith(" characters in all)") and len(details) < 4096, details[-100:]
    folder = write_python_model(tmp_path / "repo" / "loud", LOUD_MODEL.replace("FAILS", fails), 4)
    cfg = ProfileConfig(batch_sizes=[1, 2], warmup=0, repeats=2, sizes="fixed:4", cpu_linear="torch")
    with pytest.raises(ValueError) as refused:
        profiler.profile(load_servable(folder), cfg, lambda device: roofline_for(device, 1e12, 1e11))
    told = str(refused.value)
    assert said in told and told.endswith(f": {details}"), told[:300]


class KeyedByTask(PaddedLinear):
    """PaddedLinear batched by a request's task (its first value, rounded: -1, 0 or 1 mostly), as a model with a head
    per task would be: its assemble refuses a batch of several tasks, which the server never forms."""

    def batch_key(self, inputs):
        return int(np.round(np.clip(inputs["x"][0, 0], -1, 1)))

    def assemble(self, requests, rows, buffers):
        tasks = sorted({self.batch_key(r) for r in requests})
        if len(tasks) > 1:
            raise InvalidInput(f"expected one task per batch; got tasks {tasks}")
        return super().assemble(requests, rows, buffers)


def test_the_counting_pass_counts_a_batch_the_timing_ran():
    """With one shape of request the counting pass counted the pool's first n requests, whatever their batching
    keys: a batch the server never forms, which this model's assemble refuses; the profile was refused (`answers such
    a request INVALID_ARGUMENT as its batch is assembled`), though every timed batch ran."""
    cfg = ProfileConfig(batch_sizes=[1, 4], warmup=0, repeats=2, sizes="fixed:2")
    model = KeyedByTask()
    pool = profiler.keyed_pool(model, cfg, 256, 4)
    assert len({model.batch_key(r) for r in pool.requests[:4]}) > 1  # the pool's first 4: a batch never formed
    doc = profiler.profile(model, cfg, lambda device: roofline_for(device, 1e12, 1e11))
    assert doc["batches"][1]["flops"] == 2 * 4 * 2 * WIDTH


INFERENCE_COUNTER_MODEL = """
import torch
from torch import nn


class Counts(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = None

    def forward(self, x):
        if self.calls is None:
            self.calls = torch.zeros(())  # made in the executor's inference_mode: an inference tensor
        self.calls += 1  # in place: torch allows it in inference_mode only
        return x * 2


def build(**parameters):
    return Counts()
"""


def test_a_counting_pass_failing_a_batch_the_timing_ran_is_not_the_inputs_failure(tmp_path, capsys):
    """The counting pass runs the model under no_grad (not inference_mode, FlopCounterMode): a model that updates in
    place a tensor it made under the executor's inference_mode fails there alone. The refusal blamed the inputs (`the
    inputs made with --sizes fixed:16: model 'counts' failed: ...`), which every timed batch ran."""
    folder = write_python_model(tmp_path / "repo" / "counts", INFERENCE_COUNTER_MODEL, 4)
    fast = ["--batch-sizes", "1,4", "--warmup", "0", "--repeats", "2", "--peak-flops", "1T", "--bandwidth", "1T"]
    assert main(["profile", "counts", "--model-repository", str(folder.parent), *fast]) == 2
    err = capsys.readouterr().err
    said = (
        "wok profile: counting the FLOPs and bytes of a batch of 1 failed, a batch the timing ran: model 'counts' "
        "failed: RuntimeError: Inplace update to inference tensor outside InferenceMode"
    )
    assert said in err and "the inputs made with" not in err and "Traceback" not in err, err
