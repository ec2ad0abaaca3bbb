"""`cpu_linear`: the served mlp runs its linear layers through oneDNN by default, torch's when
asked, and the answers a batch gets agree either way (to float32 rounding)."""

from __future__ import annotations

import asyncio
import logging

import grpc
import numpy as np
import pytest
import torch

from wok.codec import decode_response, encode_request
from wok.cpulinear import OneDNNSequential, chains, onednn_available
from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

pytestmark = pytest.mark.skipif(not onednn_available(), reason="this torch build has no oneDNN linear kernel")

# Requests of 4 rows: every batch has at least MIN_ROWS, whatever the batcher forms.
ROWS = [np.random.default_rng(i).standard_normal((4, 256), dtype=np.float32) for i in range(6)]


async def answers(server) -> np.ndarray:
    """The outputs of the requests in ROWS, sent at once."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        replies = await asyncio.gather(*(stub.ModelInfer(encode_request("mlp", {"INPUT0": r})) for r in ROWS))
    return np.concatenate([decode_response(r)["OUTPUT0"] for r in replies])


def reference(server) -> np.ndarray:
    module = server.runtime("mlp").servable.module_for(torch.device("cpu"))
    with torch.inference_mode():
        return np.concatenate([module(torch.from_numpy(r)).numpy() for r in ROWS])


async def test_the_served_mlp_runs_through_onednn_and_answers_as_torch_does(serve):
    async with serve(models=("mlp",)) as server:
        inst = server.runtime("mlp").executor.instances[0]
        assert (inst.onednn_layers, inst.onednn_fused) == (3, 2)
        assert type(inst.module.net) is OneDNNSequential
        (chain,) = chains(inst.module)
        warmed = chain.calls  # the warm-up's batches
        assert warmed > 0 and inst.onednn_ran == (3, 2)
        np.testing.assert_allclose(await answers(server), reference(server), rtol=1e-5, atol=1e-5)
        assert chain.calls > warmed  # the requests' batches ran through it


async def test_with_torch_asked_for_the_module_is_the_servables_own(serve):
    async with serve(models=("mlp",), cpu_linear="torch") as server:
        inst = server.runtime("mlp").executor.instances[0]
        assert inst.onednn_layers == 0
        assert inst.module is server.runtime("mlp").servable.module_for(torch.device("cpu"))
        np.testing.assert_allclose(await answers(server), reference(server), rtol=1e-5, atol=1e-5)


def test_wok_serve_says_what_runs_through_onednn_and_takes_the_flag(start_server):
    from concurrent.futures import ThreadPoolExecutor

    # Both at once: each start is mostly a process's imports.
    with ThreadPoolExecutor(2) as ex:
        sp, sp_torch = ex.map(lambda flags: start_server("--models", "mlp", *flags), ([], ["--cpu-linear", "torch"]))
    sp.wait_for_line("wok: serving")  # logged after the models load
    said = "wok: mlp: 3 linear layer(s) per CPU instance run through oneDNN (2 with their ReLU)"
    assert any(said in line for line in sp.log), "\n".join(sp.log)
    assert sp.terminate() == 0
    sp_torch.wait_for_line("wok: serving")
    assert not any("oneDNN" in line for line in sp_torch.log)
    assert sp_torch.terminate() == 0


async def test_a_model_whose_forward_calls_none_of_its_linears_is_told_as_needing_nothing(serve, caplog):
    # The encoder's transformer layers run torch's fused kernels in inference, never their Linears. The line
    # read "did not take oneDNN in the warm-up (the model runs around them)", which left an operator asking
    # whether something had failed.
    caplog.set_level(logging.INFO, logger="wok")
    async with serve(models=("encoder",)) as server:
        inst = server.runtime("encoder").executor.instances[0]
        assert inst.onednn_layers == 4 and inst.onednn_ran == (0, 0)
    said = [r.getMessage() for r in caplog.records if r.name == "wok" and "oneDNN" in r.getMessage()]
    assert said == [
        "encoder: oneDNN not used: the warm-up called none of its 4 linear layer(s), which its forward computes "
        "another way (as torch's fused transformer kernels do); nothing to do: it runs as with --cpu-linear torch"
    ], said
