"""Soak: a bounded run at a fixed share of the measured capacity, watching memory and latency drift.

`wok bench ramp --soak [DURATION]` (10 minutes by default) first finds the capacity, the
highest step of the ramp (`--steps`) that meets the SLO, unless `--capacity QPS` gives it;
then it holds `--soak-load` (80 %) of it for DURATION as one open-loop step, while a
thread scrapes each server's `process_resident_memory_bytes` every `--rss-every` (5 s).
The report splits the run into windows (`--soak-window`, 1 minute) by send time and
gives each window's P50/P99 of the answered requests and the RSS at its end; then RSS
growth (last sample − first, and the least-squares slope) and P99 drift (last full
window − first, and the slope over the windows). A soak cut short (a signal, a failed worker)
keeps what it measured up to the cut, marked by `cut`. docs/reliability.md has a run.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from ..errors import quoted_name
from ..numerals import SPACES, read_float, underscore_note
from .analysis import latency_summary
from .arrivals import nominal_for
from .runner import Ramp, RampConfig, status_name
from .scrape import NO_ANSWER, read_metrics
from .workers import END_WAIT_S, NOT_SENT, OK, Share, WorkerPool, WorkerProcesses, run_held

SCHEMA = "wok.soak/1"
# The options' defaults with --soak; None in argparse, so that one given without --soak is seen.
DEFAULTS = {"soak_load": "80%", "soak_window": "1m", "rss_every": "5s"}
NO_CAPACITY = "no step of the ramp met the SLO: no capacity to soak at (give --capacity)"
RSS = "process_resident_memory_bytes"
MIB = float(1 << 20)
# How long a cut soak waits for each worker to hand back what it measured; one that does not is
# left out (and terminated): a Ctrl-C should end the run in seconds.
CUT_WAIT_S = 10.0


def parse_fraction(text: str) -> float:
    """ "80%" or "0.8" as 0.8; ValueError outside (0, 1]."""
    t = text.strip(SPACES)
    try:
        value = read_float(t[:-1]) / 100 if t.endswith("%") else read_float(t)
    except ValueError:
        value = math.nan
    if not 0 < value <= 1:
        raise ValueError(
            f"--soak-load {quoted_name(text)}: expected a share of the capacity such as 80% or 0.8, in (0, 1]"
            f"{underscore_note(text)}"
        )
    return value


class RssSampler:
    """Scrapes each URL's process RSS every `every_s` from `start(clock0)` until `stop()`."""

    def __init__(self, urls: Sequence[str], every_s: float) -> None:
        self.urls = list(urls)
        self.every_s = every_s
        self.samples: list[tuple[float, list[float | None]]] = []  # (t_s, RSS bytes per URL)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._clock0 = 0.0
        # Per URL: scrapes that read no snapshot, counted by why (scrape.read_metrics: no answer,
        # an HTTP error, not Prometheus text), and answers without the RSS metric.
        self.unread_why: list[dict[str, int]] = [{} for _ in self.urls]
        self.without_rss = [0] * len(self.urls)

    def sample(self) -> None:
        values = []
        for i, url in enumerate(self.urls):
            snap = read_metrics(url, timeout=2.0)
            if isinstance(snap, str):
                self.unread_why[i][snap] = self.unread_why[i].get(snap, 0) + 1
                value = 0.0
            else:
                value = snap.get(RSS)
                if not value:
                    self.without_rss[i] += 1
            values.append(value or None)
        self.samples.append((round(time.monotonic() - self._clock0, 3), values))

    def unread(self) -> list[str]:
        """Why, for each URL of which no sample read the RSS: the report's RSS is then '-' for it."""
        out = []
        for i, url in enumerate(self.urls):
            whys = self.unread_why[i]
            n = sum(whys.values()) + self.without_rss[i]
            if not n or any(vs[i] for _, vs in self.samples):
                continue
            if self.without_rss[i]:
                why = f"its answers had no {RSS} (a server that does not export process metrics?)"
            elif len(whys) == 1:
                (what,) = whys
                why = f"{what} to {'any' if what == NO_ANSWER else 'each'} of its {n} scrapes (a wrong --metrics-url?)"
            else:  # the reasons changed over the run (a server that came up on the wrong page, ...)
                counts = ", ".join(f"{why} to {c}" for why, c in sorted(whys.items(), key=lambda kv: -kv[1]))
                why = f"of its {n} scrapes: {counts} (a wrong --metrics-url?)"
            out.append(f"RSS was not read from {url} ({RSS}): {why}")
        return out

    def start(self, clock0: float) -> None:
        self._clock0 = clock0
        self._thread = threading.Thread(target=self._run, name="wok-rss", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        # clock0 is the first send, a moment ahead: a sample before it would still see the
        # capacity ramp's last (often saturated) step.
        if self._stop.wait(max(0.0, self._clock0 - time.monotonic())):
            return
        # On a grid from clock0, not every_s after each scrape ends: a scrape's own time (tens of
        # ms on a busy host) would otherwise stretch every interval. Ticks a slow scrape overran
        # are skipped, not made up in a burst.
        tick = 0
        while True:
            self.sample()
            late = time.monotonic() - self._clock0
            tick = max(tick + 1, math.floor(late / self.every_s) + 1)
            if self._stop.wait(max(0.0, self._clock0 + tick * self.every_s - time.monotonic())):
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
            self.sample()  # the state at the end


SOAK_KEPT = "the soak measured is the result"


def _kept(result: dict) -> str:
    """What a signal after the run leaves as its `result`, in the words `Ramp.late` says it: the soak, or the
    capacity ramp's steps where no soak was kept (cut short, not started, no capacity)."""
    return SOAK_KEPT if result.get("soak") is not None else Ramp.kept


class SoakRamp(Ramp):
    """A Ramp whose first step starts the RSS sampler, and whose step cut short keeps its answers."""

    keeps_cut_step = True
    # One step, the soak: "the steps run" said a ramp's (until 2026-12-07).
    kept = SOAK_KEPT

    def __init__(
        self,
        cfg: RampConfig,
        sampler: RssSampler,
        progress: Callable[[str], None] | None = None,
        *,
        pool_of: Ramp | None = None,
        processes: WorkerProcesses | None = None,
    ):
        super().__init__(cfg, progress, pool_of=pool_of, processes=processes)
        self.sampler = sampler
        # Set when the soak step was cut after its first send: `at_s` (from the first send),
        # `in_flight` (sent, unanswered at the cut: left out), `sent_after` (sent after the cut, before
        # the workers saw the stop: left out), `workers_lost` (nothing came back).
        self.cut: dict | None = None
        self.cut_by: BaseException | None = None

    def started(self, clock0: float) -> None:
        self.sampler.start(clock0)

    def step_cut(self, workers: WorkerPool, shares: list[Share], start_at: float, exc: BaseException) -> None:
        at = time.monotonic() - start_at
        outcomes = workers.cut(CUT_WAIT_S)
        if at <= 0:
            return  # before the first send: nothing of the soak was measured
        # Only answers that came before the cut count: a request in flight then has no latency,
        # and one answered while the workers were stopping was not part of the run that was cut.
        # A worker sees the stop only at its next look (workers.STOP_POLL_S), and sends on until
        # then: those requests are counted apart, so that every request sent is counted once.
        intended, done, codes = [np.empty(0)], [np.empty(0)], [np.empty(0, dtype=np.int16)]
        in_flight = sent_after = lost = 0
        for share, outcome in zip(shares, outcomes):
            if outcome is None:
                lost += 1
                continue
            # NaN (no answer: never sent, NOT_SENT, or cut in flight, CANCELLED) compares False.
            answered = outcome.done < at
            in_flight += int(np.count_nonzero((outcome.sent < at) & ~answered))
            sent_after += int(np.count_nonzero(outcome.sent >= at))
            intended.append(share.times[answered])
            done.append(outcome.done[answered])
            codes.append(outcome.codes[answered])
        t, d = np.concatenate(intended), np.concatenate(done)
        offset = start_at - self._clock0
        self.timeline.append((t + offset, d + offset, d - t, np.concatenate(codes)))
        self.cut = {
            "at_s": round(at + offset, 3),
            "in_flight": in_flight,
            "sent_after": sent_after,
            "workers_lost": lost,
        }
        self.cut_by = exc

    def _hold(self, exc: KeyboardInterrupt) -> None:
        # Its answers are all in, but the soak's time is its RSS watch's too, which ends here, short
        # of `duration_s`: a cut, as one before the last answer, that left no request out. Not held for
        # Ramp.run (super()._hold): a soak is one step, with none after it for the signal to stop, and
        # run_soak says the cut; Ramp.run said it too, as a signal "after the last step".
        at = round(time.monotonic() - self._clock0, 3)
        self.cut = {"at_s": at, "in_flight": 0, "sent_after": 0, "workers_lost": 0}
        self.cut_by = exc

    def run(self) -> dict:
        try:
            result = super().run()
        except BaseException:
            self.sampler.stop()
            raise
        # The soak's window has ended, its step is whole: a signal as the RSS watch takes its last sample (a scrape
        # per server, up to 2 s each) keeps it, as one after a ramp's last step. Raised here, it lost the soak.
        _, came = run_held(self.sampler.stop)
        if came is not None:
            self.late(came, "as the RSS watch stopped")
        return result


def _slope_per_min(t_s: np.ndarray, y: np.ndarray) -> float | None:
    ok = np.isfinite(y)
    if ok.sum() < 2 or np.ptp(t_s[ok]) == 0:
        return None
    return float(np.polyfit(t_s[ok] / 60.0, y[ok], 1)[0])


def _pct(latency_s: np.ndarray, key: str) -> float | None:
    """Nearest-rank percentile `key` ("p50", "p99") in ms, as every other figure of the result."""
    if not len(latency_s):
        return None
    value = latency_summary(latency_s * 1e3)[key]
    return None if math.isnan(value) else value


def soak_report(
    intended: np.ndarray,
    latency_s: np.ndarray,
    codes: np.ndarray,
    rss: Sequence[tuple[float, Sequence[float | None]]],
    *,
    duration_s: float,
    window_s: float,
    urls: Sequence[str] = (),
    cut: dict | None = None,
) -> dict:
    """Per-window latency and RSS, and the growth and drift figures (docs/reliability.md).

    `cut` (a soak cut short: `at_s` from the first send, and its counts) ends the windows and the
    RSS samples at the cut; the last window is then as long as the soak ran into it. A request
    the cut left unsent (code NOT_SENT, workers.Outcome) is left out: it was never part of the load.
    """
    was_sent = codes != NOT_SENT
    if not was_sent.all():
        intended, latency_s, codes = intended[was_sent], latency_s[was_sent], codes[was_sent]
    ok = codes == OK
    end_s = duration_s if cut is None else min(duration_s, cut["at_s"])
    # Before the soak's start: the capacity ramp's; after a cut: the run that was stopped.
    last = math.inf if cut is None else end_s
    rss = [(t, vs) for t, vs in rss if 0 <= t <= last]
    n = max(1, math.ceil(end_s / window_s - 1e-9))
    idx = np.floor(intended / window_s).astype(int)
    rss_t = np.array([t for t, _ in rss], dtype=float)
    rss_total = np.array([sum(v for v in vs if v) if any(vs) else np.nan for _, vs in rss], dtype=float)
    windows = []
    for w in range(n):
        here = idx == w
        lat = latency_s[here & ok]
        end = min((w + 1) * window_s, end_s)
        at_end = rss_total[rss_t <= end + 1e-9] if len(rss_t) else np.empty(0)
        windows.append(
            {
                "t_s": w * window_s,
                "length_s": end - w * window_s,
                "sent": int(here.sum()),
                "ok": int((here & ok).sum()),
                "p50_ms": _pct(lat, "p50"),
                "p99_ms": _pct(lat, "p99"),
                "rss_mib": float(at_end[-1] / MIB) if len(at_end) and np.isfinite(at_end[-1]) else None,
            }
        )
    full = [w for w in windows if w["length_s"] >= 0.5 * window_s and w["p99_ms"] is not None]
    p99 = np.array([w["p99_ms"] for w in full], dtype=float)
    p99_t = np.array([w["t_s"] for w in full], dtype=float)
    finite = np.isfinite(rss_total)
    rss_section: dict = {"urls": list(urls), "samples": [[t, vs] for t, vs in rss]}
    if finite.sum() >= 1:
        first, last = rss_total[finite][0], rss_total[finite][-1]
        half = rss_t >= rss_t[finite][-1] / 2
        rss_section.update(
            first_mib=first / MIB,
            last_mib=last / MIB,
            max_mib=float(np.nanmax(rss_total)) / MIB,
            growth_mib=(last - first) / MIB,
            growth_pct=100 * (last - first) / first if first else None,
            slope_mib_per_min=_none_or(_slope_per_min(rss_t, rss_total), 1 / MIB),
            slope_second_half_mib_per_min=_none_or(_slope_per_min(rss_t[half], rss_total[half]), 1 / MIB),
        )
    p99_section: dict = {"windows": len(full)}
    if len(full):
        p99_section.update(
            first_ms=float(p99[0]),
            last_ms=float(p99[-1]),
            drift_ms=float(p99[-1] - p99[0]),
            drift_pct=float(100 * (p99[-1] - p99[0]) / p99[0]) if p99[0] else None,
            slope_ms_per_min=_slope_per_min(p99_t, p99),
            max_ms=float(p99.max()),
        )
    names = np.array([status_name(c) for c in codes[~ok]])
    values, counts = np.unique(names, return_counts=True)
    return {
        "schema": SCHEMA,
        "duration_s": duration_s,
        "window_s": window_s,
        "cut": None if cut is None else dict(cut),
        "requests": {"sent": len(codes), "ok": int(ok.sum()), "errors": int((~ok).sum())},
        "errors_by_code": {str(v): int(c) for v, c in zip(values, counts)},
        "windows": windows,
        "rss": rss_section,
        "p99": p99_section,
    }


def _none_or(v: float | None, scale: float) -> float | None:
    return None if v is None else v * scale


def run_soak(args, cfg: RampConfig, *, say: Callable[[str], None] | None = None) -> dict:
    """Capacity (measured or given), then the soak; the soak step's wok.bench/2 result with `soak` added.

    Without a soak, the capacity ramp's result with `soak` null: when that ramp was cut short
    (`interrupted` set; the soak is not started), or whole but for a signal after its last step
    (`Ramp.late_signal`: `soak not started`), found no step under the SLO, or the soak step was cut
    short before its first send (`interrupted` then says so). A soak step cut later keeps what it
    measured: no `steps` (none finished), its `soak` section up to the cut, with `cut`; one cut as
    it waited for its end, its answers all in (`SoakRamp._hold`), keeps its whole step too.
    """
    from . import faults

    say = say or faults.say
    # Both ramps on the same --workers load-generator processes: the soak's own were a second start of each (a spawned
    # interpreter's imports, a few tenths of a second), as the capacity ramp's were stopped.
    processes = WorkerProcesses().start()
    try:
        result = _capacity_then_soak(args, cfg, say, processes)
    except BaseException:
        processes.stop()
        raise
    # Held, as a ramp's result is built (Ramp.run): what was measured is whole. Caught instead, a signal ended the
    # stop where it came, before it had told a worker to end or waited for one. Said as it comes: a worker that would
    # not exit holds the stop END_WAIT_S, and a Ctrl-C there did nothing to be seen for as long.
    kept = _kept(result)
    _, came = run_held(processes.stop, doing=f"the workers stop (up to {END_WAIT_S:g} s)", kept=kept)
    if came is not None:
        say(f"{type(came).__name__}: {came} as the workers stopped: {kept}")
    return result


def _capacity_then_soak(args, cfg: RampConfig, say: Callable[[str], None], processes: WorkerProcesses) -> dict:
    """`run_soak`'s ramps, on `processes` (started; stopped by the caller)."""
    from . import faults

    values = soak_values(args, cfg)
    replicas, cfg = faults.start_replicas(args, cfg, say)
    try:
        result = _ramps(args, cfg, say, processes, replicas, values)
    except BaseException:
        if replicas is not None:
            replicas.close(say)
        raise
    faults.close_replicas_held(replicas, say, kept=_kept(result))
    return result


def _ramps(args, cfg: RampConfig, say: Callable[[str], None], processes: WorkerProcesses, replicas, values) -> dict:
    """`_capacity_then_soak`'s ramps on `replicas` (None: the target's server) with `soak_values`' `values`, and
    their result."""
    duration, window, every, share = values
    urls = [r.metrics_url for r in replicas] if replicas is not None else [cfg.metrics_url] if cfg.metrics_url else []
    capacity_result = capacity_ramp = None
    if args.capacity is not None:
        capacity, source = args.capacity, "given"
    else:
        say("measuring the capacity: the highest step under the SLO")
        capacity_ramp = Ramp(cfg, say, processes=processes)
        capacity_ramp.replicas = replicas  # its result, the run's when no soak follows, names them
        capacity_ramp.says_late_signal = False  # "soak not started", below, says it
        capacity_result = capacity_ramp.run()
        capacity, source = capacity_result["max_qps_under_slo"], "measured"
        if capacity_result["interrupted"] is not None:
            # Its highest step under the SLO is the last one reached, not the capacity: a
            # soak at a share of it would load the server at a rate nobody chose.
            say("the capacity ramp was cut short: no soak")
            return _without_soak(capacity_result)
        if capacity_ramp.late_signal is not None:
            # A signal as its last step waited for its end, or as its workers stopped: the ramp is
            # whole, but the soak (minutes) is what the signal said not to start.
            return _soak_not_run(capacity_result, f"soak not started: {capacity_ramp.late_signal}", True, say)
        if capacity is None:  # the command line says so, and exits with its status
            capacity_result["warnings"].append(NO_CAPACITY)
            return _without_soak(capacity_result)
    try:  # its start too (the payload pool, the metadata: seconds), where a signal lost the capacity ramp
        load = share * capacity
        # The capacity is an offered rate; a burst or a sawtooth offers another rate than the
        # step rate that makes it, so the soak's step rate is solved for, not scaled.
        nominal = nominal_for(cfg.arrival, load, duration)
        shown = "" if math.isclose(nominal, load, rel_tol=1e-9) else f" offered (step rate {nominal:.4g})"
        say(f"soak: {load:g} QPS{shown} ({100 * share:g}% of {capacity:g}) for {duration:g} s")
        soak_cfg = replace(cfg, steps=[nominal], step_duration_s=duration, warmup_s=0.0, refine=0, stop_factor=math.inf)
        sampler = RssSampler(urls, every)
        # The capacity ramp's pool: the soak's config differs from its in the steps' rates and times alone.
        ramp = SoakRamp(soak_cfg, sampler, say, pool_of=capacity_ramp, processes=processes)
        ramp.replicas = replicas
        result = ramp.run()
    except (Exception, KeyboardInterrupt) as exc:
        if capacity_result is None:
            raise  # nothing measured: as a ramp cut in its first step
        # The soak is one step, so nothing of it is kept; the capacity ramp still is a result.
        reason = f"soak ended early: {type(exc).__name__}: {exc}"
        return _soak_not_run(capacity_result, reason, isinstance(exc, KeyboardInterrupt), say)
    given = {"qps": capacity, "source": source, "load_share": share, "load_qps": load, "load_nominal_qps": nominal}
    # What the soak measured is whole: a signal while its report is made keeps it, as one as a ramp's result is built.
    result, came = run_held(
        lambda: _with_soak(ramp, result, capacity_result, given, say, duration=duration, window=window, urls=urls)
    )
    if came is not None:
        ramp.late(came, "as the soak's report was made")
    return result


def _with_soak(
    ramp: SoakRamp,
    result: dict,
    capacity_result: dict | None,
    capacity: dict,
    say: Callable[[str], None],
    *,
    duration: float,
    window: float,
    urls: list[str],
) -> dict:
    """The soak step's `result` with its `soak` section (`capacity`: that section's, but for the capacity ramp's
    steps), and the capacity ramp's verdicts where it ran (`capacity_result`)."""
    sampler = ramp.sampler
    if ramp.cut is not None:
        # Said as for a soak cut before its first send (`_ramps`), but with what it measured kept.
        exc = ramp.cut_by
        reason = f"soak ended early: {type(exc).__name__}: {exc}"
        say(f"{reason}; the soak's {ramp.cut['at_s']:g} s measured are kept")
        # The ramp's own words for its one step; none when the cut came as the step, its answers all
        # in, waited for its end (SoakRamp._hold): the step is whole, and kept.
        cut_warning = (result["interrupted"] or {}).get("reason")
        result["warnings"] = [w for w in result["warnings"] if w != cut_warning] + [reason]
        result["interrupted"] = {"reason": reason, "by_signal": isinstance(exc, KeyboardInterrupt), "phase": "soak"}
    if ramp.timeline:
        intended, _, lat, codes = (np.concatenate([t[k] for t in ramp.timeline]) for k in range(4))
    else:
        intended = lat = np.empty(0)
        codes = np.empty(0, dtype=np.int16)
    section = soak_report(
        intended, lat, codes, sampler.samples, duration_s=duration, window_s=window, urls=urls, cut=ramp.cut
    )
    section["capacity"] = {**capacity, "steps": None if capacity_result is None else capacity_result["steps"]}
    # A one-step ramp's verdicts describe the soak step; the run's figures are the capacity's.
    result["warnings"] = [w for w in result["warnings"] if not w.startswith("every step met the SLO")]
    if capacity_result is not None:
        result["max_qps_under_slo"] = capacity_result["max_qps_under_slo"]
        result["knee_qps"] = capacity_result["knee_qps"]
        result["knee_at_or_below_first_step"] = capacity_result["knee_at_or_below_first_step"]
        # The soak step is a ramp of one step, which skips none: the run's ramp is the capacity ramp.
        result["stopped_early"] = capacity_result["stopped_early"]
        # The soak ran on the capacity ramp's pool (`pool_of`): what that pool's build said is in both results, kept
        # once, unprefixed (it is the run's, not the capacity ramp's alone).
        pool = set(ramp.setup_warnings + ramp.plan_notes())
        own = [f"capacity ramp: {w}" for w in capacity_result["warnings"] if w not in pool]
        result["warnings"] = own + result["warnings"]
    else:  # nothing measured a maximum: the soak step's own verdict is what there is
        result["knee_qps"] = None
        result["knee_at_or_below_first_step"] = False
    section["verdict_from"] = "capacity ramp" if capacity_result is not None else "soak step"
    if not urls:
        result["warnings"].append("no /metrics to scrape (give --metrics-url): RSS was not sampled")
    result["warnings"].extend(sampler.unread())
    result["soak"] = section
    return result


def soak_values(args, cfg: RampConfig) -> tuple[float, float, float, float]:
    """(duration, window, RSS interval in seconds, share of the capacity) of a soak's options, checked
    against each other and the arrival cap before anything connects (`wok bench ramp` calls this
    before it scrapes --metrics-url); ValueError naming the option."""
    given = {k: d if getattr(args, k) is None else getattr(args, k) for k, d in DEFAULTS.items()}
    duration = _duration("--soak", args.soak)
    window = _duration("--soak-window", given["soak_window"])
    every = _duration("--rss-every", given["rss_every"])
    share = parse_fraction(given["soak_load"])
    if args.soak_window is not None and window > duration:
        # The soak would be one window, shorter than asked: its P99 has nothing to drift from, and the
        # report said so only as `-` (a window longer than twice the soak: no P99 at all). The default
        # window is left to a short soak, run to see its RSS.
        raise ValueError(
            f"--soak-window {given['soak_window']} is longer than --soak {args.soak}: one window, no P99 drift to "
            "measure"
        )
    if args.capacity is not None and not args.capacity > 0:
        raise ValueError(f"--capacity: expected a rate > 0; got {args.capacity:g}")
    _check_arrivals(args, cfg, share, duration)
    return duration, window, every, share


def _duration(option: str, text: str) -> float:
    """`text` in seconds, finite and > 0; a ValueError names `option`."""
    from .arrivals import parse_duration

    try:
        value = parse_duration(text)
    except ValueError as exc:
        raise ValueError(f"{option}: {exc}") from None
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{option}: expected a finite duration > 0; got {quoted_name(text)}")
    return value


def _check_arrivals(args, cfg: RampConfig, share: float, duration: float) -> None:
    """Refuse, before anything connects, a soak whose one step expects more arrivals than a ramp's
    step may: its whole schedule is drawn up front and every request's figures kept to the end
    (a long --soak at a high rate was a numpy MemoryError traceback, or the bench's memory)."""
    from .arrivals import parse_arrivals, window_rate
    from .simulate import MAX_ARRIVALS_PER_STEP, arrival_count

    if args.capacity is not None:
        top, whose = args.capacity, f"--capacity {args.capacity:g}"
    else:
        # The measured capacity is a step's offered rate: the highest step's at most (refinement
        # steps lie between the given ones).
        total = cfg.warmup_s + cfg.step_duration_s
        top = window_rate(parse_arrivals(cfg.arrival, max(cfg.steps), duration_s=total), cfg.warmup_s, total)
        whose = f"the highest step ({top:g} QPS offered), which the capacity may reach"
    nominal = nominal_for(cfg.arrival, share * top, duration)
    expected = arrival_count(parse_arrivals(cfg.arrival, nominal, duration_s=duration), duration)
    if not expected <= MAX_ARRIVALS_PER_STEP:
        raise ValueError(
            f"--soak {args.soak} at {100 * share:g}% of {whose}: at most {MAX_ARRIVALS_PER_STEP:.0e} arrivals in "
            f"the soak; got {expected:.3g} expected (give a shorter --soak or a lower load)"
        )


def _soak_not_run(capacity_result: dict, reason: str, by_signal: bool, say: Callable[[str], None]) -> dict:
    """The capacity ramp's result as the run's, for a soak cut before its first send (`reason`)."""
    say(reason)
    capacity_result["interrupted"] = {"reason": reason, "by_signal": by_signal, "phase": "soak"}
    capacity_result["warnings"].append(reason)
    return _without_soak(capacity_result)


def _without_soak(capacity_result: dict) -> dict:
    """The capacity ramp's result as the run's, when the soak did not run or did not finish."""
    capacity_result["soak"] = None
    return capacity_result


def print_soak(result: dict, file=None) -> None:
    from rich.table import Table

    from .faults import by_code, section_console
    from .faults import fmt as _f

    s, console = section_console(result, "soak", file)
    if s is None:
        return
    cap = s["capacity"]
    cut = s.get("cut")
    ran = f"{s['duration_s']:g} s" if cut is None else f"cut at {cut['at_s']:g} s of {s['duration_s']:g} s"
    table = Table(
        title=f"soak: {cap['load_qps']:g} QPS = {100 * cap['load_share']:g}% of {cap['qps']:g} ({cap['source']}), {ran}"
    )
    for head in ("from s", "sent", "ok %", "P50 ms", "P99 ms", "RSS MiB"):
        table.add_column(head, justify="right")
    for w in s["windows"]:
        ok_pct = 100 * w["ok"] / w["sent"] if w["sent"] else None
        table.add_row(
            f"{w['t_s']:g}", str(w["sent"]), _f(ok_pct, ".2f"), _f(w["p50_ms"]), _f(w["p99_ms"]), _f(w["rss_mib"])
        )
    console.print(table)
    r, p = s["rss"], s["p99"]
    console.print(
        f"RSS: {_f(r.get('first_mib'))} → {_f(r.get('last_mib'))} MiB (growth {_f(r.get('growth_mib'), '+.1f')} MiB, "
        f"{_f(r.get('growth_pct'), '+.2f')}%), slope {_f(r.get('slope_mib_per_min'), '+.3f')} MiB/min "
        f"({_f(r.get('slope_second_half_mib_per_min'), '+.3f')} in the second half), max {_f(r.get('max_mib'))} MiB"
    )
    console.print(
        f"P99: first window {_f(p.get('first_ms'))} ms, last {_f(p.get('last_ms'))} ms (drift "
        f"{_f(p.get('drift_ms'), '+.1f')} ms, {_f(p.get('drift_pct'), '+.1f')}%), slope "
        f"{_f(p.get('slope_ms_per_min'), '+.2f')} ms/min, worst window {_f(p.get('max_ms'))} ms; "
        f"errors {by_code(s['errors_by_code'], 'none')} of {s['requests']['sent']}"
    )
    if cut is not None:
        from .report import soak_cut_note

        console.print(soak_cut_note(result), markup=False, highlight=False)  # the reason is an error's own text


def add_arguments(p) -> None:
    g = p.add_argument_group("soak", "a long run at a share of the capacity; see docs/reliability.md")
    g.add_argument(
        "--soak",
        nargs="?",
        const="10m",
        metavar="DURATION",
        help="after finding the capacity with the ramp's steps (or --capacity), hold --soak-load of it for "
        "DURATION (default 10m) and report RSS growth and P99 drift",
    )
    g.add_argument("--soak-load", help="with --soak: share of the capacity to hold (default 80%%)")
    g.add_argument("--capacity", type=float, help="with --soak: capacity in QPS: skip measuring it")
    g.add_argument("--soak-window", help="with --soak: window of the per-window P99 (default 1m)")
    g.add_argument("--rss-every", help="with --soak: how often the server's RSS is scraped (default 5s)")


def check_options(args) -> None:
    """ValueError for a soak option given without --soak: it would be ignored."""
    if args.soak is not None:
        return
    given = [f"--{k.replace('_', '-')}" for k in ("capacity", *DEFAULTS) if getattr(args, k) is not None]
    if given:
        many = len(given) > 1
        raise ValueError(
            f"{', '.join(given)} {'are' if many else 'is'} for --soak, which was not given: "
            f"{'they' if many else 'it'} would be ignored"
        )
