"""Drive a wok server with Triton's own client, unmodified: `triton_peer.py TARGET OUTDIR`.

Runs in its own process and never imports wok, so that what it checks is tritonclient
exactly as a Triton user runs it, untouched by anything wok loads (wok.v2pb keeps its
`inference.*` types in a pool of its own: test_one_process.py checks the two side by side).
Every input and output is saved under OUTDIR as .npy and every call's outcome in
report.json, for tests/compat/test_tritonclient.py to check against the models run
in-process. Exits non-zero, naming what failed, if any call failed.
"""

from __future__ import annotations

import asyncio
import json
import queue
import sys
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from peer_common import describe, finish, main, tritonclient_version, wok_imported
from tritonclient.utils import InferenceServerException

MODELS = ("mlp", "recsys", "encoder")
# Both demo models with id inputs accept ids below 50 whatever their size options are.
ID_RANGE = 50
# Generous, so a slow 2-core machine is not mistaken for a broken server.
CALL_TIMEOUT_S = 60.0
# Raw transport is what set_data_from_numpy produces; "typed" goes through InferTensorContents.
CONTENTS_FIELD = {"FP32": "fp32_contents", "INT64": "int64_contents"}
DATATYPE_OF = {np.dtype(np.float32): "FP32", np.dtype(np.int64): "INT64"}


def make_cases() -> dict[str, tuple[str, dict[str, np.ndarray]]]:
    """case name -> (model, inputs); fixed seeds so a rerun sends the same tensors."""
    rng = np.random.default_rng(20240611)
    return {
        "mlp_a": ("mlp", {"INPUT0": rng.standard_normal((3, 256), dtype=np.float32)}),
        "mlp_b": ("mlp", {"INPUT0": rng.standard_normal((1, 256), dtype=np.float32)}),
        "recsys_a": (
            "recsys",
            {
                "dense": rng.standard_normal((2, 13), dtype=np.float32),
                "ids": rng.integers(0, ID_RANGE, (2, 5), dtype=np.int64),
            },
        ),
        "recsys_b": (
            "recsys",
            {
                "dense": rng.standard_normal((3, 13), dtype=np.float32),
                "ids": rng.integers(0, ID_RANGE, (3, 17), dtype=np.int64),
            },
        ),
        "encoder_a": ("encoder", {"tokens": rng.integers(0, ID_RANGE, (2, 7), dtype=np.int64)}),
        "encoder_b": ("encoder", {"tokens": rng.integers(0, ID_RANGE, (1, 20), dtype=np.int64)}),
    }


def infer_inputs(arrays: dict[str, np.ndarray], typed: bool = False) -> list:
    out = []
    for name, a in arrays.items():
        dtype = DATATYPE_OF[a.dtype]
        inp = grpcclient.InferInput(name, list(a.shape), dtype)
        if typed:
            # tritonclient's public API only ever sends raw_input_contents over gRPC. Its
            # request builder copies the InferInputTensor message as is, so filling that
            # message's typed contents (and leaving the raw content unset) still lets
            # tritonclient put a typed-contents request on the wire.
            getattr(inp._get_tensor().contents, CONTENTS_FIELD[dtype]).extend(a.ravel().tolist())
        else:
            inp.set_data_from_numpy(a)
        out.append(inp)
    return out


class Peer:
    def __init__(self, target: str, outdir: Path) -> None:
        self.target = target
        self.outdir = outdir
        self.cases = make_cases()
        self.report: dict = {
            "target": target,
            "tritonclient": tritonclient_version(),
            "calls": [],
            "cases": {},
            "outputs": {},
            "rows_sent": {m: 0 for m in MODELS},
        }

    # -- bookkeeping ----------------------------------------------------------------------
    def record(self, call: str, model: str | None, fn, *args, **kwargs):
        """Run one call; its pass/fail (and error text) goes into the report."""
        entry = {"call": call, "model": model, "ok": False, "error": None}
        self.report["calls"].append(entry)
        try:
            value = fn(*args, **kwargs)
        except Exception as exc:
            entry["error"] = describe(exc)
            return None
        entry["ok"] = True
        return value

    def fail(self, call: str, model: str | None, error: str) -> None:
        self.report["calls"].append({"call": call, "model": model, "ok": False, "error": error})

    def save_inputs(self) -> None:
        for case, (model, arrays) in self.cases.items():
            files = {}
            for name, a in arrays.items():
                files[name] = f"input.{case}.{name}.npy"
                np.save(self.outdir / files[name], a)
            self.report["cases"][case] = {"model": model, "inputs": files}

    def save_result(self, mode: str, case: str, result) -> None:
        """Save a response's outputs; checks what the response itself must say."""
        model, arrays = self.cases[case]
        self.report["rows_sent"][model] += next(iter(arrays.values())).shape[0]
        resp = result.get_response()
        if resp.model_name != model:
            raise AssertionError(f"{mode}/{case}: response model_name {resp.model_name!r}, want {model!r}")
        if resp.id != f"{mode}-{case}":
            raise AssertionError(f"{mode}/{case}: response id {resp.id!r}, want {mode + '-' + case!r}")
        files = {}
        for out in resp.outputs:
            a = result.as_numpy(out.name)
            if a is None:
                raise AssertionError(f"{mode}/{case}: output {out.name!r} has no data")
            files[out.name] = f"output.{mode}.{case}.{out.name}.npy"
            np.save(self.outdir / files[out.name], a)
        if not files:
            raise AssertionError(f"{mode}/{case}: response has no outputs")
        self.report["outputs"].setdefault(mode, {})[case] = files

    # -- the calls ------------------------------------------------------------------------
    def health_and_metadata(self, client) -> None:
        self.report["server_live"] = self.record("is_server_live", None, client.is_server_live)
        self.report["server_ready"] = self.record("is_server_ready", None, client.is_server_ready)
        self.report["server_metadata"] = self.record(
            "get_server_metadata", None, client.get_server_metadata, as_json=True
        )
        self.report["model_ready"] = {}
        self.report["model_metadata"] = {}
        self.report["model_config"] = {}
        for m in MODELS:
            self.report["model_ready"][m] = self.record("is_model_ready", m, client.is_model_ready, m)
            self.report["model_metadata"][m] = self.record(
                "get_model_metadata", m, client.get_model_metadata, m, as_json=True
            )
            self.report["model_config"][m] = self.record(
                "get_model_config", m, client.get_model_config, m, as_json=True
            )
        self.report["repository_index"] = self.record(
            "get_model_repository_index", None, client.get_model_repository_index, as_json=True
        )
        # None means the call itself failed, which is already on record.
        for key in ("server_live", "server_ready"):
            if self.report[key] is False:
                self.fail(key, None, f"{key} returned {self.report[key]!r}")
        for m, ready in self.report["model_ready"].items():
            if ready is False:
                self.fail("is_model_ready", m, f"is_model_ready returned {ready!r}")

    def statistics(self, client, key: str) -> None:
        counts = {}
        for m in MODELS:
            stats = self.record(
                f"get_inference_statistics[{key}]",
                m,
                client.get_inference_statistics,
                m,
                as_json=True,
            )
            if stats is None:
                continue
            entries = [s for s in stats.get("model_stats", []) if s.get("name") == m]
            if len(entries) != 1:
                self.fail(f"get_inference_statistics[{key}]", m, f"no single entry for {m}: {stats}")
                continue
            # MessageToJson renders uint64 as strings and leaves zero counts out.
            counts[m] = {
                "inference_count": int(entries[0].get("inference_count", 0)),
                "execution_count": int(entries[0].get("execution_count", 0)),
            }
        self.report[f"statistics_{key}"] = counts

    def sync_infer(self, client) -> None:
        for case, (model, arrays) in self.cases.items():
            # One request per model names its outputs, the others leave them to the server.
            outputs = None
            if case.endswith("_a"):
                outputs = [grpcclient.InferRequestedOutput(_output_of(model))]
            result = self.record(
                "infer",
                model,
                client.infer,
                model,
                infer_inputs(arrays),
                outputs=outputs,
                request_id=f"infer-{case}",
                client_timeout=CALL_TIMEOUT_S,
            )
            if result is not None:
                self.record("infer.result", model, self.save_result, "infer", case, result)

    def typed_infer(self, client) -> None:
        for case, (model, arrays) in self.cases.items():
            result = self.record(
                "infer[typed contents]",
                model,
                client.infer,
                model,
                infer_inputs(arrays, typed=True),
                request_id=f"typed-{case}",
                client_timeout=CALL_TIMEOUT_S,
            )
            if result is not None:
                self.record("infer[typed contents].result", model, self.save_result, "typed", case, result)

    def callback_infer(self, client) -> None:
        """The sync client's async_infer: all requests in flight at once, so they can batch."""
        done: queue.Queue = queue.Queue()
        sent = {}
        for case, (model, arrays) in self.cases.items():

            def callback(result, error, case=case):
                done.put((case, result, error))

            self.record(
                "async_infer",
                model,
                client.async_infer,
                model,
                infer_inputs(arrays),
                callback,
                request_id=f"async_infer-{case}",
                client_timeout=CALL_TIMEOUT_S,
            )
            if self.report["calls"][-1]["ok"]:
                sent[case] = model
        for _ in sent:
            try:
                case, result, error = done.get(timeout=CALL_TIMEOUT_S)
            except queue.Empty:
                self.fail("async_infer.callback", None, "not every callback came back in time")
                return
            model = sent[case]
            if error is not None:
                self.fail("async_infer.callback", model, describe(error))
            else:
                self.record("async_infer.result", model, self.save_result, "async_infer", case, result)

    def stream_infer(self, client) -> None:
        """One bidirectional stream: every case, plus a bad request that must not end it."""
        got: queue.Queue = queue.Queue()

        def callback(result, error):
            got.put((result, error))

        self.record("start_stream", None, client.start_stream, callback)
        if not self.report["calls"][-1]["ok"]:
            return
        sent = {}
        for case, (model, arrays) in self.cases.items():
            self.record(
                "async_stream_infer",
                model,
                client.async_stream_infer,
                model,
                infer_inputs(arrays),
                request_id=f"stream-{case}",
            )
            if self.report["calls"][-1]["ok"]:
                sent[f"stream-{case}"] = case
        bad = bad_inputs()
        self.record(
            "async_stream_infer[bad]",
            "mlp",
            client.async_stream_infer,
            "mlp",
            bad,
            request_id="stream-bad",
        )
        # Waits until the server has answered every request and closed its side.
        self.record("stop_stream", None, client.stop_stream)
        errors = []
        while True:
            try:
                result, error = got.get_nowait()
            except queue.Empty:
                break
            if error is not None:
                errors.append(error)
                continue
            response = result.get_response()
            # Triton marks every stream answer final (one per request for a non-decoupled model).
            final = response.parameters.get("triton_final_response")
            self.report.setdefault("stream_final_flags", []).append(final is not None and final.bool_param)
            rid = response.id
            case = sent.pop(rid, None)
            if case is None:
                self.fail("stream.result", None, f"unexpected response id {rid!r}")
                continue
            self.record("stream.result", self.cases[case][0], self.save_result, "stream", case, result)
        for rid in sent:
            self.fail("stream.result", None, f"no response for {rid}")
        self.report["stream_errors"] = [describe(e) for e in errors]
        # Triton puts a failed streamed request's error in error_message, which tritonclient
        # turns into an InferenceServerException without a status.
        if len(errors) != 1 or "INPUT0" not in errors[0].message():
            self.fail(
                "stream.bad_request",
                "mlp",
                f"want one error naming INPUT0, got {self.report['stream_errors']}",
            )

    def bad_request(self, client) -> None:
        entry = {"raised": False, "status": None, "message": None}
        self.report["bad_request"] = entry
        try:
            client.infer("mlp", bad_inputs(), client_timeout=CALL_TIMEOUT_S)
        except InferenceServerException as exc:
            entry.update(raised=True, status=exc.status(), message=exc.message())
        ok = entry["status"] == "StatusCode.INVALID_ARGUMENT" and "INPUT0" in (entry["message"] or "")
        self.report["calls"].append(
            {
                "call": "infer[bad shape]",
                "model": "mlp",
                "ok": ok,
                "error": None if ok else json.dumps(entry),
            }
        )

    def unsupported_features(self, client) -> None:
        """Triton features wok does not offer: refused with INVALID_ARGUMENT naming them, never
        ignored (a class_count ignored would return the whole tensor as if it were the top k)."""
        a = np.zeros((1, 256), dtype=np.float32)
        plain = grpcclient.InferInput("INPUT0", list(a.shape), "FP32")
        plain.set_data_from_numpy(a)
        shm = grpcclient.InferInput("INPUT0", list(a.shape), "FP32")
        shm.set_shared_memory("region0", a.nbytes)
        attempts = {
            "class_count": ([plain], [grpcclient.InferRequestedOutput("OUTPUT0", class_count=3)]),
            "shared_memory_input": ([shm], None),
        }
        for name, (inputs, outputs) in attempts.items():
            entry = {"raised": False, "status": None, "message": None}
            try:
                client.infer("mlp", inputs, outputs=outputs, client_timeout=CALL_TIMEOUT_S)
            except InferenceServerException as exc:
                entry.update(raised=True, status=exc.status(), message=exc.message())
            self.report.setdefault("unsupported", {})[name] = entry

    def output_twice(self, client) -> None:
        """An output named twice in tritonclient's outputs list: refused, naming both places."""
        a = np.zeros((1, 256), dtype=np.float32)
        inp = grpcclient.InferInput("INPUT0", list(a.shape), "FP32")
        inp.set_data_from_numpy(a)
        outputs = [grpcclient.InferRequestedOutput("OUTPUT0"), grpcclient.InferRequestedOutput("OUTPUT0")]
        entry = {"raised": False, "status": None, "message": None}
        try:
            client.infer("mlp", [inp], outputs=outputs, client_timeout=CALL_TIMEOUT_S)
        except InferenceServerException as exc:
            entry.update(raised=True, status=exc.status(), message=exc.message())
        self.report["output_twice"] = entry

    async def aio_infer(self) -> None:
        async with aioclient.InferenceServerClient(self.target) as client:
            if not await client.is_server_ready():
                self.fail("aio.is_server_ready", None, "aio client: server not ready")

            async def one(case: str, model: str, arrays: dict[str, np.ndarray]) -> None:
                entry = {"call": "aio.infer", "model": model, "ok": False, "error": None}
                self.report["calls"].append(entry)
                try:
                    result = await client.infer(
                        model,
                        infer_inputs(arrays),
                        request_id=f"aio-{case}",
                        client_timeout=CALL_TIMEOUT_S,
                    )
                    self.save_result("aio", case, result)
                except Exception as exc:
                    entry["error"] = describe(exc)
                    return
                entry["ok"] = True

            await asyncio.gather(*(one(c, m, a) for c, (m, a) in self.cases.items()))

    # -- the whole run --------------------------------------------------------------------
    def run(self) -> int:
        self.save_inputs()
        client = grpcclient.InferenceServerClient(self.target)
        try:
            self.health_and_metadata(client)
            self.statistics(client, "before")
            self.sync_infer(client)
            self.typed_infer(client)
            self.callback_infer(client)
            self.stream_infer(client)
            self.record("aio", None, asyncio.run, self.aio_infer())
            self.bad_request(client)
            self.unsupported_features(client)
            self.output_twice(client)
            self.statistics(client, "after")
        finally:
            client.close()
        # The whole point of a separate process: a wok import here would hide a clash.
        self.report["wok_imported"] = wok_imported()
        if self.report["wok_imported"]:
            self.fail("isolation", None, "the peer process imported wok")
        return finish(self, "triton_peer", lambda c: f"{c['call']} ({c['model']}): {c['error']}")

    def write(self) -> None:
        (self.outdir / "report.json").write_text(json.dumps(self.report, indent=2, sort_keys=True))


def bad_inputs() -> list:
    """An mlp request one feature short: the server must refuse it, naming INPUT0."""
    a = np.zeros((2, 255), dtype=np.float32)
    inp = grpcclient.InferInput("INPUT0", list(a.shape), "FP32")
    inp.set_data_from_numpy(a)
    return [inp]


def _output_of(model: str) -> str:
    return {"mlp": "OUTPUT0", "recsys": "score", "encoder": "embedding"}[model]


if __name__ == "__main__":
    sys.exit(main(Peer, sys.argv, "triton_peer.py"))
