"""A stepped QPS ramp: schedules each step, runs it on the workers, and judges it.

Each step's schedule comes from its arrival process (at the step's offered rate) and is
dealt round-robin to the workers, so every worker sends at a fraction of the rate. The
first `warmup_s` of each step run but are not counted. Latency is measured from each
request's intended send time, so a late send (or a stalled server) shows in the figures
of every request it delays.
"""

from __future__ import annotations

import functools
import math
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np

from wok.clients.channel import tls_mode

from . import analysis
from .arrivals import parse_arrivals, window_rate
from .payloads import (
    DEFAULT_INT_HIGH,
    POOL_CAP_BYTES,
    Mix,
    PayloadGenerator,
    PoolPlan,
    TensorSpec,
    integer_cap,
    parse_sizes,
    plan_pool,
)
from .scrape import Fleet, scrape, server_view
from .workers import (
    NOT_SENT,
    OK,
    STEPS_KEPT,
    Share,
    WorkerPool,
    WorkerProcesses,
    merge_details,
    pick_balancer,
    run_held,
)

if TYPE_CHECKING:
    from rich.console import Console

# Off a terminal, a step's progress line comes every tenth of the step, but no oftener than this
# (a short step prints none) and no rarer than that.
PLAIN_PROGRESS_MIN_S = 10.0
PLAIN_PROGRESS_MAX_S = 60.0
# How often PlainProgress's thread looks whether a line is due, as WorkerPool.finish ticks a ramp's step.
PLAIN_TICK_S = 0.2
STATUS_NAMES: dict[int, str] = {}


def plain_progress_every(total_s: float) -> float:
    """Off a terminal, seconds between a step's progress lines: a tenth of the step (`total_s`,
    its warm-up included), kept between PLAIN_PROGRESS_MIN_S and PLAIN_PROGRESS_MAX_S (read at each
    call), so that a short step prints none and a day-long one a line a minute."""
    return min(PLAIN_PROGRESS_MAX_S, max(PLAIN_PROGRESS_MIN_S, total_s / 10))


def live_bar_console() -> Console | None:
    """rich's Console on stderr where a live progress bar belongs: stderr is a terminal (isatty) that draws
    one (rich's is_interactive: not TERM=dumb). None elsewhere (nohup, CI, a pipe), where progress is plain lines
    (plain_progress_line, plain_count_line). Both halves, for the ramp and `wok profile` alike: rich takes a pipe for
    a terminal where FORCE_COLOR (or TTY_INTERACTIVE) is set, and the profile, asking rich alone, drew its bar into
    the log (until 2026-12-06)."""
    from rich.console import Console

    console = Console(stderr=True)
    return console if sys.stderr.isatty() and console.is_interactive else None


def plain_due(elapsed_s: float, due_s: float, every_s: float) -> float | None:
    """Off a terminal, the one rule of when a progress line is due, for a ramp's step and `wok profile` alike: a
    period `every_s` after the last one was due (`due_s`; 0 for none yet), `elapsed_s` seconds from the start. The
    time the line due now stands for, on that grid (a tick late by more than a period shows the latest period alone,
    and the next is due a period after it), else None. Until 2026-12-06 the profile's count timed its next line from
    the last one shown, the ramp from the step's start."""
    if elapsed_s < due_s + every_s:
        return None
    due = due_s + every_s * math.floor((elapsed_s - due_s) / every_s)
    # The division rounds where `elapsed_s` is on the grid to the last bit (a period of 38.93... s, 4 of them past 3):
    # the time stood for is the last that the check above, the next call's, finds passed, or a line due stood for the
    # one before, and the same was due again at the next look.
    while due + every_s <= elapsed_s:
        due += every_s
    return due


def plain_count_line(
    label: str, done: int, total: int, unit: str, elapsed_s: float, due_s: float
) -> tuple[str | None, float]:
    """Off a terminal, a line on the way through `total` items (`wok profile`'s batches), if one is due: (the line or
    None, the time the last line was due, `due_s` the same before; `plain_due`). `done` of them done `elapsed_s`
    seconds from the start. The period is a step's (plain_progress_every) for the whole's time as the pace so far
    foretells it (`elapsed_s` × `total` / `done`; before the first item, at least the time so far), which is all a
    count knows of it: none for a run over before the first period, none once the last item is done."""
    foretold = elapsed_s * total / done if done else elapsed_s
    if done >= total or (due := plain_due(elapsed_s, due_s, plain_progress_every(foretold))) is None:
        return None, due_s
    return f"{label}: {done}/{total} {unit} ({100 * done / total:.0f}%), {elapsed_s:.0f} s", due


def plain_progress_line(label: str, elapsed_s: float, total_s: float, due_s: float) -> tuple[str | None, float]:
    """Off a terminal, a step's progress line at `elapsed_s` (seconds since it started), if one is due: (the line or
    None, the time the last line was due, `due_s` the same before; `plain_due`). None at or after the step's end."""
    if elapsed_s >= total_s or (due := plain_due(elapsed_s, due_s, plain_progress_every(total_s))) is None:
        return None, due_s
    return f"{label}: {elapsed_s:.0f} s of {total_s:g} s ({100 * elapsed_s / total_s:.0f}%)", due


class PlainProgress:
    """Off a terminal, the progress of a run of `total` items (`wok profile`'s batches) in plain lines, said on time
    by a thread of its own while entered (`with`): a line is due by `plain_due` whether an item ends meanwhile or not.
    Until 2026-12-06 the lines were said as items ended, by the thread that ran them: a long start-up warm-up, a
    roofline's measurement or one batch slower than the period said nothing meanwhile. The items run elsewhere (the
    profile's model on the executor's thread, waited for by the caller's): this thread takes no lock but its own,
    held to read or change a count, never while a line is said.

    Called with the number of items just done (profiler.Progress); `phase(name)` names what runs where no item
    is counted (`None`: the items again): its line says that name and the time since the start, its period a step's
    for a whole at least as long as the time so far. `line()` is the line due now, if any, at `clock()`. `total` may
    be None until `count_to` says it, while a phase runs (`wok profile`'s model load: the model sets the count)."""

    def __init__(
        self,
        label: str,
        total: int | None,
        unit: str,
        say: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
        tick_s: float = PLAIN_TICK_S,
    ) -> None:
        self.label, self.total, self.unit, self.say, self.clock, self.tick_s = label, total, unit, say, clock, tick_s
        self._lock = threading.Lock()
        self._done = 0
        self._phase: str | None = None
        self._due = 0.0
        self._start = clock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def __call__(self, done: int) -> None:
        with self._lock:
            self._done += done

    def phase(self, name: str | None) -> None:
        with self._lock:
            self._phase = name

    def count_to(self, total: int) -> None:
        with self._lock:
            self.total = total

    def line(self) -> str | None:
        with self._lock:
            elapsed = self.clock() - self._start
            if self._phase is None and self.total is None:  # no count to say yet, nor a phase
                line, due = None, self._due
            elif self._phase is None:
                line, due = plain_count_line(self.label, self._done, self.total, self.unit, elapsed, self._due)
            else:
                due = plain_due(elapsed, self._due, plain_progress_every(elapsed))
                line = None if due is None else f"{self.label}: {self._phase}, {elapsed:.0f} s"
            if line is not None:
                # Said later than a look after the time it stands for (the process was paused, Ctrl-Z; a phase's or a
                # faster pace's shorter period), it starts the grid again: on the old one the next was due at once,
                # two lines a moment apart. A line a look late or less keeps the grid, so the lines do not drift.
                self._due = elapsed if elapsed - due > self.tick_s else due
            return line

    def _run(self) -> None:
        while not self._stopped.wait(self.tick_s):
            if (line := self.line()) is not None:
                self.say(line)

    def __enter__(self) -> PlainProgress:
        # A daemon: one left saying a line into a pipe nobody reads does not hold the process's exit.
        self._thread = threading.Thread(target=self._run, name="wok-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        # No line after this: a refusal or the table follows.
        self._stopped.set()
        if self._thread is not None:
            self._thread.join()


def status_name(code: int) -> str:
    """A status number's name: gRPC's, or "NOT_SENT" for a request of a cut step never sent (workers.Outcome)."""
    if not STATUS_NAMES:
        import grpc

        STATUS_NAMES.update({c.value[0]: c.name for c in grpc.StatusCode})
        STATUS_NAMES[NOT_SENT] = analysis.NOT_SENT
    return STATUS_NAMES.get(int(code), str(code))


def wall_offset(tries: int = 5) -> float:
    """time.time() − time.monotonic() now, in s.

    Two clock reads in a row are not one instant: a thread descheduled between them (a few ms on a
    busy machine) would put the difference off by the stall, and a step's wall-clock slot with it.
    Each try brackets the wall-clock read between two monotonic ones; the tightest bracket's
    midpoint is taken."""
    best_gap, offset = math.inf, 0.0
    for _ in range(tries):
        before = time.monotonic()
        wall = time.time()
        after = time.monotonic()
        if after - before < best_gap:
            best_gap, offset = after - before, wall - (before + after) / 2
        if best_gap < 50e-6:
            break
    return offset


@dataclass
class RampConfig:
    target: str
    models: list[tuple[str, float]]  # (model, weight)
    steps: list[float]  # offered QPS per step
    step_duration_s: float
    warmup_s: float = 1.0
    arrival: str = "poisson"
    sizes: str = "fixed:16"
    rows: int = 1
    int_high: int = DEFAULT_INT_HIGH  # integer inputs uniform in [0, int_high), but those with a published bound
    # --int-high given: every integer input below int_high, the bounds the server publishes unread (`published_bounds`)
    int_high_given: bool = False
    slo_p99_ms: float = 200.0
    workers: int = 2
    timeout_s: float = 30.0
    metrics_url: str | None = None
    # Each replica's /metrics (`--replicas` with `--metrics-url auto`): scraped at each step and summed
    # (scrape.Fleet) into the server view, in place of metrics_url's.
    replica_metrics: list[str] | None = None
    seed: int = 0
    stop_factor: float = 10.0
    refine: int = 0
    knee_threshold: float = 0.5
    tls: object = None  # wok.clients.TLS, True (bundled roots) or None (plaintext)
    token: str | None = None  # bearer token sent with every request
    retries: bool = True  # retry UNAVAILABLE (wok.clients.channel's policy)
    balancer: str | None = None  # "grpc", "wok" or None (workers.default_balancer: wok for several targets)
    hedge_after: float | str | None = "auto"  # the wok balancer's hedge delay: seconds, "auto" or None (off)
    rpc: str = "unary"  # "unary" (ModelInfer) or "stream" (ModelStreamInfer, `streams` per worker)
    streams: int = 4
    # Read each answer's server-timing trailer (the server runs with --server-timing) and split
    # every latency into the server's stages and the time outside it (`server_timing` per step).
    server_timing: bool = False
    # Several generators in step (the Kubernetes Indexed Job): Unix seconds at which step 1's t = 0
    # falls; step k's falls step_period_s later each. None: each step starts when the last ended.
    start_at: float | None = None
    step_gap_s: float = 2.0  # with start_at: from one step's end (warm-up + duration) to the next step's t = 0

    def __post_init__(self) -> None:
        if self.start_at is not None:
            if not math.isfinite(self.start_at) or self.start_at <= 0:
                raise ValueError(f"start_at: expected a Unix time in seconds (> 0); got {self.start_at!r}")
            if self.refine:
                raise ValueError("start_at does not go with refine: bisection steps are one generator's own")
            if not 0 <= self.step_gap_s < 3600:
                raise ValueError(f"step_gap_s: expected seconds in [0, 3600); got {self.step_gap_s!r}")

    @property
    def step_period_s(self) -> float:
        """With start_at: seconds from one step's t = 0 to the next one's."""
        return self.warmup_s + self.step_duration_s + self.step_gap_s


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class LateStart(RuntimeError):
    """With start_at: the first step's slot passed before this generator was ready for it."""


def _metadata(
    cfg: RampConfig,
    say: Callable[[str], None] = _stderr,
    notes: list[str] | None = None,
    devices: dict[str, str | None] | None = None,
    bounds: dict[str, dict[str, int]] | None = None,
) -> tuple[list, tuple[int, int] | None]:
    """Each model's metadata, fetched through the balancer the workers will use: a target that
    only the wok balancer reaches (TLS checked per server, mixed address families) must not
    fail here before any worker tries it. `--rows` is checked against each model's config; a
    server without ModelConfig is said (`say`, and added to `notes`) to leave it unchecked.
    With them, the server's published request limit (Client.request_limit; None: none published).
    `devices` gets each model's device by its config (`instance_device`; None without ModelConfig), `bounds` its
    inputs' published id bounds (`published_bounds`)."""
    from wok.clients import Client, InferError
    from wok.clients.channel import target_list

    names = [name for name, _ in cfg.models]
    # Streams to several servers run on a channel per server (stream_sender), as wok's balancer
    # does: one gRPC channel over them all would refuse a list of mixed address families.
    per_server = cfg.rpc == "stream" and len(target_list(cfg.target)) > 1
    if pick_balancer(cfg.balancer, cfg.rpc, cfg.target) == "grpc" and not per_server:
        with Client(cfg.target, tls=cfg.tls, token=cfg.token, retries=cfg.retries) as client:
            infos = [client.model_metadata(name, timeout=30) for name in names]
            for name in names:
                try:
                    config = client.model_config(name, timeout=30).config
                except InferError as exc:
                    if exc.code.name != "UNIMPLEMENTED":  # a server without ModelConfig: nothing to check
                        raise
                    config = None
                _checked(cfg.rows, name, config, say, notes, devices, bounds)
            return infos, client.request_limit(timeout=30)
    import asyncio

    from wok.clients import AsyncClient

    async def fetch() -> list:
        async with AsyncClient(cfg.target, tls=cfg.tls, token=cfg.token, retries=cfg.retries, balancer="wok") as client:
            infos = [await client.model_metadata(name, timeout=30) for name in names]
            for name in names:
                try:
                    config = (await client.model_config(name, timeout=30)).config
                except InferError as exc:
                    if exc.code.name != "UNIMPLEMENTED":
                        raise
                    config = None
                _checked(cfg.rows, name, config, say, notes, devices, bounds)
            return infos, await client.request_limit(timeout=30)

    return asyncio.run(fetch())


def _over_limit(name: str, payloads: list[bytes], limit: tuple[int, int], rpc: str) -> str | None:
    """What the server will do with the payloads of model `name` over its published `limit`
    ((--max-request-bytes, gRPC receive limit)); None when none is over it. Said, not refused: the
    steps then measure those refusals, as asked, but a reader must know why they failed."""
    max_request, max_message = limit
    sizes = np.fromiter(map(len, payloads), dtype=np.int64, count=len(payloads))
    over = int((sizes > max_request).sum())
    if not over:
        return None
    line = (
        f"{over} of model '{name}''s {len(sizes)} payloads are over the server's --max-request-bytes of "
        f"{max_request:,} bytes (the largest is {int(sizes.max()):,}): the server refuses each such request "
        "INVALID_ARGUMENT"
    )
    beyond = int((sizes > max_message).sum())
    if beyond:
        line += f"; {beyond} are over its gRPC limit of {max_message:,} bytes, which gRPC refuses unread " + (
            "RESOURCE_EXHAUSTED, ending the stream it was sent on with every request in flight there"
            if rpc == "stream"
            else "RESOURCE_EXHAUSTED"
        )
    return line + " (raise the server's --max-request-bytes, or send smaller --sizes)"


def _checked(
    rows: int, name: str, config, say, notes: list[str] | None, devices: dict | None, bounds: dict | None = None
) -> None:
    """`rows` checked against model `name`'s ModelConfig `config` (None: the server answers none, which
    leaves it unchecked, `_rows_unchecked`), the model's device recorded in `devices`, and its inputs' published id
    bounds in `bounds`."""
    if config is None:
        _rows_unchecked(rows, name, say, notes)
    else:
        _check_rows(rows, name, config.max_batch_size)
    if devices is not None:
        devices[name] = None if config is None else instance_device(config)
    if bounds is not None:
        bounds[name] = {} if config is None else published_bounds(config, name, say, notes)


def published_bounds(config, model: str, say: Callable[[str], None], notes: list[str] | None = None) -> dict[str, int]:
    """By input, the bound of its ids that a wok server publishes in the model's ModelConfig parameters
    (`wok.ids_bound.<input>`, codec.IDS_BOUND_PREFIX): ids below it reach no embedding table past its rows (a wok
    server publishes none for an input some of whose ids it did not follow). A value
    that is not a whole number (no wok server's) is said and left out; 0 (a table of no rows) is taken as 1, as
    `wok profile` takes it: no id is then good, and the requests' refusals say so."""
    from wok.codec import IDS_BOUND_PREFIX
    from wok.errors import quoted_name

    out = {}
    for key, value in config.parameters.items():
        if not key.startswith(IDS_BOUND_PREFIX):
            continue
        name, text = key[len(IDS_BOUND_PREFIX) :], value.string_value
        if not (text.isascii() and text.isdigit()):
            line = (
                f"model '{model}': parameter {quoted_name(key)} of its ModelConfig: expected the whole number of its "
                f"input's id bound; got {quoted_name(text)}; the input is drawn below --int-high"
            )
            say(f"warning: {line}")
            if notes is not None:
                notes.append(line)
            continue
        out[name] = max(int(text), 1)
    return out


def instance_device(config) -> str | None:
    """What runs a model, by its ModelConfig's instance groups: "cpu" when each is KIND_CPU, "gpu" when
    each is KIND_GPU, else None (none listed, both kinds, or KIND_AUTO or KIND_MODEL, which name no
    device). wok lists a group per device type its instances run on, Triton its config's groups."""
    from wok.v2pb import model_config_pb2 as mc

    kinds = {g.kind for g in config.instance_group}
    return {mc.ModelInstanceGroup.KIND_CPU: "cpu", mc.ModelInstanceGroup.KIND_GPU: "gpu"}.get(
        kinds.pop() if len(kinds) == 1 else None
    )


def _check_rows(rows: int, name: str, max_batch_size: int) -> None:
    """Refuse `rows` above the model's max_batch_size before the first step: the server refuses
    every such request, so the ramp (or a --capacity soak, for its whole length) would measure
    only refusals, and said so only after its first step. 0 is Triton's "no batch dimension":
    nothing to check against."""
    if 0 < max_batch_size < rows:
        raise ValueError(
            f"--rows {rows}: model '{name}' takes at most {max_batch_size} rows per request (its max_batch_size); "
            "the server would refuse every request"
        )


def _rows_unchecked(rows: int, name: str, say: Callable[[str], None], notes: list[str] | None = None) -> None:
    """Say that `rows` went unchecked (one row is within any model's batch: nothing to say), and note it
    in `notes` (the result's warnings)."""
    if rows > 1:
        line = (
            f"--rows {rows}: not checked against model '{name}''s max_batch_size (the server answers ModelConfig "
            "UNIMPLEMENTED); above it, the first step's requests are refused"
        )
        say(line)
        if notes is not None:
            notes.append(line)


@dataclass(frozen=True)
class ModelSlice:
    """One model's payloads in the pool: `plan.payload_sizes`' count from `start`, `nbytes` serialized."""

    model: str
    start: int
    plan: PoolPlan
    nbytes: int

    @property
    def count(self) -> int:
        return len(self.plan)

    def pick(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Each of n requests' payload, an index into the pool."""
        return self.start + self.plan.pick(rng, n)

    def info(self) -> dict:
        """The result's `payloads` entry (docs/bench-schema.md)."""
        plan = self.plan
        sizes = None if plan.kind == "fixed_shape" else plan.payload_sizes
        return {
            "model": self.model,
            "pool": plan.kind,
            "payloads": self.count,
            "distinct_sizes": None if sizes is None else len(np.unique(sizes)),
            "min_size": None if sizes is None else int(sizes.min()),
            "max_size": None if sizes is None else int(sizes.max()),
            "variants": plan.variants if plan.kind == "per_size" else None,
            "bytes": self.nbytes,
            "cap_bytes": POOL_CAP_BYTES,
            "note": plan.note,
        }


def build_pool(
    cfg: RampConfig,
    say: Callable[[str], None] = _stderr,
    notes: list[str] | None = None,
    devices: dict[str, str | None] | None = None,
    drawn: dict[str, dict[str, int]] | None = None,
) -> tuple[list[bytes], list[ModelSlice], Mix]:
    """Serialized requests for every model of the mix; each model's slice of them (`ModelSlice`).

    A model's slice holds a payload of every size its `--sizes` can draw (`payloads.plan_pool`), its
    share of POOL_CAP_BYTES allowing; over it, a pool of draws, which is said (`say`) and in the result.
    What the models' checks leave unchecked is said and added to `notes`, and each model's device put
    in `devices` (_metadata). An integer input whose server publishes the bound of its ids (`published_bounds`) is
    drawn below it, unless --int-high was given (`cfg.int_high_given`); said, and put in `drawn` by model.
    """
    from wok.codec import encode_request

    rng = np.random.default_rng(cfg.seed)
    pool: list[bytes] = []
    slices = []
    gens = []
    budget = POOL_CAP_BYTES / len(cfg.models)
    cap_text = f"{POOL_CAP_BYTES / 2**20:g} MiB" + (
        f" ({budget / 2**20:g} MiB for each of the mix's {len(cfg.models)} models)" if len(cfg.models) > 1 else ""
    )
    bounds: dict[str, dict[str, int]] = {}
    infos, limit = _metadata(cfg, say, notes, devices, bounds)
    for (name, weight), info in zip(cfg.models, infos):
        specs = [TensorSpec(t.name, t.datatype, tuple(t.shape)) for t in info.inputs.values()]
        own = _drawn_below(cfg, name, specs, bounds.get(name, {}), say, notes)
        if drawn is not None:
            drawn[name] = own
        gen = PayloadGenerator(
            name,
            specs,
            sizes=parse_sizes(cfg.sizes),
            rows=cfg.rows,
            seed=cfg.seed,
            int_high=cfg.int_high,
            int_highs=own,
        )
        plan = plan_pool(gen, budget, rng, cap_text=cap_text)
        if plan.note:
            say(f"warning: {_pool_warning(cfg, plan)}")
        start = len(pool)
        for size in plan.payload_sizes.tolist():
            pool.append(encode_request(name, gen.make(rng, size), datatypes=gen.datatypes).SerializeToString())
        slices.append(ModelSlice(name, start, plan, sum(len(p) for p in pool[start:])))
        if limit is not None and (line := _over_limit(name, pool[start:], limit, cfg.rpc)):
            say(f"warning: {line}")
            if notes is not None:
                notes.append(line)
        gens.append((gen, weight))
    return pool, slices, Mix(gens)


def _drawn_below(
    cfg: RampConfig, model: str, specs: list[TensorSpec], bounds: dict[str, int], say, notes: list[str] | None
) -> dict[str, int]:
    """By integer input of `model` with a published bound (`bounds`), the bound it is drawn below: that one, said,
    or none with --int-high, which is then said where it passes one (its requests may be refused)."""
    from wok.errors import quoted_name

    caps = {t.name: integer_cap(t.datatype) for t in specs}
    integers = [n for n, cap in caps.items() if cap is not None and n in bounds]
    if not integers:
        return {}

    def drawn(n: str) -> str:
        # PayloadGenerator caps a bound past the datatype's ids (an INT8 input's 300-row table): ids below 128.
        if caps[n] >= bounds[n]:
            return f"input {quoted_name(n)} in [0, {bounds[n]})"
        return (
            f"input {quoted_name(n)} in [0, {caps[n]}) (its datatype holds no larger id, the server publishes "
            f"{bounds[n]})"
        )

    each = ", ".join(drawn(n) for n in integers)
    if not cfg.int_high_given:
        say(
            f"model '{model}': integer inputs drawn below the bounds of their ids the server publishes "
            f"(wok.ids_bound.<input>): {each}; --int-high to draw every one below one bound"
        )
        return {n: bounds[n] for n in integers}
    past = [n for n in integers if bounds[n] < min(cfg.int_high, caps[n])]
    if past:
        line = (
            f"--int-high {cfg.int_high}: the server of model '{model}' publishes smaller bounds of ids: "
            + ", ".join(f"input {quoted_name(n)} in [0, {bounds[n]})" for n in past)
            + "; a request holding an id past one may be refused INVALID_ARGUMENT, or fail its model"
        )
        say(f"warning: {line}")
        if notes is not None:
            notes.append(line)
    return {}


def _pool_warning(cfg: RampConfig, plan: PoolPlan) -> str:
    # A model without a variable dimension is cut by its requests' size, not by --sizes.
    return plan.note if plan.kind == "fixed_shape" else f"--sizes {cfg.sizes}: {plan.note}"


class Ramp:
    # Whether a step cut short hands what its workers measured to `step_cut` (a stoppable pool).
    keeps_cut_step = False
    # Whether a step with no request answered OK ends the ramp, even with --stop-factor inf. A fault run
    # (FaultRamp) goes on: its faults fail whole steps by design, and stopping would skip their end.
    stops_when_none_ok = True
    # What a signal after the last step leaves as the result, said with it (`late`).
    kept = STEPS_KEPT

    def __init__(
        self,
        cfg: RampConfig,
        progress: Callable[[str], None] | None = None,
        *,
        processes: WorkerProcesses | None = None,
        pool_of: Ramp | None = None,
    ) -> None:
        self.cfg = cfg
        self.say = progress or _stderr
        # The caller's started WorkerProcesses, to run on workers kept from its last ramp; None: this ramp's own.
        self.processes = processes
        self.rng = np.random.default_rng(cfg.seed + 1)
        if pool_of is not None:
            # An earlier ramp of the same server, models and pool options (a soak's capacity ramp): its pool and what
            # its build found, as they are. Built again, its lines were said twice, and its metadata read twice.
            self.setup_warnings = list(pool_of.setup_warnings)
            self.devices = dict(pool_of.devices)
            self.int_high_published = dict(pool_of.int_high_published)
            self.pool, self.slices, self.mix = pool_of.pool, pool_of.slices, pool_of.mix
        else:
            self.setup_warnings: list[str] = []  # what the pool's build said (an unchecked --rows)
            # Each model's, by the server's ModelConfig: the result's `devices`.
            self.devices: dict[str, str | None] = {}
            # By model, the integer inputs drawn below their published bounds: the result's `config.int_high_published`.
            self.int_high_published: dict[str, dict[str, int]] = {}
            self.pool, self.slices, self.mix = build_pool(
                cfg, self.say, self.setup_warnings, self.devices, self.int_high_published
            )
        # Each payload's size, -1 where the model has no variable dimension: the step's `request_sizes`.
        self.pool_sizes = np.full(len(self.pool), -1, dtype=np.int64)
        for s in self.slices:
            if s.plan.kind != "fixed_shape":
                self.pool_sizes[s.start : s.start + s.count] = s.plan.payload_sizes
        self.timeline: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        self._clock0: float | None = None
        self._step_label = "step"  # the running step's, for _collect's progress line
        # A signal (KeyboardInterrupt's text) that came as the workers stopped after the ramp: `run`
        # keeps the result; a caller stops what it meant to do next (the CLI's host probe).
        self.late_signal: str | None = None
        # False where the caller says such a signal in its own words (a soak's capacity ramp: "soak not started"):
        # said here too, it was two lines for one signal.
        self.says_late_signal = True
        # A signal that came while a whole step held to its planned end (`_hold_to`): raised as the
        # next step would start, so that the step is kept and the cut falls between the two.
        self._held: KeyboardInterrupt | None = None
        self.fleet = Fleet(cfg.replica_metrics, self.say) if cfg.replica_metrics else None
        # The ReplicaSet the bench started and ramps (`--replicas`): the result's `replicas`.
        self.replicas = None

    def started(self, clock0: float) -> None:
        """Called once, as the first step is handed out: `clock0` (time.monotonic()) is the timeline's 0."""

    def step_cut(self, workers: WorkerPool, shares: list[Share], start_at: float, exc: BaseException) -> None:
        """With `keeps_cut_step`: the step started at `start_at` was cut short by `exc`, its workers
        still running. What is added to `self.timeline` here is kept: `run` then returns a result
        even when no step finished."""

    def run(self) -> dict:
        cfg = self.cfg
        workers = WorkerPool(
            cfg.target,
            self.pool,
            cfg.workers,
            tls=cfg.tls,
            token=cfg.token,
            retries=cfg.retries,
            balancer=cfg.balancer,
            hedge_after=cfg.hedge_after,
            rpc=cfg.rpc,
            streams=cfg.streams,
            server_timing=cfg.server_timing,
            stoppable=self.keeps_cut_step,
            processes=self.processes,
        )
        steps: list[dict] = []
        interrupted = None
        cut_phase = None
        cut_at_qps = None  # the --steps value of the step a cut in the ramp stopped
        by_signal = False
        stopped_early = None  # the result's `stopped_early`: a stop rule that skipped planned steps
        try:
            for i, qps in enumerate(cfg.steps):
                try:
                    self._raise_held()
                    step = self.run_step(workers, qps, f"step {i + 1}/{len(cfg.steps)}", slot=i)
                except (Exception, KeyboardInterrupt) as exc:
                    if not steps and not (self.keeps_cut_step and self.timeline):
                        raise
                    # Keep what was measured: the steps done so far are still a result.
                    interrupted = f"ramp ended early at {qps:g} QPS: {type(exc).__name__}: {exc}"
                    cut_phase = "ramp"
                    cut_at_qps = qps
                    by_signal = isinstance(exc, KeyboardInterrupt)
                    self.say(interrupted)
                    break
                steps.append(step)
                stop, came = run_held(functools.partial(self._stop_rule, step))
                if came is not None:
                    self._hold(came)  # the step is kept: raised as the next one would start
                if stop is not None and i + 1 < len(cfg.steps):
                    # Only a step skipped makes the ramp shorter than planned: the last step meeting a rule
                    # stops nothing early, and is said as the result says it (`stopped_early` null).
                    rule, why = stop
                    self.say(f"stopping early: {why}")
                    stopped_early = {
                        "reason": why,
                        "rule": rule,
                        "at_qps": step["offered_qps"],
                        "steps_run": i + 1,
                        "steps_planned": len(cfg.steps),
                    }
                    break
            if cfg.refine and interrupted is None:
                lo = analysis.max_qps_under_slo(steps, cfg.slo_p99_ms)
                higher = [s for s in steps if lo is not None and s["offered_qps"] > lo]
                if lo is not None and higher:
                    # Bisect on the --steps values that run_step takes, not on the offered rates
                    # the verdict reads: a burst offers about twice its nominal rate.
                    passed = next(s["nominal_qps"] for s in steps if s["offered_qps"] == lo)
                    failed = min(higher, key=lambda s: s["offered_qps"])["nominal_qps"]
                    if passed < failed:
                        # Collected as each finishes: a refinement cut short keeps the steps it ran.
                        extra: list[dict] = []

                        def refine_at(q: float) -> dict:
                            nonlocal at_qps, started
                            at_qps = q
                            self._raise_held()
                            started = True
                            step = self.run_step(workers, q, "refine")
                            step["phase"] = "refine"
                            extra.append(step)
                            return step

                        at_qps = passed
                        started = False  # whether a refinement step began: a signal held may come first
                        try:
                            analysis.bisect_max_qps(refine_at, passed, failed, cfg.slo_p99_ms, cfg.refine)
                        except (Exception, KeyboardInterrupt) as exc:
                            why = f"{type(exc).__name__}: {exc}"
                            if started:
                                interrupted = f"refinement ended early at {at_qps:g} QPS: {why}"
                            else:  # a signal held as the ramp's last step waited for its end (`_hold_to`)
                                interrupted = (
                                    f"refinement not started (its first step, at {at_qps:g} QPS, not run): {why}"
                                )
                            cut_phase = "refine"
                            by_signal = isinstance(exc, KeyboardInterrupt)
                            self.say(interrupted)
                        steps = sorted(steps + extra, key=lambda s: s["offered_qps"])
            if self._held is not None:
                # After the last step, as it held to its end: every step run is whole.
                held, self._held = self._held, None
                self.late(held, "after the last step")
        finally:
            try:
                workers.close()
            except KeyboardInterrupt as exc:
                # A signal as the workers exit, after the last step (close() takes ~0.1 s each run):
                # what was measured is whole, and raising here lost every step of the ramp.
                if not steps and not (self.keeps_cut_step and self.timeline):
                    raise
                self.late(exc, "as the workers stopped")
        result, came = run_held(
            lambda: self._result(workers, steps, interrupted, by_signal, cut_phase, cut_at_qps, stopped_early)
        )
        if came is not None:
            self.late(came, "as the result was built")
        return result

    def late(self, exc: KeyboardInterrupt, when: str) -> None:
        """A signal after the last step (`when`: as what happened) leaves every step run whole: `late_signal`."""
        self.late_signal = f"{type(exc).__name__}: {exc}"
        if self.says_late_signal:
            self.say(f"{self.late_signal} {when}: {self.kept}")

    def _result(self, workers, steps, interrupted, by_signal, cut_phase, cut_at_qps, stopped_early) -> dict:
        cfg = self.cfg
        # Key material and the token never reach the result; only which kind of security was used.
        config = {**asdict(self.cfg), "source": "bench", "tls": tls_mode(cfg.tls), "token": cfg.token is not None}
        config["balancer"] = workers.balancer
        config["int_high_published"] = self.int_high_published
        result = analysis.ramp_result(
            steps=steps,
            slo_p99_ms=cfg.slo_p99_ms,
            config=config,
            knee_threshold=cfg.knee_threshold,
            timeline=self._timeline(),
            cut_at_qps=cut_at_qps,
        )
        result["balancer"] = workers.balancer_stats()
        result["payloads"] = [s.info() for s in self.slices]
        result["devices"] = self.devices
        result["warnings"] += self.setup_warnings
        if self.fleet is not None:
            result["warnings"] += self.fleet.warnings()
        if self.replicas is not None:
            result["replicas"] = self.replicas.describe()
        result["warnings"] += self.plan_notes()
        # Null for a ramp that ran every step it meant to (or stopped early by its own rule);
        # else why it ended, and whether a signal (Ctrl-C, SIGTERM) ended it.
        # `phase`: where it was cut, "ramp" or "refine" (a refinement cut leaves the ramp's steps whole).
        result["interrupted"] = (
            {"reason": interrupted, "by_signal": by_signal, "phase": cut_phase} if interrupted else None
        )
        if interrupted:
            result["warnings"].append(interrupted)
        # Null for a ramp that ran every step planned, or was cut (`interrupted`); else the rule that ended it.
        result["stopped_early"] = stopped_early
        return result

    def plan_notes(self) -> list[str]:
        """The pool plans' notes as the result's warnings word them (a pool cut to its cap)."""
        return [_pool_warning(self.cfg, s.plan) for s in self.slices if s.plan.note]

    def _stop_rule(self, step: dict) -> tuple[str, str] | None:
        """The rule that ends the ramp after `step` and why, in the words said ("stopping early: …"); None: it goes on.
        The rule is the result's `stopped_early.rule`."""
        if analysis.refused_as_bad(step) is not None:
            # Every request refused for what it is: higher rates would measure the same refusals.
            return "refused_as_bad", f"the server refused every request of the step ({', '.join(step['errors'])})"
        failed = analysis.none_ok(step) if self.stops_when_none_ok else None
        if failed is not None:
            # Not one answer, whatever --stop-factor says: higher rates would measure the same
            # failures (a model failing every input, a server gone), not more of the server.
            return "none_ok", f"no request of the step succeeded ({failed})"
        # A step that sent nothing ends any ramp, --stop-factor inf too: the generator is not working.
        return analysis.stop_rule(step, self.cfg.slo_p99_ms, self.cfg.stop_factor)

    def run_step(self, workers: WorkerPool, qps: float, label: str, slot: int | None = None) -> dict:
        """Run one step; with `cfg.start_at`, `slot` k starts at start_at + k × step_period_s."""
        cfg = self.cfg
        total = cfg.warmup_s + cfg.step_duration_s
        arrivals, times, which = self.schedule_step(qps)
        n = len(workers)
        # A lead lets every worker receive its share (pickled arrays) before t = 0.
        start_at = time.monotonic() + 0.2 + 2e-6 * len(times)
        late_s = None
        if cfg.start_at is not None and slot is not None:
            start_at, late_s = self._slot_start(slot, start_at)
        if self._clock0 is None:
            self._clock0 = start_at
            self.started(start_at)
        shares = [Share(start_at, times[w::n], which[w::n], cfg.timeout_s) for w in range(n)]
        # The rate the step's JSON reports as offered_qps; a burst, sawtooth or trace offers other
        # than its --steps value (nominal_qps) over the window.
        offered = window_rate(arrivals, cfg.warmup_s, total)
        nominal = "" if math.isclose(offered, qps, rel_tol=1e-9) else f" (nominal {qps:g})"
        self.say(
            f"{label}: {offered:g} QPS offered{nominal} for {cfg.step_duration_s:g} s (+{cfg.warmup_s:g} s warm-up)"
        )
        workers.start(shares)
        scrapes: dict[str, object] = {}
        scraper = None
        if cfg.metrics_url or self.fleet is not None:
            # Scraped as the warm-up ends and as the window ends, so the server's figures
            # cover the measured window (the requests it completed in it).
            def scrape_window() -> None:
                for key, at in (("before", start_at + cfg.warmup_s), ("after", start_at + total)):
                    time.sleep(max(0.0, at - time.monotonic()))
                    scrapes[key] = self.fleet.scrape() if self.fleet is not None else scrape(cfg.metrics_url)

            scraper = threading.Thread(target=scrape_window, daemon=True)
            scraper.start()
        self._step_label = label
        try:
            outcomes = self._collect(workers, start_at)
        except (Exception, KeyboardInterrupt) as exc:
            if self.keeps_cut_step:
                self.step_cut(workers, shares, start_at, exc)
            raise
        if scraper is not None:
            # It scrapes as the window ends: waiting for it is the step's wait for its end, where a
            # signal lost the step whose answers were all in (a soak's: all it measured, exit 130).
            self._hold_to(start_at + total, label, scraper.join)
        # Its answers are in: a signal from here is held until the step's figures are whole, then kept as one in the
        # wait for its end is (`_hold`). Raised in their midst, it lost a step whose answers were all in.
        step, came = run_held(lambda: self._figures(qps, label, arrivals, shares, outcomes, scrapes, start_at, late_s))
        if came is not None:
            self._hold(came)
        if cfg.start_at is None and self._held is None:
            # With --start-at each step waits for its own slot, warm-up + duration + gap after the last one's:
            # holding too would make a step after a gap under the 0.2 s lead late.
            self._hold_to(start_at + total, label)
        return step

    def _figures(self, qps, label, arrivals, shares, outcomes, scrapes, start_at, late_s) -> dict:
        """The step's result from its answers (`outcomes`) and the server's scrapes, said on stderr."""
        cfg = self.cfg
        total = cfg.warmup_s + cfg.step_duration_s
        before, after = scrapes.get("before"), scrapes.get("after")
        intended = np.concatenate([s.times for s in shares])
        sent = np.concatenate([o.sent for o in outcomes])
        done = np.concatenate([o.done for o in outcomes])
        codes = np.concatenate([o.codes for o in outcomes])
        host_lag = np.concatenate(
            [np.full(len(o.sent), np.nan) if o.host_lag is None else o.host_lag for o in outcomes]
        )
        server_ms = np.concatenate([o.server_ms for o in outcomes]) if cfg.server_timing else None
        self.timeline.append(
            (intended + start_at - self._clock0, done + start_at - self._clock0, done - intended, codes)
        )
        keep = intended >= cfg.warmup_s
        w = cfg.warmup_s
        inflight_total = _mean_inflight([o.inflight for o in outcomes], w, total)
        # A mix's server view sums its models' series (queue, batches, stages); loop lag and GPU are the server's.
        names = [name for name, _ in cfg.models]
        model = names[0] if len(names) == 1 else names
        server = (
            server_view(before, after, model) if self.fleet is None else self.fleet.view(before, after, model, label)
        )
        in_window = (codes == OK) & (done >= w) & (done < total)
        step = analysis.step_result(
            offered_qps=window_rate(arrivals, w, total),
            completed_ok=int(in_window.sum()),
            duration_s=cfg.step_duration_s,
            intended_s=intended[keep] - w,
            sent_s=sent[keep] - w,
            done_s=done[keep] - w,
            host_lag_s=host_lag[keep],
            codes=np.array([("OK" if c == OK else status_name(c)) for c in codes[keep]]),
            inflight_samples=inflight_total,
            server=server,
            server_timing_ms=None if server_ms is None else server_ms[keep],
            error_details={status_name(c): m for c, m in merge_details(outcomes).items()},
        )
        step["littles_law"].update(_littles_law_edges(sent, done, keep, w, total))
        step["nominal_qps"] = qps
        if (self.pool_sizes >= 0).any():
            sizes = self.pool_sizes[np.concatenate([s.which for s in shares])]
            step["request_sizes"] = analysis.request_size_summary(sizes[keep & np.isfinite(sent) & (sizes >= 0)])
        if late_s is not None:
            step["start_late_s"] = late_s
            if late_s > 0:
                self.say(f"warning: {label} started {late_s:.3f} s after its slot (the last step's answers came late)")
        lat = step["latency_ms"]
        self.say(
            f"{label}: achieved {step['achieved_qps']:.1f} QPS, ok {100 * step['success_rate']:.1f}%, "
            f"P50 {_ms(lat['p50'])} P99 {_ms(lat['p99'])} max {_ms(lat['max'])}"
        )
        timing = step.get("server_timing")
        for code, count in step["errors"].items():
            message = step["error_details"].get(code)
            self.say(f"{label}: {count} × {code}" + (f": {message}" if message else ""))
        if timing is not None:
            self.say(f"{label}: {_timing_line(timing)}")
        for warning in analysis.check_precision(step, cfg.slo_p99_ms):
            self.say(f"warning: {warning}")
        return step

    def _hold_to(self, end: float, label: str, wait_for: Callable[[], None] | None = None) -> None:
        """Once a step's answers are in, wait for its planned end, `end` (time.monotonic()); or for
        `wait_for` (the join of the scrape made at `end`), which lasts as long.

        Open loop: the schedule sets time, not the answers. A step whose last answer comes before
        its end (a sparse trace, a low rate) still lasts its warm-up + duration, as the plan says:
        otherwise the next step started early, and parts of a merged run without --start-at, each
        ending its steps at its own last answer, drifted apart. A signal meanwhile, as the wait is
        said too, leaves the step whole: it is kept (`_hold`), and raised as the next step would
        start (`_raise_held`)."""
        try:
            wait = end - time.monotonic()
            if wait >= 1.0:
                self.say(
                    f"{label}: every answer is in; waiting {wait:.1f} s for the step's end (its schedule ended early)"
                )
            if wait_for is not None:
                wait_for()
            elif wait > 0:
                time.sleep(wait)
        except KeyboardInterrupt as exc:
            self._hold(exc)

    def _hold(self, exc: KeyboardInterrupt) -> None:
        """Keep a signal that came as a step, its answers all in, waited for its end (`_hold_to`)."""
        self._held = exc

    def _raise_held(self) -> None:
        """Raise the signal that came as the last step held to its end (`_hold_to`), if one did."""
        held, self._held = self._held, None
        if held is not None:
            raise held

    def schedule_step(self, qps: float):
        """A step at `qps`: its arrival process, the intended send times, and each request's payload
        (an index into the pool): its model by the mix's weights, then its size drawn from `--sizes`
        (`ModelSlice.pick`), here rather than once for the pool, so that every size, the tail's too,
        comes at its rate. From the ramp's seeded generator: the same seed, the same schedules."""
        total = self.cfg.warmup_s + self.cfg.step_duration_s
        arrivals = parse_arrivals(self.cfg.arrival, qps, duration_s=total)
        times = arrivals.times(total, self.rng)
        model_of = self.mix.choose(self.rng, len(times))
        which = np.empty(len(times), dtype=np.int64)
        for m, s in enumerate(self.slices):
            idx = np.flatnonzero(model_of == m)
            which[idx] = s.pick(self.rng, len(idx))
        return arrivals, times, which

    def _slot_start(self, slot: int, earliest: float) -> tuple[float, float]:
        """time.monotonic() at which step `slot` starts, and how late that is after its slot.

        The slot is on the wall clock (what several machines share, through NTP); it is
        turned into this process's monotonic clock once per step, so a wall-clock step in the
        middle of a step moves nothing. A step whose slot passed starts as soon as it can, and
        the next ones keep their own slots: generators drift apart by one step's lateness at
        most, never by the sum of them.
        """
        cfg = self.cfg
        slot_wall = cfg.start_at + slot * cfg.step_period_s
        planned = slot_wall - wall_offset()
        late = max(0.0, earliest - planned)
        if slot == 0 and late > cfg.warmup_s:
            raise LateStart(
                f"start_at {cfg.start_at:.3f} was {late:.1f} s ago, more than the warm-up ({cfg.warmup_s:g} s): "
                "this generator is too late to run in step with the others"
            )
        wait = planned - time.monotonic()
        if wait > 1.0:
            self.say(f"step {slot + 1}: waiting {wait:.1f} s for its slot at {slot_wall:.3f} (--start-at)")
        return max(planned, earliest), late

    def _collect(self, workers: WorkerPool, start: float):
        total = self.cfg.warmup_s + self.cfg.step_duration_s
        # The bar on stderr, where the step lines go: on stdout (the table's, a file's where redirected) it drew
        # nothing off a terminal and its stop wrote an empty line there, one a step, before the table (until
        # 2026-12-06). A terminal that draws no bar (TERM=dumb) gets the plain lines.
        console = live_bar_console()
        if console is None:
            # No live bar in a log (nohup, CI, a pipe), but a long step (a soak) must still show
            # it is running: plain lines (plain_progress_every).
            label = self._step_label
            due = 0.0

            def plain_tick() -> None:
                nonlocal due
                line, due = plain_progress_line(label, time.monotonic() - start, total, due)
                if line is not None:
                    self.say(line)

            return workers.finish(on_tick=plain_tick)
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        columns = (TextColumn("{task.description}"), BarColumn(), TimeRemainingColumn())
        with Progress(*columns, console=console, transient=True) as bar:
            task = bar.add_task("step", total=total)

            def tick() -> None:
                bar.update(task, completed=min(total, max(0.0, time.monotonic() - start)))

            return workers.finish(on_tick=tick)

    def _timeline(self) -> dict | None:
        return timeline_series(self.timeline)


def timeline_series(entries: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]) -> dict | None:
    """The result's `timeline` from the steps' requests (`Ramp.timeline`: per step, each request's intended
    send time and completion, seconds from the first step's start, latency and status number): per 1 s
    bin, the requests intended in it, the OK answers that came in it and their P99. None without steps."""
    if not entries:
        return None
    intended = np.concatenate([t[0] for t in entries])
    done = np.concatenate([t[1] for t in entries])
    lat = np.concatenate([t[2] for t in entries])
    codes = np.concatenate([t[3] for t in entries])
    # Bins up to the one holding the last answer: ceil() left out an answer on a whole second.
    end = math.floor(np.nanmax(done)) + 1 if np.isfinite(done).any() else 0
    t_s, offered, achieved, p99 = [], [], [], []
    sec_i = np.floor(intended).astype(int)
    sec_d = np.floor(np.nan_to_num(done, nan=-1)).astype(int)
    for s in range(max(end, 0)):
        t_s.append(s)
        offered.append(int(np.count_nonzero(sec_i == s)))
        ok_here = (sec_d == s) & (codes == OK)
        achieved.append(int(np.count_nonzero(ok_here)))
        p99.append(analysis.latency_summary(lat[ok_here] * 1e3)["p99"] if ok_here.any() else None)
    return {"t_s": t_s, "offered": offered, "achieved": achieved, "p99_ms": p99}


def _mean_inflight(per_worker: list[np.ndarray], start: float, end: float) -> np.ndarray:
    """Time-weighted mean of requests in flight over [start, end), summed over the workers.

    Each worker records (offset, count) at every send and every answer, so its samples are the
    count's exact step function: a count holds from its sample to the next, none is in flight
    before the first, and the last holds on. Empty when no worker sent anything.
    """
    if end <= start or not any(len(samples) for samples in per_worker):
        return np.empty(0)
    total = 0.0
    for samples in per_worker:
        if not len(samples):
            continue  # it sent nothing: none in flight
        edges = np.clip(np.append(samples[:, 0], max(end, float(samples[-1, 0]))), start, end)
        total += float(np.sum(samples[:, 1] * np.diff(edges)))
    return np.array([total / (end - start)])


def _littles_law_edges(sent: np.ndarray, done: np.ndarray, keep: np.ndarray, start: float, end: float) -> dict:
    """What sets λW apart from L over the window [start, end), in requests (L's unit).

    λW counts each of the window's calls (`keep`) whole, L only its time inside the window; and
    L counts the earlier calls' time inside it, λW none of it. So with exact clocks and counters
    λW − L = late_edge − early_edge: `late_edge`, the window's calls' time after its end, and
    `early_edge`, the earlier calls' time inside it, each over the window's length. A short
    window on a noisy host can owe several percent to one stall at an edge; a disagreement
    beyond these is the clocks' or the counters'.
    """
    span = end - start
    ok = np.isfinite(sent) & np.isfinite(done)
    late = np.clip(done - np.maximum(sent, end), 0.0, None)[keep & ok].sum()
    early = np.clip(np.minimum(done, end) - np.maximum(sent, start), 0.0, None)[~keep & ok].sum()
    return {"late_edge": float(late) / span, "early_edge": float(early) / span}


def _timing_line(t: dict) -> str:
    """One progress line of a step's server timing: where the latency went, and its slowest 1 %."""
    if not t["requests"]:
        if not t["missing"]:
            return "no successful answer to split"
        return f"no server-timing trailer on {t['missing']} answers (is the server run with --server-timing?)"
    st, out, tail = t["stages_ms"], t["outside_ms"], t["tail"]
    m = tail["mean_ms"]
    parts = (
        f"decode {_ms(m['decode'])}, queue {_ms(m['queue'])}, batch {_ms(m['batch'])} (start {_ms(m['start'])}, "
        f"compute {_ms(m['compute'])}), respond {_ms(m['respond'])}, encode {_ms(m['encode'])}, "
        f"outside {_ms(m['outside'])}"
    )
    missing = f"; {t['missing']} answers without one" if t["missing"] else ""
    return (
        f"server P50 {_ms(st['total']['p50'])} P99 {_ms(st['total']['p99'])}, outside P50 {_ms(out['p50'])} "
        f"P99 {_ms(out['p99'])}; the slowest 1 % (≥ {_ms(tail['threshold_ms'])}) on average: {parts}{missing}"
    )


def _ms(v) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.1f} ms"
