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
                    f"them up in); got values {refused[i]}"
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

    # `flag` an input too: not known at load (left out, it is False, as served, and `a` reaches no table).
    found = id_ranges(torch.jit.script(Branches()), ["a", "b", "flag"], {"a": torch.int64, "b": torch.int64})
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
        # No input checked: no refusal promised.
        "model 'Branchy': integer inputs that reach embedding tables: input 'ids' not checked: its module cannot be "
        "traced by torch.fx (TraceError), so what reaches its tables is not known",
        "model 'Plain': integer inputs that reach embedding tables (a request with an id outside its input's "
        "range is refused, INVALID_ARGUMENT): input 'ids' in [0, 10)",
    ]
    req = encode_request("Plain", {"ids": np.array([[1, 2, 3]], np.int32)})
    decode_request(req, plain)
    with pytest.raises(InvalidInput, match=r"input 'ids': expected ids in \[0, 10\) .*got values from 1 to 12"):
        decode_request(encode_request("Plain", {"ids": np.array([[1, 12, 3]], np.int32)}), plain)


def test_the_start_says_why_a_checked_input_publishes_no_bound(tmp_path, caplog):
    """An input refused past a table every id reaches, with no bound (a use of its ids not followed): the start-up
    line said only its range, not why `wok.ids_bound.ids` is missing."""
    source = textwrap.dedent(
        """
        from torch import nn


        class Doubled(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.a = nn.Embedding(10, 4)
                self.b = nn.Embedding(15, 4)

            def forward(self, ids):
                return (self.a(ids) + self.b(ids * 2)).sum(1)
        """
    )
    d = tmp_path / "doubled"
    d.mkdir()
    (d / "model.py").write_text(source)
    (d / "config.toml").write_text(config_text("python", 'factory = "model:Doubled"'))
    with caplog.at_level(logging.INFO, logger="wok"):
        servable = load_servable(d)
    assert (servable.id_ranges, dict(servable.id_bounds)) == ({"ids": 10}, {})
    lines = [r.getMessage() for r in caplog.records if "embedding tables" in r.getMessage()]
    assert lines == [
        "model 'doubled': integer inputs that reach embedding tables (a request with an id outside its input's range "
        "is refused, INVALID_ARGUMENT): input 'ids' in [0, 10) (checked per request; no bound published: it reaches "
        "the Embedding module through mul, which wok does not follow)"
    ]


def _gather(ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    # Scripted with the module that calls it, a function of its own (prim::CallFunction).
    if ids.dim() == 1:
        ids = ids.unsqueeze(0)
    return F.embedding(ids, table)


class BranchedLookup(Lookup):
    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return _gather(ids, self.table.weight).sum(1)


class IndexedRows(Lookup):
    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table.weight[ids].sum(1)


INDEXED_ROWS = f"""
import torch
from torch import nn


class IndexedRows(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("table", torch.arange({ROWS * 4}, dtype=torch.float32).reshape({ROWS}, 4))

    def forward(self, ids):
        return self.table[ids].sum(1)
"""


def write_module(root: Path, name: str, module: nn.Module | None, platform: str, mbs: int = 4) -> None:
    """`module` in `root / name` as `platform` serves it (python: model.py's IndexedRows), with config_text's
    config."""
    d = root / name
    d.mkdir(parents=True)
    if platform == "python":
        (d / "model.py").write_text(INDEXED_ROWS)
        (d / "config.toml").write_text(config_text(platform, 'factory = "model:IndexedRows"', mbs))
        return
    if platform == "torchscript":
        torch.jit.script(module.eval()).save(str(d / "model.pt"))
    else:
        batch = torch.export.Dim("batch", min=1, max=mbs)
        example = (torch.zeros(2, 3, dtype=torch.int64),)
        program = torch.export.export(module.eval(), example, dynamic_shapes={"ids": {0: batch}})
        torch.export.save(program, str(d / "model.pt2"))
    model_file = "model.pt" if platform == "torchscript" else "model.pt2"
    (d / "config.toml").write_text(config_text(platform, f'model_file = "{model_file}"', mbs))


async def _sent(server, name: str, sent: list[np.ndarray]) -> list:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        calls = [stub.ModelInfer(encode_request(name, {"ids": ids.astype(np.int64)})) for ids in sent]
        return await asyncio.gather(*calls, return_exceptions=True)


async def test_ids_through_a_scripted_function_and_a_branch_that_keeps_them_are_checked(tmp_path, serve):
    """A scripted function's F.embedding, its ids through a branch whose every way keeps them (`if ids.dim() == 1:
    ids = ids.unsqueeze(0)`): TorchScript's graph called the function (prim::CallFunction) and the server did not
    step in; the id past the table failed its batch INTERNAL ("index out of range in self") and the batch ran again
    in parts. Read in the inlined graph (as `wok profile` read it), the branch keeps the ids."""
    write_module(tmp_path / "repo", "branched", BranchedLookup(), "torchscript")
    sent = [np.array([[0, 1, 2]]), np.array([[3, ROWS, 4]]), np.array([[9, 8, 7]])]
    async with serve(models=(), repository=tmp_path / "repo") as server:
        assert server.runtime("branched").servable.id_ranges == {"ids": ROWS}
        results = await _sent(server, "branched", sent)
        metrics = server.metrics.models["branched"]
    assert isinstance(results[1], grpc.aio.AioRpcError) and results[1].code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"expected ids in [0, {ROWS})" in results[1].details()
    for i in (0, 2):
        np.testing.assert_array_equal(decode_response(results[i])["out"], expected(sent[i]))
    assert (metrics.reruns, metrics.rejections["invalid"]) == (0, 1)


@pytest.mark.parametrize("platform", ["torchscript", "torch_export", "python"])
async def test_table_indexed_by_ids_refuses_ids_past_either_end_and_takes_negative_ones(tmp_path, serve, platform):
    """`table[ids]` (aten::index) was not followed: an id past the table failed its batch INTERNAL. It counts a
    negative id from the table's end, so -1 is answered (its last row), and only ids below -rows are refused with
    those at or past rows."""
    write_module(tmp_path / "repo", "indexed", IndexedRows(), platform)
    sent = [np.array([[0, 1, 2]]), np.array([[3, ROWS, 4]]), np.array([[-1, -ROWS, 5]]), np.array([[-ROWS - 1, 0, 1]])]
    async with serve(models=(), repository=tmp_path / "repo") as server:
        servable = server.runtime("indexed").servable
        assert servable.id_ranges == {"ids": ROWS}
        assert servable.id_least == {"ids": -ROWS}
        results = await _sent(server, "indexed", sent)
        metrics = server.metrics.models["indexed"]
    refused = {1: f"from 3 to {ROWS}", 3: f"from {-ROWS - 1} to 1"}
    for i, (ids, r) in enumerate(zip(sent, results)):
        if i in refused:
            assert isinstance(r, grpc.aio.AioRpcError) and r.code() == grpc.StatusCode.INVALID_ARGUMENT, r
            assert r.details() == (
                f"input 'ids': expected ids in [{-ROWS}, {ROWS}) (the rows of the embedding table model 'indexed' "
                f"looks them up in, a negative id counted from its end); got values {refused[i]}"
            )
        else:
            np.testing.assert_array_equal(decode_response(r)["out"], expected(ids))
    assert (metrics.reruns, metrics.rejections["invalid"]) == (0, 2)


def test_what_the_profile_may_draw_is_found_where_the_server_checks_nothing():
    """`bounds`, wok profile's: ids below it reach no table past its rows, also through a slice (only some ids are
    looked up: the server refuses none of them) and under a branch; a cast that loses values bounds nothing (the
    profile took it, and drew ids that wrapped to negative ones)."""

    class Parts(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(10, 4)
            self.small = nn.Parameter(torch.randn(7, 4))
            self.wide = nn.Parameter(torch.randn(300, 4))

        def forward(self, a, b, c, d):
            out = self.emb(a[:, 0]) + self.emb(b.t()).sum(0) + F.embedding(c.to(torch.int8).long(), self.wide).sum(1)
            return out + F.embedding(d.expand(2, -1, -1), self.small).sum((0, 1))

    module = Parts().eval()
    order = list("abcd")
    example = tuple(torch.zeros(2, 2, dtype=torch.int64) for _ in order)
    for kind, model in {
        "python": module,
        "scripted": torch.jit.script(module),
        "exported": torch.export.export(module, example),
    }.items():
        found = id_ranges(model, order, {n: torch.int64 for n in order})
        assert found.bounds == {"a": 10, "b": 10, "d": 7}, kind
        assert found.rows == {"b": 10}, kind
        assert set(found.unclear) == {"a", "c", "d"}, kind


MARKED = """
from torch import nn


class Marked(nn.Module):
    def __init__(self, marker):
        super().__init__()
        self.marker = marker
        self.emb = nn.Embedding(10, 4)

    def forward(self, ids):
        with open(self.marker, "a") as out:  # outside the module: the trace on a copy does it too
            out.write("forward\\n")
        return self.emb(ids.long()).sum(1)
"""


@pytest.mark.parametrize(("datatype", "traced"), [("FP32", 0), ("INT64", 1)])
def test_a_python_models_forward_is_traced_at_load_only_with_an_integer_input(tmp_path, datatype, traced):
    """As README says: the load traces a python model's forward once, with torch.fx, to find its tables, and what
    forward does outside its module (here a file written) is done then; a model with no integer input has no ids
    to check, and is not traced."""
    d = tmp_path / "marked"
    d.mkdir()
    (d / "model.py").write_text(MARKED)
    marker = tmp_path / "calls.txt"
    source = f'factory = "model:Marked"\nparameters = {{ marker = "{marker}" }}'
    (d / "config.toml").write_text(config_text("python", source, datatype=datatype))
    servable = load_servable(d)
    assert (marker.read_text().count("forward") if marker.exists() else 0) == traced
    assert servable.id_ranges == ({"ids": 10} if traced else {})


SERVED_CLAMPED = """
import torch
from torch import nn


class ServedClamped(nn.Module):
    # Trained on ids in range; served, an id past the vocabulary goes to its last row (out of vocabulary).
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)

    def forward(self, ids):
        if not self.training:
            ids = ids.clamp(0, 9)
        return self.emb(ids).sum(1)


class Widened(nn.Module):
    # Built for 10 ids, its table then replaced by one of 100 rows (pretrained vectors): num_embeddings says 10.
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.emb.weight.data = torch.ones(100, 4)

    def forward(self, ids):
        return self.emb(ids).sum(1)
"""


@pytest.mark.parametrize(("factory", "rows"), [("ServedClamped", None), ("Widened", 100)])
def test_a_python_model_is_read_as_it_is_served(tmp_path, factory, rows):
    """A factory's module comes in training mode and is served in eval mode (Servable): traced as it came, the
    `if not self.training` way was left out, and an id the served model clamps was refused. A table's rows are its
    weight's, not the num_embeddings it was built with: an id its replaced table holds was refused."""
    d = tmp_path / factory
    d.mkdir()
    (d / "model.py").write_text(SERVED_CLAMPED)
    (d / "config.toml").write_text(config_text("python", f'factory = "model:{factory}"'))
    servable = load_servable(d)
    assert servable.id_ranges == ({} if rows is None else {"ids": rows})
    sent = np.array([[1, 50, 2]], np.int64)
    decode_request(encode_request(factory, {"ids": sent}), servable)
    with torch.no_grad():
        assert servable._module(torch.from_numpy(sent)).shape == (1, 4)  # the model answers it


class LazyTable(nn.Module):
    """Builds its table at the first call (an attribute set by forward): the load sees it empty."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.zeros(0, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.table.size(0) == 0:
            self.table = torch.arange(400, dtype=torch.float32).reshape(100, 4)
        return self.table[ids].sum(1)


def test_a_table_forward_sets_is_not_read_at_load():
    """TorchScript: `self.table` read after forward's prim::SetAttr of it is not the tensor the load sees; read
    there, its 0 rows refused every id of every request."""
    scripted = torch.jit.script(LazyTable())
    found = id_ranges(scripted, ["ids"], {"ids": torch.int64})
    assert found.rows == {} and found.bounds == {}
    assert scripted(torch.tensor([[1, 50, 2]])).shape == (1, 4)  # the model answers it


def test_inputs_sent_into_a_python_forwards_varargs_are_not_taken_for_others():
    """`forward(self, *xs)`: torch.fx has one placeholder for all of them, which was taken for the first input, so
    `xs[1]`'s table bounded input 'a' (which reaches another) and input 'b' went unbounded."""

    class Varargs(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.big, self.small = nn.Embedding(100, 4), nn.Embedding(10, 4)

        def forward(self, *xs):
            return self.big(xs[0]).sum(1) + self.small(xs[1]).sum(1)

    found = id_ranges(Varargs().eval(), ["a", "b"], {"a": torch.int64, "b": torch.int64})
    assert (found.rows, found.bounds, found.unclear) == ({}, {}, {})


async def test_a_request_read_in_chunks_is_refused_at_the_chunk_holding_an_id_past_the_table(tmp_path, serve):
    """Typed contents of more than CONTENTS_CHUNK ids, read a chunk per turn of the loop (codec.finish_decoding):
    their ids are checked a chunk at a time, and the request refused at the first chunk holding one past the table,
    INVALID_ARGUMENT, saying how much it read."""
    from wok.codec import CONTENTS_CHUNK
    from wok.v2pb import grpc_service_pb2 as pb

    d = tmp_path / "repo" / "indexed"
    d.mkdir(parents=True)
    (d / "model.py").write_text(INDEXED_ROWS)
    config = config_text("python", 'factory = "model:IndexedRows"', 1).replace("dims = [3]", "dims = [-1]")
    (d / "config.toml").write_text(config)
    n = 2 * CONTENTS_CHUNK + 5
    ids = np.arange(n) % ROWS
    ids[CONTENTS_CHUNK + 3] = ROWS
    req = pb.ModelInferRequest(model_name="indexed")
    req.inputs.add(name="ids", datatype="INT64", shape=[1, n]).contents.int64_contents.extend(ids.tolist())
    async with serve(models=(), repository=tmp_path / "repo") as server:
        assert server.runtime("indexed").servable.id_ranges == {"ids": ROWS}
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(req)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == (
        f"input 'ids': expected ids in [{-ROWS}, {ROWS}) (the rows of the embedding table model 'indexed' looks them "
        f"up in, a negative id counted from its end); got values from 0 to {ROWS} in its first {2 * CONTENTS_CHUNK:,} "
        f"of {n:,} values (the rest not read)"
    )
