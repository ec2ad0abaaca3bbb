"""Ids past an embedding table: found at load from the model's graph (server/tables.py), refused per request with
INVALID_ARGUMENT before the request is batched (codec.check_ids), not failed with its batch (INTERNAL, rerun in
parts)."""

from __future__ import annotations

import asyncio
import logging
import textwrap
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from wok.codec import decode_request, decode_response, encode_request
from wok.errors import InvalidInput
from wok.repository import load_servable
from wok.tables import id_ranges, table_rows
from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.:DeprecationWarning")

ROWS = 10


class Lookup(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Embedding(ROWS, 4)
        with torch.no_grad():
            self.table.weight.copy_(torch.arange(ROWS * 4, dtype=torch.float32).reshape(ROWS, 4))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table(ids.reshape(-1, 3)).sum(1)


def expected(ids: np.ndarray) -> np.ndarray:
    return Lookup().table.weight.detach().numpy()[ids].sum(1)


def config_text(platform: str, source: str, mbs: int = 4, datatype: str = "INT64") -> str:
    """A config of one integer input 'ids' of dims [3] and an FP32 output 'out' of [4]; `source`: its model_file or
    factory line."""
    return textwrap.dedent(
        f"""
        platform = "{platform}"
        {source}
        max_batch_size = {mbs}

        [[inputs]]
        name = "ids"
        datatype = "{datatype}"
        dims = [3]

        [[outputs]]
        name = "out"
        datatype = "FP32"
        dims = [4]

        [dynamic_batching]
        max_queue_delay_ms = 50.0
        """
    )


def write_model(root: Path, platform: str, mbs: int = 4) -> str:
    name = f"ids_{platform}"
    d = root / name
    d.mkdir(parents=True)
    module = Lookup().eval()
    if platform == "torchscript":
        torch.jit.script(module).save(str(d / "model.pt"))
    else:
        batch = torch.export.Dim("batch", min=1, max=mbs)
        example = (torch.zeros(2, 3, dtype=torch.int64),)
        torch.export.save(
            torch.export.export(module, example, dynamic_shapes={"ids": {0: batch}}), str(d / "model.pt2")
        )
    model_file = "model.pt" if platform == "torchscript" else "model.pt2"
    (d / "config.toml").write_text(config_text(platform, f'model_file = "{model_file}"', mbs))
    return name


@pytest.mark.parametrize("platform", ["torchscript", "torch_export"])
async def test_an_id_past_the_table_is_refused_alone_before_its_batch_and_the_others_answered(
    tmp_path, serve, platform
):
    """A batch's worth of requests, one past the table and one negative: those two get INVALID_ARGUMENT naming the
    input, the range and what came; the others their answers, from a batch the model ran once (no rerun in parts,
    which answered the bad ones INTERNAL, in torch's words)."""
    name = write_model(tmp_path / "repo", platform)
    sent = [
        np.array([[0, 1, 2]]),
        np.array([[3, ROWS, 4]]),
        np.array([[9, 8, 7]]),
        np.array([[-1, 0, 5]]),
    ]
    async with serve(models=(), repository=tmp_path / "repo") as server:
        assert server.runtime(name).servable.id_ranges == {"ids": ROWS}
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            calls = [stub.ModelInfer(encode_request(name, {"ids": ids.astype(np.int64)})) for ids in sent]
            results = await asyncio.gather(*calls, return_exceptions=True)
        metrics = server.metrics.models[name]
        refused = {1: f"from 3 to {ROWS}", 3: "from -1 to 5"}
        for i, (ids, r) in enumerate(zip(sent, results)):
            if i in refused:
                assert isinstance(r, grpc.aio.AioRpcError), r
                assert r.code() == grpc.StatusCode.INVALID_ARGUMENT, r.details()
                assert r.details() == (
                    f"input 'ids': expected ids in [0, {ROWS}) (the rows of the embedding table model '{name}' looks "
                    f"them up in), got values {refused[i]}"
                )
            else:
                np.testing.assert_array_equal(decode_response(r)["out"], expected(ids))
        assert metrics.reruns == 0
        assert metrics.rejections["invalid"] == 2


def test_the_tables_are_found_through_the_ops_that_keep_ids_and_not_guessed_through_others():
    """nn.Embedding, nn.EmbeddingBag, F.embedding and index_select on a parameter, through reshape, view, flatten
    and a cast that loses nothing, alike in a python module (torch.fx), TorchScript (scripted or traced) and a
    torch.export program; ids changed on the way (+1, a narrowing cast) are not checked, and say why."""

    class Tables(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(10, 4)
            self.bag = nn.EmbeddingBag(7, 4, mode="sum")
            self.w = nn.Parameter(torch.randn(5, 4))
            self.tab = nn.Parameter(torch.randn(6, 4))

        def forward(self, a, b, c, d, e, f, g, x):
            out = self.emb(a.reshape(-1, 2)).sum(1) + self.bag(b.long())
            out = out + F.embedding(c.view(-1), self.w).view(-1, 2, 4).sum(1)
            out = out + torch.index_select(self.tab, 0, d.flatten()).view(-1, 2, 4).sum(1)
            out = out + self.emb(e + 1).sum(1) + self.emb(f.to(torch.int8).long()).sum(1)
            return out + self.emb(g).sum(1) + self.bag(g).sum() + x

    module = Tables().eval()
    order = list("abcdefgx")
    dtypes = {n: torch.int64 for n in order[:-1]}
    example = (*(torch.zeros(2, 2, dtype=torch.int64) for _ in range(7)), torch.zeros(2, 4))
    models = {
        "python": module,
        "scripted": torch.jit.script(module),
        "traced": torch.jit.trace(module, example),
        "exported": torch.export.export(module, example),
    }
    for kind, model in models.items():
        found = id_ranges(model, order, dtypes)
        # g reaches two tables: the smaller one bounds it.
        assert found.rows == {"a": 10, "b": 7, "c": 5, "d": 6, "g": 7}, kind
        assert set(found.unclear) == {"e", "f"}, kind
        assert "add" in found.unclear["e"] and "which wok does not follow" in found.unclear["e"], kind
        assert "to" in found.unclear["f"], kind
    assert table_rows(module.emb) == [10] and table_rows(models["scripted"].bag) == [7]


def test_a_lookup_under_a_branch_or_of_a_slice_is_not_checked():
    """A TorchScript branch runs its lookup only on some requests; a slice looks up only part of the ids: neither
    bounds every id a request holds."""

    class Branches(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(10, 4)

        def forward(self, a, b, flag: bool = False):
            if flag:
                return self.emb(a).sum(1)
            return self.emb(b[:, 0])

    found = id_ranges(torch.jit.script(Branches()), ["a", "b"], {"a": torch.int64, "b": torch.int64})
    assert found.rows == {}
    assert "under a condition (prim::If)" in found.unclear["a"]
    assert "aten::select" in found.unclear["b"] or "aten::slice" in found.unclear["b"]


def test_a_python_model_that_torch_fx_cannot_trace_is_not_checked_and_the_start_says_so(tmp_path, caplog):
    source = textwrap.dedent(
        """
        import torch
        from torch import nn


        class Branchy(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.emb = nn.Embedding(10, 4)
                self.calls = 0

            def forward(self, ids):
                self.calls += 1
                if ids.sum() > 0:  # on the values: torch.fx cannot trace it
                    return self.emb(ids).sum(1)
                return self.emb(ids).mean(1)


        class Plain(Branchy):
            def forward(self, ids):
                self.calls += 1
                return self.emb(ids).sum(1)
        """
    )
    for factory in ("Branchy", "Plain"):
        d = tmp_path / factory
        d.mkdir()
        (d / "model.py").write_text(source)
        (d / "config.toml").write_text(config_text("python", f'factory = "model:{factory}"', datatype="INT32"))
    with caplog.at_level(logging.INFO, logger="wok"):
        branchy = load_servable(tmp_path / "Branchy")
        plain = load_servable(tmp_path / "Plain")
    assert branchy.id_ranges == {}
    assert plain.id_ranges == {"ids": 10}
    # The trace ran on a copy: the served module's state is its own.
    assert branchy._module.calls == 0 and plain._module.calls == 0
    lines = [r.getMessage() for r in caplog.records if "embedding tables" in r.getMessage()]
    assert lines == [
        "model 'Branchy': integer inputs that reach embedding tables (a request with an id outside its input's "
        "range is refused, INVALID_ARGUMENT): input 'ids' not checked: its module cannot be traced by "
        "torch.fx (TraceError), so what reaches its tables is not known",
        "model 'Plain': integer inputs that reach embedding tables (a request with an id outside its input's "
        "range is refused, INVALID_ARGUMENT): input 'ids' in [0, 10)",
    ]
    req = encode_request("Plain", {"ids": np.array([[1, 2, 3]], np.int32)})
    decode_request(req, plain)
    with pytest.raises(InvalidInput, match=r"input 'ids': expected ids in \[0, 10\) .*got values from 1 to 12"):
        decode_request(encode_request("Plain", {"ids": np.array([[1, 12, 3]], np.int32)}), plain)
