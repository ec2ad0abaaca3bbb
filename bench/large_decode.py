"""What reading a ModelInferRequest costs the event loop, protobuf's parse against wok's (server/codec.py).

    python bench/large_decode.py [--reps 15] [--json out.json]

A request of `codec.LARGE_REQUEST` bytes or more is read by `parse_infer_request`: its raw tensors as views of
the received bytes, its size counted without serializing it. Below that size it is protobuf's parse, as before.
Each figure is one request's parse, size (`ByteSize`, as the server's size limit read it until 2026-12-06) and a
read of every raw entry, the two ways interleaved within each rep (the order reversed every other rep); the
medians of the reps, and the median of the per-rep ratios.

`size_check`: the server's size limit on the demo mlp's requests (1 and 32 rows), held the two ways it has been:
by the parsed message's ByteSize() in decode_request (a serialization of it), and by the bytes received, in the
deserializer (since 2026-12-06); the server's deserializer and decode_request(in_steps=True) timed together
(`read`), and decode_request alone over messages parsed beforehand (`decode`); the four interleaved as above,
each timed by this thread's CPU time (`time.thread_time`: the time other processes take the core from it is not
counted, on a shared machine most of the noise of a figure of microseconds)."""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from wok.bench.outputs import finish_json, refuse_unwritable
from wok.bench.payloads import integer_refusal

SCHEMA = "wok.large_decode/1"
# Request sizes (bytes of raw FP32 tensor): below LARGE_REQUEST, at it, and well past it.
SIZES = (1 << 10, 16 << 10, 64 << 10, 1 << 20, 64 << 20)


def _request(size: int) -> bytes:
    import numpy as np

    from wok.codec import pb

    req = pb.ModelInferRequest(model_name="mlp")
    req.inputs.add(name="INPUT0", datatype="FP32", shape=[1, size // 4])
    req.raw_input_contents.append(np.ones(size // 4, np.float32).tobytes())
    return req.SerializeToString()


def _read(parse, data: bytes) -> float:
    began = time.perf_counter()
    req = parse(data)
    req.ByteSize()
    for i in range(len(req.raw_input_contents)):
        req.raw_input_contents[i]
    return time.perf_counter() - began


def _measure(reps: int, progress) -> list[dict]:
    from wok.codec import parse_infer_request, pb

    ways = {"protobuf": pb.ModelInferRequest.FromString, "wok": parse_infer_request}
    out = []
    for size in SIZES:
        data = _request(size)
        # Small requests take microseconds: each figure is the mean of a loop long enough to time.
        loops = max(1, (1 << 22) // size)
        times: dict[str, list[float]] = {name: [] for name in ways}
        for parse in ways.values():  # warm
            _read(parse, data)
        for rep in range(reps):
            order = list(ways.items())
            for name, parse in order if rep % 2 == 0 else reversed(order):
                times[name].append(sum(_read(parse, data) for _ in range(loops)) / loops)
        medians = {name: 1e6 * statistics.median(v) for name, v in times.items()}
        ratio = statistics.median(a / b for a, b in zip(times["wok"], times["protobuf"]))
        out.append({"bytes": len(data), "loops": loops, "median_us": medians, "median_ratio_wok_over_protobuf": ratio})
        progress(size)
    return out


# The demo mlp's requests for `size_check`: one row (1 KiB of FP32), and its max_batch_size.
SIZE_CHECK_ROWS = (1, 32)
_METHOD = "/inference.GRPCInferenceService/ModelInfer"


def _size_check(reps: int, progress) -> dict:
    """The server's read of a small request, its size held by ByteSize against by the bytes received."""
    import numpy as np

    from wok.codec import decode_request, encode_request, pb
    from wok.config import ServerSettings
    from wok.models import build_demo
    from wok.service import tolerant_parser

    limit = ServerSettings().max_request_bytes
    servable = build_demo("mlp")
    by_bytesize = tolerant_parser(pb.ModelInferRequest, _METHOD)  # no limit: decode_request's ByteSize holds it
    by_received = tolerant_parser(pb.ModelInferRequest, _METHOD, limit)
    parse = pb.ModelInferRequest.FromString
    loops = 2000

    def read(deserialize, max_bytes):
        def run(data: bytes) -> float:
            began = time.thread_time()
            for _ in range(loops):
                decode_request(deserialize(data), servable, max_bytes, in_steps=True)
            return time.thread_time() - began

        return run

    def decode(max_bytes):
        def run(data: bytes) -> float:
            messages = [parse(data) for _ in range(loops)]  # parsed before the clock: decode_request alone
            began = time.thread_time()
            for m in messages:
                decode_request(m, servable, max_bytes, in_steps=True)
            return time.thread_time() - began

        return run

    ways = {
        "read_bytesize": read(by_bytesize, limit),
        "read_received": read(by_received, None),
        "decode_bytesize": decode(limit),
        "decode_received": decode(None),
    }
    out = []
    for rows in SIZE_CHECK_ROWS:
        x = np.arange(rows * 256, dtype=np.float32).reshape(rows, 256) / 1024
        data = encode_request("mlp", {"INPUT0": x}).SerializeToString()
        assert type(by_received(data)) is pb.ModelInferRequest  # the small path: no wrapper, no ByteSize
        times: dict[str, list[float]] = {name: [] for name in ways}
        for run in ways.values():  # warm
            run(data)
        for rep in range(reps):
            order = list(ways.items())
            for name, run in order if rep % 2 == 0 else reversed(order):
                times[name].append(run(data) / loops)
        medians = {name: 1e6 * statistics.median(v) for name, v in times.items()}
        diffs = {
            part: [1e6 * (a - b) for a, b in zip(times[f"{part}_bytesize"], times[f"{part}_received"])]
            for part in ("read", "decode")
        }
        saved = {part: statistics.median(d) for part, d in diffs.items()}
        spread = {part: [min(d), max(d)] for part, d in diffs.items()}
        ratio = {
            part: statistics.median(b / a for a, b in zip(times[f"{part}_bytesize"], times[f"{part}_received"]))
            for part in ("read", "decode")
        }
        out.append(
            {
                "rows": rows,
                "bytes": len(data),
                "loops": loops,
                "median_us": medians,
                "median_saved_us": saved,
                "saved_us_range": spread,
                "median_ratio_received_over_bytesize": ratio,
            }
        )
        progress(rows)
    return {"model": "mlp", "max_request_bytes": limit, "results": out}


def build_parser() -> argparse.ArgumentParser:
    """This script's parser (tests/deploy/test_doc_commands.py parses the docs' command lines with it)."""
    from wok.cliargs import ArgumentParser  # argparse's, its refusals in wok's words

    ap = ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=15, help="repetitions, each way once per rep (default 15)")
    ap.add_argument("--json", help="write the figures here (schema wok.large_decode/1)")
    return ap


def main(argv=None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    refuse_unwritable(ap, args, "--json")
    if (refusal := integer_refusal("--reps", args.reps, 1)) is not None:
        ap.error(refusal)
    from wok.codec import LARGE_REQUEST

    results = _measure(args.reps, lambda size: print(f"{size} bytes done", file=sys.stderr, flush=True))
    sizing = _size_check(args.reps, lambda rows: print(f"size check, {rows} rows done", file=sys.stderr, flush=True))
    report = {
        "schema": SCHEMA,
        "reps": args.reps,
        "large_request_bytes": LARGE_REQUEST,
        "results": results,
        "size_check": sizing,
    }
    print(f"{'request bytes':>14}{'protobuf µs':>14}{'wok µs':>12}{'wok/protobuf':>14}")
    for r in results:
        m = r["median_us"]
        print(f"{r['bytes']:>14}{m['protobuf']:>14.2f}{m['wok']:>12.2f}{r['median_ratio_wok_over_protobuf']:>14.4g}")
    print("\nthe size limit on the mlp's requests, by ByteSize against by the bytes received (µs a request)")
    print(
        f"{'rows':>5}{'bytes':>8}{'read: ByteSize':>16}{'received':>10}{'saved':>8}{'decode: ByteSize':>18}"
        f"{'received':>10}{'saved':>8}"
    )
    for r in sizing["results"]:
        m, d = r["median_us"], r["median_saved_us"]
        print(
            f"{r['rows']:>5}{r['bytes']:>8}{m['read_bytesize']:>16.2f}{m['read_received']:>10.2f}{d['read']:>8.2f}"
            f"{m['decode_bytesize']:>18.2f}{m['decode_received']:>10.2f}{d['decode']:>8.2f}"
        )
    return finish_json(report, args.json, "large_decode: ")


if __name__ == "__main__":
    sys.exit(main())
