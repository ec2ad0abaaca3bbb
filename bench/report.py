"""Write a `wok.bench/2` result as JSON, CSV, PNG plots, one self-contained HTML page, or a table.

The HTML report has no external reference at all (inline CSS, plots as data: URIs, a
Content-Security-Policy that forbids any fetch), so it can be mailed, attached to a CI
run, or opened offline. Plots use matplotlib's object API on a standalone Figure, which
needs no display and keeps no global pyplot state between reports.
"""

from __future__ import annotations

import base64
import csv
import html
import io
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import matplotlib
import numpy as np

# Agg needs no display. Left alone when pyplot is already in use (a notebook): switching
# would close that session's figures, and the Figure API below does not need the backend.
if "matplotlib.pyplot" not in sys.modules:
    matplotlib.use("Agg")

from matplotlib.backend_bases import FigureCanvasBase
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter

from .analysis import LATENCY_KEYS, knee_at_or_below_first_step, passes_slo
from .outputs import json_text, replacing

PathOrFile = str | os.PathLike | IO

COLORS = {"p50": "#4c72b0", "p95": "#dd8452", "p99": "#c44e52", "slo": "#b22222", "knee": "#8172b3", "max": "#2e8b57"}
LOG_SPAN = 4.0  # log x once the steps span more than this ratio: 50..400 QPS would crowd the left otherwise
LOG_Y_SPAN = 50.0  # past the knee latency grows by orders of magnitude; a linear axis flattens the rest


# ---------------------------------------------------------------------------- JSON / CSV


def _plain(x: Any) -> Any:
    """JSON-ready copy: NaN and ±inf become null, numpy values Python ones, tuples lists."""
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, np.ndarray):
        return _plain(x.tolist())
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, os.PathLike):
        return os.fspath(x)
    return x


def to_json(result: dict) -> str:
    """The JSON text of a result, keys in the order the schema builds them (`outputs.json_text`)."""
    return json_text(_plain(result), allow_nan=False)


def bench_header(schema: str, config: dict) -> dict:
    """The first keys of a bench script's JSON: schema, UTC time written, the host, the config."""
    return {
        "schema": schema,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": {"cpus": os.cpu_count(), "loadavg_at_end": os.getloadavg()},
        "config": config,
    }


def write_json(result: dict, path) -> None:
    """NaN → null, key order as built (schema first, steps in offered order), indent 2."""
    Path(path).write_text(to_json(result), encoding="utf-8")


def read_json_object(path) -> dict:
    """A JSON object read from `path` (a finished run, a profile); a ValueError beginning with the
    path says why not."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: {exc}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: expected a JSON object; got {type(doc).__name__}")
    return doc


CSV_COLUMNS = (
    "offered_qps",
    "achieved_qps",
    "phase",
    "requests",
    "ok",
    "errors",
    "success_rate",
    *(f"latency_{k}_ms" for k in LATENCY_KEYS),
    "queue_mean_ms",
    "queue_p99_ms",
    "loop_lag_p99_ms",
    "mean_batch_size",
    "dispatch_lag_p99_ms",
    # Appended, not beside `requests`: a reader that takes the columns by position keeps its own.
    "not_sent",
)


def _num(x: Any) -> float:
    try:
        return float(x) if x is not None else math.nan
    except (TypeError, ValueError):
        return math.nan


def _get(d: dict | None, *keys: str) -> Any:
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def _steps(result_or_steps: dict | Sequence[dict]) -> list[dict]:
    steps = result_or_steps["steps"] if isinstance(result_or_steps, dict) else result_or_steps
    return sorted(steps, key=lambda s: s["offered_qps"])


def _csv_row(step: dict) -> dict:
    row = {
        "offered_qps": step["offered_qps"],
        "achieved_qps": step["achieved_qps"],
        "phase": step.get("phase", "ramp"),
        "requests": step["requests"],
        "ok": step["ok"],
        "errors": sum((step.get("errors") or {}).values()),
        "success_rate": step["success_rate"],
        "queue_mean_ms": _get(step, "queue_ms", "mean"),
        "queue_p99_ms": _get(step, "queue_ms", "p99"),
        "loop_lag_p99_ms": _get(step, "loop_lag_ms", "p99"),
        "mean_batch_size": step.get("mean_batch_size"),
        "dispatch_lag_p99_ms": _get(step, "dispatch_lag_ms", "p99"),
        "not_sent": step.get("not_sent", 0),  # absent: every request of the step was sent
    }
    for k in LATENCY_KEYS:
        row[f"latency_{k}_ms"] = _get(step, "latency_ms", k)
    # An empty cell, not "nan": spreadsheets and pandas both read it as missing.
    return {k: ("" if v is None or (isinstance(v, float) and not math.isfinite(v)) else v) for k, v in row.items()}


def write_csv(result: dict, path) -> None:
    """One row per step, in offered order; missing figures are empty cells."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        w.writeheader()
        for step in _steps(result):
            w.writerow(_csv_row(step))


# ---------------------------------------------------------------------------- plots


def _series(steps: list[dict], *keys: str) -> np.ndarray:
    return np.array([_num(_get(s, *keys)) for s in steps], dtype=np.float64)


def _span(values: np.ndarray) -> float:
    v = values[np.isfinite(values) & (values > 0)]
    return float(v.max() / v.min()) if v.size else 1.0


def _log_axis(ax, which: str, ticks: np.ndarray | None = None) -> None:
    """Log scale with plain numbers ("400", not "4×10²"); on x, ticks at the offers themselves."""
    axis = ax.xaxis if which == "x" else ax.yaxis
    (ax.set_xscale if which == "x" else ax.set_yscale)("log")
    if ticks is not None and 0 < len(ticks) <= 12:
        axis.set_ticks(ticks)
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def _offers_in_view(ax, offers: np.ndarray) -> None:
    """Every step's offer inside the x axis, whether or not it has a point to draw (a step with no
    latency had none, and the axis closed around the verdict marks alone)."""
    lo, hi = float(np.nanmin(offers)), float(np.nanmax(offers))
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return
    if ax.get_xscale() == "log":
        if lo > 0:
            ax.set_xlim(min(ax.get_xlim()[0], lo / 1.15), max(ax.get_xlim()[1], hi * 1.15))
    else:
        pad = 0.05 * (hi - lo) or 0.05 * abs(hi) or 1.0
        ax.set_xlim(min(ax.get_xlim()[0], lo - pad), max(ax.get_xlim()[1], hi + pad))


def _placeholder(fig: Figure, text: str) -> None:
    ax = fig.add_subplot()
    ax.set_axis_off()
    ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=12, color="#666", transform=ax.transAxes)


def _mark_offer(ax, x: float | None, label: str, color: str, y_frac: float, offers: np.ndarray) -> None:
    if x is None:
        return
    ax.axvline(x, color=color, linestyle=":", linewidth=1.5, label=label)
    # Labels of marks in the right part of the plot go to the line's left, so they stay inside the axes.
    # The mark itself counts: a soak's capacity-ramp verdict lies beyond its one step.
    lo, hi = min(float(np.nanmin(offers)), x), max(float(np.nanmax(offers)), x)
    scale = np.log if _span(offers) > LOG_SPAN else (lambda v: v)
    frac = (scale(x) - scale(lo)) / (scale(hi) - scale(lo)) if hi > lo else 0.0
    left = frac > 0.6
    ax.annotate(
        label,
        xy=(x, y_frac),
        xycoords=("data", "axes fraction"),
        xytext=(-4 if left else 4, 0),
        textcoords="offset points",
        ha="right" if left else "left",
        color=color,
        fontsize=9,
        va="top",
    )


def _mark_verdicts(ax, result: dict, offers: np.ndarray) -> None:
    """The knee and the max under the SLO; named as the capacity ramp's when that ramp's steps are not drawn."""
    origin = " (capacity ramp)" if _verdicts_from_capacity_ramp(result) else ""
    knee, best = result.get("knee_qps"), result.get("max_qps_under_slo")
    at = "≤ " if _knee_at_first(result) else ""
    _mark_offer(ax, knee, f"knee {at}{_fmt_qps(knee)} QPS{origin}", COLORS["knee"], 0.98, offers)
    _mark_offer(ax, best, f"max under SLO {_fmt_qps(best)} QPS{origin}", COLORS["max"], 0.85, offers)


def latency_figure(result: dict) -> Figure:
    fig = Figure(figsize=(8, 4.5), layout="constrained")
    steps = _steps(result)
    if not steps:
        _placeholder(fig, "no steps in this result")
        return fig
    ax = fig.add_subplot()
    x = _series(steps, "offered_qps")
    for key in ("p50", "p95", "p99"):
        ax.plot(x, _series(steps, "latency_ms", key), marker="o", markersize=4, color=COLORS[key], label=key.upper())
    slo = _num(result.get("slo_p99_ms"))
    if math.isfinite(slo):
        ax.axhline(slo, color=COLORS["slo"], linestyle="--", linewidth=1.2, label=f"SLO: P99 ≤ {slo:g} ms")
    best = result.get("max_qps_under_slo")
    if best is not None:
        at = next((s for s in steps if s["offered_qps"] == best), None)
        if at is not None:
            ax.plot(
                [best], [_num(_get(at, "latency_ms", "p99"))], marker="*", markersize=14, color=COLORS["max"], zorder=5
            )
    _mark_verdicts(ax, result, x)
    if _span(x) > LOG_SPAN:
        _log_axis(ax, "x", x)
    _offers_in_view(ax, x)
    lat = np.concatenate([_series(steps, "latency_ms", k) for k in ("p50", "p95", "p99")] + [np.array([slo])])
    if _span(lat) > LOG_Y_SPAN:
        _log_axis(ax, "y")
    ax.set_xlabel("offered load (QPS)")
    ax.set_ylabel("latency (ms)")
    ax.set_title("Latency vs offered load")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    return fig


def throughput_figure(result: dict) -> Figure:
    fig = Figure(figsize=(8, 4.5), layout="constrained")
    steps = _steps(result)
    if not steps:
        _placeholder(fig, "no steps in this result")
        return fig
    ax = fig.add_subplot()
    x = _series(steps, "offered_qps")
    y = _series(steps, "achieved_qps")
    lim = [float(np.nanmin(x)), float(np.nanmax(x))]
    ax.plot(lim, lim, color="#999", linestyle="--", linewidth=1, label="achieved = offered")
    ax.plot(x, y, marker="o", markersize=4, color=COLORS["p50"], label="achieved (successful requests)")
    _mark_verdicts(ax, result, x)
    finite = y[np.isfinite(y)]
    log_x = _span(x) > LOG_SPAN
    if log_x:
        _log_axis(ax, "x", x)
    # y as x, so that y = x stays the diagonal; but a step that answered nothing (0 QPS) has no
    # place on a log axis (it vanished, where the failure was): then y is linear from 0.
    if log_x and finite.size and finite.min() > 0:
        _log_axis(ax, "y", x)
    else:
        # From 0: autoscaled around one step's point the axis spans a few QPS, and a throughput
        # on target looks like noise; from 0 a shortfall is drawn at its true size.
        top = float(np.nanmax(np.concatenate([x, y])))
        if math.isfinite(top) and top > 0:
            ax.set_ylim(0, 1.05 * top)
    ax.set_xlabel("offered load (QPS)")
    ax.set_ylabel("achieved throughput (QPS)")
    ax.set_title("Throughput vs offered load")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    return fig


def timeline_figure(result: dict) -> Figure:
    fig = Figure(figsize=(8, 5), layout="constrained")
    tl = result.get("timeline")
    if not tl or not tl.get("t_s"):
        _placeholder(fig, "no timeline in this result\n(per-second series were not recorded)")
        return fig
    t = np.array([_num(v) for v in tl["t_s"]])
    top, bottom = fig.subplots(2, 1, sharex=True)
    top.step(t, [_num(v) for v in tl["offered"]], where="post", color="#999", label="offered")
    top.step(t, [_num(v) for v in tl["achieved"]], where="post", color=COLORS["p50"], label="achieved")
    top.set_ylabel("QPS")
    top.set_title("Load and P99 over time (1 s bins)")
    top.legend(loc="upper left", fontsize=8)
    top.grid(True, alpha=0.3)
    p99 = np.array([_num(v) for v in tl["p99_ms"]])
    bottom.plot(t, p99, color=COLORS["p99"], linewidth=1.2, label="P99")
    slo = _num(result.get("slo_p99_ms"))
    if math.isfinite(slo):
        bottom.axhline(slo, color=COLORS["slo"], linestyle="--", linewidth=1.2, label=f"SLO {slo:g} ms")
    if _span(np.append(p99, slo)) > LOG_Y_SPAN:
        _log_axis(bottom, "y")
    bottom.set_ylabel("P99 latency (ms)")
    bottom.set_xlabel("time since the first step (s)")
    bottom.legend(loc="upper left", fontsize=8)
    bottom.grid(True, alpha=0.3)
    return fig


# The parts a latency splits into with server timing, in the order a request meets them.
BREAKDOWN = (
    ("queue", ("queue",), "#4c72b0"),
    ("batch (model and hops)", ("batch",), "#dd8452"),
    ("respond", ("respond",), "#55a868"),
    ("decode + encode", ("decode", "encode"), "#8c8c8c"),
    ("outside the server", ("outside",), "#c44e52"),
)


def _timed(steps: list[dict]) -> list[dict]:
    return [s for s in steps if (s.get("server_timing") or {}).get("requests")]


def _tail_part(timing: dict, part: str) -> float | None:
    # A merged result (wok bench merge) has no tail: its parts' slowest 1 % are not the whole's.
    return ((timing.get("tail") or {}).get("mean_ms") or {}).get(part)


def breakdown_figure(result: dict) -> Figure:
    """Where the time went, per step (`--server-timing`): the mean request, and the slowest 1 %."""
    fig = Figure(figsize=(10, 4.2), layout="constrained")
    steps = _timed(_steps(result))
    if not steps:
        _placeholder(fig, "no server timing in this result (wok bench ramp --server-timing)")
        return fig
    labels = [_fmt_qps(s["offered_qps"]) for s in steps]
    x = np.arange(len(steps))
    views = (
        ("the mean request", lambda t, k: t["outside_ms"]["mean"] if k == "outside" else t["stages_ms"][k]["mean"]),
        ("the slowest 1 % (at or above the P99), mean", _tail_part),
    )
    for i, (title, value) in enumerate(views):
        ax = fig.add_subplot(1, 2, i + 1)
        if value is _tail_part and not any(s["server_timing"].get("tail") for s in steps):
            # Zero-height bars read as a slowest 1 % that took no time.
            ax.set_axis_off()
            ax.set_title(title)
            text = "not in this result: a merged result's parts'\nslowest 1 % are not the whole's"
            ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=11, color="#666", transform=ax.transAxes)
            continue
        bottom = np.zeros(len(steps))
        for name, keys, color in BREAKDOWN:
            part = np.array([sum(_num(value(s["server_timing"], k)) for k in keys) for s in steps])
            part = np.where(np.isfinite(part), part, 0.0)
            ax.bar(x, part, bottom=bottom, color=color, label=name, width=0.7)
            bottom += part
        ax.set_xticks(x, labels, rotation=45 if len(steps) > 6 else 0)
        ax.set_xlabel("offered load (QPS)")
        ax.set_ylabel("latency (ms)")
        ax.set_title(title)
        ax.grid(True, axis="y", alpha=0.3)
        if i == 0:
            ax.legend(loc="upper left", fontsize=8)
    return fig


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return buf.getvalue()


def _write_bytes(data: bytes, path: PathOrFile) -> None:
    if hasattr(path, "write"):
        path.write(data)
    else:
        with replacing(Path(path)) as where:  # --plots' files, whole or not at all, as the other outputs
            where.write_bytes(data)


def figure_format(path) -> str:
    """The format `savefig` should write at `path`: its suffix's, PNG for none; ValueError for one
    matplotlib does not know. Given explicitly, as matplotlib would read `.part` (an output written
    beside its path, `outputs.replacing`, of a path with no suffix) as the format, and for no
    suffix add `.png` to the name."""
    suffix = Path(path).suffix.lstrip(".").lower()
    if suffix in ("", "part"):  # none given: the file beside it, `outputs.replacing`, ends in .part
        return "png"
    if suffix not in FigureCanvasBase.get_supported_filetypes():
        # Drawn as PNG, it would overwrite what the path holds (a --plot run.json, by a slip).
        raise ValueError(f"a figure cannot be written as .{suffix}; give a path ending in .png, .svg or .pdf")
    return suffix


def plot_latency_vs_offered(result: dict, path: PathOrFile) -> None:
    """P50/P95/P99 against offered QPS, with the SLO line, the knee and the max under the SLO."""
    _write_bytes(_png(latency_figure(result)), path)


def plot_throughput(result: dict, path: PathOrFile) -> None:
    """Achieved against offered QPS, with y = x and the knee."""
    _write_bytes(_png(throughput_figure(result)), path)


def plot_timeline(result: dict, path: PathOrFile) -> None:
    """Offered and achieved QPS, and P99, per second; a placeholder figure when there is no timeline."""
    _write_bytes(_png(timeline_figure(result)), path)


# ---------------------------------------------------------------------------- text


def _fmt_qps(x: Any) -> str:
    # Whole rates in full (":g" printed 1,048,576 as 1.04858e+06), others to 0.1 QPS, and below 1 QPS
    # to 3 significant digits (0.25 read 0.2, 0.04 read 0.0).
    v = _num(x)
    if not math.isfinite(v):
        return "-"
    if v == round(v):
        return f"{v:.0f}"
    return f"{v:.1f}" if abs(v) >= 1 else f"{v:.3g}"


def _fmt_ms(x: Any) -> str:
    v = _num(x)
    if not math.isfinite(v):
        return "-"
    return f"{v:.2f}" if abs(v) < 10 else f"{v:.1f}" if abs(v) < 100 else f"{v:.0f}"


def _fmt_pct(x: Any) -> str:
    v = _num(x)
    return "-" if not math.isfinite(v) else f"{100 * v:.2f}"


def _beside_verdict(x: Any, limit: Any, text: str, passes, scale: float = 1.0) -> str:
    """`text` (x × scale as a cell shows it), with more decimals where its rounding puts the figure on
    the other side of the verdict's `limit` than x is: a P99 of 200.4 ms read "200" beside FAIL for
    a 200 ms SLO, a success rate of 98.996 % "99.00" beside FAIL for 99 %."""
    v, lim = _num(x), _num(limit)
    if not (math.isfinite(v) and math.isfinite(lim)):
        return text
    want = passes(v, lim)
    decimals = len(text.partition(".")[2])
    while passes(float(text) / scale, lim) != want:
        decimals += 1
        if decimals > 15:
            return repr(v * scale)
        text = f"{v * scale:.{decimals}f}"
    return text


def _p99_cell(step: dict, result: dict | None) -> str:
    p99 = _get(step, "latency_ms", "p99")
    if not result or result.get("slo_p99_ms") is None:
        return _fmt_ms(p99)
    return _beside_verdict(p99, result["slo_p99_ms"], _fmt_ms(p99), lambda v, lim: v <= lim)


def _success_cell(step: dict, result: dict | None) -> str:
    rate = step["success_rate"]
    if not result or result.get("slo_p99_ms") is None:
        return _fmt_pct(rate)
    least = result.get("min_success_rate", 0.99)
    return _beside_verdict(rate, least, _fmt_pct(rate), lambda v, lim: v >= lim, scale=100.0)


def _verdict(step: dict, result: dict | None) -> str:
    if not result or result.get("slo_p99_ms") is None:
        return ""
    return "pass" if passes_slo(step, result["slo_p99_ms"], result.get("min_success_rate", 0.99)) else "FAIL"


def _simulated(result_or_steps) -> bool:
    """Whether the steps are `wok simulate`'s: its config says so or, for bare steps, each carries
    `utilization`, which only the simulator writes."""
    if isinstance(result_or_steps, dict) and (result_or_steps.get("config") or {}).get("source") == "simulate":
        return True
    steps = _steps(result_or_steps)
    return bool(steps) and all("utilization" in s for s in steps)


def _table_rows(result_or_steps) -> tuple[list[str], list[list[str]]]:
    result = result_or_steps if isinstance(result_or_steps, dict) else None
    steps = _steps(result_or_steps)
    refine = any(s.get("phase", "ramp") != "ramp" for s in steps)
    simulated = _simulated(result_or_steps)
    columns = [
        ("offered", lambda s: _fmt_qps(s["offered_qps"])),
        ("achieved", lambda s: f"{_num(s['achieved_qps']):.1f}"),
        ("ok %", lambda s: _success_cell(s, result)),
        ("p50 ms", lambda s: _fmt_ms(_get(s, "latency_ms", "p50"))),
        ("p95 ms", lambda s: _fmt_ms(_get(s, "latency_ms", "p95"))),
        ("p99 ms", lambda s: _p99_cell(s, result)),
        ("max ms", lambda s: _fmt_ms(_get(s, "latency_ms", "max"))),
        ("queue p99", lambda s: _fmt_ms(_get(s, "queue_ms", "p99"))),
        ("loop p99", lambda s: _fmt_ms(_get(s, "loop_lag_ms", "p99"))),
        ("batch", lambda s: "-" if s.get("mean_batch_size") is None else f"{_num(s['mean_batch_size']):.1f}"),
        ("lag p99", lambda s: _fmt_ms(_get(s, "dispatch_lag_ms", "p99"))),
    ]
    if simulated:
        # No figure to show: the simulator has no event loop to lag, and sends every request on time (lag 0).
        columns = [c for c in columns if c[0] not in ("loop p99", "lag p99")]
    if _timed(steps):  # with --server-timing: the server's own P99 and the time outside it
        columns += [
            ("server p99", lambda s: _fmt_ms(_get(s, "server_timing", "stages_ms", "total", "p99"))),
            ("outside p99", lambda s: _fmt_ms(_get(s, "server_timing", "outside_ms", "p99"))),
        ]
    columns.append(("errors", lambda s: str(sum((s.get("errors") or {}).values()))))
    if refine:
        columns.append(("phase", lambda s: s.get("phase", "ramp")))
    if result:
        columns.append(("SLO", lambda s: _verdict(s, result)))
    return [name for name, _ in columns], [[cell(s) for _, cell in columns] for s in steps]


# What the table's less obvious columns hold, said under it (`_legend_lines`) and in docs/bench.md
# ("Reading the table"): "lag p99", the generator's, beside "loop p99", the server's, read as one figure.
LEGEND = {
    "p50 ms": "p50 ms … max ms: latency from each request's intended send to its answer (OK requests)",
    "queue p99": "queue p99: ms waited in the server's batching queue",
    "loop p99": "loop p99: ms the server's event loop ran late (its lag)",
    "batch": "batch: mean rows per batch the server ran",
    "lag p99": "lag p99: ms the load generator sent late (its dispatch lag)",
    "server p99": "server p99: ms inside the server (its server-timing trailer)",
    "outside p99": "outside p99: ms of latency outside the server (network, client, gRPC)",
}
SIMULATED_LEGEND = {
    **LEGEND,
    "queue p99": "queue p99: ms waited in the simulated batching queue",
    "batch": "batch: mean rows per simulated batch",
}
LEGEND_WIDTH = 110


def _legend_lines(result_or_steps, head: list[str], rows: list[list[str]]) -> list[str]:
    """The legend of the table's columns `head`, packed into lines of at most LEGEND_WIDTH characters
    (an entry is never split), with what "-" means when a cell shows it."""
    legend = SIMULATED_LEGEND if _simulated(result_or_steps) else LEGEND
    entries = [legend[h] for h in head if h in legend]
    if any(cell == "-" for row in rows for cell in row):
        steps = result_or_steps["steps"] if isinstance(result_or_steps, dict) else result_or_steps
        unread = not _simulated(result_or_steps) and "queue p99" in head and steps
        if unread and all(s.get(k) is None for s in steps for k in ("queue_ms", "loop_lag_ms", "mean_batch_size")):
            # Said once before the first step, minutes up the scroll: the table alone read as a server that ran nothing.
            entries.append(
                "-: no figure (queue p99, loop p99, batch: the server's /metrics was not read: give --metrics-url)"
            )
        else:
            entries.append("-: no figure")
    lines: list[str] = []
    for entry in entries:
        if lines and len(lines[-1]) + 2 + len(entry) <= LEGEND_WIDTH:
            lines[-1] += "; " + entry
        else:
            lines.append(entry)
    return lines


def _verdicts_from_capacity_ramp(result: dict) -> bool:
    """Whether the verdicts are a `--soak` run's capacity ramp's, whose steps are not the result's `steps`."""
    return (result.get("soak") or {}).get("verdict_from") == "capacity ramp"


def _knee_at_first(result: dict) -> bool:
    """Whether the knee is at or below the first step of the ramp it was found on (a soak run's
    capacity ramp's), read from those steps: the soak run copies `knee_qps` only, and files
    written before `knee_at_or_below_first_step` lack it."""
    if _verdicts_from_capacity_ramp(result):
        steps = ((result.get("soak") or {}).get("capacity") or {}).get("steps")
    else:
        steps = result.get("steps")
    return knee_at_or_below_first_step(steps or [], result.get("knee_qps"))


def _knee_text(result: dict) -> str:
    knee = result.get("knee_qps")
    if knee is None:
        return "none (throughput kept up at every step)"
    if _knee_at_first(result):
        return f"at or below {_fmt_qps(knee)} QPS (the first step already fell short of its offer)"
    return f"{_fmt_qps(knee)} QPS"


def _soak_verdict_note(result: dict, where: str) -> str | None:
    """Where a soak run's verdicts come from, said under them; `where` points at the soak step's row."""
    soak = result.get("soak")
    # Files from before `verdict_from` existed carry the soak step's own verdicts: nothing to explain.
    if not soak or "verdict_from" not in soak:
        return None
    cap = soak["capacity"]
    cut = soak.get("cut")
    if cut:  # no soak step row to point at: it did not finish
        held = f"the soak, cut at {cut['at_s']:g} s, held {_fmt_qps(cap['load_qps'])} QPS"
        if soak["verdict_from"] == "capacity ramp":
            return f"(from the capacity ramp's steps; {held}, {100 * cap['load_share']:g}% of it: see Soak)"
        return f"({held}; its capacity, {_fmt_qps(cap['qps'])} QPS, was given, not measured: see Soak)"
    if soak["verdict_from"] == "capacity ramp":
        return (
            f"(from the capacity ramp's steps; the soak step {where} held {_fmt_qps(cap['load_qps'])} QPS, "
            f"{100 * cap['load_share']:g}% of it)"
        )
    return f"(from the soak step {where}: the capacity, {_fmt_qps(cap['qps'])} QPS, was given, not measured)"


def stopped_early_note(result: dict) -> str | None:
    """Which step a stop rule ended the ramp at, of how many planned, and why (`stopped_early`): under the verdicts,
    in text and HTML alike; None for a ramp that ran every step planned (or a file written before the key)."""
    stop = result.get("stopped_early")
    if not stop:
        return None
    ramp = "the capacity ramp" if _verdicts_from_capacity_ramp(result) else "the ramp"
    return (
        f"{ramp} stopped early, after step {stop['steps_run']} of {stop['steps_planned']} "
        f"({_fmt_qps(stop['at_qps'])} QPS offered): {stop['reason']}"
    )


def _verdict_lines(result: dict) -> list[str]:
    slo = _num(result.get("slo_p99_ms"))
    best = result.get("max_qps_under_slo")
    lines = [
        f"max QPS under SLO (P99 ≤ {slo:g} ms): {'none (no step met it)' if best is None else _fmt_qps(best)}",
        f"knee: {_knee_text(result)}",
    ]
    lines += [n for n in (_soak_verdict_note(result, "above"), stopped_early_note(result)) if n]
    lines += _error_lines(_steps(result))
    merged = (result.get("config") or {}).get("merged")
    if merged:
        errs = [_num(_get(s, "latency_histogram", "relative_error")) for s in _steps(result)]
        err = max((e for e in errs if math.isfinite(e)), default=0.0)
        source = merged.get("server_view_from")
        # The first part's scrapes are the only server view; a part that reached no /metrics has none to give.
        if any(s.get("server") for s in _steps(result)):
            server = f"server columns from {source}"
        else:
            server = f"no server columns: {source}, the part they come from, scraped none"
        lines.append(
            f"merged from {len(merged['parts'])} results: percentiles from the merged histograms "
            f"(at most {100 * err:.2g}% above exact), {server}"
        )
    # The document's warnings (a verdict's bound, a step that measured the generator, a merge's
    # parts): a run printed without --json or --html would lose them.
    lines += [f"warning: {w}" for w in result.get("warnings") or []]
    return lines


def _error_lines(steps: Sequence[dict]) -> list[str]:
    """A line per error code the server said something for (`error_details`, the bench's): how many
    requests over the steps, and its first message."""
    counts: dict[str, int] = {}
    messages: dict[str, str] = {}
    for step in steps:
        for code, n in (step.get("errors") or {}).items():
            counts[code] = counts.get(code, 0) + int(n)
        for code, message in (step.get("error_details") or {}).items():
            messages.setdefault(code, message)
    return [
        f"errors: {counts.get(code, 0)} × {code}: {message}" for code, message in sorted(messages.items()) if message
    ]


def print_table(result_or_steps: dict | Sequence[dict], file=None) -> None:
    """A fixed-width table of the steps; with a whole result, an SLO column and the two verdicts under it.

    Uses rich when it is installed, in plain text either way: no colour, no markup, and
    wide enough that a row never wraps when the output is a file or a pipe.
    """
    file = sys.stdout if file is None else file
    head, rows = _table_rows(result_or_steps)
    footer = _legend_lines(result_or_steps, head, rows)
    footer += _verdict_lines(result_or_steps) if isinstance(result_or_steps, dict) else []
    try:
        from rich import box
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        Console = None
    if Console is not None:
        table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
        for h in head:
            table.add_column(h, justify="right", no_wrap=True)
        for r in rows:
            table.add_row(*r)
        console = Console(file=file, color_system=None, highlight=False, markup=False, emoji=False, width=240)
        console.print(table)
        for line in footer:
            console.print(line)
        return
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    print("  ".join(h.rjust(w) for h, w in zip(head, widths)), file=file)
    print("  ".join("-" * w for w in widths), file=file)
    for r in rows:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)), file=file)
    for line in footer:
        print(line, file=file)


# ---------------------------------------------------------------------------- HTML

CSS = """
:root { --fg: #1d2329; --muted: #5f6b76; --line: #d9dee3; --pass: #1f7a45; --fail: #b3261e; --bg2: #f5f7f9; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif;
       color: var(--fg); background: #fff; }
main { max-width: 1180px; margin: 0 auto; padding: 24px 28px 48px; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 17px; margin: 32px 0 10px; border-bottom: 1px solid var(--line); padding-bottom: 4px; }
.meta { color: var(--muted); margin: 0 0 18px; }
.cards { display: flex; flex-wrap: wrap; gap: 12px; }
.card { flex: 1 1 200px; border: 1px solid var(--line); border-radius: 8px; padding: 12px 14px;
        background: var(--bg2); }
.card .k { color: var(--muted); font-size: 12px; text-transform: uppercase; letter-spacing: .04em; }
.card .v { font-size: 24px; font-weight: 600; margin-top: 2px; }
.card .n { color: var(--muted); font-size: 12px; }
.warnings { border-left: 4px solid #d9822b; background: #fff7ed; padding: 8px 14px; margin: 16px 0 0; }
.warnings ul { margin: 4px 0; padding-left: 18px; }
.ok-note { color: var(--pass); margin: 16px 0 0; }
figure { margin: 18px 0; }
figure img { max-width: 100%; height: auto; border: 1px solid var(--line); border-radius: 6px; }
figcaption { color: var(--muted); font-size: 12px; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; }
table.steps { width: 100%; font-size: 12.5px; }
th, td { border-bottom: 1px solid var(--line); padding: 4px 6px; text-align: right; white-space: nowrap; }
th { background: var(--bg2); position: sticky; top: 0; white-space: normal; vertical-align: bottom; }
td.l, th.l { text-align: left; white-space: normal; min-width: 16em; }
tr.fail td.v { color: var(--fail); font-weight: 600; }
tr td.v { color: var(--pass); }
tr.knee td { background: #f1eefa; }
table.config td { font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: 12.5px; }
.wrap { overflow-x: auto; }
.wrap.tall { max-height: 480px; overflow-y: auto; }
h3 { font-size: 15px; margin: 22px 0 8px; }
.verdict-note { color: var(--muted); margin: 10px 0 0; }
table.soak-drift, table.soak-windows { font-size: 12.5px; margin: 8px 0; }
table.faults, table.fault-windows, table.replicas { font-size: 12.5px; margin: 8px 0; }
table.faults tr > :first-child { text-align: left; }
table.faults td:first-child { font-family: ui-monospace, "DejaVu Sans Mono", monospace; }
p.problem { color: var(--fail); font-weight: 600; }
"""


def _e(x: Any) -> str:
    # A lone surrogate (a command-line value's undecodable bytes, by surrogateescape) has no UTF-8:
    # shown as its backslash escape, \udcXX, as the JSON writes it, rather than fail the page's write.
    return html.escape(str(x), quote=True).encode("utf-8", "backslashreplace").decode("utf-8")


def _img(fig: Figure, alt: str, caption: str) -> str:
    data = base64.b64encode(_png(fig)).decode("ascii")
    img = f'<img src="data:image/png;base64,{data}" alt="{_e(alt)}">'
    return f"<figure>{img}<figcaption>{_e(caption)}</figcaption></figure>"


def _models(config: dict) -> str:
    models = config.get("models", config.get("model"))
    if isinstance(models, (list, tuple)):
        return ", ".join(str(m[0]) if isinstance(m, (list, tuple)) else str(m) for m in models)
    return "" if models is None else str(models)


def _card(key: str, value: str, note: str = "") -> str:
    inner = f'<div class="k">{_e(key)}</div><div class="v">{_e(value)}</div><div class="n">{_e(note)}</div>'
    return f'<div class="card">{inner}</div>'


def _steps_table(result: dict) -> str:
    steps = _steps(result)
    refine = any(st.get("phase", "ramp") != "ramp" for st in steps)
    # As the text table (`_table_rows`): a simulation has no event loop to lag and sends every request on time.
    simulated = _simulated(result)
    head = ["offered QPS", "achieved QPS"] + (["phase"] if refine else []) + ["requests", "ok", "success %"]
    head += [f"{k} ms" for k in LATENCY_KEYS] + ["queue mean ms", "queue p99 ms"]
    head += ["mean batch"] if simulated else ["loop p99 ms", "mean batch", "lag p99 ms", "late sends"]
    head += ["SLO", "errors"]
    out = ['<div class="wrap"><table class="steps"><thead><tr>']
    out += [f"<th{' class=l' if h == 'errors' else ''}>{_e(h)}</th>" for h in head]
    out.append("</tr></thead><tbody>")
    knee = result.get("knee_qps")
    for s in steps:
        verdict = _verdict(s, result)
        classes = ("fail" if verdict == "FAIL" else "", "knee" if s["offered_qps"] == knee else "")
        cells = [_fmt_qps(s["offered_qps"]), f"{_num(s['achieved_qps']):.1f}"]
        cells += [s.get("phase", "ramp")] if refine else []
        cells += [str(s["requests"]), str(s["ok"]), _success_cell(s, result)]
        cells += [_p99_cell(s, result) if k == "p99" else _fmt_ms(_get(s, "latency_ms", k)) for k in LATENCY_KEYS]
        cells += [_fmt_ms(_get(s, "queue_ms", "mean")), _fmt_ms(_get(s, "queue_ms", "p99"))]
        batch = "-" if s.get("mean_batch_size") is None else f"{_num(s['mean_batch_size']):.1f}"
        if simulated:
            cells += [batch]
        else:
            cells += [_fmt_ms(_get(s, "loop_lag_ms", "p99")), batch]
            cells += [_fmt_ms(_get(s, "dispatch_lag_ms", "p99")), str(s.get("late_sends", "-"))]
        errors = ", ".join(f"{k}: {v}" for k, v in (s.get("errors") or {}).items()) or "-"
        tds = [f"<td>{_e(c)}</td>" for c in cells]
        tds += [f'<td class="v">{_e(verdict)}</td>', f'<td class="l">{_e(errors)}</td>']
        out.append(f'<tr class="{" ".join(c for c in classes if c)}">' + "".join(tds) + "</tr>")
    out.append("</tbody></table></div>")
    return "".join(out)


def _fmt(v: Any, spec: str) -> str:
    x = _num(v)
    return "-" if not math.isfinite(x) else format(x, spec)


def soak_cut_note(result: dict) -> str | None:
    """What a soak cut short left out, and why it was cut (the run's `interrupted` reason): the line
    under the soak's table, in text and HTML alike; None for a whole soak. A count a file lacks
    (`sent_after`, written before it) is not named."""
    cut = (result.get("soak") or {}).get("cut")
    if not cut:
        return None
    counts = []
    if cut.get("in_flight") is not None:
        counts.append(f"{cut['in_flight']} requests in flight")
    if cut.get("sent_after") is not None:
        counts.append(f"{cut['sent_after']} sent after it (before the workers saw the stop)")
    lost = cut.get("workers_lost")
    note = "left out at the cut: " + (", ".join(counts) or "nothing counted")
    note += f", and all that {lost} lost worker(s) sent" if lost else ""
    interrupted = result.get("interrupted") or {}
    if interrupted.get("phase") == "soak" and interrupted.get("reason"):
        note = f"{interrupted['reason']}; {note}"
    return note


def _soak_html(result: dict) -> str:
    """`--soak`'s section (docs/reliability.md): the load held, P99 and RSS per window, their drift."""
    s = result.get("soak")
    if not s:
        return ""
    cap, req = s.get("capacity") or {}, s.get("requests") or {}
    rss, p99 = s.get("rss") or {}, s.get("p99") or {}
    held = f"{_fmt_qps(cap.get('load_qps'))} QPS offered"
    nominal = _num(cap.get("load_nominal_qps"))
    if math.isfinite(nominal) and not math.isclose(nominal, _num(cap.get("load_qps")), rel_tol=1e-9):
        held += f" (step rate {nominal:.4g})"
    from .faults import by_code

    errors = by_code(s.get("errors_by_code"), "none")
    cut = s.get("cut")
    ran = f"for {_fmt(s.get('duration_s'), 'g')} s"
    if cut:  # a soak cut short: what it measured, up to the cut
        ran = f"cut at {_fmt(cut.get('at_s'), 'g')} s of {_fmt(s.get('duration_s'), 'g')} s"
    summary = (
        f"{held} = {100 * _num(cap.get('load_share')):g}% of the capacity, {_fmt_qps(cap.get('qps'))} QPS "
        f"({cap.get('source', '?')}), {ran} in {_fmt(s.get('window_s'), 'g')} s "
        f"windows: {req.get('sent', '-')} sent, {req.get('ok', '-')} ok; errors {errors}."
    )
    out = ["<h2>Soak</h2>", f"<p>{_e(summary)}</p>"]
    if cut_note := soak_cut_note(result):
        out.append(f"<p>{_e(cut_note)}.</p>")
    head = ["", "first", "last", "change", "change %", "slope /min", "slope /min, 2nd half", "worst"]
    drift = [
        ["RSS MiB"]
        + [_fmt(rss.get(k), ".1f") for k in ("first_mib", "last_mib")]
        + [_fmt(rss.get("growth_mib"), "+.1f"), _fmt(rss.get("growth_pct"), "+.2f")]
        + [_fmt(rss.get(k), "+.3f") for k in ("slope_mib_per_min", "slope_second_half_mib_per_min")]
        + [_fmt(rss.get("max_mib"), ".1f")],
        [f"P99 ms ({p99.get('windows', 0)} full windows)"]
        + [_fmt_ms(p99.get(k)) for k in ("first_ms", "last_ms")]
        + [_fmt(p99.get("drift_ms"), "+.1f"), _fmt(p99.get("drift_pct"), "+.1f")]
        + [_fmt(p99.get("slope_ms_per_min"), "+.2f"), "-", _fmt_ms(p99.get("max_ms"))],
    ]
    out.append('<table class="soak-drift"><thead><tr>')
    out += [f"<th>{_e(h)}</th>" for h in head]
    out.append("</tr></thead><tbody>")
    for row in drift:
        out.append(f'<tr><th class="l">{_e(row[0])}</th>' + "".join(f"<td>{_e(c)}</td>" for c in row[1:]) + "</tr>")
    out.append("</tbody></table>")
    urls = rss.get("urls") or []
    sampled = f"RSS: process_resident_memory_bytes of {', '.join(urls)}" if urls else "RSS was not sampled"
    out.append(f'<p class="meta">{_e(" ".join([f"{sampled}.", *([s["note"]] if s.get("note") else [])]))}</p>')
    rows = []
    for w in s.get("windows") or []:
        ok_pct = 100 * w["ok"] / w["sent"] if w.get("sent") else None
        rows.append(
            [
                _fmt(w.get("t_s"), "g"),
                _fmt(w.get("length_s"), "g"),
                str(w.get("sent", "-")),
                _fmt(ok_pct, ".2f"),
                _fmt_ms(w.get("p50_ms")),
                _fmt_ms(w.get("p99_ms")),
                _fmt(w.get("rss_mib"), ".1f"),
            ]
        )
    windows_head = ("from s", "length s", "sent", "ok %", "P50 ms", "P99 ms", "RSS MiB")
    out.append(_table("soak-windows", windows_head, rows, wrap="wrap tall"))
    if cap.get("steps"):
        # The steps the verdicts above were found on, which the result's own `steps` do not hold.
        out.append("<h3>Capacity ramp steps</h3>")
        out.append(_steps_table({**result, "steps": cap["steps"]}))
    return "".join(out)


def _table(cls: str, head: Sequence[str], rows: Sequence[Sequence[str]], wrap: str = "wrap") -> str:
    out = [f'<div class="{wrap}"><table class="{cls}"><thead><tr>']
    out += [f"<th>{_e(h)}</th>" for h in head]
    out.append("</tr></thead><tbody>")
    out += ["<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows]
    out.append("</tbody></table></div>")
    return "".join(out)


BALANCER_COUNTS = ("attempts", "ok", "failures", "slow", "hedges", "retries", "ejections")
BALANCER_TOTALS = ("calls", "ok", "attempts", "hedges", "retries", "budget_refusals", "ejections")


TEXT_WIDTH = 100  # the text report's lines after the steps, as a terminal shows them unwrapped


def _balancer_phrases(result: dict) -> list[str]:
    """The wok balancer's totals (`balancer`) in the phrases a line may break between; none without them."""
    balancer = result.get("balancer")
    if not balancer:
        return []
    hedge = balancer.get("hedge_after_ms")
    hedge_text = "-" if not hedge else ", ".join(f"{_num(h):.3g}" for h in hedge)
    totals = [f"{balancer.get(k, 0)} {k.replace('_', ' ')}," for k in BALANCER_TOTALS]
    totals[-1] = totals[-1][:-1] + ";"
    return ["wok balancer, over the workers and the whole run:", *totals, f"hedge after (per worker) {hedge_text} ms."]


def balancer_line(result: dict) -> str | None:
    """The wok balancer's totals (`balancer`) as the Replicas table's line; None without its counters."""
    return " ".join(_balancer_phrases(result)) or None


def replica_rows(result: dict) -> tuple[list[str], list[list[str]]]:
    """The Replicas table (head, rows): each replica the bench started (`faults.replicas`, how many
    processes it ran as) beside the wok balancer's counters (`balancer.replicas`) for its address, then
    each address only the balancer counted (`--target a,b`, or a fault run's `--admin-url` fleet). No rows
    with neither; no counter columns behind round robin (grpc), which counts nothing per replica."""
    balancer = result.get("balancer") or {}
    started = (result.get("faults") or {}).get("replicas") or []
    # Per address, not per target: behind a `dns:` name one target is several addresses.
    counted = {r.get("address", r.get("target")): r for r in balancer.get("replicas") or []}
    keys = list(BALANCER_COUNTS) if balancer else []
    rows = []
    for r in started:  # the bench's replicas by the address they serve on
        c = counted.pop(r.get("target"), None) or {}
        rows.append([str(r.get("replica", "-")), str(r.get("target", "-")), str(len(r.get("pids") or []) or "-")]
                    + [str(c.get(k, "-")) for k in keys])  # fmt: skip
    if started:
        rows += [["-", str(address), "-"] + [str(c.get(k, "-")) for k in keys] for address, c in counted.items()]
        return ["replica", "address", "processes (1 + restarts)", *keys], rows
    return ["address", *keys], [[str(address)] + [str(c.get(k, "-")) for k in keys] for address, c in counted.items()]


def print_replicas(result: dict, file=None) -> None:
    """The Replicas table after the steps, as the HTML report draws it: only with the wok balancer's
    counters (a run behind round robin has none to print)."""
    from .faults import print_rows, section_console

    _, console = section_console(result, "balancer", file)
    if console is None:
        return
    # Broken between its phrases into lines of TEXT_WIDTH at most: on one line it ran to ~180 columns,
    # wrapped by the console at 160 inside a phrase ("(per" ending the line).
    lines: list[str] = []
    for phrase in _balancer_phrases(result):
        if lines and len(lines[-1]) + 1 + len(phrase) <= TEXT_WIDTH:
            lines[-1] += " " + phrase
        else:
            lines.append(phrase if not lines else "  " + phrase)
    for line in lines:
        console.print(line, markup=False, highlight=False)
    print_rows(console, "replicas", *replica_rows(result))


def _replicas_html(result: dict) -> str:
    """The Replicas section after the steps: the wok balancer's counters per replica, beside what a fault
    run's bench started (`faults.replicas`: how many processes each took); nothing with neither."""
    line = balancer_line(result)
    head, rows = replica_rows(result)
    if not rows and line is None:
        return ""
    out = ["<h2>Replicas</h2>"]
    if line is not None:
        out.append(f"<p>{_e(line)}</p>")
    out.append(_table("replicas", head, rows))
    if line is None:
        out.append(
            '<p class="meta">No balancer counters in this result: round robin (grpc) counts nothing per replica.</p>'
        )
    return "".join(out)


def _faults_html(result: dict) -> str:
    """A fault run's section (docs/reliability.md): what the text prints after the steps (the
    requests, the fault table, the timeline around the faults) and faults.png. Each replica's answers
    are the Replicas section's, before it. `--replicas` with no fault has the requests and faults.png
    alone, headed for what they are (until 2026-12-07 "Faults", over no fault)."""
    section = result.get("faults")
    if not section:
        return ""
    from .faults import FAULT_HEAD, TIMELINE_HEAD, fault_rows, problem_lines, requests_summary, timeline_rows

    head, lost, tail = requests_summary(result)
    title = "Faults" if section["faults"] else NO_FAULT_TITLE
    out = [f"<h2>{title}</h2>", f"<p>{_e(head)}<strong>{_e(lost)}</strong>{_e(tail)}</p>"]
    if section["faults"]:  # --replicas alone: no table of none (until 2026-12-07, a head and no row)
        out.append(f"<h3>Faults (SLO P99 {_e(format(section['definitions']['slo_p99_ms'], 'g'))} ms)</h3>")
        out.append(_table("faults", FAULT_HEAD, fault_rows(section)))
    out += [f'<p class="problem">{_e(line)}</p>' for line in problem_lines(section)]
    w = section["definitions"]["window_s"]
    caption = f"Per {w:g} s window of send time, every request of the ramp (warm-ups included): what faults.png draws."
    alt = "Requests per second, P99 and replicas up per window"
    if section["faults"]:
        caption += " Dash-dot lines are the faults' events, solid ones where each recovered below the SLO."
        alt += ", with each fault's events"
    out.append(_img(fault_timeline_figure(result), alt, caption))
    rows = timeline_rows(section)
    if rows:
        out.append(f"<h3>Timeline around the faults ({w:g} s windows, by send time)</h3>")
        out.append(_table("fault-windows", TIMELINE_HEAD, rows, wrap="wrap tall"))
    return "".join(out)


def _config_table(result: dict) -> str:
    rows = [("schema", result.get("schema")), ("created", result.get("created"))]
    rows += list((result.get("config") or {}).items())
    rows += [(k, result.get(k)) for k in ("slo_p99_ms", "min_success_rate", "knee_threshold")]
    out = ['<table class="config"><tbody>']
    for k, v in rows:
        text = v if isinstance(v, str) else json.dumps(_plain(v), ensure_ascii=False)
        out.append(f'<tr><th class="l">{_e(k)}</th><td class="l">{_e(text)}</td></tr>')
    out.append("</tbody></table>")
    return "".join(out)


def render_html(result: dict, *, title: str | None = None) -> str:
    """The report page as one string (what write_html writes)."""
    config = result.get("config") or {}
    title = title or f"wok bench: {_models(config) or 'model'} on {config.get('target', '?')}"
    slo = _num(result.get("slo_p99_ms"))
    steps = _steps(result)
    peak = max((_num(s["achieved_qps"]) for s in steps), default=math.nan)
    best, knee = result.get("max_qps_under_slo"), result.get("knee_qps")
    # A soak run's step table holds the soak step only; its verdicts may be the capacity ramp's.
    from_ramp = _verdicts_from_capacity_ramp(result)
    if from_ramp:
        best_note = "of the capacity ramp (see Soak)" if best is not None else "no capacity-ramp step met the SLO"
        knee_note = "of the capacity ramp: where achieved stops following offered"
    else:
        best_note = "no step met the SLO" if best is None else "highest passing step below the first failure"
        knee_note = "where achieved stops following offered"
    knee_value = "none" if knee is None else f"{_fmt_qps(knee)} QPS"
    if _knee_at_first(result):
        knee_value = f"≤ {knee_value}"
        knee_note = "at or below the first step" + (" of the capacity ramp" if from_ramp else "")
        knee_note += ": it already fell short of its offer"
    cards = [
        _card("max QPS under SLO", _fmt_qps(best), best_note),
        _card("knee", knee_value, knee_note),
        _card("SLO", f"P99 ≤ {slo:g} ms", f"and ≥ {100 * _num(result.get('min_success_rate', 0.99)):g}% success"),
        _card(
            "peak achieved", f"{_fmt_qps(round(peak, 1)) if math.isfinite(peak) else '-'} QPS", "successful requests"
        ),
    ]
    notes = [n for n in (_soak_verdict_note(result, "below"), stopped_early_note(result)) if n]
    verdict_note = "".join(f'<p class="verdict-note">{_e(n)}</p>' for n in notes)
    warnings = result.get("warnings") or []
    if warnings:
        warn = '<div class="warnings"><strong>Warnings</strong><ul>' + "".join(f"<li>{_e(w)}</li>" for w in warnings)
        warn += "</ul></div>"
    elif _simulated(result):
        # No generator to have kept a schedule: the simulator sends each request at its intended time (lag 0).
        warn = (
            '<p class="ok-note">No warnings (a simulation has no load generator: '
            "it sends each request at its scheduled time).</p>"
        )
    else:
        warn = '<p class="ok-note">No warnings: the generator kept its schedule at every step.</p>'
    source = config.get("source", "bench")
    count = f"{len(steps)} step{'' if len(steps) == 1 else 's'}"
    meta = f"{_e(result.get('schema', ''))} · {_e(source)} · created {_e(result.get('created', ''))} · {count}"
    figures = [
        _img(
            latency_figure(result),
            "Latency percentiles against offered QPS",
            "Latency is measured from each request's intended send time (open loop).",
        ),
        _img(
            throughput_figure(result),
            "Achieved against offered QPS",
            "Achieved counts successful requests per second of the measured window.",
        ),
        _img(
            timeline_figure(result), "QPS and P99 over time", "Per-second bins over the whole run, warm-ups included."
        ),
    ]
    if _timed(steps):
        figures.append(
            _img(
                breakdown_figure(result),
                "Where the time goes per step: server stages and time outside the server",
                "From each answer's server-timing trailer (--server-timing): the server's stages, and the client's "
                "latency less the server's total (generator, client, transport, gRPC on both sides).",
            )
        )
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; img-src data:; style-src 'unsafe-inline'">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{_e(title)}</title>
<style>{CSS}</style>
</head>
<body>
<main>
<h1>{_e(title)}</h1>
<p class="meta">{meta}</p>
<section class="cards">{"".join(cards)}</section>
{verdict_note}
{warn}
<h2>Plots</h2>
{"".join(figures)}
<h2>Steps</h2>
{_steps_table(result)}
{_replicas_html(result)}{_faults_html(result)}{_soak_html(result)}
<h2>Configuration</h2>
{_config_table(result)}
</main>
</body>
</html>
"""


def write_html(result: dict, path, *, title: str | None = None) -> None:
    """One self-contained HTML file: verdicts, warnings, the plots inline, the step table, the replicas' (the
    wok balancer's counters), a fault run's and a soak's sections, the config."""
    # backslashreplace: the same escape as _e, for a lone surrogate in any text that did not pass through it.
    Path(path).write_text(render_html(result, title=title), encoding="utf-8", errors="backslashreplace")


# ---------------------------------------------------------------------------- faults


# A `--replicas` run's section and figure where it injected no fault: its requests across the replicas.
NO_FAULT_TITLE = "Requests to the replicas"


def fault_timeline_figure(result: dict) -> Figure:
    """Sent, answered and lost per window, P99 against the SLO, replicas up, and each fault's events."""
    fig = Figure(figsize=(9, 6), layout="constrained")
    section = result.get("faults")
    if not section or not section["timeline"]["t_s"]:
        _placeholder(fig, "no fault injection in this result")
        return fig
    tl = section["timeline"]
    w = section["definitions"]["window_s"]
    t = np.array(tl["t_s"], dtype=float)
    top, bottom = fig.subplots(2, 1, sharex=True)
    top.step(t, np.array(tl["sent"]) / w, where="post", color="#999", label="sent /s")
    top.step(t, np.array(tl["ok"]) / w, where="post", color=COLORS["p50"], label="ok /s")
    errors, lost = np.array(tl["errors"]) / w, np.array(tl["lost"]) / w
    if errors.any():
        top.step(t, errors, where="post", color=COLORS["p95"], label="errors /s")
    if lost.any():
        top.step(t, lost, where="post", color="black", label="lost /s")
    top.set_ylabel(f"requests/s ({w:g} s windows)")
    if tl.get("replicas_up") is not None:
        twin = top.twinx()
        twin.step(t, tl["replicas_up"], where="post", color=COLORS["max"], linestyle=":", label="replicas up")
        twin.set_ylabel("replicas up")
        twin.set_ylim(0, max(tl["replicas_up"]) + 1)
        twin.legend(loc="upper right", fontsize=8)
    lost, sent = section["requests"]["lost"], section["requests"]["sent"]
    top.set_title(
        f"Faults: {lost} lost of {sent} requests" if section["faults"] else f"{NO_FAULT_TITLE}: {lost} lost of {sent}"
    )
    top.legend(loc="upper left", fontsize=8)
    top.grid(True, alpha=0.3)
    p99 = np.array([_num(v) for v in tl["p99_ms"]])
    bottom.step(t, p99, where="post", color=COLORS["p99"], label="P99 of the ok")
    slo = section["definitions"]["slo_p99_ms"]
    bottom.axhline(slo, color=COLORS["slo"], linestyle="--", linewidth=1.2, label=f"SLO {slo:g} ms")
    if _span(np.append(p99, slo)) > LOG_Y_SPAN:
        _log_axis(bottom, "y")
    for e in section["events"]:
        for ax in (top, bottom):
            ax.axvline(e["t_s"], color="#555", linewidth=0.8, linestyle="-.")
        label = f"{e['action']} r{e.get('replica', '')}"
        top.annotate(label, (e["t_s"], 1.0), xycoords=("data", "axes fraction"), rotation=90, fontsize=7, va="top")
    for f in section["faults"]:
        if f.get("start_s") is not None and f.get("recovery_s") is not None:
            at = f["start_s"] + f["recovery_s"]
            bottom.axvline(at, color=COLORS["max"], linewidth=1.0)
            bottom.annotate(f"recovered +{f['recovery_s']:g} s", (at, 0.95), xycoords=("data", "axes fraction"),
                            fontsize=7, color=COLORS["max"], va="top")  # fmt: skip
    bottom.set_ylabel("P99 latency (ms)")
    bottom.set_xlabel("time since the first step (s)")
    bottom.legend(loc="upper left", fontsize=8)
    bottom.grid(True, alpha=0.3)
    return fig


def plot_fault_timeline(result: dict, path: PathOrFile) -> None:
    _write_bytes(_png(fault_timeline_figure(result)), path)
