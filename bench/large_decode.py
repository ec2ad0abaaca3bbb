"""What reading a ModelInferRequest costs the event loop, protobuf's parse against wok's (server/codec.py).

    python bench/large_decode.py [--reps 15] [--json out.json] [--codec-before NAME=FILE ...]

A request of `codec.LARGE_REQUEST` bytes or more is read by `parse_infer_request`: its raw tensors as views of
the received bytes, its size counted without serializing it. Below that size protobuf parses it.
Each figure (`results`) is one request's parse, size (`ByteSize`, as the server's size limit read it until 2026-12-06)
and a read of every raw entry, the two ways interleaved within each rep (the order reversed every other rep); the
medians of the reps, and the median of the per-rep ratios. The server no longer reads ByteSize (its limit is held by
the bytes received), so protobuf's figure there counts a serialization it no longer pays: its read since is
`break_even`'s, kept here to compare with the files before.

`break_even`: where `codec.LARGE_REQUEST` lies: the server's read of a request of one raw FP32 tensor of 16 to 256 KiB
(`decode_request(in_steps=True)` of it parsed), by protobuf's parse against the walk's (`codec._parse_large`, its way
from LARGE_REQUEST), interleaved as above, each figure this thread's CPU time.

`size_check`: the server's size limit on the demo mlp's requests (1 and 32 rows), held the two ways it has been:
by the parsed message's ByteSize() in decode_request (a serialization of it), and by the bytes received, in the
deserializer (since 2026-12-06); the server's deserializer and decode_request(in_steps=True) timed together
(`read`), and decode_request alone over messages parsed beforehand (`decode`); the four interleaved as above,
each timed by this thread's CPU time (`time.thread_time`: the time other processes take the core from it is not
counted, on a shared machine most of the noise of a figure of microseconds).

`codecs` (with `--codec-before NAME=FILE`, FILE an older server/codec.py, e.g. `git show REV:server/codec.py`): the
server's read of the same mlp requests (its deserializer's `parse_infer_request` and `decode_request(in_steps=True)`)
by this checkout's codec against each FILE's, loaded into this process as a module of the wok package beside it
(its decode_request is handed a Servable of this checkout's, with the file's own DecodePlan where it has one),
interleaved and timed as `size_check`'s.

`oversized`: what refusing a request over the server's --max-request-bytes costs the event loop, for a typed
INT64 request of about 60 MiB over a limit L of 16 MiB (gRPC's receive limit, 4·L + 1 MiB, lets it through to
wok's refusal): the server's deserializer and decode_request's refusal together, the request parsed whole and then
refused (as until 2026-12-06) against only its model_name, model_version and id parsed (since), interleaved as
above, each figure one refusal's wall time; and its `worst_cases`, requests over the limit whose head the walk does
not read (`WORST_CASES`: more than 1,024 top-level fields, a tag cut short after the tensor), parsed whole (before
codec.UnreadOversized) against refused unread (since), the same way."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable

from wok.bench.outputs import finish_json, refuse_unwritable
from wok.bench.payloads import integer_refusal

SCHEMA = "wok.large_decode/1"
# Request sizes (bytes of raw FP32 tensor): below LARGE_REQUEST, at it, and well past it.
SIZES = (1 << 10, 16 << 10, 96 << 10, 1 << 20, 64 << 20)


def _alternated(ways: dict, reps: int, figure: Callable, warm: Callable | None = None) -> dict[str, list[float]]:
    """Each way's `figure(way)` once a rep, the ways in turn, their order reversed every other rep (so that neither
    always runs first), after one `warm(way)` each (`figure` where none is given)."""
    times: dict[str, list[float]] = {name: [] for name in ways}
    for way in ways.values():
        (warm or figure)(way)
    for rep in range(reps):
        order = list(ways.items())
        for name, way in order if rep % 2 == 0 else reversed(order):
            times[name].append(figure(way))
    return times


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
        times = _alternated(
            ways,
            reps,
            lambda parse, data=data, loops=loops: sum(_read(parse, data) for _ in range(loops)) / loops,
            lambda parse, data=data: _read(parse, data),
        )
        medians = {name: 1e6 * statistics.median(v) for name, v in times.items()}
        ratio = statistics.median(a / b for a, b in zip(times["wok"], times["protobuf"]))
        out.append({"bytes": len(data), "loops": loops, "median_us": medians, "median_ratio_wok_over_protobuf": ratio})
        progress(size)
    return out


# Request sizes (bytes of raw FP32 tensor) of `break_even`: around LARGE_REQUEST, on both sides of it.
BREAK_EVEN_SIZES = (16 << 10, 32 << 10, 48 << 10, 64 << 10, 96 << 10, 128 << 10, 192 << 10, 256 << 10)


def _break_even(reps: int, progress) -> list[dict]:
    """The server's read of a request of one raw FP32 tensor, protobuf's parse (below LARGE_REQUEST) against the walk
    (`codec._parse_large`, from it), each followed by `decode_request(in_steps=True)`, as the server reads it since
    its size is held by the bytes received (no ByteSize); each figure this thread's CPU time."""
    from torch import nn

    from wok import codec
    from wok.config import model_config_from_dict
    from wok.servable import Servable

    cfg = model_config_from_dict(
        {
            "name": "mlp",
            "platform": "python",
            "factory": "x:y",
            "max_batch_size": 1,
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "dims": [-1]}],
            "outputs": [{"name": "Y", "datatype": "FP32", "dims": [-1]}],
        },
        "break_even",
    )
    servable = Servable(cfg, nn.Identity())
    decode = codec.decode_request

    def way(parse):
        def run(data: bytes, loops: int) -> float:
            began = time.thread_time()
            for _ in range(loops):
                decode(parse(data), servable, in_steps=True)
            return time.thread_time() - began

        return run

    ways = {"protobuf": way(codec.pb.ModelInferRequest.FromString), "walk": way(codec._parse_large)}
    out = []
    for size in BREAK_EVEN_SIZES:
        data = _request(size)
        assert type(codec._parse_large(data)) is codec.ReceivedRequest, "the walk left it to protobuf"
        loops = max(1, (1 << 24) // size)  # ~a few ms a figure
        times = _alternated(ways, reps, lambda run, data=data, loops=loops: run(data, loops) / loops)
        ratios = [b / a for a, b in zip(times["protobuf"], times["walk"])]
        out.append(
            {
                "bytes": len(data),
                "loops": loops,
                "median_us": {name: 1e6 * statistics.median(v) for name, v in times.items()},
                "median_ratio_walk_over_protobuf": statistics.median(ratios),
                "ratio_range": [min(ratios), max(ratios)],
            }
        )
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
        times = _alternated(ways, reps, lambda run, data=data: run(data) / loops)
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


def _load_codec(name: str, path: str):
    """The codec.py at `path` as the module `wok._codec_NAME`, its relative imports resolved in this wok."""
    import importlib.util

    module_name = f"wok._codec_{name}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


def _codecs(reps: int, files: dict[str, str], progress) -> dict:
    """The server's read of the mlp's requests by this checkout's codec (`current`) against each older codec.py of
    `files` (name -> path): parse_infer_request, then decode_request(in_steps=True), each codec's own."""
    import numpy as np

    from wok import codec
    from wok.config import ServerSettings
    from wok.models import build_demo

    limit = ServerSettings().max_request_bytes
    modules = {"current": codec, **{name: _load_codec(name, path) for name, path in files.items()}}
    servables = {}
    for name, module in modules.items():
        servables[name] = servable = build_demo("mlp")
        if hasattr(module, "DecodePlan"):  # the plan its decode_request reads, as its Servable built it
            servable.decode_plan = module.DecodePlan(servable.config)
    loops = 2000

    def read(name, module):
        parse, decode, servable = module.parse_infer_request, module.decode_request, servables[name]

        def run(data: bytes) -> float:
            began = time.thread_time()
            for _ in range(loops):
                decode(parse(data, limit), servable, in_steps=True)
            return time.thread_time() - began

        return run

    ways = {name: read(name, module) for name, module in modules.items()}
    out = []
    for rows in SIZE_CHECK_ROWS:
        x = np.arange(rows * 256, dtype=np.float32).reshape(rows, 256) / 1024
        data = codec.encode_request("mlp", {"INPUT0": x}).SerializeToString()
        for name, module in modules.items():  # each codec reads the request as this one does
            got = module.decode_request(module.parse_infer_request(data, limit), servables[name], in_steps=True)
            if got.inputs.keys() != {"INPUT0"} or not np.array_equal(got.inputs["INPUT0"], x) or got.rows != rows:
                raise RuntimeError(
                    f"codec {name} ({files.get(name, codec.__file__)}) read the {rows}-row request as {got}"
                )
        times = _alternated(ways, reps, lambda run, data=data: run(data) / loops)
        diffs = {name: [1e6 * (b - a) for a, b in zip(times["current"], times[name])] for name in files}
        out.append(
            {
                "rows": rows,
                "bytes": len(data),
                "loops": loops,
                "median_us": {name: 1e6 * statistics.median(v) for name, v in times.items()},
                "median_saved_us": {name: statistics.median(d) for name, d in diffs.items()},
                "saved_us_range": {name: [min(d), max(d)] for name, d in diffs.items()},
                "median_ratio_current_over": {
                    name: statistics.median(a / b for a, b in zip(times["current"], times[name])) for name in files
                },
            }
        )
        progress(rows)
    return {"model": "mlp", "max_request_bytes": limit, "files": dict(files), "results": out}


def _codec_file(text: str) -> tuple[str, str]:
    """--codec-before's NAME=FILE."""
    name, sep, path = text.partition("=")
    if not sep or not name.isidentifier() or name == "current" or not path:
        raise argparse.ArgumentTypeError(
            f"expected NAME=FILE, NAME a Python identifier other than 'current'; got {text!r}"
        )
    return name, path


# The typed INT64 request of `oversized`: values of 8-byte varints, ~60 MiB.
OVERSIZED_VALUES = 7_800_000
OVERSIZED_LIMIT = 16 << 20  # the --max-request-bytes it is refused under


def _typed_oversized() -> bytes:
    import numpy as np

    from wok import codec

    req = codec.pb.ModelInferRequest(model_name="mlp", id="big")
    values = np.arange(1 << 49, (1 << 49) + OVERSIZED_VALUES, dtype=np.int64)
    req.inputs.add(name="INPUT0", datatype="INT64", shape=[1, OVERSIZED_VALUES]).contents.int64_contents.extend(values)
    return req.SerializeToString()


def _entry(key: bytes) -> bytes:
    """A `parameters` map entry (field 4) of `key` and no value, as a top-level field."""
    return b"\x22" + bytes([len(key) + 2, 0x0A, len(key)]) + key


# The requests over the limit whose head the walk does not read (`oversized`'s `worst_cases`), each built from the
# typed request: 1,025 parameters before its tensor (1,028 top-level fields), the same bytes in empty parameters
# (2-byte fields: the most fields a message of its size holds, each a map entry protobuf parses), and a tag cut
# short after its tensor (protobuf parses the tensor before it meets it).
WORST_CASES = {
    "many_fields": lambda typed: b"".join(_entry(b"p%04d" % i) for i in range(1025)) + typed,
    "tiny_fields": lambda typed: b"\x0a\x03mlp" + b"\x22\x00" * ((len(typed) - 5) // 2),
    "cut_short": lambda typed: typed + b"\x80",
}


def _oversized(reps: int) -> dict:
    """Refusing a typed request over the limit: parsed whole (until 2026-12-06) against its head alone (`_head_of`);
    and the WORST_CASES, whose head the walk does not read: parsed whole (before UnreadOversized: the walk, then
    protobuf's parse) against refused unread (since)."""
    from google.protobuf.message import DecodeError

    from wok import codec
    from wok.errors import InvalidInput
    from wok.models import build_demo

    servable = build_demo("mlp")
    typed = _typed_oversized()

    def alternated(data: bytes, whole: Callable) -> dict[str, list[float]]:
        def head(data: bytes):
            return codec.parse_infer_request(data, OVERSIZED_LIMIT)

        def refuse(parse) -> float:
            began = time.perf_counter()
            try:
                codec.decode_request(parse(data), servable, in_steps=True)
            except (InvalidInput, DecodeError):  # a DecodeError: refused as a message that does not parse (Unparsed)
                return time.perf_counter() - began
            raise AssertionError("the oversized request was not refused")

        return _alternated({"parse_whole": whole, "head_only": head}, reps, refuse)

    def figures(times: dict[str, list[float]]) -> dict:
        return {
            "median_us": {name: 1e6 * statistics.median(v) for name, v in times.items()},
            "us_range": {name: [1e6 * min(v), 1e6 * max(v)] for name, v in times.items()},
            # each rep's, in rep order: head_only runs right after parse_whole in the even reps (0, 2, ...), right
            # after head_only in the odd ones, which its spread shows (docs/performance.md)
            "runs_us": {name: [1e6 * t for t in v] for name, v in times.items()},
            "median_ratio_head_over_whole": statistics.median(
                b / a for a, b in zip(times["parse_whole"], times["head_only"])
            ),
        }

    size = len(typed)
    # parse_infer_request's way until 2026-12-06: the whole message parsed, then wrapped.
    part = {"bytes": size, "values": OVERSIZED_VALUES, "max_request_bytes": OVERSIZED_LIMIT}
    part |= figures(
        alternated(typed, lambda data: codec.OversizedRequest(codec._parse_large(data), size, OVERSIZED_LIMIT))
    )
    worst = []
    for name, build in WORST_CASES.items():
        data = build(typed)

        def whole(data: bytes):
            # Its way before UnreadOversized: the head's walk, given up, then the parse of the whole (its walk again).
            codec._top_fields(data)
            return codec.OversizedRequest(codec._parse_large(data), len(data), OVERSIZED_LIMIT)

        walk = codec._top_fields(data)
        assert type(walk) is str, f"{name}: the walk read its fields"
        worst.append({"case": name, "bytes": len(data), "unread": walk} | figures(alternated(data, whole)))
        del data
    part["worst_cases"] = worst
    return part


def _after(runs: list[float]) -> str:
    """A way's reps in their two groups (`_alternated` reverses the order every other rep), as the summary shows
    them: the median of the even reps (0, 2, ...), each run right after the other way, and of the odd ones, right
    after the same way again. The head alone took about ten times as long after a whole parse as after another
    refusal (caches and TLB emptied by 60 MiB: docs/performance.md), and the median of all its reps is one of the
    two; "none" for a group of no rep (one rep)."""
    groups = [("a whole parse", runs[0::2]), ("another refusal", runs[1::2])]
    return ", ".join(
        f"{what} {statistics.median(v):,.1f} µs (median of {len(v)})" if v else f"{what} none" for what, v in groups
    )


def oversized_lines(part: dict) -> list[str]:
    """`oversized`'s summary, as `main` prints it: each request's medians, parsed whole and by its head alone (or
    refused unread), then the head's in its two groups of reps, by the way run before it (`_after`, from
    `runs_us`)."""
    m = part["median_us"]
    lines = [
        f"refusing a typed request of {part['bytes']:,} bytes over a limit of {part['max_request_bytes']:,}: parsed "
        f"whole {m['parse_whole']:,.1f} µs, its head only {m['head_only']:,.1f} µs "
        f"(median ratio {part['median_ratio_head_over_whole']:.3g})",
        f"    its head only, by the way run before it: {_after(part['runs_us']['head_only'])}",
    ]
    for w in part["worst_cases"]:
        m = w["median_us"]
        lines.append(
            f"  {w['case']} ({w['bytes']:,} bytes, {w['unread']}): parsed whole {m['parse_whole']:,.1f} µs, refused "
            f"unread {m['head_only']:,.1f} µs (median ratio {w['median_ratio_head_over_whole']:.3g})"
        )
        lines.append(f"    refused unread, by the way run before it: {_after(w['runs_us']['head_only'])}")
    return lines


def build_parser() -> argparse.ArgumentParser:
    """This script's parser (tests/deploy/test_doc_commands.py parses the docs' command lines with it)."""
    from wok.cliargs import ArgumentParser  # argparse's, its refusals in wok's words

    ap = ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=15, help="repetitions, each way once per rep (default 15)")
    ap.add_argument("--json", help="write the figures here (schema wok.large_decode/1)")
    ap.add_argument(
        "--codec-before",
        type=_codec_file,
        action="append",
        default=[],
        metavar="NAME=FILE",
        help="an older server/codec.py to time the mlp's read against (the `codecs` part); repeatable",
    )
    return ap


def main(argv=None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    refuse_unwritable(ap, args, "--json")
    if (refusal := integer_refusal("--reps", args.reps, 1)) is not None:
        ap.error(refusal)
    files = dict(args.codec_before)
    if len(files) < len(args.codec_before):
        names = [name for name, _ in args.codec_before]
        twice = sorted({name for name in names if names.count(name) > 1})
        ap.error(f"--codec-before: expected each NAME once; got {', '.join(twice)} more than once")
    for name, path in files.items():
        if not os.path.isfile(path):
            ap.error(f"--codec-before {name}: expected a file; got {path!r}")
    from wok.codec import LARGE_REQUEST

    results = _measure(args.reps, lambda size: print(f"{size} bytes done", file=sys.stderr, flush=True))
    break_even = _break_even(
        args.reps, lambda size: print(f"break-even, {size} bytes done", file=sys.stderr, flush=True)
    )
    sizing = _size_check(args.reps, lambda rows: print(f"size check, {rows} rows done", file=sys.stderr, flush=True))
    oversized = _oversized(args.reps)
    print("oversized request done", file=sys.stderr, flush=True)
    report = {
        "schema": SCHEMA,
        "reps": args.reps,
        "large_request_bytes": LARGE_REQUEST,
        "results": results,
        "break_even": break_even,
        "size_check": sizing,
        "oversized": oversized,
    }
    if files:
        report["codecs"] = _codecs(
            args.reps, files, lambda rows: print(f"codecs, {rows} rows done", file=sys.stderr, flush=True)
        )
    print("a request's parse, ByteSize (which the server no longer reads) and raw entries, protobuf's against wok's")
    print(f"{'request bytes':>14}{'protobuf µs':>14}{'wok µs':>12}{'wok/protobuf':>14}")
    for r in results:
        m = r["median_us"]
        print(f"{r['bytes']:>14}{m['protobuf']:>14.2f}{m['wok']:>12.2f}{r['median_ratio_wok_over_protobuf']:>14.4g}")
    print(
        f"\nthe server's read (with decode_request), protobuf's parse against the walk (from {LARGE_REQUEST:,} bytes)"
    )
    print(f"{'request bytes':>14}{'protobuf µs':>14}{'walk µs':>12}{'walk/protobuf':>15}{'range':>16}")
    for r in break_even:
        m, (low, high) = r["median_us"], r["ratio_range"]
        print(
            f"{r['bytes']:>14}{m['protobuf']:>14.2f}{m['walk']:>12.2f}{r['median_ratio_walk_over_protobuf']:>15.3f}"
            f"{low:>8.3f}-{high:<7.3f}"
        )
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
    if files:
        print("\nthe server's read of the mlp's requests (parse and decode), this codec against each older one")
        print(f"{'rows':>5}{'bytes':>8}{'codec':>12}{'µs':>8}{'current µs':>12}{'saved':>8}{'current/it':>12}")
        for r in report["codecs"]["results"]:
            m = r["median_us"]
            for name in files:
                print(
                    f"{r['rows']:>5}{r['bytes']:>8}{name:>12}{m[name]:>8.2f}{m['current']:>12.2f}"
                    f"{r['median_saved_us'][name]:>8.2f}{r['median_ratio_current_over'][name]:>12.3f}"
                )
    print("\n" + "\n".join(oversized_lines(oversized)))
    return finish_json(report, args.json, "large_decode: ")


if __name__ == "__main__":
    sys.exit(main())
