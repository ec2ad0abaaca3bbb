"""The `server-timing` trailer: one request's stage times, for the client that asked for them.

With `server_timing` on (`wok serve --server-timing`), every unary ModelInfer answer carries
this trailer, in the syntax of the W3C Server-Timing header (`name;dur=ms, ...`), so a load
generator can split each latency into the server's stages and the time outside the server
(the client, the transport, gRPC's own work on both sides). Free of wok's other modules: the
bench's worker processes import it.
"""

from __future__ import annotations

SERVER_TIMING = "server-timing"
# Of one request, in the order they follow each other (perf_counter instants in `server_timing`);
# they add up to `total`.
TIMING_STAGES = ("decode", "queue", "batch", "respond", "encode", "total")
# Parts of `batch`, reported beside it: the wait for the worker to take the batch (the hop to
# its thread, or a batch or weight read before it) and the model's own time.
BATCH_PARTS = ("start", "compute")
TIMING_PARTS = TIMING_STAGES + BATCH_PARTS


def server_timing(
    arrival: float,
    queued: float,
    dispatched: float,
    started: float,
    compute: float,
    finished: float,
    resumed: float,
    done: float,
) -> str:
    """A `server-timing` value (W3C Server-Timing syntax, ms with µs resolution) of one request:
    decode (arrival → in the batcher's queue), queue (→ its batch dispatched), batch (→ the
    batch's outputs on the host), respond (→ its coroutine resumed on the loop), encode (→ the
    answer built), total (arrival → answer built); and inside batch, start (dispatched → the
    worker took the batch: the hop to the worker's thread, or a wait behind the batch or
    weight read before it) and compute (the model's forward; `compute` seconds). gRPC's own
    work before arrival and after the handler returns is outside all of them.
    """
    return (
        f"decode;dur={1e3 * (queued - arrival):.3f}, queue;dur={1e3 * (dispatched - queued):.3f}, "
        f"batch;dur={1e3 * (finished - dispatched):.3f}, respond;dur={1e3 * (resumed - finished):.3f}, "
        f"encode;dur={1e3 * (done - resumed):.3f}, total;dur={1e3 * (done - arrival):.3f}, "
        f"start;dur={1e3 * (started - dispatched):.3f}, compute;dur={1e3 * compute:.3f}"
    )


def parse_server_timing(value: str) -> dict[str, float]:
    """A `server-timing` value → {metric: duration in ms}; metrics without a dur are left out."""
    out: dict[str, float] = {}
    for metric in value.split(","):
        name, *params = (part.strip() for part in metric.split(";"))
        for param in params:
            key, _, dur = param.partition("=")
            if key == "dur" and name:
                try:
                    out[name] = float(dur)
                except ValueError:
                    raise ValueError(f"server-timing metric {name!r}: dur {dur!r} is not a number") from None
    return out
