"""Wire compatibility with Triton's own Python client, `tritonclient[grpc]` from PyPI.

The client runs in a child process (triton_peer.py), so that it runs exactly as a Triton
user's, with nothing of wok loaded beside it (test_one_process.py checks the two together). This process only
reads what the peer saved and checks it against wok's configs and against the demo
models run in-process on the same inputs.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from wok.models import build_demo
from wok.servable import HostBuffers, Servable

PEER = Path(__file__).with_name("triton_peer.py")
MODELS = ("mlp", "recsys", "encoder")
# The options conftest.SMALL_DEMO starts the server with; checked against what the server
# reports below, so a change there shows up as a clear failure here, not as wrong numbers.
DEMO_OPTIONS = {"recsys": {"num_embeddings": 20000}}
# Every way the peer sends requests; each one must have answered every case.
MODES = ("infer", "typed", "async_infer", "stream", "aio")
PEER_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def peer_run(server_process, tmp_path_factory) -> tuple[dict, Path]:
    # A missing client must fail the suite: it is a declared test dependency, not optional.
    assert importlib.util.find_spec("tritonclient") is not None, (
        "tritonclient is not installed; install the test extra: pip install -e '.[test]'"
    )
    out = tmp_path_factory.mktemp("triton_peer")
    proc = subprocess.run(
        [sys.executable, str(PEER), server_process.target, str(out)],
        check=False,
        capture_output=True,
        text=True,
        timeout=PEER_TIMEOUT_S,
    )
    if proc.returncode != 0:
        pytest.fail(
            f"triton_peer.py exited {proc.returncode}\n--- stderr ---\n{proc.stderr}"
            f"\n--- stdout ---\n{proc.stdout}\n--- server log ---\n" + "\n".join(server_process.log[-40:])
        )
    return json.loads((out / "report.json").read_text()), out


@pytest.fixture(scope="module")
def servables() -> dict[str, Servable]:
    return {m: build_demo(m, **DEMO_OPTIONS.get(m, {})) for m in MODELS}


def run_in_process(s: Servable, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    rows = next(iter(inputs.values())).shape[0]
    tensors = s.assemble([inputs], rows, HostBuffers(pinned=False))
    with torch.inference_mode():
        out = s.forward(s.module_for(torch.device("cpu")), s.prepare(tensors))
    return {k: v.numpy().copy() for k, v in out.items()}


def test_every_call_passed(peer_run):
    report, _ = peer_run
    failed = [c for c in report["calls"] if not c["ok"]]
    assert not failed, json.dumps(failed, indent=2)
    assert report["ok"] is True
    assert report["wok_imported"] is False
    assert report["server_live"] is True and report["server_ready"] is True
    assert report["model_ready"] == {m: True for m in MODELS}
    meta = report["server_metadata"]
    assert meta["name"] and meta["version"]


def test_model_metadata_matches_config(peer_run, servables):
    report, _ = peer_run
    for m, s in servables.items():
        meta = report["model_metadata"][m]
        cfg = s.config
        assert meta["name"] == m
        assert meta["platform"] == s.platform_label
        assert meta["versions"], f"{m}: no versions in metadata"

        def tensors(entries):
            # MessageToJson renders int64 shapes as strings.
            return [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in entries]

        assert tensors(meta["inputs"]) == [(t.name, t.datatype, [-1, *t.dims]) for t in cfg.inputs], m
        assert tensors(meta["outputs"]) == [(t.name, t.datatype, [-1, *t.dims]) for t in cfg.outputs], m


def test_model_config_matches_config(peer_run, servables):
    report, _ = peer_run
    for m, s in servables.items():
        got = report["model_config"][m]["config"]
        cfg = s.config
        assert got["name"] == m
        assert got["max_batch_size"] == cfg.max_batch_size, m

        def tensors(entries):
            return [(t["name"], t["data_type"], [int(d) for d in t["dims"]]) for t in entries]

        assert tensors(got["input"]) == [(t.name, f"TYPE_{t.datatype}", list(t.dims)) for t in cfg.inputs], m
        assert tensors(got["output"]) == [(t.name, f"TYPE_{t.datatype}", list(t.dims)) for t in cfg.outputs], m
        delay_us = int(got["dynamic_batching"].get("max_queue_delay_microseconds", 0))
        assert delay_us == int(cfg.dynamic_batching.max_queue_delay_ms * 1000), m
        params = got.get("parameters", {})
        for key, value in DEMO_OPTIONS.get(m, {}).items():
            assert params.get(key, {}).get("string_value") == str(value), (
                f"{m}: server runs {key}={params.get(key)}, this test builds {key}={value}; "
                "keep DEMO_OPTIONS in step with conftest.SMALL_DEMO"
            )


def test_repository_index(peer_run, server_process):
    report, _ = peer_run
    models = report["repository_index"]["models"]
    assert sorted(e["name"] for e in models) == sorted(server_process.models)
    assert set(MODELS) <= {e["name"] for e in models}
    for e in models:
        assert e.get("state") == "READY", e


def test_statistics_count_the_peer_requests(peer_run):
    report, _ = peer_run
    before, after, rows = (
        report["statistics_before"],
        report["statistics_after"],
        report["rows_sent"],
    )
    for m in MODELS:
        b, a = before[m], after[m]
        samples = a["inference_count"] - b["inference_count"]
        batches = a["execution_count"] - b["execution_count"]
        # inference_count counts rows, as Triton does, so it grows by exactly what was sent.
        assert samples == rows[m], f"{m}: inference_count grew by {samples}, the peer sent {rows[m]} rows"
        assert 1 <= batches <= samples, f"{m}: execution_count grew by {batches} for {samples} rows"
        assert a["inference_count"] >= a["execution_count"], (m, a)


def test_outputs_match_the_model_in_process(peer_run, servables):
    report, out = peer_run
    cases = report["cases"]
    for mode in MODES:
        assert sorted(report["outputs"].get(mode, {})) == sorted(cases), f"{mode}: cases missing"
    for case, spec in cases.items():
        s = servables[spec["model"]]
        inputs = {name: np.load(out / f) for name, f in spec["inputs"].items()}
        rows = next(iter(inputs.values())).shape[0]
        want = run_in_process(s, inputs)
        for mode in MODES:
            files = report["outputs"][mode][case]
            assert sorted(files) == sorted(t.name for t in s.config.outputs), (mode, case, files)
            for name, f in files.items():
                got = np.load(out / f)
                assert got.dtype == want[name].dtype, (mode, case, name, got.dtype)
                assert got.shape == want[name].shape, (mode, case, name, got.shape)
                assert got.shape[0] == rows
                np.testing.assert_allclose(got, want[name], rtol=1e-5, atol=1e-6, err_msg=f"{mode}/{case}/{name}")


def test_bad_request_is_invalid_argument(peer_run):
    report, _ = peer_run
    bad = report["bad_request"]
    assert bad["raised"] is True, bad
    assert bad["status"] == "StatusCode.INVALID_ARGUMENT", bad
    assert "INPUT0" in bad["message"], bad
    # On the stream the same mistake comes back as an error_message and the stream goes on.
    assert len(report["stream_errors"]) == 1 and "INPUT0" in report["stream_errors"][0]


def test_stream_answers_are_marked_final_as_triton_marks_them(peer_run):
    # Stream loops written for Triton read triton_final_response to know a request is done.
    report, _ = peer_run
    flags = report["stream_final_flags"]
    assert flags and all(flags), flags


def test_triton_features_wok_lacks_are_refused_by_name_not_ignored(peer_run):
    report, _ = peer_run
    got = report["unsupported"]
    assert got["class_count"] == {
        "raised": True,
        "status": "StatusCode.INVALID_ARGUMENT",
        "message": "output 'OUTPUT0': parameter 'classification' (top-k classes, tritonclient's class_count) is not "
        "supported by this server; request the output without it",
    }
    assert got["shared_memory_input"] == {
        "raised": True,
        "status": "StatusCode.INVALID_ARGUMENT",
        "message": "input 'INPUT0': parameter 'shared_memory_region' (shared memory) is not supported by this "
        "server; send the tensor in raw_input_contents",
    }


def test_an_output_requested_twice_is_refused_naming_both_places(peer_run):
    # As an input given twice is (was "output 'OUTPUT0' requested more than once", with no expected).
    report, _ = peer_run
    assert report["output_twice"] == {
        "raised": True,
        "status": "StatusCode.INVALID_ARGUMENT",
        "message": "output 'OUTPUT0' requested more than once (outputs 0 and 1); expected each output once",
    }
