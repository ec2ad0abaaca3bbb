"""The bound of an integer input's ids, found by the server at load in the model's embedding tables, published in its
ModelConfig answer's parameters (`wok.ids_bound.<input>`), read by an unmodified tritonclient and drawn below by
`wok bench ramp` where --int-high is not given: a model of a 10-row table had every request of a default ramp (ids
up to 50) refused INVALID_ARGUMENT."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from wok.bench.cli import BAD_REQUESTS

ROWS = 10

MODEL = f"""
import torch
from torch import nn


class Lookup(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Embedding({ROWS}, 4)

    def forward(self, ids, dense):
        return self.table(ids).sum(1) + dense
"""

CONFIG = """
platform = "python"
factory = "model:Lookup"
max_batch_size = 8

[[inputs]]
name = "ids"
datatype = "INT64"
dims = [16]

[[inputs]]
name = "dense"
datatype = "FP32"
dims = [4]

[[outputs]]
name = "out"
datatype = "FP32"
dims = [4]
"""


@pytest.fixture
def ten_rows(tmp_path, serve_in_thread):
    """A server of one model, `lookup`, whose input 'ids' (16 a row) reaches a table of ROWS rows: a request of ids
    drawn below 50 holds one past it but once in 0.2**-16."""
    return _lookup(tmp_path, serve_in_thread, MODEL, CONFIG)


def _lookup(tmp_path, serve_in_thread, model: str, config: str):
    """A server of one python model, `lookup`, of `model` (model.py) and `config` (config.toml)."""
    d = tmp_path / "repo" / "lookup"
    d.mkdir(parents=True)
    (d / "model.py").write_text(model)
    (d / "config.toml").write_text(config)
    return serve_in_thread(models=(), repository=tmp_path / "repo")


PEER = textwrap.dedent(
    """
    import json, sys
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(sys.argv[1])
    print(json.dumps(client.get_model_config("lookup", as_json=True)))
    """
)


def test_the_bound_is_in_the_model_config_parameters_an_unmodified_tritonclient_reads(ten_rows):
    # In a process of its own, with nothing of wok loaded beside it (as tests/compat's peer).
    out = subprocess.run(
        [sys.executable, "-c", PEER, ten_rows.target], check=True, capture_output=True, text=True, timeout=60
    )
    config = json.loads(out.stdout)["config"]
    assert config["parameters"] == {"wok.ids_bound.ids": {"string_value": str(ROWS)}}
    assert [t["name"] for t in config["input"]] == ["ids", "dense"]


def _ramp(target: str, path, *extra: str) -> int:
    from wok.__main__ import main

    argv = ["bench", "ramp", "--target", target, "--model", "lookup", "--steps", "40", "--step-duration", "1s"]
    argv += ["--warmup", "0.2s", "--workers", "1", "--metrics-url", "none", "--json", str(path), *extra]
    return main(argv)


def test_a_ramp_without_int_high_draws_below_the_published_bound_and_no_request_is_refused(ten_rows, tmp_path, capsys):
    assert _ramp(ten_rows.target, tmp_path / "r.json") == 0
    err = capsys.readouterr().err
    assert (
        "model 'lookup': integer inputs drawn below the bounds of their ids the server publishes "
        f"(wok.ids_bound.<input>): input 'ids' in [0, {ROWS}); --int-high to draw every one below one bound"
    ) in err
    doc = json.loads((tmp_path / "r.json").read_text())
    (step,) = doc["steps"]
    assert step["success_rate"] == 1.0 and step["errors"] == {}, step["errors"]
    assert (doc["config"]["int_high"], doc["config"]["int_high_given"]) == (50, False)
    assert doc["config"]["int_high_published"] == {"lookup": {"ids": ROWS}}


def test_int_high_given_draws_below_it_said_where_it_passes_the_published_bound(ten_rows, tmp_path, capsys):
    assert _ramp(ten_rows.target, tmp_path / "r.json", "--int-high", "50") == BAD_REQUESTS
    err = capsys.readouterr().err
    assert (
        "warning: --int-high 50: the server of model 'lookup' publishes smaller bounds of ids: input 'ids' in [0, "
        f"{ROWS}); a request holding an id past one may be refused INVALID_ARGUMENT, or fail its model"
    ) in err
    # The default is no longer 50 alone: the ramp draws an input below the bound its server publishes.
    assert "--int-high (50; default 50, or an input's id bound the server publishes) against the model" in err
    doc = json.loads((tmp_path / "r.json").read_text())
    assert (doc["config"]["int_high_given"], doc["config"]["int_high_published"]) == (True, {"lookup": {}})


TWO_TABLES_MODEL = """
import torch
from torch import nn


class Lookup(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Embedding(100, 4)
        self.b = nn.Embedding(150, 4)

    def forward(self, ids, other):
        return (self.a(ids) + self.b(ids * 2) + self.a(other)).sum(1)
"""
# CONFIG's model of two integer inputs, 'ids' and 'other'.
TWO_TABLES_CONFIG = CONFIG.replace('name = "dense"\ndatatype = "FP32"', 'name = "other"\ndatatype = "INT64"').replace(
    "dims = [4]", "dims = [16]", 1
)


def test_an_input_that_also_reaches_a_table_through_an_op_not_followed_has_no_published_bound(
    tmp_path, serve_in_thread
):
    """'ids' reaches a table of 100 rows as it is and one of 150 doubled: 100 was published, and a ramp's ids from
    75 on failed the model. 'other' reaches the first alone: its bound is published. A request's ids past 100 are
    still refused (every id reaches that table)."""
    import grpc
    import numpy as np

    from wok.codec import encode_request
    from wok.v2pb import grpc_service_pb2 as pb
    from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

    assert 'name = "other"' in TWO_TABLES_CONFIG and "dense" not in TWO_TABLES_CONFIG, TWO_TABLES_CONFIG
    served = _lookup(tmp_path, serve_in_thread, TWO_TABLES_MODEL, TWO_TABLES_CONFIG)
    with grpc.insecure_channel(served.target) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        config = stub.ModelConfig(pb.ModelConfigRequest(name="lookup"), timeout=30).config
        assert {k: v.string_value for k, v in config.parameters.items()} == {"wok.ids_bound.other": "100"}
        ids = np.full((1, 16), 100, np.int64)
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(encode_request("lookup", {"ids": ids, "other": ids * 0}), timeout=30)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()


def test_a_published_bound_that_is_no_whole_number_is_said_and_left_out():
    """No wok server's, but a ModelConfig answer is any server's: such an input is drawn below --int-high."""
    from wok.bench.runner import published_bounds
    from wok.v2pb import model_config_pb2 as mc

    config = mc.ModelConfig(name="m")
    config.parameters["wok.ids_bound.ids"].string_value = "10"
    config.parameters["wok.ids_bound.empty"].string_value = "0"
    config.parameters["wok.ids_bound.odd"].string_value = "1e3"
    config.parameters["hidden"].string_value = "16"
    said: list[str] = []
    notes: list[str] = []
    assert published_bounds(config, "m", said.append, notes) == {"ids": 10, "empty": 1}
    line = (
        "model 'm': parameter 'wok.ids_bound.odd' of its ModelConfig: expected the whole number of its input's id "
        "bound; got '1e3'; the input is drawn below --int-high"
    )
    assert (said, notes) == ([f"warning: {line}"], [line])


WIDE = 300  # the INT8 input's table: more rows than its datatype has ids

INT8_MODEL = f"""
import torch
from torch import nn


class Lookup(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Embedding({WIDE}, 4)

    def forward(self, ids):
        return self.table(ids.long()).sum(1)
"""

DENSE = """
[[inputs]]
name = "dense"
datatype = "FP32"
dims = [4]
"""
# CONFIG's model of ids alone, INT8 ones.
INT8_CONFIG = CONFIG.replace(DENSE, "").replace('datatype = "INT64"', 'datatype = "INT8"')


@pytest.fixture
def int8_ids(tmp_path, serve_in_thread):
    """A server of `lookup`, whose INT8 input 'ids' reaches a table of WIDE rows: its published bound, which the
    payloads cap at 128 (INT8's largest id + 1)."""
    assert "dense" not in INT8_CONFIG and "INT8" in INT8_CONFIG, INT8_CONFIG
    return _lookup(tmp_path, serve_in_thread, INT8_MODEL, INT8_CONFIG)


def test_an_int8_input_is_said_drawn_below_its_datatypes_cap_not_past_it(int8_ids, tmp_path, capsys):
    assert _ramp(int8_ids.target, tmp_path / "r.json") == 0
    err = capsys.readouterr().err
    assert (
        "(wok.ids_bound.<input>): input 'ids' in [0, 128) (its datatype holds no larger id, the server publishes "
        f"{WIDE}); --int-high"
    ) in err
    assert json.loads((tmp_path / "r.json").read_text())["config"]["int_high_published"] == {"lookup": {"ids": WIDE}}
    # --int-high past the bound draws below 128 all the same: no id reaches past the table, and no warning says so.
    assert _ramp(int8_ids.target, tmp_path / "r.json", "--int-high", "1000") == 0
    assert "publishes smaller bounds" not in capsys.readouterr().err


def test_a_soak_says_the_bounds_it_draws_below_once(ten_rows, tmp_path, capsys):
    """The capacity ramp and the soak step each built the pool: the line came twice, for one pool."""
    assert _ramp(ten_rows.target, tmp_path / "r.json", "--soak", "1s", "--soak-window", "0.5s") == 0
    err = capsys.readouterr().err
    line = "model 'lookup': integer inputs drawn below the bounds of their ids the server publishes"
    assert err.count(line) == 1, err
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["soak"]["capacity"]["source"] == "measured"
    (step,) = doc["steps"]
    assert step["success_rate"] == 1.0 and step["errors"] == {}, step["errors"]
    assert doc["config"]["int_high_published"] == {"lookup": {"ids": ROWS}}
