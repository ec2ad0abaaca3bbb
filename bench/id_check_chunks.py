"""What checking a large request's ids costs the event loop: a check per chunk as read, against one of the whole input.

    python bench/id_check_chunks.py [--values 21000000] [--reps 5] [--json out.json]

An INT64 input sent as typed `contents` of more than `codec.CONTENTS_CHUNK` values is read a chunk per turn of the
event loop (`decode_request(in_steps=True)`, then `finish_decoding`); its ids are checked against the rows of the
embedding table they reach as each chunk is read (`codec._ChunkIds`). Until 2026-12-06 one min and max over the whole
input ran after its last chunk, in that chunk's turn: run here as it ran then, by a model with no `id_ranges` whose
value check (`Servable.check`, which `finish_decoding` runs in that same turn) is `codec.check_ids` of the whole input.

The request holds `--values` ids drawn in [2^14, 2^20) (3-byte varints) for a table of 2^20 rows, so every id passes
and both ways read it all. Each rep decodes it both ways, the order reversed every other rep, with a task beside the
decode turning the loop and timing the gaps between its turns: per way, the whole decode and the longest turn. Then
the medians over the reps, and the median of the per-rep ratios; and what the reductions alone take, over the
decoded input (its min and max whole, and a chunk's mean).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

from wok.bench.outputs import finish_json, refuse_unwritable
from wok.bench.payloads import integer_refusal

SCHEMA = "wok.id_check_chunks/1"
# The ids drawn: 3-byte varints on the wire, below the table's rows.
LOW, ROWS = 1 << 14, 1 << 20
WAYS = ("whole", "per_chunk")


def _request(values: int):
    """The request as the server reads it (`parse_infer_request` of its bytes), its size in bytes, and its ids."""
    import numpy as np

    from wok.codec import parse_infer_request, pb

    ids = np.random.default_rng(0).integers(LOW, ROWS, values, dtype=np.int64)
    req = pb.ModelInferRequest(model_name="lookup")
    req.inputs.add(name="ids", datatype="INT64", shape=[1, values]).contents.int64_contents.extend(ids.tolist())
    data = req.SerializeToString()
    return parse_infer_request(data), len(data), ids


def _servables(values: int) -> dict:
    """The model both ways: its ids checked per chunk (`id_ranges`), or whole after the last chunk (its `check`)."""
    from torch import nn

    from wok.codec import check_ids
    from wok.config import model_config_from_dict
    from wok.servable import Servable

    cfg = model_config_from_dict(
        {
            "name": "lookup",
            "platform": "python",
            "factory": "x:y",
            "inputs": [{"name": "ids", "datatype": "INT64", "dims": [values]}],
            "outputs": [{"name": "out", "datatype": "FP32", "dims": [1]}],
            "max_batch_size": 1,
        },
        "bench",
    )

    class WholeCheck(Servable):
        def check(self, inputs) -> None:
            check_ids({"ids": ROWS}, inputs, self.name)

    return {"whole": WholeCheck(cfg, nn.Identity()), "per_chunk": Servable(cfg, nn.Identity(), id_ranges={"ids": ROWS})}


async def _decode(req, servable) -> tuple[float, float, object]:
    """(the whole decode, the longest turn of the loop meanwhile), in seconds, and the decoded input."""
    import asyncio

    from wok.codec import decode_request, finish_decoding

    longest = 0.0
    done = False

    async def beside() -> None:
        nonlocal longest
        last = time.perf_counter()
        while not done:
            await asyncio.sleep(0)
            now = time.perf_counter()
            longest = max(longest, now - last)
            last = now

    task = asyncio.ensure_future(beside())
    await asyncio.sleep(0)  # the task turning before the decode's first turn
    try:
        began = time.perf_counter()
        dec = decode_request(req, servable, in_steps=True)
        await finish_decoding(dec, servable)
        took = time.perf_counter() - began
    finally:
        done = True
        await task
    return took, longest, dec.inputs["ids"]


def _reductions(a) -> tuple[float, float]:
    """(a min and a max of the whole input, their mean per chunk of CONTENTS_CHUNK), seconds."""
    from wok.codec import CONTENTS_CHUNK

    began = time.perf_counter()
    a.min(), a.max()
    whole = time.perf_counter() - began
    flat = a.reshape(-1)
    chunks = range(0, flat.size, CONTENTS_CHUNK)
    began = time.perf_counter()
    for start in chunks:
        chunk = flat[start : start + CONTENTS_CHUNK]
        chunk.min(), chunk.max()
    return whole, (time.perf_counter() - began) / len(chunks)


async def _measure(values: int, reps: int, progress) -> dict:
    import numpy as np

    req, size, sent = _request(values)
    servables = _servables(values)
    runs = {way: {"decode": [], "longest_turn": []} for way in WAYS}
    minmax = {"whole_input": [], "per_chunk": []}
    for way in WAYS:  # warm, and each way's read checked against the ids sent
        _, _, a = await _decode(req, servables[way])
        if not np.array_equal(a.reshape(-1), sent):
            raise RuntimeError(f"the {way} decode read other ids than were sent")
    del sent, a
    for rep in range(reps):
        for way in WAYS if rep % 2 == 0 else reversed(WAYS):
            took, longest, a = await _decode(req, servables[way])
            runs[way]["decode"].append(took)
            runs[way]["longest_turn"].append(longest)
        whole, chunk = _reductions(a)
        minmax["whole_input"].append(whole)
        minmax["per_chunk"].append(chunk)
        del a
        progress(rep)
    ms = {way: {k: [1e3 * t for t in v] for k, v in r.items()} for way, r in runs.items()}
    return {
        "request_bytes": size,
        "median_ms": {way: {k: statistics.median(v) for k, v in r.items()} for way, r in ms.items()},
        "median_ratio_per_chunk_over_whole": {
            k: statistics.median(a / b for a, b in zip(ms["per_chunk"][k], ms["whole"][k])) for k in ms["whole"]
        },
        "runs_ms": ms,
        "minmax": {
            "whole_input_ms": 1e3 * statistics.median(minmax["whole_input"]),
            "per_chunk_us": 1e6 * statistics.median(minmax["per_chunk"]),
        },
    }


def build_parser() -> argparse.ArgumentParser:
    """This script's parser (tests/deploy/test_doc_commands.py parses the docs' command lines with it)."""
    from wok.cliargs import ArgumentParser  # argparse's, its refusals in wok's words

    ap = ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--values", type=int, default=21_000_000, help="ids in the request (default 21,000,000: 60 MiB)")
    ap.add_argument("--reps", type=int, default=5, help="repetitions, each way once per rep (default 5)")
    ap.add_argument("--json", help="write the figures here (schema wok.id_check_chunks/1)")
    return ap


def main(argv=None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    refuse_unwritable(ap, args, "--json")
    from wok.codec import CONTENTS_CHUNK

    # Fewer than two chunks' worth is read in one turn, and checked whole, either way.
    for option, value, least in (("--values", args.values, CONTENTS_CHUNK + 1), ("--reps", args.reps, 1)):
        if (refusal := integer_refusal(option, value, least)) is not None:
            ap.error(refusal)
    import asyncio

    import uvloop

    def say(rep: int) -> None:
        print(f"rep {rep + 1}/{args.reps} done", file=sys.stderr, flush=True)

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:  # the server's loop
        figures = runner.run(_measure(args.values, args.reps, say))
    report = {
        "schema": SCHEMA,
        "reps": args.reps,
        "values": args.values,
        "ids_from": LOW,
        "table_rows": ROWS,
        "contents_chunk": CONTENTS_CHUNK,
        "chunks": math.ceil(args.values / CONTENTS_CHUNK),
        **figures,
    }
    m, r = report["median_ms"], report["median_ratio_per_chunk_over_whole"]
    mib = report["request_bytes"] / 2**20
    print(f"{args.values:,} INT64 ids, {mib:.1f} MiB, {report['chunks']} chunks; medians of {args.reps} reps")
    print(f"{'':>30}{'whole decode ms':>17}{'longest turn ms':>17}")
    print(f"{'one check after the last chunk':<30}{m['whole']['decode']:>17.1f}{m['whole']['longest_turn']:>17.3f}")
    print(f"{'a check per chunk':<30}{m['per_chunk']['decode']:>17.1f}{m['per_chunk']['longest_turn']:>17.3f}")
    print(f"{'per chunk / whole (ratio)':<30}{r['decode']:>17.3f}{r['longest_turn']:>17.3f}")
    mm = report["minmax"]
    print(f"min and max alone: the whole input {mm['whole_input_ms']:.2f} ms, a chunk {mm['per_chunk_us']:.1f} µs")
    return finish_json(report, args.json, "id_check_chunks: ")


if __name__ == "__main__":
    sys.exit(main())
