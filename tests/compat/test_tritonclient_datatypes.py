"""Every datatype wok serves, round trip through Triton's own client, `tritonclient[grpc]` from PyPI.

A model repository with one python model (datatype_values.py) taking one input of each V2 datatype
but BYTES, answering each back unchanged and widened to FP64, batched. datatypes_peer.py sends edge
values (min, max, 0, -0.0, NaN, ±inf, subnormals) through each of tritonclient's gRPC APIs from a
process of its own, as a Triton user would, BF16 as tritonclient itself takes it; this process
checks the answers bit for bit (a NaN's payload aside) against what was sent, with expectations of
its own, not wok's datatype table.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ..conftest import start_server_process
from .datatype_values import (
    BITS,
    CASES,
    FLOAT_FIELDS,
    MAX_BATCH_SIZE,
    MODEL,
    MODEL_PY,
    OUTPUTS,
    TOGETHER,
    TYPES,
    WIRE,
    case_inputs,
    config_toml,
    dims,
    echo_name,
    edge_values,
    f64_name,
    input_name,
)

PEER = Path(__file__).with_name("datatypes_peer.py")
PEER_TIMEOUT_S = 120
# The cases each of the peer's modes sends, and the batches they make: "full" alone, the others together.
MODE_CASES = {
    "infer": ("full", *TOGETHER),
    "async_infer": TOGETHER,
    "stream": TOGETHER,
    "aio": ("full", *TOGETHER),
}
BATCHES = sum(1 + ("full" in cases) for cases in MODE_CASES.values())
# What tritonclient's as_numpy gives for each datatype (BF16: "float32" before its ml_dtypes support).
AS_NUMPY = {t: WIRE[t].name for t in TYPES} | {"BF16": "bfloat16"}


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    # A missing client must fail the suite: it is a declared test dependency, not optional.
    assert importlib.util.find_spec("tritonclient") is not None, (
        "tritonclient is not installed; install the test extra: pip install -e '.[test]'"
    )
    repo = tmp_path_factory.mktemp("repository")
    (repo / MODEL).mkdir()
    (repo / MODEL / "config.toml").write_text(config_toml())
    (repo / MODEL / "model.py").write_text(MODEL_PY)
    out = tmp_path_factory.mktemp("datatypes_peer")
    server = start_server_process("--model-repository", str(repo))
    try:
        proc = subprocess.run(
            [sys.executable, str(PEER), server.target, str(out)],
            check=False,
            capture_output=True,
            text=True,
            timeout=PEER_TIMEOUT_S,
        )
    finally:
        code = server.terminate()
    log = "\n".join(server.log[-40:])
    if proc.returncode != 0:
        pytest.fail(
            f"datatypes_peer.py exited {proc.returncode}\n--- stderr ---\n{proc.stderr}"
            f"\n--- stdout ---\n{proc.stdout}\n--- server log ---\n{log}"
        )
    assert code == 0, f"wok serve exited {code}\n{log}"
    return json.loads((out / "report.json").read_text())


def as_float(t: str, bits: np.ndarray) -> np.ndarray:
    """Bit patterns of floating-point type `t` as numpy floats (BF16 widened to float32 exactly)."""
    if t == "BF16":
        return (bits.astype(np.uint32) << 16).view(np.float32)
    return bits.view(WIRE[t])


def sent_bits(case: str, t: str) -> np.ndarray:
    return case_inputs(case)[input_name(t)].view(BITS[t])


def widened(t: str, bits: np.ndarray) -> np.ndarray:
    """What the model's x.to(torch.float64) makes of values of type `t`, as float64 bit patterns."""
    values = as_float(t, bits) if t in FLOAT_FIELDS else bits.view(WIRE[t])
    return values.astype(np.float64).view(np.uint64)


def assert_same_bits(where: str, t: str, got: np.ndarray, want: np.ndarray) -> None:
    """Equal bit for bit, but that a NaN sent may come back as any NaN."""
    assert got.shape == want.shape, f"{where}: shape {list(got.shape)}, expected {list(want.shape)}"
    same = got == want
    if t in FLOAT_FIELDS:
        same |= np.isnan(as_float(t, got)) & np.isnan(as_float(t, want))
    if not same.all():
        width = 2 * got.dtype.itemsize
        bad = [
            f"[{', '.join(map(str, i))}] got {int(got[i]):#0{width + 2}x}, expected {int(want[i]):#0{width + 2}x}"
            for i in zip(*np.nonzero(~same), strict=True)
        ]
        raise AssertionError(f"{where} ({t}): {len(bad)} value(s) differ: " + "; ".join(bad[:8]))


def answers(report: dict):
    """(mode, case, answer) of every answer the peer kept."""
    for mode, cases in report["answers"].items():
        for case, ans in cases.items():
            yield mode, case, ans


def test_edge_values_are_each_types_limits():
    # The float edges are built from bit fields; numpy's own limits say the fields are right.
    for t in ("FP16", "FP32", "FP64"):
        v = edge_values(t)
        info = np.finfo(WIRE[t])
        assert v[7] == info.max and v[8] == info.min and v[9] == info.smallest_normal, t
        assert v[10] == info.smallest_subnormal and v[12] == 1.0 and v[13] == -2.5, t
    bf16 = as_float("BF16", edge_values("BF16"))
    assert bf16[7] == np.float32(3.3895313892515355e38) and bf16[10] == np.float32(2.0**-133), bf16
    for t in TYPES:
        v = edge_values(t).view(BITS[t])
        assert len(set(v.tolist())) == len(v), f"{t}: an edge value given twice: {v}"
        if t in FLOAT_FIELDS:
            f = as_float(t, v)
            assert np.isnan(f).sum() == 3 and np.isposinf(f).sum() == 1 and np.isneginf(f).sum() == 1, t
            assert {(x, np.signbit(x)) for x in f[f == 0]} == {(0.0, False), (0.0, True)}, t
        elif t != "BOOL":
            info = np.iinfo(WIRE[t])
            assert {info.min, info.max, 0} <= set(edge_values(t).tolist()), t


def test_every_call_was_answered(report):
    failed = [c for c in report["calls"] if not c["ok"]]
    assert not failed, json.dumps(failed, indent=2)
    assert report["ok"] is True and report["wok_imported"] is False
    assert {m: sorted(c) for m, c in report["answers"].items()} == {m: sorted(c) for m, c in MODE_CASES.items()}


def test_the_peer_sent_the_edge_values_as_tritonclient_takes_them(report):
    assert report["bf16_numpy"] in ("bfloat16", "float32"), report["bf16_numpy"]
    for case in CASES:
        sent = report["sent"][case]
        assert sorted(sent) == sorted(input_name(t) for t in TYPES), case
        for t in TYPES:
            s = sent[input_name(t)]
            assert s["datatype"] == t and s["numpy"] == (report["bf16_numpy"] if t == "BF16" else AS_NUMPY[t])
            assert s["shape"] == [CASES[case][0], dims(t)], (case, t, s["shape"])
            assert_same_bits(f"sent {case}/{t}", t, np.array(s["bits"], BITS[t]), sent_bits(case, t))


def test_metadata_and_config_name_every_datatype(report):
    meta = report["metadata"]
    inputs = [(i["name"], i["datatype"], [int(d) for d in i["shape"]]) for i in meta["inputs"]]
    assert inputs == [(input_name(t), t, [-1, dims(t)]) for t in TYPES]
    outputs = [(o["name"], o["datatype"]) for o in meta["outputs"]]
    assert outputs == [(n, "FP64" if n.startswith("F64_") else n.split("_", 1)[1]) for n in OUTPUTS]
    config = report["config"]["config"]
    assert config["max_batch_size"] == MAX_BATCH_SIZE
    # Triton's DataType enum, as MessageToJson names it: TYPE_BF16 is 14, TYPE_STRING (BYTES) 13.
    assert [(i["name"], i["data_type"]) for i in config["input"]] == [(input_name(t), f"TYPE_{t}") for t in TYPES]
    assert [o["data_type"] for o in config["output"]] == [f"TYPE_{d}" for _, d in outputs]


def test_answers_echo_the_model_its_version_and_the_request_id(report):
    for mode, case, ans in answers(report):
        got = (ans["model_name"], ans["model_version"], ans["id"])
        # Case "b" names version "1"; the others leave it empty, and the answer names the version served.
        assert got == (MODEL, "1", f"{mode}-{case}"), (mode, case, got)


def test_outputs_come_in_the_order_asked_with_their_datatype_and_shape(report):
    for mode, case, ans in answers(report):
        rows, _, _, requested = CASES[case]
        names = [o["name"] for o in ans["outputs"]]
        # Those requested in that order, else all of them in the config's order.
        assert names == list(requested or OUTPUTS), (mode, case, names)
        assert ans["raw_output_contents"] == len(names), (mode, case)
        for o in ans["outputs"]:
            t = o["name"].split("_", 1)[1]
            datatype = "FP64" if o["name"] == f64_name(t) else t
            numpy = report["bf16_numpy"] if datatype == "BF16" else AS_NUMPY[datatype]
            got = (o["datatype"], o["shape"], o["numpy"], o["numpy_shape"])
            assert got == (datatype, [rows, dims(t)], numpy, [rows, dims(t)]), (mode, case, o["name"], got)


def test_each_value_comes_back_bit_for_bit(report):
    checked = set()
    for mode, case, ans in answers(report):
        for o in ans["outputs"]:
            t = o["name"].split("_", 1)[1]
            if o["name"] == echo_name(t):
                got = np.array(o["bits"], BITS[t])
                assert_same_bits(f"{mode}/{case}/{o['name']}", t, got, sent_bits(case, t))
                checked.add(t)
    assert checked == set(TYPES)


def test_each_value_reaches_the_model_as_its_datatype(report):
    # The model's FP64 of each input: a codec that read BF16 bytes as FP16, or INT8 as UINT8, and
    # wrote them back as they came would pass the echo, not this.
    checked = set()
    for mode, case, ans in answers(report):
        for o in ans["outputs"]:
            t = o["name"].split("_", 1)[1]
            if o["name"] == f64_name(t):
                got = np.array(o["bits"], np.uint64)
                assert_same_bits(f"{mode}/{case}/{o['name']}", "FP64", got, widened(t, sent_bits(case, t)))
                checked.add(t)
    assert checked == set(TYPES)


def test_requests_shared_batches(report):
    # Each mode's "a", "b" and "c" (3 + 4 + 1 rows) fill one batch of MAX_BATCH_SIZE, "full" one alone;
    # the delay (10 s) is far past the run, so any other batch size is a request that went alone.
    def counts(key: str) -> tuple[int, int, dict[int, int]]:
        (stats,) = [s for s in report[f"statistics_{key}"]["model_stats"] if s["name"] == MODEL]
        sizes = {int(b["batch_size"]): int(b["compute_infer"].get("count", 0)) for b in stats.get("batch_stats", [])}
        return int(stats.get("inference_count", 0)), int(stats.get("execution_count", 0)), sizes

    rows_before, batches_before, sizes_before = counts("before")
    rows_after, batches_after, sizes_after = counts("after")
    rows_sent = sum(CASES[c][0] for cases in MODE_CASES.values() for c in cases)
    assert rows_after - rows_before == rows_sent == BATCHES * MAX_BATCH_SIZE
    assert batches_after - batches_before == BATCHES
    grew = {size: n - sizes_before.get(size, 0) for size, n in sizes_after.items() if n != sizes_before.get(size, 0)}
    assert grew == {MAX_BATCH_SIZE: BATCHES}, grew
