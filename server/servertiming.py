"""The `server-timing` trailer: one request's stage times (and its batch's size), for the client that asked.

With `server_timing` on (`wok serve --server-timing`), every unary ModelInfer answer carries
this trailer, in the syntax of the W3C Server-Timing header (`name;dur=ms, ...`), so a load
generator can split each latency into the server's stages and the time outside the server
(the client, the transport, gRPC's own work on both sides). Free of wok's other modules but
fieldvalues and numerals (standard library alone): the bench's worker processes import it.
"""

from __future__ import annotations

from .fieldvalues import OWS, split_unquoted, unquoted
from .numerals import ascii_digits, read_float, underscore_note

SERVER_TIMING = "server-timing"
# Of one request, in the order they follow each other (perf_counter instants in `server_timing`);
# they add up to `total`.
TIMING_STAGES = ("decode", "queue", "batch", "respond", "encode", "total")
# Parts of `batch`, reported beside it: the wait for the worker to take the batch (the hop to
# its thread, or a batch or weight read before it) and the model's own time.
BATCH_PARTS = ("start", "compute")
TIMING_PARTS = TIMING_STAGES + BATCH_PARTS
# Not times: the size of the request's batch, its requests and its samples (rows), each a metric whose
# `desc` is the count (`batch_requests;desc=27`), as Server-Timing has no field for a count and its
# `dur` is a duration in ms. They let a reader weigh the per-request compute times by batch: each
# request of a batch of n carries the same compute, so it counts 1/n of that batch (bench/analysis.py).
TIMING_COUNTS = ("batch_requests", "batch_samples")
# The columns of the bench's per-request rows (bench/workers.py): the parts, then the counts.
TIMING_COLUMNS = TIMING_PARTS + TIMING_COUNTS


def server_timing(
    arrival: float,
    queued: float,
    dispatched: float,
    started: float,
    compute: float,
    finished: float,
    resumed: float,
    done: float,
    *,
    batch_requests: int | None = None,
    batch_samples: int | None = None,
) -> str:
    """A `server-timing` value (W3C Server-Timing syntax, ms with µs resolution) of one request:
    decode (arrival → in the batcher's queue), queue (→ its batch dispatched), batch (→ the
    batch's outputs on the host), respond (→ its coroutine resumed on the loop), encode (→ the
    answer built), total (arrival → answer built); and inside batch, start (dispatched → the
    worker took the batch: the hop to the worker's thread, or a wait behind the batch or
    weight read before it) and compute (the model's forward; `compute` seconds). gRPC's own
    work before arrival and after the handler returns is outside all of them. With
    `batch_requests` and `batch_samples`, its batch's size (TIMING_COUNTS) follows, each as a `desc`.
    """
    value = (
        f"decode;dur={1e3 * (queued - arrival):.3f}, queue;dur={1e3 * (dispatched - queued):.3f}, "
        f"batch;dur={1e3 * (finished - dispatched):.3f}, respond;dur={1e3 * (resumed - finished):.3f}, "
        f"encode;dur={1e3 * (done - resumed):.3f}, total;dur={1e3 * (done - arrival):.3f}, "
        f"start;dur={1e3 * (started - dispatched):.3f}, compute;dur={1e3 * compute:.3f}"
    )
    if batch_requests is not None:
        value += f", batch_requests;desc={batch_requests}"
    if batch_samples is not None:
        value += f", batch_samples;desc={batch_samples}"
    return value


def parse_server_timing(value: str) -> dict[str, float]:
    """A `server-timing` value → {metric: duration in ms}, and for the batch's counts (TIMING_COUNTS)
    {metric: its desc, a whole number}; other metrics without a dur are left out, and so are the counts
    where the server sent none (a server from before them)."""
    out: dict[str, float] = {}
    # Split outside quoted strings (RFC 9110 5.6.1, 5.6.4): at every comma and semicolon, another
    # server's `cache;desc="hit, miss";dur=1` made a metric `miss"` of 1 ms and lost `cache`.
    for metric in split_unquoted(value, ","):
        # OWS: the white space HTTP allows around them (RFC 9110 5.6.3).
        name, *params = (part.strip(OWS) for part in split_unquoted(metric, ";"))
        if not name:
            continue
        want = "desc" if name in TIMING_COUNTS else "dur"
        for param in params:
            key, _, given = param.partition("=")
            if key.strip(OWS) != want:
                continue
            given = given.strip(OWS)
            if want == "desc":
                count = unquoted(given)
                if not ascii_digits(count):
                    raise ValueError(
                        f"server-timing metric {name!r}: desc {given!r} is not a whole number{underscore_note(count)}"
                    )
                out[name] = float(count)
                continue
            try:
                out[name] = read_float(unquoted(given))
            except ValueError:
                raise ValueError(
                    f"server-timing metric {name!r}: dur {given!r} is not a number{underscore_note(given)}"
                ) from None
    return out
