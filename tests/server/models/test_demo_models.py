"""The built-in demo models: configs, determinism, batching hooks and input checks."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch

from wok.errors import InvalidInput
from wok.models import DEMO_MODELS, build_demo
from wok.models.encoder import length_bucket
from wok.servable import HostBuffers, Servable

TOL = {"rtol": 1e-5, "atol": 1e-5}


def run_batch(
    s: Servable, requests: list[dict[str, np.ndarray]], buffers: HostBuffers | None = None
) -> list[dict[str, np.ndarray]]:
    """One batch through the hooks, in the order the executor calls them, on the CPU."""
    buffers = buffers or HostBuffers(pinned=False)
    rows = [next(iter(r.values())).shape[0] for r in requests]
    tensors = s.assemble(requests, sum(rows), buffers)
    with torch.inference_mode():
        out = s.forward(s.module_for(torch.device("cpu")), s.prepare(tensors))
    # Copies: the split views alias the batch outputs, which a reused buffer could overwrite.
    per_request = s.split({k: v.numpy() for k, v in out.items()}, rows)
    return [{k: v.copy() for k, v in r.items()} for r in per_request]


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def mlp_request(rng, n):
    return {"INPUT0": rng.standard_normal((n, 256), dtype=np.float32)}


def recsys_request(rng, n, ids_per_row):
    return {
        "dense": rng.standard_normal((n, 13), dtype=np.float32),
        "ids": rng.integers(0, 50, (n, ids_per_row), dtype=np.int64),
    }


def encoder_request(rng, n, length):
    return {"tokens": rng.integers(0, 50, (n, length), dtype=np.int64)}


def random_request(s: Servable, rng, n=3, variable=7):
    """What a client that knows only the metadata sends: random data of each declared
    datatype and shape, small non-negative integers for integer inputs."""
    req = {}
    for t in s.config.inputs:
        shape = (n, *(variable if d == -1 else d for d in t.dims))
        if t.datatype == "FP32":
            req[t.name] = rng.standard_normal(shape, dtype=np.float32)
        else:
            assert t.datatype == "INT64"
            req[t.name] = rng.integers(0, 50, shape, dtype=np.int64)
    return req


@pytest.fixture
def served(request):
    return request.getfixturevalue(request.param)


ALL = pytest.mark.parametrize("served", ["mlp", "recsys", "encoder"], indirect=True)


# -- registry ------------------------------------------------------------------------


def test_registry_names_and_factories():
    assert set(DEMO_MODELS) == {"mlp", "recsys", "encoder"}
    for name, builder in DEMO_MODELS.items():
        module_name, _, attr = f"wok.models.{name}:build".partition(":")
        assert getattr(importlib.import_module(module_name), attr) is builder


def test_unknown_demo_names_the_known_ones():
    with pytest.raises(ValueError, match="nope") as info:
        build_demo("nope")
    for name in DEMO_MODELS:
        assert name in str(info.value)


def test_build_options_pass_through():
    s = build_demo("mlp", in_features=8, hidden=16, out_features=4, layers=1, max_batch_size=4)
    assert s.config.inputs[0].dims == (8,)
    assert s.config.outputs[0].dims == (4,)
    assert s.config.max_batch_size == 4
    assert s.config.parameters["hidden"] == 16
    out = run_batch(s, [{"INPUT0": np.ones((2, 8), np.float32)}])[0]["OUTPUT0"]
    assert out.shape == (2, 4)


@pytest.mark.parametrize("name", sorted(DEMO_MODELS))
def test_the_queue_bound_is_an_option_and_0_lifts_it(name):
    kw = {"num_embeddings": 20_000} if name == "recsys" else {}
    lifted = build_demo(name, max_queue_size=0, **kw).config
    assert lifted.dynamic_batching.max_queue_size == 0
    assert lifted.parameters["max_queue_size"] == 0
    assert build_demo(name, max_queue_size=8, **kw).config.dynamic_batching.max_queue_size == 8


def test_tables_too_small_for_random_clients_are_refused():
    with pytest.raises(ValueError, match="num_embeddings"):
        build_demo("recsys", num_embeddings=10)
    with pytest.raises(ValueError, match="vocab"):
        build_demo("encoder", vocab=10)


# -- configs -------------------------------------------------------------------------


def _io(tensors):
    return [(t.name, t.datatype, t.dims) for t in tensors]


def test_mlp_config(mlp):
    c = mlp.config
    assert (c.name, c.platform, c.factory) == ("mlp", "python", "wok.models.mlp:build")
    assert _io(c.inputs) == [("INPUT0", "FP32", (256,))]
    assert _io(c.outputs) == [("OUTPUT0", "FP32", (256,))]
    assert c.max_batch_size == 32
    assert c.dynamic_batching.max_queue_delay_ms == 5.0
    assert c.dynamic_batching.max_queue_size == 4096


def test_recsys_config(recsys):
    c = recsys.config
    assert (c.name, c.platform, c.factory) == ("recsys", "python", "wok.models.recsys:build")
    assert _io(c.inputs) == [("dense", "FP32", (13,)), ("ids", "INT64", (-1,))]
    assert _io(c.outputs) == [("score", "FP32", (1,))]
    assert c.max_batch_size == 64
    assert c.dynamic_batching.max_queue_delay_ms == 2.0
    assert c.dynamic_batching.max_queue_size == 4096


def test_encoder_config(encoder):
    c = encoder.config
    assert (c.name, c.platform, c.factory) == ("encoder", "python", "wok.models.encoder:build")
    assert _io(c.inputs) == [("tokens", "INT64", (-1,))]
    assert _io(c.outputs) == [("embedding", "FP32", (128,))]
    assert c.max_batch_size == 32
    assert c.dynamic_batching.max_queue_delay_ms == 5.0
    assert c.dynamic_batching.max_queue_size == 4096


def test_mlp_default_layer_sizes(mlp):
    module = mlp.module_for(torch.device("cpu"))
    n_params = sum(p.numel() for p in module.parameters())
    assert n_params == 256 * 1024 + 1024 + 1024 * 1024 + 1024 + 1024 * 256 + 256
    shapes = [tuple(p.shape) for p in module.parameters() if p.dim() == 2]
    assert shapes == [(1024, 256), (1024, 1024), (256, 1024)]


@ALL
def test_modules_are_in_eval_mode(served):
    module = served.module_for(torch.device("cpu"))
    assert not any(m.training for m in module.modules())
    assert served.platform_label == "python"


# -- determinism ---------------------------------------------------------------------


@pytest.mark.parametrize("name", ["mlp", "recsys", "encoder"])
def test_build_is_deterministic_and_leaves_global_rng_alone(name):
    rng_before = torch.get_rng_state()
    a, b = build_demo(name), build_demo(name)
    assert torch.equal(torch.get_rng_state(), rng_before)
    req = random_request(a, _rng(1))
    out_a, out_b = run_batch(a, [req])[0], run_batch(b, [req])[0]
    for k in out_a:
        np.testing.assert_array_equal(out_a[k], out_b[k])


# -- outputs -------------------------------------------------------------------------


@ALL
def test_random_metadata_driven_request_runs(served):
    """A perf_analyzer-style client: random data of the declared types and shapes."""
    req = random_request(served, _rng(2), n=5)
    served.check(req)
    served.batch_key(req)
    out = run_batch(served, [req])[0]
    assert set(out) == {t.name for t in served.config.outputs}
    for t in served.config.outputs:
        assert out[t.name].shape == (5, *t.dims)
        assert out[t.name].dtype == served.output_types[t.name].numpy
        assert np.isfinite(out[t.name]).all()


def _assert_batched_equals_alone(s, requests):
    batched = run_batch(s, requests)
    for req, got in zip(requests, batched):
        alone = run_batch(s, [req])[0]
        for k in alone:
            np.testing.assert_allclose(got[k], alone[k], **TOL)


def test_mlp_batch_matches_alone(mlp):
    rng = _rng(3)
    _assert_batched_equals_alone(mlp, [mlp_request(rng, n) for n in (1, 4, 2)])


def test_recsys_mixed_id_counts_share_a_batch(recsys):
    rng = _rng(4)
    requests = [recsys_request(rng, n, k) for n, k in ((2, 5), (1, 0), (3, 40), (1, 1))]
    assert len({recsys.batch_key(r) for r in requests}) == 1
    _assert_batched_equals_alone(recsys, requests)


def test_recsys_zero_ids_only(recsys):
    out = run_batch(recsys, [recsys_request(_rng(5), 3, 0)])[0]["score"]
    assert out.shape == (3, 1)
    assert np.isfinite(out).all()
    assert ((out > 0) & (out < 1)).all()


def test_recsys_scores_are_not_saturated(recsys):
    out = run_batch(recsys, [recsys_request(_rng(6), 8, 49)])[0]["score"]
    assert ((out > 0.01) & (out < 0.99)).all()


def test_encoder_lengths_in_one_bucket_share_a_batch(encoder):
    rng = _rng(7)
    requests = [encoder_request(rng, n, length) for n, length in ((2, 9), (1, 16), (3, 12), (1, 10))]
    assert len({encoder.batch_key(r) for r in requests}) == 1
    _assert_batched_equals_alone(encoder, requests)


def test_encoder_result_does_not_depend_on_padding(encoder):
    """A short sequence padded far beyond its length gives its result alone."""
    rng = _rng(8)
    short, long_ = encoder_request(rng, 1, 3), encoder_request(rng, 2, 200)
    alone = run_batch(encoder, [short])[0]["embedding"]
    together = run_batch(encoder, [short, long_])[0]["embedding"]
    np.testing.assert_allclose(together, alone, **TOL)


def test_encoder_reused_buffers_do_not_leak_stale_tokens(encoder):
    rng = _rng(9)
    buffers = HostBuffers(pinned=False)
    run_batch(encoder, [encoder_request(rng, 4, 16)], buffers)
    short, longer = encoder_request(rng, 2, 9), encoder_request(rng, 1, 13)
    reused = run_batch(encoder, [short, longer], buffers)[0]["embedding"]
    fresh = run_batch(encoder, [short])[0]["embedding"]
    np.testing.assert_allclose(reused, fresh, **TOL)


def test_encoder_buckets():
    assert [length_bucket(n, 256) for n in (1, 8, 9, 16, 17, 100, 128, 129, 256)] == [
        8,
        8,
        16,
        16,
        32,
        128,
        128,
        256,
        256,
    ]
    assert length_bucket(150, 200) == 200
    assert length_bucket(3, 5) == 5


def test_encoder_batch_key_is_the_bucket(encoder):
    rng = _rng(10)
    assert encoder.batch_key(encoder_request(rng, 1, 5)) == 8
    assert encoder.batch_key(encoder_request(rng, 1, 9)) == 16
    assert encoder.batch_key(encoder_request(rng, 1, 256)) == 256


# -- input checks --------------------------------------------------------------------


def test_recsys_accepts_small_ids(recsys):
    ids = np.arange(50, dtype=np.int64).reshape(2, 25)
    recsys.check({"dense": np.zeros((2, 13), np.float32), "ids": ids})
    recsys.check({"dense": np.zeros((2, 13), np.float32), "ids": np.zeros((2, 0), np.int64)})


def test_recsys_rejects_out_of_range_ids(recsys):
    ids = np.array([[1, -3], [250_001, 7]], dtype=np.int64)
    with pytest.raises(InvalidInput) as info:
        recsys.check({"dense": np.zeros((2, 13), np.float32), "ids": ids})
    assert str(info.value) == ("input 'ids': expected ids in [0, 200000); got values from -3 to 250001")


def test_encoder_accepts_small_ids(encoder):
    encoder.check({"tokens": np.arange(50, dtype=np.int64).reshape(1, 50)})


def test_encoder_rejects_out_of_range_tokens(encoder):
    with pytest.raises(InvalidInput, match=r"'tokens'.*\[0, 1000\).*from 0 to 1000"):
        encoder.check({"tokens": np.array([[0, 1000]], dtype=np.int64)})
    with pytest.raises(InvalidInput, match=r"'tokens'.*\[0, 1000\).*from -1 to 5"):
        encoder.check({"tokens": np.array([[-1, 5]], dtype=np.int64)})


def test_encoder_rejects_bad_lengths(encoder):
    with pytest.raises(InvalidInput, match=r"'tokens'.*at most 256; got 257"):
        encoder.check({"tokens": np.zeros((1, 257), np.int64)})
    with pytest.raises(InvalidInput, match=r"'tokens'.*at least 1; got 0"):
        encoder.check({"tokens": np.zeros((1, 0), np.int64)})
    encoder.check({"tokens": np.zeros((1, 256), np.int64)})
