"""Models loaded from real files in a repository folder, each platform and each way it fails.

Every model here is written to tmp_path the way a user would lay it out, then loaded with
`load_servable` / `ModelRepository.from_directory`; outputs are compared with the module
the files were made from, so a loader that silently drops weights or shapes is caught.
"""

from __future__ import annotations

import logging
import math
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import textwrap
import zipfile
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from wok.codec import decode_response, encode_request
from wok.errors import ConfigError, ModelNotFound, quoted_name
from wok.executor import Executor
from wok.repository import ModelRepository, load_model, load_servable
from wok.servable import Servable
from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

CPU = torch.device("cpu")
# torch 2.13 deprecates torch.jit, but the torchscript platform is still served.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.:DeprecationWarning")


def config_toml(platform: str, *, extra: str = "", in_dims="[4]", out_dims="[3]", mbs=8, warmup_dims="") -> str:
    return textwrap.dedent(
        f"""
        platform = "{platform}"
        max_batch_size = {mbs}
        {extra}

        [[inputs]]
        name = "INPUT0"
        datatype = "FP32"
        dims = {in_dims}
        {warmup_dims and f"warmup_dims = {warmup_dims}"}

        [[outputs]]
        name = "OUTPUT0"
        datatype = "FP32"
        dims = {out_dims}

        [dynamic_batching]
        max_queue_delay_ms = 1.0

        [instances]
        devices = ["cpu"]
        """
    )


def model_dir(root: Path, name: str, platform: str, extra: str = "", **kw) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "config.toml").write_text(config_toml(platform, extra=extra, **kw))
    return d


def run(servable: Servable, x: torch.Tensor) -> torch.Tensor:
    """What the executor does for one batch on CPU."""
    module = servable.module_for(CPU)
    with torch.inference_mode():
        return servable.forward(module, {"INPUT0": x})["OUTPUT0"]


def reference_linear(seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(4, 3).eval()


# A python-platform model whose weights come from a file: built with deterministic but
# different-from-the-file values, so an ignored weights file shows up as a mismatch.
LINEAR_FACTORY = textwrap.dedent(
    """
    import torch
    from torch import nn


    def build(out_features: int = 3) -> nn.Module:
        m = nn.Linear(4, out_features)
        with torch.no_grad():
            m.weight.fill_(0.0)
            m.bias.fill_(0.0)
        return m
    """
)


# -- torchscript -----------------------------------------------------------------------
def write_torchscript(root: Path, name: str = "ts") -> tuple[Path, nn.Module]:
    ref = reference_linear(1)
    d = model_dir(root, name, "torchscript", extra='model_file = "model.pt"')
    torch.jit.script(ref).save(str(d / "model.pt"))
    return d, ref


def test_torchscript_loads_and_matches(tmp_path):
    d, ref = write_torchscript(tmp_path)
    s = load_servable(d)
    assert s.name == "ts" and s.platform_label == "torchscript"
    x = torch.randn(5, 4)
    torch.testing.assert_close(run(s, x), ref(x).detach())


@pytest.mark.parametrize("platform", ["torchscript", "frozen", "torch_export"])
async def test_a_torchscript_or_export_model_is_said_to_run_torchs_linear_layers(tmp_path, serve, caplog, platform):
    # Only a python model's nn.Linear modules run through oneDNN: the start-up said nothing for the others, nor
    # (its Linear inlined, no submodule left) for a TorchScript model saved frozen, as one is shipped.
    repo = tmp_path / "repo"
    if platform == "frozen":
        platform = "torchscript"
        d = model_dir(repo, "ts", platform, extra='model_file = "model.pt"')
        mlp = nn.Sequential(reference_linear(1), nn.ReLU()).eval()  # not a Linear alone, whose type freezing keeps
        torch.jit.freeze(torch.jit.script(mlp)).save(str(d / "model.pt"))
    else:
        (write_torchscript if platform == "torchscript" else write_exported)(repo)
    name = "ts" if platform == "torchscript" else next(p.name for p in repo.iterdir())
    caplog.set_level(logging.INFO, logger="wok")
    async with serve(repository=repo):
        pass
    said = [r.getMessage() for r in caplog.records if r.name == "wok" and "oneDNN" in r.getMessage()]
    assert said == [
        f"{name}: oneDNN not used: a {platform} model runs torch's own linear layers; to run them through oneDNN, "
        'serve its nn.Module with platform = "python" (a factory and weights = its state dict)'
    ], said


class Doubles(nn.Module):
    """No linear layer at all."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


class FunctionalLinear(nn.Module):
    """A linear computed with F.linear, no nn.Linear: served as an nn.Module it runs as torch's too."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.eye(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.weight)


@pytest.mark.parametrize("module", [Doubles, FunctionalLinear])
@pytest.mark.parametrize("platform", ["torchscript", "torch_export"])
async def test_a_torchscript_or_export_model_without_linear_layers_is_said_nothing_of_onednn(
    tmp_path, serve, caplog, platform, module
):
    # The line above was said of every such model: "runs torch's own linear layers" of one that has none, and
    # advice to serve it as an nn.Module, whose run would be the same.
    repo = tmp_path / "repo"
    if platform == "torchscript":
        d = model_dir(repo, "ts", platform, extra='model_file = "model.pt"', out_dims="[4]")
        torch.jit.script(module()).save(str(d / "model.pt"))
    else:
        write_exported(repo, module=module(), out_dims="[4]")
    caplog.set_level(logging.INFO, logger="wok")
    async with serve(repository=repo):
        pass
    assert any(r.getMessage().startswith("wok serving ") for r in caplog.records)  # its start was logged
    said = [r.getMessage() for r in caplog.records if "oneDNN" in r.getMessage()]
    assert said == [], said


PYTHON_MODELS = {
    "doubles": "return x * 2",
    "functional": "return nn.functional.linear(x, torch.eye(4))",
    "linear": "return self.fc(x)",
}


@pytest.mark.parametrize(("body", "warned"), [("doubles", False), ("functional", False), ("linear", True)])
async def test_a_python_model_on_a_torch_build_without_onednn_is_warned_only_if_it_has_linear_layers(
    tmp_path, serve, caplog, monkeypatch, body, warned
):
    # The warning was said of every python model there: of one with no nn.Linear, which oneDNN would not run either.
    from wok import app, cpulinear

    for where in (app, cpulinear):  # a torch build without oneDNN's linear kernel, as this one may not be
        monkeypatch.setattr(where, "onednn_available", lambda: False)
    d = model_dir(tmp_path / "repo", body, "python", extra='factory = "model:build"', out_dims="[4]")
    (d / "model.py").write_text(
        textwrap.dedent(
            f"""
            import torch
            from torch import nn


            class M(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.fc = nn.Linear(4, 4) if {body == "linear"} else None

                def forward(self, x):
                    {PYTHON_MODELS[body]}


            def build():
                return M()
            """
        )
    )
    caplog.set_level(logging.INFO, logger="wok")
    async with serve(repository=tmp_path / "repo"):
        pass
    assert any(r.getMessage().startswith("wok serving ") for r in caplog.records)  # its start was logged
    said = [r.getMessage() for r in caplog.records if "oneDNN" in r.getMessage()]
    assert said == ([f"{body}: this torch build cannot run linear layers through oneDNN; torch runs them"] * warned), (
        said
    )


async def test_torchscript_round_trip_through_server(tmp_path, serve):
    repo = tmp_path / "repo"
    _, ref = write_torchscript(repo)
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    async with serve(repository=repo) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            resp = await stub.ModelInfer(encode_request("ts", {"INPUT0": x}), timeout=30)
    out = decode_response(resp)["OUTPUT0"]
    assert out.shape == (2, 3) and out.dtype == np.float32
    np.testing.assert_allclose(out, ref(torch.from_numpy(x)).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_corrupt_torchscript_file(tmp_path):
    d = model_dir(tmp_path, "ts", "torchscript", extra='model_file = "model.pt"')
    (d / "model.pt").write_bytes(b"not a torchscript archive")
    with pytest.raises(ConfigError) as info:
        load_servable(d)
    assert str(info.value).startswith(
        f"{d / 'config.toml'}: model_file 'model.pt': cannot load torchscript file {d / 'model.pt'}: "
    )


# -- torch.export ----------------------------------------------------------------------
def write_exported(
    root: Path,
    batch=None,
    *,
    module: nn.Module | None = None,
    rows: int = 3,
    static: bool = False,
    cols: int = 4,
    cols_dim=None,
    **config,
) -> tuple[Path, nn.Module]:
    """`module` (nn.Linear(4, 3) unless given) exported from a batch of `rows` rows of `cols` with `batch` as its
    batch dim (a Dim of 1-64 rows unless given; none where `static`) and `cols_dim` as its dim 1 (none unless
    given), into a model folder whose config takes `config` (model_dir's keywords)."""
    module = reference_linear(2) if module is None else module
    # min=1 exports and runs fine with torch 2.13; the example batch must not be 1 or the
    # tracer would specialize the dim to a constant.
    batch = torch.export.Dim("batch", min=1, max=64) if batch is None else batch
    dims = {0: batch} if cols_dim is None else {0: batch, 1: cols_dim}
    ep = torch.export.export(module, (torch.randn(rows, cols),), dynamic_shapes=None if static else (dims,))
    d = model_dir(root, "exported", "torch_export", extra='model_file = "model.pt2"', **config)
    torch.export.save(ep, str(d / "model.pt2"))
    return d, module


def program_rows(servable: Servable) -> list[int]:
    """The row counts of the batches the program's own module (under any wrapper) is called with, one per call
    from now on."""
    seen: list[int] = []
    program_module(servable).register_forward_pre_hook(lambda _module, args: seen.append(args[0].shape[0]))
    return seen


def program_module(servable: Servable) -> torch.fx.GraphModule:
    """The program's own module that `servable` runs on CPU, under any wrapper of wok's."""
    return next(m for m in servable.module_for(CPU).modules() if isinstance(m, torch.fx.GraphModule))


def test_torch_export_dynamic_batch(tmp_path):
    d, ref = write_exported(tmp_path)
    s = load_servable(d)
    assert s.platform_label == "torch_export"
    for rows in (1, 5):
        x = torch.randn(rows, 4)
        out = run(s, x)
        assert out.shape == (rows, 3)
        torch.testing.assert_close(out, ref(x).detach())


# From 2 rows (Dim.AUTO), refused at load before: a one-row batch is padded to 2. Of 8 rows only, max_batch_size
# (no batch Dim), refused at load before: every batch is padded to 8.
@pytest.mark.parametrize(
    ("exported", "ran"),
    [({}, [1, 5]), ({"batch": torch.export.Dim.AUTO}, [2, 5]), ({"rows": 8, "static": True}, [8, 8])],
    ids=["from-1", "auto", "no-batch-dim-of-max_batch_size"],
)
async def test_torch_export_round_trip_through_server(tmp_path, serve, exported, ran):
    repo = tmp_path / "repo"
    _, ref = write_exported(repo, **exported)
    rng = np.random.default_rng(1)
    async with serve(repository=repo) as server:
        seen = program_rows(server.repository.get("exported"))  # the module its one instance runs, warmed up
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            for rows in (1, 5):
                x = rng.standard_normal((rows, 4)).astype(np.float32)
                resp = await stub.ModelInfer(encode_request("exported", {"INPUT0": x}), timeout=30)
                out = decode_response(resp)["OUTPUT0"]
                want = ref(torch.from_numpy(x)).detach().numpy()
                np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    assert seen == ran


def test_a_torch_export_model_runs_without_torchs_per_call_checks_where_every_batch_passes_them(tmp_path):
    # The program takes 1-64 rows of 4; the config lets 1-8 rows of 4 through. Those 8 shapes are run
    # through the program's guards at load; per batch, torch's pre-hook and guards (1.3 x the demo mlp's
    # one-row forward) no longer run: a batch the guards would refuse, which wok never sends, runs.
    d, ref = write_exported(tmp_path)
    s = load_servable(d)
    for rows in (1, 8, 65):
        x = torch.randn(rows, 4)
        torch.testing.assert_close(run(s, x), ref(x).detach())


@pytest.mark.parametrize("in_dims", ["[4]", "[-1]"], ids=["unchecked", "checked"])  # a -1 dim keeps torch's checks
@pytest.mark.parametrize(
    ("batch", "least"),
    [
        (torch.export.Dim.AUTO, 2),
        (torch.export.Dim.DYNAMIC, 2),
        (torch.export.Dim("batch", min=2, max=64), 2),
        (torch.export.Dim("batch", min=3), 3),
        (torch.export.Dim("batch", min=3, max=8), 3),
    ],
    ids=["auto", "dynamic", "min-2", "min-3", "min-3-max-8"],
)
def test_a_torch_export_program_whose_batches_start_above_one_row_runs_short_ones_padded(
    tmp_path, caplog, batch, least, in_dims
):
    # Refused at load before; before that, a one-row batch ran outside the traced range (from 2) or failed
    # its guards (from 3), as did a two-row one from 3.
    d, ref = write_exported(tmp_path, batch, rows=5, in_dims=in_dims)
    caplog.set_level(logging.INFO, logger="wok")
    s = load_servable(d)
    # A -1 dim the program was exported for at 4 alone (no Dim on it): requests of another size refused, said.
    fixed = (
        "model 'exported': input 'INPUT0' of its torch.export program takes a dim 1 of exactly 4: a request whose "
        "dim 1 is outside it is refused (INVALID_ARGUMENT), being outside what was traced"
    )
    assert [r.getMessage() for r in caplog.records if r.name == "wok"] == [fixed] * (in_dims == "[-1]") + [
        f"model 'exported': input 'INPUT0' of its torch.export program takes batches of {least} rows or more: "
        f"batches of fewer than {least} rows are padded to {least}, copies of their first row, the copies' answers "
        "dropped"
    ]
    seen = program_rows(s)
    for rows in range(1, 9):
        x = torch.randn(rows, 4)
        torch.testing.assert_close(run(s, x), ref(x).detach())
    assert seen == [max(rows, least) for rows in range(1, 9)]
    assert program_module(s).validate_inputs is (in_dims == "[-1]")  # the attribute torch's pre-hook reads


def test_a_torch_export_program_of_max_batch_size_rows_only_runs_every_batch_padded_to_it(tmp_path, caplog):
    # Exported with no batch Dim from 4 rows, max_batch_size 4: refused at load before.
    d, ref = write_exported(tmp_path, rows=4, static=True, mbs=4)
    caplog.set_level(logging.INFO, logger="wok")
    s = load_servable(d)
    assert [r.getMessage() for r in caplog.records if r.name == "wok"] == [
        "model 'exported': input 'INPUT0' of its torch.export program takes batches of exactly 4 rows (exported with "
        "no batch Dim): batches of fewer than 4 rows are padded to 4, copies of their first row, the copies' answers "
        "dropped"
    ]
    seen = program_rows(s)
    for rows in range(1, 5):
        x = torch.randn(rows, 4)
        torch.testing.assert_close(run(s, x), ref(x).detach())
    assert seen == [4, 4, 4, 4]
    assert program_module(s).validate_inputs is False  # its one shape passes its guards


class Returning(nn.Module):
    """nn.Linear(4, 3), its answer returned as `kind` says: a tensor, or a tuple, list or dict of one; or twice
    over in dim 0 (2 × the batch's rows), as its one output ("twice") or beside it in a dict ("dict-twice")."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.linear = reference_linear(2)

    def forward(self, x):
        y = self.linear(x)
        if self.kind.endswith("twice"):
            twice = torch.cat((y, y))
            return twice if self.kind == "twice" else {"OUTPUT0": y, "TWICE": twice}
        return {"tensor": y, "tuple": (y,), "list": [y], "dict": {"OUTPUT0": y}}[self.kind]


@pytest.mark.parametrize("kind", ["tensor", "tuple", "list", "dict"])
def test_a_padded_batchs_outputs_are_cut_to_its_rows_however_the_program_returns_them(tmp_path, kind):
    d, model = write_exported(tmp_path, torch.export.Dim.AUTO, module=Returning(kind).eval(), rows=5)
    s = load_servable(d)
    seen = program_rows(s)
    x = torch.randn(1, 4)
    torch.testing.assert_close(run(s, x), model.linear(x).detach())
    assert seen == [2]


class WithTable(nn.Module):
    """nn.Linear(4, 3)'s answer, and a table of `rows` rows of `dims` whatever the batch's."""

    def __init__(self, rows: int, dims: tuple[int, ...]) -> None:
        super().__init__()
        self.linear = reference_linear(2)
        self.register_buffer("table", torch.arange(float(rows * math.prod(dims))).reshape(rows, *dims))

    def forward(self, x):
        return self.linear(x), self.table * 1  # * 1: an output of the graph's own, not its buffer


@pytest.mark.parametrize("dims", [(), (3,)], ids=["1d", "2d"])
@pytest.mark.parametrize(
    ("batch", "least"),
    [(torch.export.Dim.AUTO, 2), (torch.export.Dim("batch", min=3), 3), (None, 1)],
    ids=["auto", "min-3", "from-1"],
)
def test_a_padded_batch_cuts_only_the_outputs_that_carry_the_batch(tmp_path, batch, least, dims):
    # A table of as many rows as the padded batch was cut to the batch's rows with the rest (its first row
    # answered for a one-row batch); read from the program, its dim 0 is not the batch's. From 1 row: not padded.
    d, model = write_exported(tmp_path, batch, module=WithTable(least, dims).eval(), rows=5)
    s = load_servable(d)
    module = s.module_for(CPU)
    seen = program_rows(s)
    for rows in range(1, 5):
        x = torch.randn(rows, 4)
        with torch.inference_mode():
            got = module(x)
        torch.testing.assert_close(got, model(x))
    assert seen == [max(rows, least) for rows in range(1, 5)]


def test_a_padded_program_with_an_output_of_a_size_derived_from_the_batch_is_refused_at_load(tmp_path):
    # It loaded before, the output uncut (4 rows for a one-row batch padded to 2), and every batch failed.
    d, _ = write_exported(tmp_path, torch.export.Dim.AUTO, module=Returning("twice").eval(), rows=5)
    with pytest.raises(ConfigError) as info:
        load_servable(d)
    assert str(info.value) == (
        f"{d / 'config.toml'}: model_file 'model.pt2': output 'OUTPUT0' of its torch.export program has a dim 0 of "
        "2 × the batch's rows, where wok takes one row per sample: a batch of fewer than 2 rows, padded to 2, cannot "
        "be cut back to its own rows in it; return one row per sample as dim 0 of each output"
    )


@pytest.mark.parametrize("batch", [torch.export.Dim.AUTO, None], ids=["auto", "from-1"])
def test_an_output_wok_does_not_take_is_not_read(tmp_path, batch):
    # A dict's key that is none of the config's outputs is dropped: its size is no reason to refuse. From 1 row,
    # not padded, its outputs are not read either.
    d, model = write_exported(tmp_path, batch, module=Returning("dict-twice").eval(), rows=5)
    s = load_servable(d)
    x = torch.randn(1, 4)
    torch.testing.assert_close(run(s, x), model.linear(x).detach())


def padded_to_more_than(rows: int) -> str:
    return (
        f"none is in its range, and wok pads a batch to max_batch_size rows at most; set max_batch_size = {rows} "
        f"(a batch of fewer rows is then padded to {rows}), or export it with a batch Dim from 1, "
        'torch.export.Dim("batch", min=1, max={mbs})'
    )


@pytest.mark.parametrize(
    ("example_rows", "batch", "mbs", "said"),
    [
        # No batch wok sends is in range: padding to 3 would make batches of more than max_batch_size rows.
        (5, torch.export.Dim("batch", min=3), 2, f"3 rows or more, {{but}}: {padded_to_more_than(3)}"),
        (5, torch.export.Dim.AUTO, 1, f"2 rows or more, {{but}}: {padded_to_more_than(2)}"),
        # The load warned and kept the checks; a batch of 5 to 8 rows failed (rerun in parts), a request so big too.
        (
            3,
            torch.export.Dim("batch", min=1, max=4),
            8,
            "1 to 4 rows, {but}: a batch of more than 4 rows fails its guards; set max_batch_size = 4, or export "
            'it with a batch Dim up to 8, torch.export.Dim("batch", min=1, max=8)',
        ),
        (
            3,
            torch.export.Dim("batch", min=2, max=4),
            8,
            "2 to 4 rows, {but}: a batch of more than 4 rows fails its guards; set max_batch_size = 4, or export "
            'it with a batch Dim up to 8, torch.export.Dim("batch", min=1, max=8)',
        ),
        (
            3,
            None,
            8,
            "exactly 3 row(s), exported with no batch Dim, {but}: a batch of any other size fails its guards; "
            "set max_batch_size = 3 (a batch of fewer rows is then padded to 3), or export it with a batch Dim from "
            '1, torch.export.Dim("batch", min=1, max=8)',
        ),
        (
            1,
            None,
            8,
            "exactly 1 row(s), exported with no batch Dim, {but}: a batch of any other size fails its guards; set "
            'max_batch_size = 1, or export it with a batch Dim from 1, torch.export.Dim("batch", min=1, max=8)',
        ),
        # torch checks 2 <= rows <= 16 only: a batch of 3 rows ran.
        (
            4,
            2 * torch.export.Dim("half", min=1, max=8),
            8,
            "2 × Dim rows, a size derived from a Dim, {but}: torch checks only such a size's bounds, and a batch "
            'of another would run unchecked; export it with a batch Dim from 1, torch.export.Dim("batch", min=1, '
            "max=8)",
        ),
    ],
    ids=[
        "min-3-above-max_batch_size",
        "auto-above-max_batch_size",
        "max-below-max_batch_size",
        "min-2-max-below-max_batch_size",
        "no-batch-dim",
        "no-batch-dim-of-1",
        "derived",
    ],
)
def test_a_torch_export_program_that_leaves_out_a_batch_size_the_config_allows_is_refused_at_load(
    tmp_path, example_rows, batch, mbs, said
):
    d, _ = write_exported(tmp_path, batch, rows=example_rows, static=batch is None, mbs=mbs)
    but = f"but model 'exported' has max_batch_size {mbs}, so wok sends it batches of 1 to {mbs} rows"
    with pytest.raises(ConfigError) as info:
        load_servable(d)
    assert str(info.value) == (
        f"{d / 'config.toml'}: model_file 'model.pt2': input 'INPUT0' of its torch.export program takes batches "
        f"(its dim 0) of " + said.format(but=but, mbs=mbs)
    )


class Not2(nn.Module):
    """x, doubled but for a batch of 2 rows: exported from more, its guards refuse 2 rows."""

    def forward(self, x):
        return x if x.shape[0] == 2 else x * 2


class Even(nn.Module):
    """x, doubled for a batch of even rows: exported from such a batch, its guards refuse an odd one."""

    def forward(self, x):
        return x * 2 if x.shape[0] % 2 == 0 else x


@pytest.mark.parametrize(
    ("exported", "said"),
    [
        # Dims the program was not exported for (5 features, not 4).
        (
            {"batch": torch.export.Dim("batch", min=1, max=8), "in_dims": "[5]"},
            "1 row(s) (INPUT0 [1, 5]), the fewest wok sends it: AssertionError: Guard failed: input.size()[1] == 4; "
            "every batch of 1 row(s) or fewer",
        ),
        # A guard on the batch's size that its range (from 2, Dim.AUTO) does not say: a one-row batch, padded to 2.
        (
            {"batch": torch.export.Dim.AUTO, "module": Not2(), "rows": 5, "out_dims": "[4]"},
            "2 row(s) (INPUT0 [2, 4]), what wok pads a batch of fewer rows to: AssertionError: Guard failed: "
            "x.size()[0] != 2; every batch of 2 row(s) or fewer",
        ),
    ],
    ids=["dims", "padded-to-a-refused-size"],
)
def test_a_torch_export_program_that_refuses_the_fewest_rows_wok_sends_is_refused_at_load(tmp_path, exported, said):
    # The load warned and kept the checks before, and the start-up's warm-up (one row) failed on it.
    d, _ = write_exported(tmp_path, **exported)
    with pytest.raises(ConfigError) as info:
        load_servable(d)
    assert str(info.value) == (
        f"{d / 'config.toml'}: model_file 'model.pt2': its torch.export program refuses a batch of {said}, and the "
        "start-up's warm-up, would fail: give the config the dims the program was exported for, or export it for "
        "the config's, every batch size from 1 to max_batch_size"
    )


def test_a_torch_export_program_that_refuses_a_batch_size_above_its_fewest_keeps_its_checks(tmp_path, caplog):
    # Its guards pass 2 rows (and a one-row batch padded to 2, the warm-up's), and refuse 3: such batches fail.
    d, _ = write_exported(tmp_path, torch.export.Dim.AUTO, module=Even(), rows=6, out_dims="[4]")
    caplog.set_level(logging.WARNING, logger="wok")
    s = load_servable(d)
    assert [r.getMessage() for r in caplog.records if r.name == "wok"] == [
        "model 'exported': its torch.export program refuses a batch of 3 row(s) (INPUT0 [3, 4]), which its config "
        "lets through: AssertionError: Guard failed: x.size()[0] % 2 == 0; such batches will fail, and its checks "
        "stay on every batch: export it so that every batch of 1 to 8 rows passes them (no condition on the "
        "batch's size), or set max_batch_size = 2"
    ]
    for rows in (1, 2, 4):
        x = torch.randn(rows, 4)
        torch.testing.assert_close(run(s, x), x * 2)
    with pytest.raises(AssertionError, match=r"^Guard failed: x.size\(\)\[0\] % 2 == 0$"):
        run(s, torch.randn(3, 4))


def test_a_torch_export_model_with_a_variable_dim_keeps_its_checks(tmp_path):
    # wok lets any size through a -1 dim: only the program's own check refuses the sizes it cannot take.
    d, _ = write_exported(tmp_path, in_dims="[-1]")
    s = load_servable(d)
    with pytest.raises(AssertionError, match=r"^Guard failed: input.size\(\)\[1\] == 4$"):
        run(s, torch.randn(2, 5))


class Cols1(nn.Module):
    """Each row doubled where it holds one column, else summed: exported from more columns, the program sums."""

    def forward(self, x):
        return x * 2 if x.shape[1] == 1 else x.sum(1, keepdim=True)


def fix_dim_1(size: int, wide: str = "") -> str:
    fix = f"export it with no Dim on that dim, from an example whose dim 1 is {size} (the config fixes it)"
    if not wide:
        return fix + ": a Dim of min=1 would let 1 through, traced from 2 all the same"
    return fix + f', or with a Dim that takes {size}, torch.export.Dim("dim1", {wide})'


@pytest.mark.parametrize(
    ("cols_dim", "size", "said"),
    [
        # Loaded before, and answered a one-column row summed (the program's path for 2 or more), not doubled.
        (
            torch.export.Dim.AUTO,
            1,
            "2 or more, but model 'exported' fixes it at 1 (shape [-1, 1], batch first): torch's guards let a dim of "
            "1 through (they check no least of 2), and it would run outside what was traced, the tracer having taken "
            f"the dim to be 2 or more (a branch on that size takes the other path); {fix_dim_1(1)}",
        ),
        (
            torch.export.Dim("cols", min=2, max=8),
            1,
            "2 to 8, but model 'exported' fixes it at 1 (shape [-1, 1], batch first): torch's guards let a dim of "
            "1 through (they check no least of 2), and it would run outside what was traced, the tracer having taken "
            f"the dim to be 2 or more (a branch on that size takes the other path); {fix_dim_1(1)}",
        ),
        # Refused before by its guards, run at load, in words that named no range, no dim and no Dim.
        (
            torch.export.Dim("cols", min=3),
            2,
            "3 or more, but model 'exported' fixes it at 2 (shape [-1, 2], batch first): every batch would fail its "
            f"guards; {fix_dim_1(2, 'min=2')}",
        ),
        (
            torch.export.Dim("cols", min=1, max=8),
            16,
            "1 to 8, but model 'exported' fixes it at 16 (shape [-1, 16], batch first): every batch would fail its "
            f"guards; {fix_dim_1(16, 'min=1, max=16')}",
        ),
    ],
    ids=["auto", "min-2", "min-3", "max-8"],
)
def test_a_torch_export_program_whose_range_leaves_out_a_fixed_dim_of_the_config_is_refused_at_load(
    tmp_path, cols_dim, size, said
):
    d, _ = write_exported(tmp_path, module=Cols1(), cols=5, cols_dim=cols_dim, in_dims=f"[{size}]", out_dims="[1]")
    with pytest.raises(ConfigError) as info:
        load_servable(d)
    assert str(info.value) == (
        f"{d / 'config.toml'}: model_file 'model.pt2': input 'INPUT0' of its torch.export program takes a dim 1 of "
        + said
    )


class Sum2(nn.Module):
    """Sums dim 2 of its input, which has 3 dims: (batch, 2, 4) -> (batch, 2)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum(2)


@pytest.mark.parametrize(
    ("in_dims", "ranks", "own"),
    [
        # Triton's way, the batch in dims: it loaded, and its warm-up ran a batch of [1, 4, 4] (Linear takes any
        # rank), failing the start on the output's shape; with out_dims [-1, 3] it served 3-d requests.
        ("[-1, 4]", "3 dims (shape [-1, -1, 4]", "[4]"),
        # Refused by its guards, run at load, in words that said nothing of the batch: "Guard failed: ...[1] == 4".
        ("[8, 4]", "3 dims (shape [-1, 8, 4]", "[4]"),
        ("[4]", "2 dims (shape [-1, 4]", "[2, 4]"),
    ],
    ids=["triton-variable", "triton-fixed", "too-few"],
)
def test_dims_that_do_not_make_a_torch_export_programs_rank_are_refused_at_load_saying_dims_exclude_the_batch(
    tmp_path, in_dims, ranks, own
):
    if own == "[2, 4]":
        module = Sum2()
        ep = torch.export.export(module, (torch.randn(3, 2, 4),), dynamic_shapes=({0: torch.export.Dim("batch")},))
        d = model_dir(tmp_path, "exported", "torch_export", extra='model_file = "model.pt2"', in_dims=in_dims)
        torch.export.save(ep, str(d / "model.pt2"))
        program = 3
    else:
        d, _ = write_exported(tmp_path, in_dims=in_dims)
        program = 2
    said = (
        f"{d / 'config.toml'}: model_file 'model.pt2': input 'INPUT0' of its torch.export program takes tensors of "
        f"{program} dims, batch first, but model 'exported' declares dims {in_dims}, which wok sends as {ranks}, "
        "batch first): dims exclude the batch dim, as Triton's do where max_batch_size > 0; write "
        f"dims = {own}, the program's after its batch dim"
    )
    with pytest.raises(ConfigError) as info:
        load_servable(d)
    assert str(info.value) == said


# A dim of 1 exported with no Dim, from an example of 1 (as the refusal above says to): traced at 1, it doubles.
@pytest.mark.parametrize(("cols", "cols_dim"), [(3, torch.export.Dim.AUTO), (1, None)], ids=["auto", "one"])
def test_a_torch_export_program_whose_range_holds_a_fixed_dim_of_the_config_runs_it_unchecked(tmp_path, cols, cols_dim):
    d, _ = write_exported(
        tmp_path, module=Cols1(), cols=5 if cols_dim else cols, cols_dim=cols_dim, in_dims=f"[{cols}]", out_dims="[1]"
    )
    s = load_servable(d)
    x = torch.randn(2, cols)
    torch.testing.assert_close(run(s, x), Cols1()(x))
    assert program_module(s).validate_inputs is False
    assert s.dim_ranges == {}


async def refusal_after_answers(serve, repo: Path, sizes: tuple[int, ...], refused: int) -> str:
    """The details of the INVALID_ARGUMENT that `repo`'s model 'exported' (Cols1) answers to a request of 3 rows of
    `refused` columns, once it has answered one of each of `sizes` columns as Cols1 does."""
    async with serve(repository=repo) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            for cols in sizes:
                x = np.arange(3 * cols, dtype=np.float32).reshape(3, cols)
                resp = await stub.ModelInfer(encode_request("exported", {"INPUT0": x}), timeout=30)
                np.testing.assert_allclose(decode_response(resp)["OUTPUT0"], Cols1()(torch.from_numpy(x)).numpy())
            x = np.ones((3, refused), np.float32)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.ModelInfer(encode_request("exported", {"INPUT0": x}), timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    return info.value.details()


def refusal(said: str, refused: int) -> str:
    return (
        f"input 'INPUT0': expected dim 1 of {said} (the sizes model 'exported' was exported for); got {refused} in "
        f"shape [3, {refused}]"
    )


@pytest.mark.parametrize(
    ("cols_dim", "sizes", "refused", "said"),
    [
        # Answered before, summed (the program's path for 2 or more columns), not doubled.
        (torch.export.Dim.AUTO, (2, 5), 1, "2 or more"),
        # Failed before as the batch ran (torch's guards), INTERNAL, after it was queued.
        (torch.export.Dim("cols", min=3, max=8), (3, 8), 9, "3 to 8"),
        (torch.export.Dim("cols", min=3, max=8), (3, 8), 2, "3 to 8"),
        (None, (5,), 4, "exactly 5"),  # exported with no Dim there, the config's -1 notwithstanding
        # Its range says 1 column, but torch traced it as 2 or more all the same (a branch on 1 took the other
        # path): none is sent here. An empty dim passed its guards before.
        (torch.export.Dim("cols", min=1), (2, 3), 0, "1 or more"),
    ],
    ids=["auto", "above-max", "below-min-3", "no-dim", "min-1-empty"],
)
async def test_a_variable_dim_outside_a_torch_export_programs_range_is_refused_naming_it(
    tmp_path, serve, cols_dim, sizes, refused, said, caplog
):
    caplog.set_level(logging.WARNING, logger="wok")
    repo = tmp_path / "repo"
    # No warmup_dims: the warm-up runs on the range's least (it ran on 1 column, failing the guards of min=3).
    write_exported(repo, module=Cols1(), cols=5, cols_dim=cols_dim, in_dims="[-1]", out_dims="[1]")
    assert await refusal_after_answers(serve, repo, sizes, refused) == refusal(said, refused)
    # Said once at load where the range starts above 1 (requests of one column refused); not for min=1.
    warned = [r.getMessage() for r in caplog.records if "is refused (INVALID_ARGUMENT)" in r.getMessage()]
    least = 1 if said == "1 or more" else sizes[0]
    assert warned == (
        []
        if least == 1
        else [
            f"model 'exported': input 'INPUT0' of its torch.export program takes a dim 1 of {said}: a request whose "
            "dim 1 is outside it is refused (INVALID_ARGUMENT), being outside what was traced"
            + (
                "; a Dim of min=1 takes 1 (traced from 2 all the same: right unless the model branches on that size)"
                if least == 2
                else ""
            )
        ]
    )


def warmed_shapes(servable: Servable) -> list[tuple[int, ...]]:
    """The input shapes the program's own module is called with in `servable`'s start-up warm-up."""
    seen: list[tuple[int, ...]] = []
    program_module(servable).register_forward_pre_hook(lambda _module, args: seen.append(tuple(args[0].shape)))
    ex = Executor(servable, servable.config.instances)
    try:
        ex.warmup()
    finally:
        ex.shutdown()
    return seen


@pytest.mark.parametrize(
    ("cols_dim", "cols", "warmup_dims", "warmed"),
    [
        # Warmed on 1 column before: outside what was traced (from 2), unrefused, and a size no request may send.
        (torch.export.Dim.AUTO, 5, "", 2),
        (torch.export.Dim.DYNAMIC, 5, "", 2),
        # Failed the start before: the guards refuse 1 column (warmup_dims had to say 3).
        (torch.export.Dim("cols", min=3), 5, "", 3),
        # 1 before, no size of 2 × Dim or 3 × Dim + 1, which the guards let through (they check its bounds).
        (2 * torch.export.Dim("half", min=1, max=8), 6, "", 2),
        (2 * torch.export.Dim("half"), 6, "", 2),  # an even size of 0 or more: the least from 1
        (3 * torch.export.Dim("third", min=2, max=8) + 1, 7, "", 7),
        # Its range takes 1, and warmup_dims are the config's own.
        (torch.export.Dim("cols", min=1), 5, "", 1),
        (torch.export.Dim.AUTO, 5, "[4]", 4),
    ],
    ids=["auto", "dynamic", "min-3", "2-dim", "2-dim-from-0", "3-dim-plus-1", "min-1", "warmup_dims"],
)
def test_the_warm_up_runs_a_torch_export_program_on_the_least_size_of_its_range_for_a_variable_dim(
    tmp_path, cols_dim, cols, warmup_dims, warmed
):
    d, _ = write_exported(
        tmp_path, module=Cols1(), cols=cols, cols_dim=cols_dim, in_dims="[-1]", out_dims="[1]", warmup_dims=warmup_dims
    )
    assert warmed_shapes(load_servable(d)) == [(1, warmed)]


@pytest.mark.parametrize(("most", "held"), [(8, ((1, 5, 17, 2),)), (None, ((1, 5, None, 2),))], ids=["max-8", "no-max"])
def test_a_derived_dim_whose_own_range_the_program_does_not_keep_is_held_to_its_symbols(tmp_path, most, held):
    # torch 2.13 keeps 2*s + 1's range beside s's, so the program is saved with it deleted, as a torch that keeps
    # only its symbols' would: it was held to odd sizes from 1 (0 and None, with no range read) and warmed on 1,
    # outside what was traced (from 2 × 2 + 1).
    half = torch.export.Dim("half", min=2) if most is None else torch.export.Dim("half", min=2, max=most)
    dims = {0: torch.export.Dim("batch", min=1, max=64), 1: 2 * half + 1}
    ep = torch.export.export(Cols1(), (torch.randn(3, 7),), dynamic_shapes=(dims,))
    for expr in [e for e in ep.range_constraints if not e.is_Symbol]:
        del ep.range_constraints[expr]
    assert all(e.is_Symbol for e in ep.range_constraints)
    d = model_dir(
        tmp_path, "exported", "torch_export", extra='model_file = "model.pt2"', in_dims="[-1]", out_dims="[1]"
    )
    torch.export.save(ep, str(d / "model.pt2"))
    s = load_servable(d)
    assert s.dim_ranges == {"INPUT0": held}
    assert warmed_shapes(s) == [(1, 5)]


@pytest.mark.parametrize(
    ("cols_dim", "cols", "warmup", "said"),
    [
        # Loaded before, and warmed on 1 column, outside what was traced; a request of 1 column is refused.
        (torch.export.Dim.AUTO, 5, 1, "2 or more"),
        # Loaded before, and warmed on 3 columns, no size of 2 × Dim (its guards check only its bounds).
        (2 * torch.export.Dim("half", min=1, max=8), 6, 3, "an even size of 2 to 16"),
    ],
    ids=["auto", "2-dim"],
)
def test_warmup_dims_outside_a_torch_export_programs_range_are_refused_at_load(tmp_path, cols_dim, cols, warmup, said):
    d, _ = write_exported(
        tmp_path,
        module=Cols1(),
        cols=cols,
        cols_dim=cols_dim,
        in_dims="[-1]",
        out_dims="[1]",
        warmup_dims=f"[{warmup}]",
    )
    with pytest.raises(ConfigError) as info:
        load_servable(d)
    assert str(info.value) == (
        f"{d / 'config.toml'}: model_file 'model.pt2': input 'INPUT0' of its torch.export program takes a dim 1 of "
        f"{said}, but its warmup_dims [{warmup}] run the start-up's warm-up on {warmup} there, outside what was "
        "traced (a request of that size is refused): set warmup_dims to sizes in its range, or leave them out (the "
        "warm-up then takes the least)"
    )


@pytest.mark.parametrize(
    ("cols_dim", "cols", "sizes", "refused", "said"),
    [
        (2 * torch.export.Dim("half", min=1, max=8), 6, (2, 16), 5, "an even size of 2 to 16"),
        (2 * torch.export.Dim("half", min=1, max=8) + 1, 7, (3, 17), 4, "an odd size of 3 to 17"),
        (3 * torch.export.Dim("third", min=2, max=8) + 1, 7, (7, 25), 9, "a size of 7 to 25 in steps of 3"),
    ],
    ids=["2-dim", "2-dim-plus-1", "3-dim-plus-1"],
)
async def test_a_variable_dim_between_the_sizes_of_a_derived_dim_is_refused_naming_them(
    tmp_path, serve, caplog, cols_dim, cols, sizes, refused, said
):
    # Answered before: torch's guards check only such a size's bounds, and the program ran on a size it was not
    # traced for (5 columns of 2 × Dim).
    caplog.set_level(logging.WARNING, logger="wok")
    repo = tmp_path / "repo"
    write_exported(repo, module=Cols1(), cols=cols, cols_dim=cols_dim, in_dims="[-1]", out_dims="[1]")
    assert await refusal_after_answers(serve, repo, sizes, refused) == refusal(said, refused)
    assert [r.getMessage() for r in caplog.records if "is refused (INVALID_ARGUMENT)" in r.getMessage()] == [
        f"model 'exported': input 'INPUT0' of its torch.export program takes a dim 1 of {said}: a request whose dim 1 "
        "is outside it is refused (INVALID_ARGUMENT), being outside what was traced"
    ]


def test_a_fixed_dim_between_the_sizes_of_a_derived_dim_is_refused_at_load_and_one_of_them_runs_unchecked(tmp_path):
    # Loaded before, and ran unchecked: the guards, run at load, check only the bounds of 2 × Dim.
    half = torch.export.Dim("half", min=1, max=8)
    d, _ = write_exported(tmp_path / "odd", module=Cols1(), cols=6, cols_dim=2 * half, in_dims="[5]", out_dims="[1]")
    with pytest.raises(ConfigError) as info:
        load_servable(d)
    assert str(info.value) == (
        f"{d / 'config.toml'}: model_file 'model.pt2': input 'INPUT0' of its torch.export program takes a dim 1 of "
        "an even size of 2 to 16, but model 'exported' fixes it at 5 (shape [-1, 5], batch first): torch's guards "
        "let it through (they check only the bounds of a size derived from a Dim, 2 × Dim), and it would run as no "
        f"size the program was traced for; {fix_dim_1(5, 'min=2, max=16')}"
    )
    d, _ = write_exported(tmp_path / "even", module=Cols1(), cols=6, cols_dim=2 * half, in_dims="[4]", out_dims="[1]")
    s = load_servable(d)
    x = torch.randn(2, 4)
    torch.testing.assert_close(run(s, x), Cols1()(x))
    assert program_module(s).validate_inputs is False
    assert s.dim_ranges == {}


class FirstTimesSecond(nn.Module):
    """x, times the mean of y: y's batch is traced apart from x's, its Dim's range its own."""

    def forward(self, x, y):
        return x * y.mean()


@pytest.mark.parametrize(
    ("mins", "said"),
    [
        # Both said to take 3 rows or more before, the range of the one that pads most.
        (
            (2, 3),
            "input 'INPUT0' of its torch.export program takes batches of 2 rows or more, input 'INPUT1' batches of 3 "
            "rows or more: batches of fewer than 3 rows are padded to 3",
        ),
        (
            (3, 3),
            "inputs 'INPUT0', 'INPUT1' of its torch.export program take batches of 3 rows or more: batches of fewer "
            "than 3 rows are padded to 3",
        ),
    ],
    ids=["each-its-own", "one-range"],
)
def test_each_padded_input_of_a_torch_export_program_is_said_with_its_own_range(tmp_path, caplog, mins, said):
    batch = [{0: torch.export.Dim(f"batch{i}", min=m, max=64)} for i, m in enumerate(mins)]
    ep = torch.export.export(FirstTimesSecond(), (torch.randn(5, 4), torch.randn(5, 4)), dynamic_shapes=tuple(batch))
    d = model_dir(tmp_path, "two", "torch_export", extra='model_file = "model.pt2"', out_dims="[4]")
    torch.export.save(ep, str(d / "model.pt2"))
    with (d / "config.toml").open("a") as config:  # a second [[inputs]] table, after the others
        config.write('[[inputs]]\nname = "INPUT1"\ndatatype = "FP32"\ndims = [4]\n')
    caplog.set_level(logging.INFO, logger="wok")
    s = load_servable(d)
    assert [r.getMessage() for r in caplog.records if r.name == "wok"] == [
        f"model 'two': {said}, copies of their first row, the copies' answers dropped"
    ]
    x, y = torch.randn(1, 4), torch.randn(1, 4)
    with torch.inference_mode():
        torch.testing.assert_close(s.module_for(CPU)(x, y), x * torch.cat((y, y, y)).mean())


async def test_a_wrong_shaped_input_to_a_torch_export_model_is_refused_naming_it(tmp_path, serve):
    # Without torch's per-call checks, wok's own check of the request is what refuses a shape the program
    # cannot take: INVALID_ARGUMENT, before the request is queued, naming the input.
    repo = tmp_path / "repo"
    write_exported(repo)
    async with serve(repository=repo) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            for shape, said in (
                ((2, 5), "input 'INPUT0': expected shape [-1, 4] (batch first, -1 = any); got [2, 5]"),
                ((9, 4), "input 'INPUT0': expected at most 8 rows (max_batch_size of model 'exported'); got 9"),
            ):
                x = np.zeros(shape, np.float32)
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.ModelInfer(encode_request("exported", {"INPUT0": x}), timeout=30)
                assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert info.value.details() == said


def test_a_torchscript_file_given_as_torch_export_is_named_in_one_line(tmp_path):
    d = model_dir(tmp_path, "exported", "torch_export", extra='model_file = "model.pt"')
    torch.jit.trace(reference_linear(), torch.zeros(1, 4)).save(str(d / "model.pt"))
    with pytest.raises(ConfigError) as info:
        load_servable(d)
    assert str(info.value) == (
        f"{d / 'config.toml'}: model_file 'model.pt': cannot load torch_export file {d / 'model.pt'}: it is a "
        "TorchScript file, "
        'not a torch.export program; set platform = "torchscript"'
    )


def test_a_torch_export_file_given_as_torchscript_is_named_in_one_line(tmp_path):
    d = model_dir(tmp_path, "ts", "torchscript", extra='model_file = "model.pt2"')
    torch.export.save(torch.export.export(reference_linear(), (torch.zeros(2, 4),)), str(d / "model.pt2"))
    with pytest.raises(ConfigError) as info:
        load_servable(d)
    assert str(info.value) == (
        f"{d / 'config.toml'}: model_file 'model.pt2': cannot load torchscript file {d / 'model.pt2'}: it is a "
        "torch.export program, "
        'not a TorchScript file; set platform = "torch_export"'
    )


@pytest.mark.parametrize("platform", ["torchscript", "torch_export"])
@pytest.mark.parametrize("saved", ["module", "state_dict"])
def test_a_torch_save_file_is_named_with_how_to_save_the_platforms_file(tmp_path, platform, saved):
    """torch.save(model), the usual way to keep a trained model, given as a model file: torch.jit.load called
    it a corrupted checkpoint ("failed locating file constants.pkl ... your checkpoint file is corrupted"),
    torch_export said only that it held no archive_format record."""
    d = model_dir(tmp_path, "saved", platform, extra='model_file = "model.pt"')
    module = reference_linear()
    torch.save(module if saved == "module" else module.state_dict(), d / "model.pt")
    with pytest.raises(ConfigError) as info:
        load_servable(d)
    what, how = {
        "torchscript": (
            "TorchScript file",
            "torch.jit.script(model).save(path) or torch.jit.trace(model, example_inputs).save(path)",
        ),
        "torch_export": ("torch.export program", "torch.export.save(torch.export.export(model, example_inputs), path)"),
    }[platform]
    assert str(info.value) == (
        f"{d / 'config.toml'}: model_file 'model.pt': cannot load {platform} file {d / 'model.pt'}: it is a "
        f"torch.save file (a pickled module or state dict), not a {what}: save the model with {how}, or serve its "
        'nn.Module with platform = "python", a factory and weights = its state dict'
    )


@pytest.mark.parametrize(
    ("zipped", "reason"),
    [(False, "it is not a zip archive"), (True, "it holds no archive_format record")],
)
def test_a_file_that_is_no_torch_export_archive_is_named_in_one_line(tmp_path, zipped, reason):
    d = model_dir(tmp_path, "exported", "torch_export", extra='model_file = "model.pt2"')
    if zipped:
        with zipfile.ZipFile(d / "model.pt2", "w") as z:
            z.writestr("model/other", "x")
    else:
        (d / "model.pt2").write_bytes(b"not a zip")
    with pytest.raises(ConfigError) as info:
        load_servable(d)
    assert str(info.value).startswith(
        f"{d / 'config.toml'}: model_file 'model.pt2': cannot load torch_export file {d / 'model.pt2'}: {reason}"
    )
    assert "warnings above" not in str(info.value)


def test_torch_export_model_file_missing(tmp_path):
    d = model_dir(tmp_path, "exported", "torch_export", extra='model_file = "model.pt2"')
    with pytest.raises(ConfigError) as info:
        load_servable(d)
    assert str(info.value) == f"{d / 'config.toml'}: model_file 'model.pt2': {d / 'model.pt2'} does not exist"


# -- python factories ------------------------------------------------------------------
SCALE_FACTORY = textwrap.dedent(
    """
    import torch
    from torch import nn


    class Scale(nn.Module):
        def __init__(self, factor, offset, negate):
            super().__init__()
            self.factor, self.offset, self.negate = factor, offset, negate

        def forward(self, x):
            y = x * self.factor + self.offset
            return -y if self.negate else y


    def build(factor: float, offset: int = 0, negate: bool = False, label: str = "") -> nn.Module:
        assert label == "scaled", label
        return Scale(factor, offset, negate)
    """
)


def test_python_factory_gets_parameters(tmp_path):
    d = model_dir(
        tmp_path,
        "scaled",
        "python",
        extra='factory = "model:build"\nparameters = { factor = 2.5, offset = 1, negate = true, label = "scaled" }',
        out_dims="[4]",
    )
    (d / "model.py").write_text(SCALE_FACTORY)
    s = load_servable(d)
    x = torch.arange(8, dtype=torch.float32).reshape(2, 4)
    torch.testing.assert_close(run(s, x), -(x * 2.5 + 1))


def test_two_models_with_their_own_model_py(tmp_path):
    # Same module name, different code: each model must get its own file.
    for name, body in (("plus", "x + 1"), ("times", "x * 10")):
        d = model_dir(tmp_path, name, "python", extra='factory = "model:build"', out_dims="[4]")
        (d / "model.py").write_text(
            textwrap.dedent(
                f"""
                from torch import nn


                class M(nn.Module):
                    def forward(self, x):
                        return {body}


                def build():
                    return M()
                """
            )
        )
    repo = ModelRepository.from_directory(tmp_path)
    assert sorted(repo.models) == ["plus", "times"]
    x = torch.ones(2, 4)
    torch.testing.assert_close(run(repo.get("plus"), x), x + 1)
    torch.testing.assert_close(run(repo.get("times"), x), x * 10)


def test_model_folder_module_preferred_over_installed_one(tmp_path):
    # `json` is importable from the standard library; the folder's json.py must win.
    d = model_dir(tmp_path, "shadow", "python", extra='factory = "json:build"', out_dims="[4]")
    (d / "json.py").write_text("from torch import nn\n\ndef build():\n    return nn.Identity()\n")
    s = load_servable(d)
    x = torch.randn(3, 4)
    torch.testing.assert_close(run(s, x), x)


def test_installed_factory_module(tmp_path):
    # No model.py in the folder: the factory is imported as an ordinary module.
    d = model_dir(tmp_path, "flat", "python", extra='factory = "torch.nn:Identity"', out_dims="[4]")
    s = load_servable(d)
    x = torch.randn(2, 4)
    torch.testing.assert_close(run(s, x), x)


def test_factory_module_not_importable(tmp_path):
    d = model_dir(tmp_path, "m", "python", extra='factory = "wok_no_such_module_xyz:build"')
    with pytest.raises(ConfigError) as info:
        load_servable(d)
    # Both places looked in are named: the file in the model's folder and the installed modules.
    assert str(info.value) == (
        f"{d / 'config.toml'}: factory 'wok_no_such_module_xyz:build': no file {d / 'wok_no_such_module_xyz.py'}, "
        "and no installed module 'wok_no_such_module_xyz'"
    )


def test_no_model_py_in_the_folder_names_the_file_looked_for(tmp_path):
    d = model_dir(tmp_path, "m", "python", extra='factory = "model:build"')
    with pytest.raises(ConfigError) as info:
        load_servable(d)
    assert str(info.value) == (
        f"{d / 'config.toml'}: factory 'model:build': no file {d / 'model.py'}, and no installed module 'model'"
    )


def test_an_installed_module_missing_a_dependency_names_the_dependency(tmp_path, monkeypatch):
    # The factory's module is there; what is missing is a module it imports.
    pkg = tmp_path / "site"
    pkg.mkdir()
    (pkg / "wok_test_needs_dep.py").write_text("import wok_no_such_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(pkg))
    d = model_dir(tmp_path / "repo", "m", "python", extra='factory = "wok_test_needs_dep:build"')
    with pytest.raises(ConfigError) as info:
        load_servable(d)
    assert str(info.value) == (
        f"{d / 'config.toml'}: factory 'wok_test_needs_dep:build': cannot import installed module "
        "'wok_test_needs_dep': No module named 'wok_no_such_dependency_xyz'"
    )


def test_factory_attribute_missing(tmp_path):
    d = model_dir(tmp_path, "m", "python", extra='factory = "model:make"')
    (d / "model.py").write_text(LINEAR_FACTORY)
    with pytest.raises(ConfigError) as info:
        load_servable(d)
    assert str(info.value) == f"{d / 'config.toml'}: factory 'model:make': {d / 'model.py'} has no attribute 'make'"


def test_installed_factory_attribute_missing(tmp_path):
    d = model_dir(tmp_path, "m", "python", extra='factory = "torch.nn:NoSuchLayer"')
    with pytest.raises(ConfigError) as info:
        load_servable(d)
    assert str(info.value) == (
        f"{d / 'config.toml'}: factory 'torch.nn:NoSuchLayer': installed module 'torch.nn' "
        f"({torch.nn.__file__}) has no attribute 'NoSuchLayer'"
    )


def test_factory_returning_non_module(tmp_path):
    d = model_dir(tmp_path, "m", "python", extra='factory = "model:build"')
    (d / "model.py").write_text("def build():\n    return {'not': 'a module'}\n")
    with pytest.raises(ConfigError) as info:
        load_servable(d)
    assert (
        str(info.value) == f"{d / 'config.toml'}: factory 'model:build': expected an nn.Module as its result; got dict"
    )


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (
            "import sys\ndef build():\n    sys.exit(3)\n",
            "{d}/config.toml: factory 'model:build' failed with parameters {}: it called sys.exit(3)",
        ),
        (
            # As model code that parses arguments at import would, meeting wok's own.
            "import sys\nsys.exit('usage: model.py [-h]')\n",
            "{d}/config.toml: factory 'model:build': cannot import '{d}/model.py': it called "
            "sys.exit('usage: model.py [-h]')",
        ),
    ],
)
def test_model_code_calling_sys_exit_fails_its_load_naming_the_model(tmp_path, source, message):
    # SystemExit went past the load: `wok serve` ended with the model's status (3) and not a word.
    d = model_dir(tmp_path, "m", "python", extra='factory = "model:build"')
    (d / "model.py").write_text(source)
    with pytest.raises(ConfigError) as info:
        load_servable(d)
    assert str(info.value) == message.replace("{d}", str(d))


@pytest.mark.parametrize("kind", ["input", "output"])
def test_a_bytes_tensor_is_refused_by_name_before_any_model_code_is_imported(tmp_path, kind):
    d = model_dir(tmp_path, "t", "python", extra='factory = "model:build"')
    config = d / "config.toml"
    tensor = "INPUT0" if kind == "input" else "OUTPUT0"
    text = config.read_text()
    at = text.index(f'name = "{tensor}"')
    config.write_text(text[:at] + text[at:].replace('datatype = "FP32"', 'datatype = "BYTES"', 1))
    (d / "model.py").write_text("raise RuntimeError('imported')\n")
    with pytest.raises(ConfigError) as info:
        load_servable(d)
    assert str(info.value) == (
        f"{d / 'config.toml'}: {kind}s.0.datatype: {kind} '{tensor}' is BYTES, which wok's models cannot take or "
        "return: they run on torch tensors, which hold no byte strings; send text as token ids (INT64) or raw bytes "
        "as UINT8"
    )


def test_factory_module_failing_at_import(tmp_path):
    d = model_dir(tmp_path, "m", "python", extra='factory = "model:build"')
    (d / "model.py").write_text("def build(:\n")
    with pytest.raises(ConfigError) as info:
        load_servable(d)
    msg = str(info.value)
    assert msg.startswith(f"{d / 'config.toml'}: factory 'model:build': cannot import {str(d / 'model.py')!r}: ")
    assert "SyntaxError" in msg


def test_a_factory_returning_a_servable_is_refused_not_served_in_place_of_the_config(tmp_path):
    # Its own config would have replaced this folder's: name, inputs, batching, weights, all of it.
    d = model_dir(tmp_path, "s", "python", extra='factory = "wok.models.mlp:build"\nweights = "absent.safetensors"')
    with pytest.raises(ConfigError) as info:
        load_servable(d)
    assert str(info.value) == (
        f"{d / 'config.toml'}: factory 'wok.models.mlp:build': expected an nn.Module as its result (a repository "
        "model is configured by its config file); got a Servable (model 'mlp' with its own config)"
    )


def test_an_installed_factory_module_failing_at_import_names_the_model(tmp_path, monkeypatch):
    pkg = tmp_path / "site"
    pkg.mkdir()
    (pkg / "wok_test_breaks_on_import.py").write_text("raise RuntimeError('no GPU driver')\n")
    monkeypatch.syspath_prepend(str(pkg))
    d = model_dir(tmp_path / "repo", "m", "python", extra='factory = "wok_test_breaks_on_import:build"')
    with pytest.raises(ConfigError) as info:
        load_servable(d)
    assert str(info.value) == (
        f"{d / 'config.toml'}: factory 'wok_test_breaks_on_import:build': cannot import installed module "
        "'wok_test_breaks_on_import': RuntimeError: no GPU driver"
    )


@pytest.mark.parametrize("field", ["model_file", "weights"])
@pytest.mark.parametrize("where", ["../outside.pt", "ABSOLUTE", "link.pt"])
def test_a_file_the_config_names_outside_the_model_folder_is_refused(tmp_path, field, where):
    outside = tmp_path / "outside.pt"
    torch.jit.script(reference_linear(1)).save(str(outside))
    if where == "ABSOLUTE":
        where = str(outside)
    platform, extra = ("torchscript", "") if field == "model_file" else ("python", 'factory = "model:build"\n')
    d = model_dir(tmp_path, "m", platform, extra=extra + f'{field} = "{where}"')
    (d / "model.py").write_text(LINEAR_FACTORY)
    if where == "link.pt":
        (d / "link.pt").symlink_to(outside)  # a link out of the folder is a way out too
    with pytest.raises(ConfigError) as info:
        load_servable(d)
    assert (
        str(info.value)
        == f"{d / 'config.toml'}: {field} {where!r} leaves the model's folder {d}; expected a path inside it"
    )


def test_a_config_that_is_not_utf8_is_a_config_error(tmp_path):
    d = model_dir(tmp_path, "m", "python", extra='factory = "model:build"')
    (d / "config.toml").write_bytes(b'platform = "caf\xe9"\n')
    with pytest.raises(ConfigError) as info:
        load_servable(d)
    assert str(info.value) == f"{d / 'config.toml'}: not UTF-8 text (byte 15: 0xe9)"


def test_factory_rejecting_parameters(tmp_path):
    # A misspelt parameter surfaces as the factory's TypeError; it must name the model.
    d = model_dir(tmp_path, "m", "python", extra='factory = "model:build"\nparameters = { out_featurs = 3 }')
    (d / "model.py").write_text(LINEAR_FACTORY)
    with pytest.raises(ConfigError) as info:
        load_servable(d)
    msg = str(info.value)
    assert msg.startswith(
        f"{d / 'config.toml'}: factory 'model:build' failed with parameters {{'out_featurs': 3}}: TypeError"
    )
    assert "out_featurs" in msg


# -- weights ---------------------------------------------------------------------------
def weighted_model(root: Path, weights: str, name: str = "w") -> Path:
    d = model_dir(root, name, "python", extra=f'factory = "model:build"\nweights = "{weights}"')
    (d / "model.py").write_text(LINEAR_FACTORY)
    return d


def test_safetensors_weights_are_used(tmp_path):
    ref = reference_linear(3)
    d = weighted_model(tmp_path, "w.safetensors")
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(d / "w.safetensors"))
    x = torch.randn(4, 4)
    torch.testing.assert_close(run(load_servable(d), x), ref(x).detach())


def test_torch_state_dict_weights_are_used(tmp_path):
    ref = reference_linear(4)
    d = weighted_model(tmp_path, "w.pt")
    torch.save(ref.state_dict(), d / "w.pt")
    x = torch.randn(4, 4)
    torch.testing.assert_close(run(load_servable(d), x), ref(x).detach())


def test_weights_on_a_torchscript_model(tmp_path):
    d, _ = write_torchscript(tmp_path)
    other = reference_linear(5)
    torch.save(other.state_dict(), d / "w.pt")
    (d / "config.toml").write_text(config_toml("torchscript", extra='model_file = "model.pt"\nweights = "w.pt"'))
    x = torch.randn(2, 4)
    torch.testing.assert_close(run(load_servable(d), x), other(x).detach())


class WritesMarker:
    """Unpickling this writes a file: proof that arbitrary unpickling took place."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "unpickled"))


def test_pickle_payload_is_live(tmp_path):
    # The control for the refusal test below: plain unpickling really runs the payload.
    marker = tmp_path / "control"
    pickle.loads(pickle.dumps(WritesMarker(marker)))
    assert marker.read_text() == "unpickled"


def test_arbitrary_pickle_refused(tmp_path):
    marker = tmp_path / "pwned"
    d = weighted_model(tmp_path, "w.pt")
    torch.save(WritesMarker(marker), d / "w.pt")
    assert not marker.exists()
    with pytest.raises(ConfigError) as info:
        load_servable(d)
    assert str(info.value).startswith(
        f"{d / 'config.toml'}: weights 'w.pt': {d / 'w.pt'} is not a weights-only state dict: "
    )
    assert not marker.exists()


def test_whole_module_pickle_refused(tmp_path):
    d = weighted_model(tmp_path, "w.pt")
    torch.save(reference_linear(), d / "w.pt")
    with pytest.raises(ConfigError) as info:
        load_servable(d)
    # One line, without torch's advice to load with weights_only=False.
    assert str(info.value) == (
        f"{d / 'config.toml'}: weights 'w.pt': {d / 'w.pt'} is not a weights-only state dict: it is a pickled object "
        "(torch.nn.modules.linear.Linear), not a state dict: save model.state_dict(), or use safetensors"
    )


def test_weights_that_do_not_fit(tmp_path):
    d = weighted_model(tmp_path, "w.safetensors")
    save_file({"weight": torch.zeros(5, 4), "bias": torch.zeros(5)}, str(d / "w.safetensors"))
    with pytest.raises(ConfigError) as info:
        load_servable(d)
    msg = str(info.value)
    assert msg.startswith(
        f"{d / 'config.toml'}: weights 'w.safetensors': {d / 'w.safetensors'} does not fit the module: "
    )
    assert "size mismatch for weight" in msg


def test_weights_with_missing_keys(tmp_path):
    d = weighted_model(tmp_path, "w.pt")
    torch.save({"weight": torch.zeros(3, 4)}, d / "w.pt")
    with pytest.raises(ConfigError, match=r"(?s)does not fit the module: .*Missing key\(s\).*\"bias\""):
        load_servable(d)


def test_weights_file_that_is_not_a_dict(tmp_path):
    d = weighted_model(tmp_path, "w.pt")
    torch.save(torch.zeros(3), d / "w.pt")
    with pytest.raises(ConfigError, match=r"config\.toml: weights 'w\.pt': .*w\.pt does not fit the module: .*dict"):
        load_servable(d)


def test_corrupt_safetensors(tmp_path):
    d = weighted_model(tmp_path, "w.safetensors")
    (d / "w.safetensors").write_bytes(b"garbage")
    with pytest.raises(ConfigError) as info:
        load_servable(d)
    assert str(info.value).startswith(
        f"{d / 'config.toml'}: weights 'w.safetensors': {d / 'w.safetensors'} is not a valid safetensors file: "
    )


def test_weights_file_missing(tmp_path):
    d = weighted_model(tmp_path, "absent.pt")
    with pytest.raises(ConfigError) as info:
        load_servable(d)
    assert str(info.value) == f"{d / 'config.toml'}: weights 'absent.pt': {d / 'absent.pt'} does not exist"


# -- the repository --------------------------------------------------------------------
def test_repository_path_is_a_file(tmp_path):
    f = tmp_path / "repo.txt"
    f.write_text("")
    with pytest.raises(ConfigError) as info:
        ModelRepository.from_directory(f)
    assert str(info.value) == f"model repository {f} is not a folder"


def test_repository_path_missing(tmp_path):
    """A folder that is not there read "is not a folder", as though a file stood in its place."""
    with pytest.raises(ConfigError) as info:
        ModelRepository.from_directory(tmp_path / "nowhere")
    assert str(info.value) == f"model repository {tmp_path / 'nowhere'} does not exist"


def test_empty_repository(tmp_path):
    # Folders without a config and stray files are not models.
    (tmp_path / "notes").mkdir()
    (tmp_path / "README.md").write_text("")
    with pytest.raises(ConfigError) as info:
        ModelRepository.from_directory(tmp_path)
    msg = str(info.value)
    assert msg.startswith(f"model repository {tmp_path} has no model folders")
    assert "config.toml" in msg


def test_a_model_folder_given_as_the_repository_is_named_so(tmp_path):
    d = model_dir(tmp_path, "m", "python", extra='factory = "torch.nn:Identity"', out_dims="[4]")
    with pytest.raises(ConfigError) as info:
        ModelRepository.from_directory(d)
    assert str(info.value) == (
        f"model repository {d} has no model folders, but a config file of its own: it is a model's folder; give "
        "the folder above it, the repository, which holds one folder per model"
    )


def test_each_model_is_named_in_the_log_before_it_loads(tmp_path, caplog):
    # A factory that hangs (a download, a lock) left the start silent, naming no model.
    for name in ("b", "a"):
        model_dir(tmp_path, name, "python", extra='factory = "model:build"', out_dims="[4]")
        (tmp_path / name / "model.py").write_text(
            "import logging\nimport torch\n\n\ndef build():\n"
            "    logging.getLogger('wok').info('built')\n    return torch.nn.Identity()\n"
        )
    with caplog.at_level("INFO", logger="wok"):
        ModelRepository.from_directory(tmp_path)
    assert [r.getMessage() for r in caplog.records] == [
        f"model repository {tmp_path}: loading a",
        "built",
        f"model repository {tmp_path}: loading b",
        "built",
    ]


def test_a_folder_without_a_config_is_named_in_a_warning(tmp_path, caplog):
    write_torchscript(tmp_path, "good")
    (tmp_path / "typo").mkdir()
    (tmp_path / "typo" / "config.tml").write_text("")
    (tmp_path / ".git").mkdir()  # hidden folders are not models, and are not warned about
    with caplog.at_level("WARNING", logger="wok"):
        repo = ModelRepository.from_directory(tmp_path)
    assert list(repo.models) == ["good"]
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [
        f"model repository {tmp_path}: folder typo has no config.toml or config.yaml or config.yml; it is not served"
    ]


def test_a_folder_with_a_triton_config_pbtxt_is_told_to_write_config_toml(tmp_path, caplog):
    write_torchscript(tmp_path, "good")
    (tmp_path / "triton" / "1").mkdir(parents=True)  # Triton's layout: config.pbtxt beside a version folder
    (tmp_path / "triton" / "config.pbtxt").write_text('platform: "pytorch_libtorch"\nmax_batch_size: 8\n')
    with caplog.at_level("WARNING", logger="wok"):
        repo = ModelRepository.from_directory(tmp_path)
    assert list(repo.models) == ["good"]
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        f"model repository {tmp_path}: folder triton has no config.toml or config.yaml or config.yml (its "
        "config.pbtxt is Triton's format, which wok does not read: write config.toml, as README.md shows); it is "
        "not served"
    ]


# Loads the repository given and prints its models, its log lines on stdout.
LOAD_AS_CHILD = """
import logging, sys
from wok.repository import ModelRepository
logging.basicConfig(format="%(levelname)s %(message)s", stream=sys.stdout)
print(sorted(ModelRepository.from_directory(sys.argv[1]).models))
"""


def test_a_folder_the_server_may_not_read_is_named_in_a_warning_and_the_others_are_served():
    # A volume's root-owned lost+found under a server not run as root: is_file raised, and the start ended
    # in a traceback. Root reads a folder whatever its mode, so as root the loading child runs as nobody.
    prefix = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("as root, which reads any folder, with no setpriv to run the load as nobody")
        prefix = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]
    # Not under tmp_path, whose parent is closed to other users.
    root = Path(tempfile.mkdtemp(prefix="wok-unreadable-"))
    try:
        root.chmod(0o755)
        env = {**os.environ, "HOME": str(root)}
        if subprocess.run([*prefix, sys.executable, "-c", "import wok"], env=env, capture_output=True).returncode:
            pytest.skip("nobody cannot import wok from this checkout")
        write_torchscript(root, "good")
        (root / "lost+found").mkdir()
        (root / "lost+found").chmod(0)
        child = subprocess.run(
            [*prefix, sys.executable, "-c", LOAD_AS_CHILD, str(root)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert (child.returncode, child.stderr) == (0, "")
        assert child.stdout.splitlines() == [
            f"WARNING model repository {root}: folder lost+found cannot be read (Permission denied); it is not served",
            "['good']",
        ]
    finally:
        (root / "lost+found").chmod(0o700)
        shutil.rmtree(root)


def test_torchscript_model_file_missing(tmp_path):
    d = model_dir(tmp_path, "ts", "torchscript", extra='model_file = "model.pt"')
    with pytest.raises(ConfigError) as info:
        ModelRepository.from_directory(tmp_path)
    assert str(info.value) == f"{d / 'config.toml'}: model_file 'model.pt': {d / 'model.pt'} does not exist"


def test_bad_config_fails_the_whole_repository(tmp_path):
    write_torchscript(tmp_path, "good")
    d = model_dir(tmp_path, "bad", "torchscript", extra='model_file = "model.pt"', mbs=0)
    with pytest.raises(ConfigError) as info:
        ModelRepository.from_directory(tmp_path)
    assert str(info.value).startswith(f"{d / 'config.toml'}: max_batch_size")


def test_two_models_with_one_name(tmp_path):
    for folder in ("a", "b"):
        model_dir(tmp_path, folder, "python", extra='name = "same"\nfactory = "torch.nn:Identity"', out_dims="[4]")
    with pytest.raises(ConfigError) as info:
        ModelRepository.from_directory(tmp_path)
    assert str(info.value) == (
        f"{tmp_path}: two models are named 'same': {tmp_path / 'a' / 'config.toml'} and "
        f"{tmp_path / 'b' / 'config.toml'}; expected one name per model"
    )


def test_load_model_builds_the_model_named_and_refuses_one_named_twice(tmp_path):
    """load_model (wok profile's) finds a model by its config's name, not its folder's, and refuses a name two
    configs give as the whole repository's load refuses it; a name no config gives, after the folder of that name."""
    model_dir(tmp_path, "folder", "python", extra='name = "named"\nfactory = "torch.nn:Identity"', out_dims="[4]")
    assert load_model(tmp_path, "named").name == "named"
    with pytest.raises(ModelNotFound) as info:
        load_model(tmp_path, "folder")
    assert str(info.value) == f"unknown model 'folder'; model repository {tmp_path} holds: named"
    for folder in ("a", "b"):
        model_dir(tmp_path, folder, "python", extra='name = "same"\nfactory = "torch.nn:Identity"', out_dims="[4]")
    with pytest.raises(ConfigError) as info:
        load_model(tmp_path, "same")
    assert str(info.value) == (
        f"{tmp_path}: two models are named 'same': {tmp_path / 'a' / 'config.toml'} and "
        f"{tmp_path / 'b' / 'config.toml'}; expected one name per model"
    )


def test_load_model_names_a_sibling_named_twice_once(tmp_path):
    """A name two siblings' configs give was listed twice where the name asked is missing ("holds: c, same, same"):
    the siblings' clash is theirs, not refused here, and the list names the models there."""
    for folder in ("a", "b"):
        model_dir(tmp_path, folder, "python", extra='name = "same"\nfactory = "torch.nn:Identity"', out_dims="[4]")
    model_dir(tmp_path, "c", "python", extra='factory = "torch.nn:Identity"', out_dims="[4]")
    with pytest.raises(ModelNotFound) as info:
        load_model(tmp_path, "a")
    assert str(info.value) == f"unknown model 'a'; model repository {tmp_path} holds: c, same"


def test_a_bad_demo_name_or_option_is_a_config_error():
    with pytest.raises(ConfigError) as info:
        ModelRepository.demo(["gpt"])
    assert str(info.value) == "demo model 'gpt': unknown demo model 'gpt'; known: mlp, recsys, encoder"
    with pytest.raises(ConfigError) as info:
        ModelRepository.demo(["mlp"], mlp={"hidden": -1})
    assert str(info.value) == "demo model 'mlp': mlp: hidden: expected >= 1; got -1"


def test_get_unknown_model_and_version(tmp_path):
    for name in ("beta", "alpha"):
        model_dir(tmp_path, name, "python", extra='factory = "torch.nn:Identity"', out_dims="[4]")
    repo = ModelRepository.from_directory(tmp_path)
    assert repo.get("alpha") is repo.get("alpha", "1")
    with pytest.raises(ModelNotFound) as info:
        repo.get("gamma")
    assert str(info.value) == "unknown model 'gamma'; this server serves: alpha, beta"
    with pytest.raises(ModelNotFound) as info:
        repo.get("alpha", "2")
    assert str(info.value) == "model 'alpha' has no version '2'; available: 1"


def test_a_version_is_an_integer_as_triton_reads_it(tmp_path):
    model_dir(tmp_path, "alpha", "python", extra='factory = "torch.nn:Identity"', out_dims="[4]")
    repo = ModelRepository.from_directory(tmp_path)
    for v in ("01", "001"):
        assert repo.get("alpha", v) is repo.get("alpha")
    for v in ("0", "02", str(2**63 - 1)):
        with pytest.raises(ModelNotFound) as info:
            repo.get("alpha", v)
        assert info.value.code == grpc.StatusCode.NOT_FOUND
        assert str(info.value) == f"model 'alpha' has no version '{v}'; available: 1"
    for v in ("abc", "-1", "1.0", "1e0", "0x1", str(2**63), "1" * 4301):
        with pytest.raises(ModelNotFound) as info:  # counted as a request of no served model
            repo.get("alpha", v)
        assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert str(info.value) == (
            "model 'alpha': model version: expected an integer from 0 to 2**63-1 in decimal digits, or '' for the "
            f"version served (1); got {quoted_name(v)}"
        )


@pytest.fixture(scope="module", autouse=True)
def failed_starts(tmp_path_factory):
    """The module's `wok serve` runs that must fail at start, all started as the module begins
    (each spends seconds importing torch, beside the in-process tests, and none depends on another):
    name -> (process, its paths)."""
    import subprocess
    import sys

    runs = {}
    # `python -m` puts the working directory first on sys.path; a stray helper.py there must not
    # become a model's code (only the model folder's own files and installed modules may).
    root = tmp_path_factory.mktemp("stray")
    work = root / "work"
    work.mkdir()
    marker = root / "IMPORTED"
    (work / "wok_stray_helper.py").write_text(f"open({str(marker)!r}, 'w').close()\ndef build():\n    pass\n")
    model_dir(root / "repo", "m", "python", extra='factory = "wok_stray_helper:build"')
    argv = [sys.executable, "-m", "wok", "serve", "--model-repository", str(root / "repo"), "--port", "0"]
    runs["stray"] = (
        subprocess.Popen(argv, cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True),
        marker,
    )
    root = tmp_path_factory.mktemp("warmup")
    d = model_dir(root, "m", "python", extra='factory = "torch.nn:Identity"')  # [4] in, [3] declared out
    argv = [
        sys.executable, "-m", "wok", "serve", "--model-repository", str(root),
        "--port", "0", "--metrics-port", "-1", "--log-level", "WARNING",
    ]  # fmt: skip
    runs["warmup"] = (subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True), d)
    if not torch.cuda.is_available():
        root = tmp_path_factory.mktemp("cuda")
        d = model_dir(root, "m", "python", extra='factory = "torch.nn:Identity"', out_dims="[4]")
        config = d / "config.toml"
        config.write_text(config.read_text().replace('devices = ["cpu"]', 'devices = ["cuda:0"]'))
        argv = [*argv[:5], str(root), *argv[6:]]
        runs["cuda"] = (subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True), d)
    root = tmp_path_factory.mktemp("huge")
    d = model_dir(root, "m", "python", extra='factory = "torch.nn:Identity"', in_dims="[1000000000000, 1000000000000]")
    argv = [*argv[:5], str(root), *argv[6:]]
    runs["huge"] = (subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True), d)
    root = tmp_path_factory.mktemp("weights")
    d = model_dir(root, "m", "python", extra='factory = "torch.nn:Identity"\nweights = "w.safetensors"', out_dims="[4]")
    argv = [*argv[:5], str(root), *argv[6:]]
    runs["weights"] = (subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True), d)
    root = tmp_path_factory.mktemp("nan")
    d = model_dir(root, "m", "python", extra='factory = "torch.nn:Identity"', out_dims="[4]")
    config = d / "config.toml"
    config.write_text(config.read_text().replace("max_queue_delay_ms = 1.0", "max_queue_delay_ms = nan"))
    argv = [*argv[:5], str(root), *argv[6:]]
    runs["nan"] = (subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True), d)
    yield runs
    for proc, _ in runs.values():
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def test_python_m_wok_does_not_import_factory_modules_from_the_working_directory(failed_starts):
    proc, marker = failed_starts["stray"]
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 2, stderr[-2000:]
    repo_model = marker.parent / "repo" / "m"
    assert stderr.splitlines()[-1:] == [
        f"wok: {repo_model / 'config.toml'}: factory 'wok_stray_helper:build': no file "
        f"{repo_model / 'wok_stray_helper.py'}, and no installed module 'wok_stray_helper'"
    ]
    assert not marker.exists()


def test_a_model_that_fails_its_warm_up_makes_wok_serve_exit_2_as_a_config_error(failed_starts):
    # The warm-up's message names the model's config file: the config (or the model) must change,
    # as for every other config error; exit 1 is for a start that failed otherwise (a port taken).
    proc, d = failed_starts["warmup"]
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 2, stderr[-2000:]
    lines = stderr.splitlines()
    assert not [line for line in lines if line.startswith("Traceback")], stderr[-2000:]
    assert lines[-1:] == [
        "wok: model 'm' output 'OUTPUT0': expected shape [1, 3], as its config declares (1 row; -1 = any size); "
        "got [1, 4]; in the start-up warm-up, on a batch of zeros with input shapes "
        f"'INPUT0' [1, 4] on cpu (config: {d / 'config.toml'})"  # no -1 dims: no warmup_dims hint
    ]


def test_a_model_on_a_cuda_device_the_machine_lacks_makes_wok_serve_exit_2_naming_its_config(failed_starts):
    # It exited 1 with "cannot start: device 'cuda:0' requested but no CUDA device is present",
    # naming neither the model nor its file, where every other config error names both, exit 2.
    if "cuda" not in failed_starts:
        pytest.skip("this machine has a CUDA device: the model starts")
    proc, d = failed_starts["cuda"]
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 2, stderr[-2000:]
    assert stderr.splitlines()[-1:] == [
        f"wok: {d / 'config.toml'}: instances.devices: device 'cuda:0' requested but no CUDA device is present"
    ]


def test_dims_too_large_for_the_warm_up_make_wok_serve_exit_2_naming_the_input_and_config(failed_starts):
    # numpy's error ended the start with exit 1, "cannot start: array is too big; ..." (or, for dims of a few
    # TiB, "Unable to allocate 3.64 TiB ..."), naming neither the model nor its config. Too big for any
    # machine: numpy refuses it without asking the system for memory, which may overcommit.
    proc, d = failed_starts["huge"]
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 2, stderr[-2000:]
    assert stderr.splitlines()[-1:] == [
        "wok: model 'm': its start-up warm-up cannot make a sample of zeros for input 'INPUT0', shape "
        "[1, 1000000000000, 1000000000000] (FP32): array is too big; `arr.size * arr.dtype.itemsize` is larger "
        f"than the maximum possible size; check that input's dims (and warmup_dims) in its config "
        f"({d / 'config.toml'})"
    ]


def test_a_missing_weights_file_makes_wok_serve_exit_2_naming_the_config_file_and_field(failed_starts):
    # It said "model 'm': weights file ... does not exist": the model, not the file that names the weights.
    proc, d = failed_starts["weights"]
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 2, stderr[-2000:]
    assert stderr.splitlines()[-1:] == [
        f"wok: {d / 'config.toml'}: weights 'w.safetensors': {d / 'w.safetensors'} does not exist"
    ]


def test_a_nan_queue_delay_makes_wok_serve_exit_2_saying_it_must_be_a_finite_number(failed_starts):
    # It said "Input should be less than or equal to 60000 (got nan)".
    proc, d = failed_starts["nan"]
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 2, stderr[-2000:]
    assert stderr.splitlines()[-1:] == [
        f"wok: {d / 'config.toml'}: dynamic_batching.max_queue_delay_ms: expected a finite number; got NaN"
    ]
