"""The sizes a ramp sends follow `--sizes`, its tail included (bench/payloads.py plan_pool, bench/runner.py).

The pool held 256 draws per model and each request picked one: the server saw the empirical
distribution of 256 draws, so a size rarer than about 1/256 (a lognormal's tail, a trace's rare
long request) was never sent. Now the pool holds a payload per size the distribution can draw, and
each request's size is drawn when its step is scheduled. The sizes are read back from the very
bytes the workers would send (the pool's serialized requests), picked as `Ramp.schedule_step` picks them.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from wok.bench import runner
from wok.bench.payloads import (
    BYTES_LONGEST,
    MAX_SUPPORT,
    POOL_PER_MODEL,
    Empirical,
    Fixed,
    LogNormal,
    PayloadGenerator,
    TensorSpec,
    Uniform,
    plan_pool,
    support_of,
)
from wok.bench.runner import Ramp, RampConfig, build_pool
from wok.codec import encode_request
from wok.datatypes import DATATYPES
from wok.v2pb import grpc_service_pb2 as pb

ENCODER = [TensorSpec("tokens", "INT64", (-1, -1))]
N = 20_000
LOGNORMAL = "lognormal:median=20,sigma=0.8,max=256"


def lognormal_pmf(median: float, sigma: float, top: int) -> np.ndarray:
    """P(size = k) for k = 0..top of round(median·e^(σZ)) clipped to [1, top] (LogNormal)."""
    edges = stats.norm.cdf(np.log(np.arange(0.5, top + 1) / median) / sigma)  # P(x < k + 0.5), k = 0..top
    pmf = np.diff(edges, prepend=0.0)
    pmf[1] += pmf[0]  # round to 0 is clipped to 1
    pmf[0] = 0.0
    pmf[top] += 1.0 - edges[-1]  # beyond top is clipped to it
    return pmf


def chisquare_p(sent: np.ndarray, pmf: np.ndarray) -> float:
    """Pearson's test of the sizes sent against `pmf` (P(size = k), k = 0..), neighbouring sizes
    taken together until each group expects 5 or more: a rare size keeps a group of its own when it
    expects that many by itself."""
    counts = np.bincount(sent, minlength=len(pmf))
    assert len(counts) == len(pmf), "a size the distribution never draws was sent"
    observed, expected, o, e = [], [], 0, 0.0
    for k in np.flatnonzero(pmf > 0):
        o, e = o + counts[k], e + len(sent) * pmf[k]
        if e >= 5:
            observed.append(o)
            expected.append(e)
            o, e = 0, 0.0
    observed[-1] += o
    expected[-1] += e
    expected = np.asarray(expected) * sum(observed) / sum(expected)
    return stats.chisquare(observed, expected).pvalue


def binomial_bounds(n: int, p: float) -> tuple[int, int]:
    """Counts outside these come by chance with probability under 2e-6."""
    return int(stats.binom.ppf(1e-6, n, p)), int(stats.binom.isf(1e-6, n, p))


def rare_file(tmp_path, rare: int = 512, every: int = 2000):
    """An empirical sizes file of `every` lines, one of them `rare`, the rest 8..32."""
    values = [*np.random.default_rng(7).integers(8, 33, every - 1).tolist(), rare]
    path = tmp_path / "sizes.txt"
    path.write_text("\n".join(map(str, values)) + "\n")
    return path


def sizes_sent(target: str, sizes: str, n: int = N) -> np.ndarray:
    """The sizes of the n requests of a step as the ramp schedules it, read off the serialized payloads."""
    cfg = RampConfig(target, [("encoder", 1.0)], [n], 1.0, warmup_s=0.0, arrival="constant", sizes=sizes)
    ramp = Ramp(cfg, progress=lambda _: None)
    _, times, which = ramp.schedule_step(float(n))
    assert len(times) == n
    size_of = np.array([pb.ModelInferRequest.FromString(p).inputs[-1].shape[1] for p in ramp.pool])
    return size_of[which]


# -- the sizes sent ----------------------------------------------------------------------------
def test_a_lognormals_sizes_are_sent_at_its_rates_tail_included(bench_server):
    """20,000 requests: 256 draws reached 232 at most, so the ~15 requests of size 256 (everything
    past max piles there) never came, and a two-sample KS test against its own draws failed (p 5e-11)."""
    sent = sizes_sent(bench_server.target, LOGNORMAL)
    pmf = lognormal_pmf(20, 0.8, 256)
    lo, hi = binomial_bounds(N, pmf[256])
    assert lo <= np.count_nonzero(sent == 256) <= hi, (lo, np.count_nonzero(sent == 256), hi)
    tail = pmf[100:].sum()  # 2.2 %: 256 draws hold 5 or 6 of them, each then sent 1/256 of the time
    lo, hi = binomial_bounds(N, tail)
    assert lo <= np.count_nonzero(sent >= 100) <= hi
    assert chisquare_p(sent, pmf) > 1e-3
    # And against draws of the distribution itself (two-sample KS, which takes ties as they come).
    assert stats.ks_2samp(sent, LogNormal(20, 0.8, 256).sample(np.random.default_rng(99), 10 * N)).pvalue > 1e-3


def test_an_empirical_files_rare_size_is_sent_at_its_rate(bench_server, tmp_path):
    """One line in 2,000 holds 512: about 50 of 100,000 requests. 256 draws held it with
    probability 12 %: without it, none was ever sent; with it, 1/256 of the requests (390)."""
    sent = sizes_sent(bench_server.target, f"empirical:{rare_file(tmp_path)}", 5 * N)
    lo, hi = binomial_bounds(5 * N, 1 / 2000)
    assert 1 <= lo <= np.count_nonzero(sent == 512) <= hi < 5 * N / 256, (lo, np.count_nonzero(sent == 512), hi)
    values = np.loadtxt(rare_file(tmp_path), dtype=np.int64)
    assert chisquare_p(sent, np.bincount(values, minlength=513) / len(values)) > 1e-3


def test_the_pool_holds_a_payload_of_every_size(bench_server, tmp_path):
    """build_pool's slice, before any schedule: every size the distribution can draw, each
    decoding to the shape it claims (the bytes the workers send)."""
    for sizes, support in ((LOGNORMAL, range(1, 257)), (f"empirical:{rare_file(tmp_path)}", [*range(8, 33), 512])):
        cfg = RampConfig(bench_server.target, [("encoder", 1.0)], [1], 1.0, sizes=sizes)
        pool, (piece,), _ = build_pool(cfg, say=pytest.fail)
        shapes = [tuple(pb.ModelInferRequest.FromString(p).inputs[0].shape) for p in pool]
        assert {s[1] for s in shapes} == set(support)
        assert [s[1] for s in shapes] == piece.plan.payload_sizes.tolist()
        assert len(pool) >= POOL_PER_MODEL  # variants fill the sizes up to the old pool's variety


# -- seeds ----------------------------------------------------------------------------------
def test_the_same_seed_schedules_the_same_sizes_and_another_seed_others(bench_server):
    def run(seed: int):
        cfg = RampConfig(bench_server.target, [("encoder", 1.0)], [500], 1.0, sizes=LOGNORMAL, seed=seed)
        ramp = Ramp(cfg, progress=lambda _: None)
        first, second = ramp.schedule_step(500.0), ramp.schedule_step(500.0)
        return ramp.pool, [(t, w) for _, t, w in (first, second)]

    (pool_a, steps_a), (pool_b, steps_b), (pool_c, steps_c) = run(3), run(3), run(4)
    assert pool_a == pool_b and pool_a != pool_c
    for (ta, wa), (tb, wb) in zip(steps_a, steps_b):
        assert np.array_equal(ta, tb) and np.array_equal(wa, wb)
    assert not np.array_equal(steps_a[0][1][:100], steps_c[0][1][:100])
    assert not np.array_equal(steps_a[0][1], steps_a[1][1][: len(steps_a[0][1])])  # each step draws anew


# -- the plan ---------------------------------------------------------------------------------
def test_support_of_each_distribution():
    assert support_of(Fixed(16)).tolist() == [16]
    assert support_of(Uniform(0, 3)).tolist() == [0, 1, 2, 3]
    assert support_of(Empirical([5, 1, 5, 9])).tolist() == [1, 5, 9]
    assert support_of(LogNormal(20, 0.8, 256)).tolist() == list(range(1, 257))
    # Cut at 6σ: 20·e^(±0.6) is 11..36; a draw beyond is 1e-9 likely, and takes the nearest end.
    assert support_of(LogNormal(20, 0.1, 10_000)).tolist() == list(range(11, 37))
    assert support_of(Uniform(1, MAX_SUPPORT + 1)) is None
    assert support_of(type("Other", (), {"sample": lambda self, rng, n: np.zeros(n, np.int64)})()) is None


@pytest.mark.parametrize(
    ("sizes", "variants", "count"),
    [(Fixed(16), POOL_PER_MODEL, POOL_PER_MODEL), (Uniform(1, 64), 4, 256), (Uniform(1, 300), 1, 300)],
)
def test_variants_keep_at_least_the_old_pools_variety(sizes, variants, count):
    plan = plan_pool(PayloadGenerator("e", ENCODER, sizes=sizes), 64 << 20, np.random.default_rng(0))
    assert (plan.kind, plan.variants, len(plan)) == ("per_size", variants, count)
    picks = plan.pick(np.random.default_rng(1), 50_000)
    assert len(np.unique(picks)) == count  # every payload is used, every variant of each size


def test_a_model_without_a_variable_dimension_keeps_a_pool_of_256():
    gen = PayloadGenerator("mlp", [TensorSpec("INPUT0", "FP32", (-1, 256))], sizes=LogNormal(20, 0.8, 256))
    plan = plan_pool(gen, 64 << 20, np.random.default_rng(0))
    assert (plan.kind, len(plan)) == ("fixed_shape", POOL_PER_MODEL)


def test_over_the_byte_cap_a_larger_pool_of_draws_is_sent_and_said():
    """One payload per size of 1..4096 INT64 tokens is 64 MiB; under a 16 MiB cap, draws that fit."""
    gen = PayloadGenerator("encoder", ENCODER, sizes=Uniform(1, 4096))
    plan = plan_pool(gen, 16 << 20, np.random.default_rng(0), cap_text="16 MiB")
    assert plan.kind == "draws" and plan.support is None
    assert len(plan) > POOL_PER_MODEL  # more draws than the old pool, as many as fit
    assert (16 << 20) - gen.nbytes(np.array([4096]))[0] < gen.nbytes(plan.payload_sizes).sum() <= 16 << 20
    assert f"a pool of {len(plan)} draws" in plan.note and "cap of 16 MiB" in plan.note
    assert f"sizes {plan.payload_sizes.min()}..{plan.payload_sizes.max()}" in plan.note
    assert "1..4096, 4096 sizes" in plan.note
    # Picked uniformly from the draws.
    assert set(np.unique(plan.pick(np.random.default_rng(1), 100_000))) == set(range(len(plan)))


def test_too_many_sizes_fall_back_to_draws_and_say_why():
    gen = PayloadGenerator("encoder", ENCODER, sizes=Uniform(0, 10**9))
    plan = plan_pool(gen, 64 << 20, np.random.default_rng(0), cap_text="64 MiB")
    assert plan.kind == "draws" and f"more than the {MAX_SUPPORT} a pool makes one payload each for" in plan.note
    assert "(its cap: 64 MiB)" in plan.note and "any beyond" in plan.note


def test_draws_keep_under_the_cap_even_when_fewer_than_256_fit():
    """Every worker process holds the pool: 256 requests of 0.5-1 MiB each would take 192 MiB, three
    times the cap, in each of them. As many as fit are kept, and the note says they are fewer."""
    gen = PayloadGenerator("encoder", ENCODER, sizes=Uniform(65_536, 131_072))
    plan = plan_pool(gen, 64 << 20, np.random.default_rng(0), cap_text="64 MiB")
    assert plan.kind == "draws" and 64 <= len(plan) < POOL_PER_MODEL
    sent = gen.nbytes(plan.payload_sizes)
    assert (64 << 20) - gen.nbytes(np.array([131_072]))[0] < sent.sum() <= 64 << 20
    assert f"a pool of {len(plan)} draws (as many as fit, fewer than the 256 a pool holds where they fit)" in plan.note


def test_one_draw_is_kept_when_it_alone_is_over_the_cap():
    gen = PayloadGenerator("encoder", ENCODER, sizes=Uniform(1000, 2000))
    plan = plan_pool(gen, 4_000, np.random.default_rng(0))
    assert (plan.kind, len(plan)) == ("draws", 1)
    (size,) = plan.payload_sizes
    assert f"(the first draw alone, {gen.nbytes(np.array([size]))[0] / 1024:.1f} KiB, is over the cap)" in plan.note
    assert set(plan.pick(np.random.default_rng(1), 100).tolist()) == {0}


@pytest.mark.parametrize(("budget", "count"), [(64 << 20, 21), (2 << 20, 1)])
def test_a_fixed_shape_pool_of_large_requests_keeps_under_the_cap(budget, count):
    """An image model's 3 × 512 × 512 FP32 input is 3 MiB a request: 256 of them would be 768 MiB."""
    gen = PayloadGenerator("resnet", [TensorSpec("image", "FP32", (-1, 3, 512, 512))])
    plan = plan_pool(gen, budget, np.random.default_rng(0), cap_text="the cap")
    assert (plan.kind, len(plan)) == ("fixed_shape", count)
    assert f"its requests are 3.0 MiB each, so {count} of them fit in the pool's cap of the cap, not 256" in plan.note
    assert plan.note.endswith("(one request alone is over the cap)") == (count == 1)
    one = len(encode_request("resnet", gen.make(np.random.default_rng(0)), datatypes=gen.datatypes).SerializeToString())
    assert count == 1 or count * one <= budget


@pytest.mark.parametrize("dtype", sorted(DATATYPES))
def test_the_byte_count_is_the_encoded_size_and_bounds_bytes_strings(dtype):
    """nbytes is what the pool's cap is held against: exact for every datatype (field tags, varint lengths,
    packed shape, empty fields left out); for BYTES, whose strings are drawn 1 to 16 letters long, the
    size with every string at its longest, so never below what is encoded. An average let a pool planned
    just under the cap serialize to more than it."""
    specs = [TensorSpec("x", dtype, (-1, -1)), TensorSpec("é" * 70, "FP16", (-1, 3, -1)), TensorSpec("c", dtype, ())]
    for rows in (1, 200):
        gen = PayloadGenerator("m" * 130, specs, rows=rows)
        for size in (0, 1, 127, 128, 2047, 2048, 16_384):
            inputs = gen.make(size=size)
            real = len(encode_request(gen.model, inputs, datatypes=gen.datatypes).SerializeToString())
            count = gen.nbytes(np.array([size]))[0]
            if dtype != "BYTES":
                assert count == real, (rows, size)
                continue
            assert count >= real, (rows, size)
            longest = {k: np.full(v.shape, b"z" * BYTES_LONGEST, dtype=object) if v.dtype == object else v
                       for k, v in inputs.items()}  # fmt: skip
            assert count == len(encode_request(gen.model, longest, datatypes=gen.datatypes).SerializeToString())


@pytest.mark.parametrize("seed", range(10))
def test_a_pool_of_bytes_strings_filled_to_its_cap_serializes_within_it(seed):
    """1,000 strings a request, 1 to 16 letters each: 12,526 bytes on average, the budget 64 of that.
    Counted at their average, 64 were planned, and 5 of these 10 seeds drew more letters than that."""
    gen = PayloadGenerator("text", [TensorSpec("s", "BYTES", (-1, 1000))])
    budget = 64 * 12_526
    rng = np.random.default_rng(seed)
    plan = plan_pool(gen, budget, rng)
    sent = [encode_request("text", gen.make(rng, int(s)), datatypes=gen.datatypes) for s in plan.payload_sizes]
    assert sum(len(r.SerializeToString()) for r in sent) <= budget


def test_a_per_size_pool_planned_just_under_the_cap_serializes_within_it(bench_server):
    """encoder's INT64 tokens, one payload per size of 116..4093: estimated (12 bytes of framing an
    input), 4 bytes under 64 MiB, serialized, 2,030 over (a varint length and the packed shape a byte
    or two more each). Counted exactly, they are over: a pool of draws, within the cap."""
    cfg = RampConfig(bench_server.target, [("encoder", 1.0)], [1], 1.0, sizes="uniform:116:4093")
    pool, (piece,), _ = build_pool(cfg, say=lambda line: None)
    assert piece.nbytes == sum(map(len, pool)) <= runner.POOL_CAP_BYTES
    assert piece.plan.kind == "draws"


def test_build_pool_over_the_cap_says_so(bench_server):
    """recsys with 1..6000 ids a request: one payload per size is 137 MiB, over the 64 MiB cap."""
    said: list[str] = []
    cfg = RampConfig(bench_server.target, [("recsys", 1.0)], [1], 1.0, sizes="uniform:1:6000")
    pool, (piece,), _ = build_pool(cfg, say=said.append)
    assert piece.plan.kind == "draws"
    assert piece.nbytes == sum(map(len, pool)) <= runner.POOL_CAP_BYTES
    (line,) = said
    assert line.startswith("warning: --sizes uniform:1:6000: model 'recsys': one payload per size (1..6000")
    assert "over the pool's cap of 64 MiB" in line and f"a pool of {len(pool)} draws" in line
    info = piece.info()
    assert info["pool"] == "draws" and info["cap_bytes"] == 64 << 20 and info["note"] in line
    assert info["max_size"] == max(pb.ModelInferRequest.FromString(p).inputs[1].shape[1] for p in pool)


@pytest.mark.timeout(120)
def test_the_result_says_how_the_pool_was_made_and_the_sizes_sent(bench_server, monkeypatch):
    """A real ramp of a mix: encoder over a small cap (draws: a warning), mlp without a variable
    dimension; each step's `request_sizes` are the encoder's requests' sizes."""
    monkeypatch.setattr(runner, "POOL_CAP_BYTES", 1 << 19)  # 256 KiB a model: encoder's 1..256 take 274 KiB
    cfg = RampConfig(
        bench_server.target, [("encoder", 0.5), ("mlp", 0.5)], [60], 1.0, warmup_s=0.2, sizes=LOGNORMAL, seed=5
    )
    said: list[str] = []
    result = Ramp(cfg, progress=said.append).run()
    encoder, mlp = result["payloads"]
    assert (encoder["model"], encoder["pool"], encoder["cap_bytes"]) == ("encoder", "draws", 1 << 19)
    assert encoder["variants"] is None and encoder["distinct_sizes"] >= 1 and encoder["bytes"] <= (1 << 18) * 1.02
    # mlp's 256 FP32 a request (1 KiB and its framing): 248 fit in its 256 KiB, not 256.
    assert (mlp["model"], mlp["pool"], mlp["payloads"], mlp["distinct_sizes"]) == ("mlp", "fixed_shape", 248, None)
    assert mlp["bytes"] <= 1 << 18 < mlp["bytes"] * 249 / 248
    warning = next(w for w in result["warnings"] if w.startswith(f"--sizes {LOGNORMAL}: model 'encoder'"))
    assert "cap of 0.5 MiB (0.25 MiB for each of the mix's 2 models)" in warning
    assert any(line == f"warning: {warning}" for line in said)
    assert result["devices"] == {"encoder": "cpu", "mlp": "cpu"}  # what the server runs them on
    # Not --sizes' doing: its warning does not name it.
    (fixed,) = [w for w in result["warnings"] if w.startswith("model 'mlp'")]
    assert "so 248 of them fit in the pool's cap of 0.5 MiB (0.25 MiB for each" in fixed and fixed == mlp["note"]
    assert f"warning: {fixed}" in said
    (step,) = result["steps"]
    sizes = step["request_sizes"]
    assert 0 < sizes["requests"] < step["requests"]  # the encoder's only
    assert 1 <= sizes["p50"] <= sizes["p99"] <= sizes["max"] <= encoder["max_size"]
    assert math.isfinite(sizes["mean"])


# -- the models' devices ----------------------------------------------------------------------
@pytest.mark.parametrize("balancer", ["grpc", "wok"])
def test_the_pool_records_each_models_device_as_its_config_names_it(bench_server, balancer):
    """A ramp recorded no device, so `wok plan --from-ramp` of a CPU server planned GPUs: each model's
    ModelConfig, already read for --rows, names the kind of its instance groups."""
    cfg = RampConfig(bench_server.target, [("mlp", 1.0)], [1], 1.0, balancer=balancer)
    devices: dict = {}
    build_pool(cfg, lambda line: None, [], devices)
    assert devices == {"mlp": "cpu"}


def test_a_models_device_is_named_only_when_every_instance_group_has_it():
    from wok.v2pb import model_config_pb2 as mc

    kind = mc.ModelInstanceGroup
    for kinds, device in [
        ([kind.KIND_CPU], "cpu"),
        ([kind.KIND_GPU, kind.KIND_GPU], "gpu"),
        ([kind.KIND_GPU, kind.KIND_CPU], None),  # instances on both: neither alone
        ([kind.KIND_AUTO], None),  # Triton's "GPU if there is one": no device named
        ([kind.KIND_MODEL], None),
        ([], None),
    ]:
        config = mc.ModelConfig(instance_group=[mc.ModelInstanceGroup(kind=k) for k in kinds])
        assert runner.instance_device(config) == device, kinds


# -- the server's request limit ---------------------------------------------------------------
async def test_payloads_over_the_servers_published_limit_are_said_before_the_first_step():
    # They were sent without a word: each refused INVALID_ARGUMENT (or, over gRPC's limit, ending its
    # stream), and the result said only that the step failed.
    import asyncio

    from ..conftest import running_server

    async with running_server(models=("encoder",), max_request_bytes=1024) as server:
        cfg = RampConfig(f"127.0.0.1:{server.port}", [("encoder", 1.0)], [1], 1.0, sizes="uniform:1:200")
        said: list[str] = []
        notes: list[str] = []
        pool, _, _ = await asyncio.to_thread(build_pool, cfg, said.append, notes)
    sizes = np.array([len(p) for p in pool])
    over = int((sizes > 1024).sum())
    assert 0 < over < len(pool)
    line = (
        f"{over} of model 'encoder''s {len(pool)} payloads are over the server's --max-request-bytes of 1,024 "
        f"bytes (the largest is {sizes.max():,}): the server refuses each such request INVALID_ARGUMENT (raise "
        "the server's --max-request-bytes, or send smaller --sizes)"
    )
    assert said == [f"warning: {line}"] and notes == [line]


def test_payloads_over_the_grpc_limit_are_said_to_end_their_stream():
    limit = (1024, 4 * 1024 + (1 << 20))
    payloads = [b"x" * 100, b"x" * 2000, b"x" * (limit[1] + 1)]
    assert runner._over_limit("m", payloads[:1], limit, "unary") is None
    head = (
        f"2 of model 'm''s 3 payloads are over the server's --max-request-bytes of 1,024 bytes (the largest is "
        f"{limit[1] + 1:,}): the server refuses each such request INVALID_ARGUMENT; 1 are over its gRPC limit of "
        f"{limit[1]:,} bytes, which gRPC refuses unread RESOURCE_EXHAUSTED"
    )
    tail = " (raise the server's --max-request-bytes, or send smaller --sizes)"
    assert runner._over_limit("m", payloads, limit, "unary") == head + tail
    assert runner._over_limit("m", payloads, limit, "stream") == (
        head + ", ending the stream it was sent on with every request in flight there" + tail
    )
