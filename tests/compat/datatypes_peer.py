"""Send every datatype wok serves with Triton's own client, unmodified: `datatypes_peer.py TARGET OUTDIR`.

As triton_peer.py, it runs in its own process and never imports wok. It calls the model that
datatype_values.py describes through each of tritonclient's gRPC APIs (infer, async_infer, the
stream, tritonclient.grpc.aio), its tensors raw as set_data_from_numpy makes them, and writes
OUTDIR/report.json: what was sent, every answer as tritonclient's as_numpy read it (bit patterns,
as unsigned integers of the type's width), the model's metadata, config and statistics, and each
call's outcome, for test_tritonclient_datatypes.py to check. Exits non-zero, naming what failed, if
any call failed.
"""

from __future__ import annotations

import asyncio
import json
import queue
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient

# From the script's own folder, which Python puts first on sys.path: numpy only, no wok.
from datatype_values import CASES, MODEL, TOGETHER, TYPES, case_inputs
from peer_common import describe, finish, main, tritonclient_version, wok_imported
from tritonclient.utils import triton_to_np_dtype

# Generous, so a slow 2-core machine is not mistaken for a broken server.
CALL_TIMEOUT_S = 60.0
# tritonclient takes and gives BF16 as ml_dtypes.bfloat16 "since r26.06" (its error message says so),
# as a Triton user now writes it; before, it took float32 and kept each value's upper 16 bits, and
# widened answers back to float32.
BF16_NUMPY = np.dtype(triton_to_np_dtype("BF16"))
MODES = ("infer", "async_infer", "stream", "aio")


def client_array(t: str, a: np.ndarray) -> np.ndarray:
    """The array a Triton user hands set_data_from_numpy for values `a` of type `t` (BF16 as bits)."""
    if t != "BF16":
        return a
    if BF16_NUMPY.name == "float32":
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a.view(BF16_NUMPY)


def bits(datatype: str, a: np.ndarray) -> list:
    """A client-side array's bit patterns, as nested lists of unsigned integers of its type's width."""
    if datatype == "BF16" and a.dtype == np.float32:
        return (a.view(np.uint32) >> 16).astype(np.uint16).tolist()
    return a.view(f"u{a.dtype.itemsize}").tolist()


def infer_inputs(case: str) -> list:
    out = []
    for t, (name, values) in zip(TYPES, case_inputs(case).items(), strict=True):
        a = client_array(t, values)
        inp = grpcclient.InferInput(name, list(a.shape), t)
        inp.set_data_from_numpy(a)
        out.append(inp)
    return out


def call_options(mode: str, case: str) -> dict:
    _, _, version, requested = CASES[case]
    outputs = None if requested is None else [grpcclient.InferRequestedOutput(n) for n in requested]
    return {"model_version": version, "outputs": outputs, "request_id": f"{mode}-{case}"}


def answer(result) -> dict:
    """What the response says, and each output as tritonclient's as_numpy reads it."""
    resp = result.get_response()
    outputs = []
    for o in resp.outputs:
        a = result.as_numpy(o.name)
        outputs.append(
            {
                "name": o.name,
                "datatype": o.datatype,
                "shape": list(o.shape),
                "numpy": None if a is None else str(a.dtype),
                "numpy_shape": None if a is None else list(a.shape),
                "bits": None if a is None else bits(o.datatype, a),
            }
        )
    return {
        "model_name": resp.model_name,
        "model_version": resp.model_version,
        "id": resp.id,
        "raw_output_contents": len(resp.raw_output_contents),
        "outputs": outputs,
    }


class Peer:
    def __init__(self, target: str, outdir: Path) -> None:
        self.target = target
        self.outdir = outdir
        self.report: dict = {
            "tritonclient": tritonclient_version(),
            "bf16_numpy": str(BF16_NUMPY),
            "calls": [],
            "sent": {},
            "answers": {m: {} for m in MODES},
        }

    def record(self, call: str, fn, *args, **kwargs):
        """Run one call; its pass/fail (and error text) goes into the report."""
        entry = {"call": call, "ok": False, "error": None}
        self.report["calls"].append(entry)
        try:
            value = fn(*args, **kwargs)
        except Exception as exc:
            entry["error"] = describe(exc)
            return None
        entry["ok"] = True
        return value

    def fail(self, call: str, error: str) -> None:
        self.report["calls"].append({"call": call, "ok": False, "error": error})

    def keep(self, mode: str, case: str, result) -> None:
        self.record(f"{mode}.result[{case}]", self._keep, mode, case, result)

    def _keep(self, mode: str, case: str, result) -> None:
        self.report["answers"][mode][case] = answer(result)

    def save_sent(self) -> None:
        for case in CASES:
            sent = {}
            for t, (name, values) in zip(TYPES, case_inputs(case).items(), strict=True):
                a = client_array(t, values)
                sent[name] = {"datatype": t, "numpy": str(a.dtype), "shape": list(a.shape), "bits": bits(t, a)}
            self.report["sent"][case] = sent

    # -- the calls ------------------------------------------------------------------------
    def describe(self, client) -> None:
        self.report["metadata"] = self.record("get_model_metadata", client.get_model_metadata, MODEL, as_json=True)
        self.report["config"] = self.record("get_model_config", client.get_model_config, MODEL, as_json=True)

    def statistics(self, client, key: str) -> None:
        stats = self.record(f"get_inference_statistics[{key}]", client.get_inference_statistics, MODEL, as_json=True)
        self.report[f"statistics_{key}"] = stats

    def sync_infer(self, client) -> None:
        """`full` alone, then the others from threads at once, so that they share a batch."""

        def one(case: str) -> None:
            result = self.record(
                f"infer[{case}]",
                client.infer,
                MODEL,
                infer_inputs(case),
                client_timeout=CALL_TIMEOUT_S,
                **call_options("infer", case),
            )
            if result is not None:
                self.keep("infer", case, result)

        one("full")
        with ThreadPoolExecutor(len(TOGETHER)) as pool:
            list(pool.map(one, TOGETHER))

    def callback_infer(self, client) -> None:
        done: queue.Queue = queue.Queue()
        sent = []
        for case in TOGETHER:
            self.record(
                f"async_infer[{case}]",
                client.async_infer,
                MODEL,
                infer_inputs(case),
                lambda result, error, case=case: done.put((case, result, error)),
                client_timeout=CALL_TIMEOUT_S,
                **call_options("async_infer", case),
            )
            if self.report["calls"][-1]["ok"]:
                sent.append(case)
        for _ in sent:
            try:
                case, result, error = done.get(timeout=CALL_TIMEOUT_S)
            except queue.Empty:
                self.fail("async_infer.callback", "not every callback came back in time")
                return
            if error is not None:
                self.fail(f"async_infer.callback[{case}]", describe(error))
            else:
                self.keep("async_infer", case, result)

    def stream_infer(self, client) -> None:
        got: queue.Queue = queue.Queue()
        self.record("start_stream", client.start_stream, lambda result, error: got.put((result, error)))
        if not self.report["calls"][-1]["ok"]:
            return
        sent = {}
        for case in TOGETHER:
            self.record(
                f"async_stream_infer[{case}]",
                client.async_stream_infer,
                MODEL,
                infer_inputs(case),
                **call_options("stream", case),
            )
            if self.report["calls"][-1]["ok"]:
                sent[f"stream-{case}"] = case
        for _ in range(len(sent)):
            try:
                result, error = got.get(timeout=CALL_TIMEOUT_S)
            except queue.Empty:
                break
            if error is not None:
                self.fail("stream.callback", describe(error))
                continue
            rid = result.get_response().id
            case = sent.pop(rid, None)
            if case is None:
                self.fail("stream.result", f"unexpected response id {rid!r}")
                continue
            self.keep("stream", case, result)
        for rid in sent:
            self.fail("stream.result", f"no response for {rid}")
        self.record("stop_stream", client.stop_stream)

    async def aio_infer(self) -> None:
        async with aioclient.InferenceServerClient(self.target) as client:

            async def one(case: str) -> None:
                entry = {"call": f"aio.infer[{case}]", "ok": False, "error": None}
                self.report["calls"].append(entry)
                try:
                    result = await client.infer(
                        MODEL, infer_inputs(case), client_timeout=CALL_TIMEOUT_S, **call_options("aio", case)
                    )
                except Exception as exc:
                    entry["error"] = describe(exc)
                    return
                entry["ok"] = True
                self.keep("aio", case, result)

            await one("full")
            await asyncio.gather(*(one(c) for c in TOGETHER))

    # -- the whole run --------------------------------------------------------------------
    def run(self) -> int:
        self.save_sent()
        client = grpcclient.InferenceServerClient(self.target)
        try:
            self.describe(client)
            self.statistics(client, "before")
            self.sync_infer(client)
            self.callback_infer(client)
            self.stream_infer(client)
            self.record("aio", asyncio.run, self.aio_infer())
            self.statistics(client, "after")
        finally:
            client.close()
        # A wok import here would make this something other than a Triton user's process.
        self.report["wok_imported"] = wok_imported()
        if self.report["wok_imported"]:
            self.fail("isolation", "the peer process imported wok")
        return finish(self, "datatypes_peer", lambda c: f"{c['call']}: {c['error']}")

    def write(self) -> None:
        (self.outdir / "report.json").write_text(json.dumps(self.report, indent=1, sort_keys=True))


if __name__ == "__main__":
    sys.exit(main(Peer, sys.argv, "datatypes_peer.py"))
