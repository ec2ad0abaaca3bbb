"""What reading a ModelInferRequest costs the event loop, protobuf's parse against wok's (server/codec.py).

    python bench/large_decode.py [--reps 15] [--json out.json]

A request of `codec.LARGE_REQUEST` bytes or more is read by `parse_infer_request`: its raw tensors as views of
the received bytes, its size counted without serializing it. Below that size it is protobuf's parse, as before.
Each figure is one request's parse, size (`ByteSize`, as the server's size limit reads it) and a read of every
raw entry, the two ways interleaved within each rep (the order reversed every other rep); the medians of the
reps, and the median of the per-rep ratios.
"""

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
    report = {"schema": SCHEMA, "reps": args.reps, "large_request_bytes": LARGE_REQUEST, "results": results}
    print(f"{'request bytes':>14}{'protobuf µs':>14}{'wok µs':>12}{'wok/protobuf':>14}")
    for r in results:
        m = r["median_us"]
        print(f"{r['bytes']:>14}{m['protobuf']:>14.2f}{m['wok']:>12.2f}{r['median_ratio_wok_over_protobuf']:>14.4g}")
    return finish_json(report, args.json, "large_decode: ")


if __name__ == "__main__":
    sys.exit(main())
