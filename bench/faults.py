"""Fault injection for `wok bench ramp`: replicas the bench starts, faults at set times, and their report.

`--replicas N` starts N `wok serve` processes on free loopback ports and ramps all of them,
through wok's balancer (`--balancer wok`, the default with several targets: a channel per
replica, hedging, outlier ejection) or one round-robin channel (`--balancer grpc`), with
health checking and, unless `--no-retries`, retries on UNAVAILABLE (not of `--rpc stream`'s
streams). `--fault` schedules, at a fraction of the ramp's planned time (`len(steps) ×
(warm-up + step)`, from the first step's start) or at a duration from it:

  kill:replica=1,at=30%,restart=60%     SIGKILL; start it again (same ports) at `restart`
  pause:replica=1,at=30%,resume=60%     SIGSTOP; SIGCONT at `resume`
  slow:model=mlp,delay=50ms,at=30%,until=60%[,replica=0][,instance=0]
  fail:model=mlp,at=30%,until=60%[,replica=0][,instance=0]

`slow` and `fail` go through the server's admin API (`wok serve --admin`, POST
/admin/faults on its metrics port): a replica the bench started gets `--admin`; another
server is reached through `--admin-url`.

The report (`fault_report`) counts every request of the ramp, warm-ups included: a request
is *lost* when no server's answer reached the bench (the call ended with UNAVAILABLE,
CANCELLED, DEADLINE_EXCEEDED or UNKNOWN, or never ended); other errors are answers. For
each fault it gives P99 before, during and after it, the errors and losses during it, and
the time to recover below the SLO (docs/reliability.md defines each).
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace

import numpy as np

from ..children import die_with_parent
from ..errors import quoted_name
from ..faults import MAX_DELAY_MS, MAX_DURATION_S
from ..numerals import SPACES, ascii_digits, read_float, underscore_note
from .analysis import latency_summary
from .arrivals import parse_duration
from .payloads import integer_refusal
from .runner import Ramp, RampConfig, status_name
from .workers import NOT_SENT, OK, run_held

SCHEMA = "wok.faults/1"
LOST_CODES = ("UNAVAILABLE", "CANCELLED", "DEADLINE_EXCEEDED", "UNKNOWN")
WINDOW_S = 0.5  # the timeline's resolution, and the recovery's
HOLD_S = 2.0  # recovered: the last bad window is followed by good ones for at least this long
COMPARE_S = 10.0  # "before" and "after" a fault: at most this long
MAX_ERROR_RATE = 0.01  # a window with more errors than this is not good
# A server-side fault is posted with an expiry this long past its planned end, so that a bench
# killed outright (no `off` sent) leaves no fault behind; the `off` at the end still ends it.
EXPIRY_MARGIN_S = 3.0
# A run cut short (a signal, a failed worker) waits at most this long for a replica still
# restarting: the bench stops that replica with the others, and a second Ctrl-C is deferred
# until the result is written, so the full start timeout (minutes) would hold the user for nothing.
CUT_WAIT_S = 5.0
# A replica stopping takes its grace period to drain, then up to a second for each of the stages after it (the
# answers' window, the gRPC and health ports' stops, the models' shutdown) and its interpreter's exit (torch's
# teardown: seconds on a busy host); one still running this long past its grace period is killed.
STOP_MARGIN_S = 10.0
# Where the replicas of `--replicas` bind (gRPC and HTTP ports) unless --replica-host says otherwise.
REPLICA_HOST = "127.0.0.1"
READY = re.compile(r"wok: serving (.+) on (\S+):(\d+)")
# The HTTP port a replica's admin API is on: its metrics line, or, with `--no-metrics --admin`, its admin line.
METRICS = re.compile(r"wok: (?:metrics on|metrics off \(--no-metrics\); admin API on) http://(\S+):(\d+)")

_KEYS = {
    "kill": {"replica", "at", "restart", "until"},
    "pause": {"replica", "at", "resume", "until"},
    "slow": {"model", "delay", "at", "until", "replica", "instance"},
    "fail": {"model", "at", "until", "replica", "instance"},
}


# -- fault specs --------------------------------------------------------------------------


@dataclass(frozen=True)
class At:
    """A time of the ramp: a fraction of its planned time, or seconds from its start."""

    value: float
    fraction: bool

    def seconds(self, planned_s: float) -> float:
        return self.value * planned_s if self.fraction else self.value

    def __str__(self) -> str:
        return f"{100 * self.value:g}%" if self.fraction else f"{self.value:g}s"


def parse_at(text: str, what: str) -> At:
    text = text.strip(SPACES)
    if text.endswith("%"):
        try:
            value = read_float(text[:-1]) / 100
        except ValueError:
            value = math.nan
        if not 0 <= value <= 1:
            raise ValueError(
                f"{what}={quoted_name(text)}: expected a percentage of the ramp from 0% to 100%{underscore_note(text)}"
            )
        return At(value, True)
    try:
        return At(parse_duration(text), False)
    except ValueError:
        raise ValueError(
            f"{what}={quoted_name(text)}: expected a percentage of the ramp (30%) or a time from its start (12s)"
            f"{underscore_note(text)}"
        ) from None


@dataclass(frozen=True)
class FaultSpec:
    kind: str  # kill | pause | slow | fail
    at: At
    until: At | None = None  # restart (kill), resume (pause), off (slow, fail); None: never
    replica: int | None = None
    model: str | None = None
    instance: int | None = None
    delay_ms: float | None = None
    text: str = ""

    @property
    def server_side(self) -> bool:
        return self.kind in ("slow", "fail")


def parse_fault(spec: str) -> FaultSpec:
    """`kind:key=value,...` (see the module's doc); ValueError naming what is wrong."""
    kind, _, rest = spec.partition(":")
    kind = kind.strip(SPACES)
    if kind not in _KEYS:
        raise ValueError(
            f"--fault {quoted_name(spec)}: expected kill:, pause:, slow: or fail:; got {quoted_name(kind)}"
        )
    values: dict[str, str] = {}
    for item in filter(None, (part.strip(SPACES) for part in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or key not in _KEYS[kind]:
            raise ValueError(
                f"--fault {quoted_name(spec)}: {quoted_name(item)}: expected KEY=VALUE with KEY one of "
                f"{sorted(_KEYS[kind])}"
            )
        if key in values:
            raise ValueError(f"--fault {quoted_name(spec)}: {key} given twice")
        values[key] = value.strip(SPACES)
    if "at" not in values:
        raise ValueError(f"--fault {quoted_name(spec)}: at=... is required (e.g. at=30%)")
    if len(values.keys() & {"until", "restart", "resume"}) > 1:
        raise ValueError(f"--fault {quoted_name(spec)}: give one end (until=, restart= or resume=)")
    end_key = next((k for k in ("until", "restart", "resume") if k in values), None)
    try:
        at = parse_at(values["at"], "at")
        until = parse_at(values[end_key], end_key) if end_key else None
    except ValueError as exc:
        raise ValueError(f"--fault {quoted_name(spec)}: {exc}") from None
    if until is not None and until.fraction == at.fraction and until.value <= at.value:
        raise ValueError(f"--fault {quoted_name(spec)}: the fault must end after it starts ({until} <= {at})")
    replica = _int(values, "replica", spec)
    instance = _int(values, "instance", spec)
    model = values.get("model")
    delay_ms = None
    if kind in ("slow", "fail") and not model:
        raise ValueError(f"--fault {quoted_name(spec)}: model=NAME is required")
    if kind == "slow":
        if "delay" not in values:
            raise ValueError(f"--fault {quoted_name(spec)}: delay=DURATION is required (e.g. delay=50ms)")
        try:
            delay_ms = 1e3 * parse_duration(values["delay"])
        except ValueError as exc:  # in the option's name: it was "invalid duration ..." alone
            raise ValueError(f"--fault {quoted_name(spec)}: delay: {exc}") from None
        if not 0 < delay_ms <= MAX_DELAY_MS:  # the server's own bound: past it, the fault is refused
            raise ValueError(
                f"--fault {quoted_name(spec)}: delay={quoted_name(values['delay'])}: expected above 0 and at most "
                f"{MAX_DELAY_MS / 1e3:g}s"
            )
    if kind in ("kill", "pause") and replica is None:
        replica = 0
    return FaultSpec(kind, at, until, replica, model, instance, delay_ms, spec)


def _int(values: dict[str, str], key: str, spec: str) -> int | None:
    if key not in values:
        return None
    text = values[key]
    if not ascii_digits(text):
        raise ValueError(
            f"--fault {quoted_name(spec)}: {key}={quoted_name(text)}: expected an integer >= 0{underscore_note(text)}"
        )
    return int(text)


# -- replicas -----------------------------------------------------------------------------


def _spawn(cmd: list[str], **kwargs) -> subprocess.Popen:
    """Start a replica: ended by the kernel with the thread that forks it (die_with_parent), in a
    session of its own. Ctrl-C at a terminal signals the whole foreground process group, and a
    replica in the bench's would get SIGINT (one being restarted then fails to start), while the
    bench stops its replicas itself."""
    return subprocess.Popen(cmd, preexec_fn=die_with_parent(), start_new_session=True, **kwargs)


class Forker:
    """A thread that starts child processes for as long as it runs (until `close()`).

    A replica gets SIGTERM when the thread that forked it ends (PR_SET_PDEATHSIG follows the
    thread, not the process): forked from a restart's own short-lived thread, it would be
    stopped the moment the restart returned. Every replica is forked here instead, from a
    thread that lives as long as the ReplicaSet, so they end with the bench and only then."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="wok-replicas", daemon=True)
        self._thread.start()

    def popen(self, cmd: list[str], **kwargs) -> subprocess.Popen:
        done: Future = Future()
        self._jobs.put((done, cmd, kwargs))
        return done.result()

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            done, cmd, kwargs = job
            try:
                done.set_result(_spawn(cmd, **kwargs))
            except BaseException as exc:  # the caller's: raised again by popen()
                done.set_exception(exc)

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join()


def replica_host(text: str | None) -> str:
    """`--replica-host`: the loopback address the replicas bind (default REPLICA_HOST), bare (`[::1]` is ::1).
    Loopback only: the replicas serve plaintext, and with a slow:/fail: fault the admin API, unauthenticated
    (wok serve warns of both off loopback); ValueError naming the option otherwise."""
    if text is None:
        return REPLICA_HOST
    bare = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    try:
        loopback = ipaddress.ip_address(bare).is_loopback
    except ValueError:
        loopback = False  # a name too: one resolving to both families binds one of them, which the target must name
    if not loopback:
        raise ValueError(f"--replica-host {quoted_name(text)}: expected a loopback address, such as 127.0.0.1 or ::1")
    return str(ipaddress.ip_address(bare))


def reachable(address: str) -> str:
    """The host a server printed it listens on (`host_port`'s form: an IPv6 address in brackets), as a
    client on this machine connects to it: bare, and a wildcard (0.0.0.0, ::) as its family's loopback."""
    bare = address[1:-1] if address.startswith("[") and address.endswith("]") else address
    try:
        ip = ipaddress.ip_address(bare)
    except ValueError:
        return bare  # a name (localhost)
    if ip.is_unspecified:
        return "::1" if ip.version == 6 else "127.0.0.1"
    return bare


@dataclass
class Replica:
    index: int
    args: list[str]
    host: str = REPLICA_HOST
    port: int = 0
    metrics_port: int = 0
    proc: subprocess.Popen | None = None
    pids: list[int] = field(default_factory=list)
    log: deque = field(default_factory=lambda: deque(maxlen=200))
    _ready: threading.Event = field(default_factory=threading.Event)  # served, or its stderr closed
    _served: threading.Event = field(default_factory=threading.Event)  # it printed its serving line
    forker: Forker | None = None  # None: forked from the calling thread, ending with it (see Forker)
    # Where its HTTP port (metrics, admin API) is reached, read from the address it printed: a
    # `--metrics-host` in its arguments binds it there, not on `host`. None until it printed one.
    metrics_host: str | None = None
    # Whether it said "metrics on" (before its serving line): off by --no-metrics or --metrics-port -1 in
    # --serve-args, in any form argparse takes (an abbreviation, a later value winning), it has no /metrics.
    metrics_on: bool = False

    @property
    def target(self) -> str:
        from ..config import host_port  # not at the top: it imports pydantic

        return host_port(self.host, self.port)

    @property
    def admin_url(self) -> str:
        from ..config import host_port

        return f"http://{host_port(self.metrics_host or self.host, self.metrics_port)}"

    @property
    def metrics_url(self) -> str:
        return f"{self.admin_url}/metrics"

    def launch(self) -> None:
        """Start `wok serve` (on the ports it had, after the first start); wait_ready() waits for it."""
        cmd = [sys.executable, "-m", "wok", "serve", "--host", self.host, "--port", str(self.port)]
        # The HTTP port on the gRPC port's host, as wok serve's --health-host follows --host: on ::1 alone
        # the server's own 127.0.0.1 does not bind. A --metrics-host in `args` comes later, and wins.
        cmd += ["--metrics-host", self.host, "--metrics-port", str(self.metrics_port), *self.args]
        self._ready, self._served = threading.Event(), threading.Event()
        options = dict(
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        proc = self.forker.popen(cmd, **options) if self.forker is not None else _spawn(cmd, **options)
        self.proc = proc
        self.pids.append(proc.pid)
        threading.Thread(target=self._pump, args=(proc, self._ready, self._served), daemon=True).start()

    def _pump(self, proc: subprocess.Popen, ready: threading.Event, served: threading.Event) -> None:
        for line in proc.stderr:
            self.log.append(line.rstrip())
            m = METRICS.search(line)
            if m:
                self.metrics_host, self.metrics_port = reachable(m.group(1)), int(m.group(2))
                self.metrics_on = m.group(0).startswith("wok: metrics on ")
            m = READY.search(line)
            if m:
                self.port = int(m.group(3))
                served.set()
                ready.set()
        ready.set()

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        ready = self._ready.wait(timeout)
        served = self._served.is_set()
        if ready and not served:
            # Its stderr closed before the serving line: it is exiting, but may not be reaped yet,
            # and poll() would then read as still running, i.e. as ready.
            try:
                self.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        code = self.proc.poll()
        if served and code is None:
            return
        tail = "\n".join(list(self.log)[-20:])
        if code is not None:  # the process ended (its own error, or a signal) before serving
            raise RuntimeError(f"replica {self.index} exited with code {code} before serving:\n{tail}")
        if ready:
            raise RuntimeError(f"replica {self.index} closed its stderr before serving:\n{tail}")
        raise RuntimeError(f"replica {self.index} did not start within {timeout:g} s:\n{tail}")

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive:
            self.proc.send_signal(sig)

    def kill(self) -> None:
        if self.alive:
            self.proc.kill()
            self.proc.wait()

    def terminate(self) -> None:
        """Its drain begun: SIGTERM, once. A second, while it drains, is `wok serve`'s "exit without draining"."""
        if self.alive:
            self.proc.send_signal(signal.SIGCONT)  # a paused one could not drain
            self.proc.terminate()

    @property
    def grace_s(self) -> float:
        """The grace period its `wok serve` drains within, read from its arguments as that parser reads them."""
        from ..__main__ import serve_grace_period

        return serve_grace_period(self.args)

    def wait_stopped(self, timeout: float) -> bool:
        """Its end, after `terminate`, waited for `timeout` s; killed if still running then (True: it was)."""
        if not self.alive:
            return False
        try:
            self.proc.wait(timeout)
            return False
        except subprocess.TimeoutExpired:
            self.kill()
            return True


class ReplicaSet:
    """N `wok serve` processes on free ports of the loopback address `host`, started together; stopped by
    `close()`."""

    def __init__(
        self,
        n: int,
        serve_args: Sequence[str],
        *,
        admin: bool = False,
        start_timeout: float = 180.0,
        host: str = REPLICA_HOST,
    ):
        if (refusal := integer_refusal("--replicas", n, 1)) is not None:
            raise ValueError(refusal)
        args = list(serve_args) + (["--admin"] if admin and "--admin" not in serve_args else [])
        self.start_timeout = start_timeout
        self.forker = Forker()
        self.replicas = [Replica(i, args, host=host, forker=self.forker) for i in range(n)]
        try:
            for r in self.replicas:
                r.launch()
            for r in self.replicas:
                r.wait_ready(start_timeout)
        except BaseException:
            self.close()
            raise

    def __len__(self) -> int:
        return len(self.replicas)

    def __getitem__(self, i: int) -> Replica:
        return self.replicas[i]

    @property
    def target(self) -> str:
        return ",".join(r.target for r in self.replicas)

    def restart(self, i: int) -> None:
        r = self.replicas[i]
        r.kill()
        r.launch()
        r.wait_ready(self.start_timeout)

    def describe(self) -> list[dict]:
        return [{"replica": r.index, "target": r.target, "admin_url": r.admin_url, "pids": r.pids} for r in self]

    @property
    def stop_wait_s(self) -> float:
        """How long `close` waits, at most, for the replicas to stop: the longest grace period, and STOP_MARGIN_S."""
        return max(r.grace_s for r in self.replicas) + STOP_MARGIN_S

    def close(self, say: Callable[[str], None] | None = None) -> None:
        """Stop every replica: one SIGTERM each, all draining at once; one still running STOP_MARGIN_S past its grace
        period is killed (SIGKILL), which `say` (default: stderr) says."""
        start = time.monotonic()
        for r in self.replicas:
            r.terminate()
        for r in self.replicas:
            wait_s = r.grace_s + STOP_MARGIN_S
            pid = r.proc.pid if r.proc is not None else None
            if r.wait_stopped(max(0.0, start + wait_s - time.monotonic())):
                line = (
                    f"replica {r.index} (pid {pid}) still running {wait_s:g} s after its SIGTERM (its --grace-period "
                    f"{r.grace_s:g} s, then {STOP_MARGIN_S:g} s for the stop's last stages and its exit): killed"
                )
                if say is not None:
                    say(line)
                else:
                    print(line, file=sys.stderr, flush=True)
        self.forker.close()


# -- the admin API ------------------------------------------------------------------------


def post_fault(base_url: str, body: dict, timeout: float = 5.0) -> dict:
    """POST /admin/faults (docs: the admin API); RuntimeError with the server's message if refused."""
    request = urllib.request.Request(
        base_url.rstrip("/") + "/admin/faults",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")[:500]
        # A server run without --admin answers 404 at the admin paths (an older wok: 405 to a POST).
        hint = " (is the server run with --admin?)" if exc.code in (404, 405) else ""
        raise RuntimeError(f"{base_url}/admin/faults: HTTP {exc.code}{hint}: {detail}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise RuntimeError(f"{base_url}/admin/faults: {getattr(exc, 'reason', exc)}") from None


def get_faults(base_url: str, timeout: float = 5.0) -> list[dict]:
    with urllib.request.urlopen(base_url.rstrip("/") + "/admin/faults", timeout=timeout) as response:
        return json.loads(response.read())["faults"]


# -- the schedule -------------------------------------------------------------------------


@dataclass
class Action:
    t_s: float
    fault: int
    name: str
    run: Callable[[], dict | None]  # a dict: more fields of its event
    replica: int | None = None
    then: str | None = None  # an event recorded when `run` returns (e.g. "ready" after a restart)


ENDS = ("restart", "resume", "off")  # the actions that end a fault


def _window(spec: FaultSpec, planned_s: float) -> tuple[float, float]:
    """(start, end) in seconds of the ramp; a fault without an end lasts to the end (inf)."""
    end = spec.until.seconds(planned_s) if spec.until is not None else math.inf
    return spec.at.seconds(planned_s), end


def check_overlaps(specs: Sequence[FaultSpec], planned_s: float, server_of: Callable[[FaultSpec], str]) -> None:
    """ValueError naming two slow/fail faults whose windows overlap on one server (`server_of`),
    model and instance (no instance: all of them). The server keeps one fault per instance:
    the later fault would replace the earlier, and the first one's `off` clear both, while the
    report showed each in effect for its whole window."""
    spans = [(s, server_of(s), *_window(s, planned_s)) for s in specs if s.server_side]
    for k, (a, where, a0, a1) in enumerate(spans):
        for b, where_b, b0, b1 in spans[k + 1 :]:
            same = where == where_b and a.model == b.model
            same &= a.instance is None or b.instance is None or a.instance == b.instance
            if same and a0 < b1 and b0 < a1:
                inst = "every instance" if a.instance is None or b.instance is None else f"instance {a.instance}"
                raise ValueError(
                    f"--fault {quoted_name(a.text)} and --fault {quoted_name(b.text)}: both act on model "
                    f"{a.model} ({inst}) of {where} "
                    f"from {max(a0, b0):g} s to {_s(min(a1, b1))}; the server keeps one fault per instance, so "
                    "one would silently undo the other: expected windows that do not overlap (a fault without "
                    "until= lasts to the end), or another instance= or replica="
                )


def _s(t: float) -> str:
    return "the end" if math.isinf(t) else f"{t:g} s"


class FaultSchedule:
    """Runs each fault's actions at their times from `start(clock0)`, in a thread, and records events.

    A restart runs in a thread of its own, so the actions after it keep their times; its
    "ready" event is recorded when the replica serves again.
    """

    def __init__(
        self,
        specs: Sequence[FaultSpec],
        planned_s: float,
        *,
        replicas: ReplicaSet | None = None,
        admin_urls: Sequence[str] = (),
        say: Callable[[str], None] = lambda msg: None,
    ) -> None:
        self.specs = list(specs)
        self.planned_s = planned_s
        self.replicas = replicas
        self.admin_urls = list(admin_urls)
        self.say = say
        self.events: list[dict] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._clock0: float | None = None
        self._closed = False  # set by stop(): a restart that ends later records nothing
        self.stopped_s: float | None = None  # when stop() was called, seconds from the ramp's start
        self._paused: set[int] = set()
        # Per fault index, the (admin URL, `off` body) of a server-side fault still on, which the
        # end turns off. One whose `off` succeeded is forgotten: on a shared server (--admin-url)
        # another `off` at the end would clear a fault somebody else has set on that model since.
        self._server_faults: dict[int, tuple[str, dict]] = {}
        actions = [a for i, s in enumerate(self.specs) for a in self._actions(i, s)]
        check_overlaps(self.specs, planned_s, self._admin_url)
        # At one time, a fault's end runs before another's start: a `fail` from 50% after a
        # `slow` until 50% on the same instance must not be cleared by the slow one's off.
        self.actions = sorted(actions, key=lambda a: (a.t_s, a.name not in ENDS))

    def _check_replica(self, spec: FaultSpec) -> int:
        n = len(self.replicas) if self.replicas is not None else 0
        if self.replicas is None:
            raise ValueError(
                f"--fault {quoted_name(spec.text)}: {spec.kind} needs --replicas: the bench signals only replicas it "
                "started"
            )
        if spec.replica >= n:
            raise ValueError(
                f"--fault {quoted_name(spec.text)}: replica={spec.replica}, but there are {n} (0 to {n - 1})"
            )
        return spec.replica

    def _admin_url(self, spec: FaultSpec) -> str:
        if self.replicas is not None:
            i = spec.replica or 0
            if i >= len(self.replicas):
                raise ValueError(f"--fault {quoted_name(spec.text)}: replica={i}, but there are {len(self.replicas)}")
            return self.replicas[i].admin_url
        if not self.admin_urls:
            raise ValueError(f"--fault {quoted_name(spec.text)}: a server-side fault needs --replicas or --admin-url")
        i = spec.replica or 0
        if i >= len(self.admin_urls):
            raise ValueError(
                f"--fault {quoted_name(spec.text)}: replica={i}, but --admin-url names {len(self.admin_urls)}"
            )
        return self.admin_urls[i]

    def _actions(self, i: int, spec: FaultSpec) -> list[Action]:
        start = spec.at.seconds(self.planned_s)
        end = spec.until.seconds(self.planned_s) if spec.until is not None else None
        if end is not None and end <= start:
            raise ValueError(f"--fault {quoted_name(spec.text)}: ends at {end:g} s, before it starts at {start:g} s")
        if spec.kind == "kill":
            r = self._check_replica(spec)
            out = [Action(start, i, "kill", lambda: self.replicas[r].kill(), r)]
            if end is not None:
                out.append(Action(end, i, "restart", lambda: self.replicas.restart(r), r, then="ready"))
            return out
        if spec.kind == "pause":
            r = self._check_replica(spec)

            def pause() -> None:
                self._paused.add(r)
                self.replicas[r].signal(signal.SIGSTOP)

            def resume() -> None:
                self.replicas[r].signal(signal.SIGCONT)
                self._paused.discard(r)

            out = [Action(start, i, "pause", pause, r)]
            if end is not None:
                out.append(Action(end, i, "resume", resume, r))
            return out
        url = self._admin_url(spec)
        body: dict = {"model": spec.model, "mode": spec.kind}
        if spec.instance is not None:
            body["instance"] = spec.instance
        if spec.delay_ms is not None:
            body["delay_ms"] = spec.delay_ms
        off = {k: v for k, v in body.items() if k in ("model", "instance")} | {"mode": "off"}
        # The `off` at `until` runs on the schedule's clock, EXPIRY_MARGIN_S is room enough for it.
        # Without `until` the fault ends with the ramp, which an overloaded server (the usual
        # reason for a fault) can keep past its planned end by its requests' timeouts: such a
        # fault keeps a whole planned ramp's time in hand.
        planned_end = end if end is not None else self.planned_s
        margin = EXPIRY_MARGIN_S if end is not None else max(EXPIRY_MARGIN_S, self.planned_s)

        def on() -> dict:
            # An expiry, so that a bench killed outright (no `off` at the end, no stop()) leaves
            # nothing on: the fault's planned rest, plus a margin for the `off` to come first.
            left = self._clock0 + planned_end - time.monotonic()
            duration_s = min(max(left, 0.0) + margin, MAX_DURATION_S)  # the server refuses longer
            with self._lock:  # before the POST: one that fails may still have reached the server
                self._server_faults[i] = (url, off)
            post_fault(url, body | {"duration_s": round(duration_s, 3)})
            return {"expires_s": round(time.monotonic() + duration_s - self._clock0, 3)}

        def turn_off() -> None:
            post_fault(url, off)
            with self._lock:  # a failed `off` leaves it to the end's
                self._server_faults.pop(i, None)

        out = [Action(start, i, spec.kind, on, spec.replica or 0)]
        if end is not None:
            out.append(Action(end, i, "off", turn_off, spec.replica or 0))
        return out

    def start(self, clock0: float) -> None:
        self._clock0 = clock0
        thread = threading.Thread(target=self._run, name="wok-faults", daemon=True)
        self._threads.append(thread)
        thread.start()

    def _record(
        self, action: Action, name: str, error: str | None = None, at: float | None = None, extra: dict | None = None
    ) -> None:
        at = time.monotonic() if at is None else at
        event = {"t_s": round(at - self._clock0, 4), "fault": action.fault, "action": name}
        if action.replica is not None:
            event["replica"] = action.replica
        event |= extra or {}
        if error is not None:
            event["error"] = error
        with self._lock:
            if self._closed:  # after the report's events were taken: a replica stopped with the rest
                return
            self.events.append(event)
        if error is not None:
            self.say(f"fault {self.specs[action.fault].text!r}: {name} failed: {error}")
        else:
            self.say(f"fault: {name} (replica {action.replica}) at {event['t_s']:.1f} s")

    def _do(self, action: Action) -> None:
        """Run the action; record it (at the time it began) or its failure, then its `then`."""
        began = time.monotonic()
        try:
            extra = action.run()
        except Exception as exc:  # recorded and reported; the ramp goes on
            self._record(action, action.name, f"{type(exc).__name__}: {exc}", began)
            return
        if action.then is None:
            self._record(action, action.name, at=began, extra=extra)
        else:
            self._record(action, action.then)

    def _run(self) -> None:
        for action in self.actions:
            if self._stop.wait(max(0.0, self._clock0 + action.t_s - time.monotonic())):
                return
            if action.then is not None:  # a restart: its own thread, so later actions keep time
                self._record(action, action.name)
                thread = threading.Thread(target=self._do, args=(action,), daemon=True)
                self._threads.append(thread)
                thread.start()
            else:
                self._do(action)

    def stop(self, wait_s: float | None = None) -> None:
        """Stop the schedule; resume paused replicas and turn off server-side faults left on.

        Actions still running are waited for at most `wait_s` in all (default: a replica's
        start timeout); one that ends later is not recorded."""
        self._stop.set()
        if self._clock0 is not None:
            self.stopped_s = round(time.monotonic() - self._clock0, 4)
        if wait_s is None:
            wait_s = self.replicas.start_timeout if self.replicas is not None else 10.0
        deadline = time.monotonic() + wait_s
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        with self._lock:
            self._closed = True
            still_on = list(self._server_faults.values())
        for r in list(self._paused):
            self.replicas[r].signal(signal.SIGCONT)
        for url, off in still_on:
            try:
                post_fault(url, off)
            except RuntimeError:
                pass  # the replica may be gone; nothing is left on then

    def sorted_events(self) -> list[dict]:
        with self._lock:
            return sorted(self.events, key=lambda e: e["t_s"])


# -- the report ---------------------------------------------------------------------------


def fault_report(
    intended: np.ndarray,
    done: np.ndarray,
    latency_s: np.ndarray,
    codes: np.ndarray,
    *,
    specs: Sequence[FaultSpec],
    events: Sequence[dict],
    slo_p99_ms: float,
    end_s: float | None = None,
    n_replicas: int | None = None,
    window_s: float = WINDOW_S,
) -> dict:
    """The fault section of a ramp's result, from every request of the ramp.

    `intended` and `done` are seconds from the ramp's start (done NaN: never ended),
    `codes` gRPC status numbers. See docs/reliability.md for each figure.
    A request never sent (code workers.NOT_SENT, of a step cut short) was no part of the load, as in
    analysis.step_result: it is in no figure, `lost` and `errors` included, and counted in
    `requests.not_sent` (present when any was).
    """
    codes = np.asarray(codes)
    unsent = codes == NOT_SENT
    if unsent.any():
        timed = unsent & np.isfinite(done)
        if timed.any():
            i = int(np.flatnonzero(timed)[0])
            raise ValueError(
                f"request {i} has code NOT_SENT (never sent): expected a NaN completion time; got {float(done[i])!r}"
            )
        keep = ~unsent
        intended, done, latency_s, codes = intended[keep], done[keep], latency_s[keep], codes[keep]
    names = np.array([status_name(c) for c in codes]) if len(codes) else np.array([], dtype=str)
    ok = codes == OK
    lost = np.isnan(done) | np.isin(names, LOST_CODES)
    errors = ~ok & ~lost
    end_s = float(np.nanmax(intended)) + 1e-6 if end_s is None and len(intended) else (end_s or 0.0)
    windows = _windows(intended, latency_s, ok, errors, lost, end_s, window_s, slo_p99_ms)
    windows["replicas_up"] = _replicas_up(windows["t_s"], window_s, events, n_replicas)
    per_fault = [
        _one_fault(i, s, events, intended, latency_s, ok, errors, lost, names, windows, end_s, window_s)
        for i, s in enumerate(specs)
    ]
    return {
        "schema": SCHEMA,
        "requests": {
            "sent": len(codes),
            "ok": int(ok.sum()),
            "errors": int(errors.sum()),
            "lost": int(lost.sum()),
            **({"not_sent": int(unsent.sum())} if unsent.any() else {}),
        },
        "errors_by_code": _by_code(names[~ok]),
        "lost_by_code": _by_code(names[lost]),
        "definitions": {
            "lost_codes": list(LOST_CODES),
            "window_s": window_s,
            "hold_s": HOLD_S,
            "compare_s": COMPARE_S,
            "max_error_rate": MAX_ERROR_RATE,
            "slo_p99_ms": slo_p99_ms,
        },
        "faults": per_fault,
        "events": list(events),
        "timeline": windows,
    }


def _by_code(names: np.ndarray) -> dict[str, int]:
    values, counts = np.unique(names, return_counts=True)
    return {str(v): int(c) for v, c in zip(values, counts)}


def _p99_ms(latency_s: np.ndarray) -> float | None:
    """Nearest-rank P99 (docs/bench-schema.md), as every other percentile of the bench."""
    p99 = latency_summary(np.asarray(latency_s) * 1e3)["p99"] if len(latency_s) else math.nan
    return None if math.isnan(p99) else p99


def _windows(intended, latency_s, ok, errors, lost, end_s, window_s, slo_p99_ms) -> dict:
    """Per window of send time: sent, ok, errors, lost, P99 of the ok, and whether it was good."""
    n = max(1, math.ceil(end_s / window_s))
    idx = np.clip(np.floor(intended / window_s).astype(int), 0, n - 1) if len(intended) else np.array([], int)
    out: dict[str, list] = {k: [] for k in ("t_s", "sent", "ok", "errors", "lost", "p99_ms", "good")}
    for w in range(n):
        here = idx == w
        sent = int(here.sum())
        p99 = _p99_ms(latency_s[here & ok])
        n_err, n_lost = int((here & errors).sum()), int((here & lost).sum())
        good = None  # nothing sent: no evidence either way
        if sent:
            good = n_lost == 0 and n_err <= MAX_ERROR_RATE * sent and p99 is not None and p99 <= slo_p99_ms
        out["t_s"].append(round(w * window_s, 6))
        out["sent"].append(sent)
        out["ok"].append(int((here & ok).sum()))
        out["errors"].append(n_err)
        out["lost"].append(n_lost)
        out["p99_ms"].append(p99)
        out["good"].append(None if good is None else bool(good))
    return out


def _replicas_up(t_s: list[float], window_s: float, events: Sequence[dict], n: int | None) -> list[int] | None:
    """Replicas serving at each window's start, from kill/ready and pause/resume events.

    Each replica is down while killed or paused, and up once it is both restarted and resumed:
    a paused replica that is then killed is one replica down, not two."""
    if n is None:
        return None
    acts = ("kill", "pause", "ready", "resume")
    changes = sorted(
        (e["t_s"], e["action"], e.get("replica", 0)) for e in events if e["action"] in acts and "error" not in e
    )
    killed: set[int] = set()
    paused: set[int] = set()
    out, j = [], 0
    for t in t_s:
        while j < len(changes) and changes[j][0] <= t + window_s / 2:
            _, action, r = changes[j]
            if action == "kill":
                killed.add(r)
                paused.discard(r)  # a new process starts running, never stopped
            elif action == "ready":
                killed.discard(r)
            elif action == "pause":
                paused.add(r)
            else:
                paused.discard(r)
            j += 1
        out.append(n - len(killed | paused))
    return out


def _one_fault(i, spec, events, intended, latency_s, ok, errors, lost, names, windows, end_s, window_s) -> dict:
    mine = [e for e in events if e["fault"] == i]
    begin = next(
        (e["t_s"] for e in mine if e["action"] in ("kill", "pause", "slow", "fail") and "error" not in e), None
    )
    over = next((e["t_s"] for e in mine if e["action"] in ("ready", "resume", "off") and "error" not in e), None)
    out: dict = {
        "fault": spec.text,
        "kind": spec.kind,
        "replica": spec.replica,
        "start_s": begin,
        "end_s": over,
        "restart_s": next((e["t_s"] for e in mine if e["action"] == "restart"), None),
    }
    if begin is None:
        out["note"] = "the fault did not happen (the ramp ended before it, or its action failed)"
        return out
    stop = over if over is not None else end_s
    phases = {
        "before": (max(0.0, begin - COMPARE_S), begin),
        "during": (begin, stop),
        "after": (stop, min(end_s, stop + COMPARE_S)),
    }
    # A call still in flight when the fault begins is the fault's (a paused replica holds it;
    # a killed one fails it): "before" counts only calls answered before the fault began.
    answered_by = intended + np.where(np.isnan(latency_s), np.inf, latency_s)
    for phase, (a, b) in phases.items():
        here = (intended >= a) & (intended < b)
        if phase == "before":
            here &= answered_by < begin
        out[f"p99_{phase}_ms"] = _p99_ms(latency_s[here & ok])
        out[f"sent_{phase}"] = int(here.sum())
        out[f"lost_{phase}"] = int((here & lost).sum())
        out[f"errors_{phase}"] = _by_code(names[here & ~ok])
    out["recovery_s"], out["breached_slo"] = _recovery(windows, begin, phases["after"][1], window_s)
    if out["recovery_s"] is not None and over is not None:
        out["recovered_after_end_s"] = round(begin + out["recovery_s"] - over, 3)
    expires = next((e["expires_s"] for e in mine if "expires_s" in e and "error" not in e), None)
    if expires is not None and expires < stop:  # a ramp past its planned time outlives the fault
        out["expired_s"] = expires
    return out


def _recovery(windows: dict, begin: float, horizon: float, window_s: float) -> tuple[float | None, bool]:
    """(recovery, breached): `breached` if a window from the one the fault starts in up to `horizon`
    is bad; `recovery` is the start of the first good window after the last such bad one, minus
    the fault's start (0 when none is bad), provided good windows of HOLD_S in all follow the bad
    one before `horizon`; otherwise None (the run does not show a recovery). A window in which
    nothing was sent is evidence of nothing: it neither breaks a recovery nor counts towards one
    (the gap between steps while a paused replica holds the last step's calls read as recovered)."""
    t = np.array(windows["t_s"])
    bad_window = np.array([g is False for g in windows["good"]])  # None: nothing sent, no evidence
    good_window = np.array([g is True for g in windows["good"]])
    first = int(np.searchsorted(t, begin - window_s + 1e-9))  # the window the fault starts in
    last = int(np.searchsorted(t, horizon - 1e-9))  # windows [first, last) start before the horizon
    bad = np.flatnonzero(bad_window[first:last]) + first
    if not len(bad):
        return 0.0, False
    good = np.flatnonzero(good_window[bad[-1] + 1 : last]) + bad[-1] + 1
    if len(good) * window_s < HOLD_S - 1e-9:
        return None, True
    return round(float(t[good[0]] - begin), 3), True


# -- the ramp -----------------------------------------------------------------------------


def planned_s(cfg: RampConfig) -> float:
    """The ramp's planned time, which `at=30%` is a fraction of."""
    return len(cfg.steps) * (cfg.warmup_s + cfg.step_duration_s)


class FaultRamp(Ramp):
    """A Ramp that runs a FaultSchedule from its first step's start and adds `result["faults"]`."""

    def __init__(
        self,
        cfg: RampConfig,
        specs: Sequence[FaultSpec],
        *,
        replicas: ReplicaSet | None = None,
        admin_urls: Sequence[str] = (),
        progress: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__(cfg, progress)
        # Only faults fail whole steps by design: --replicas alone ran on through steps with no request OK, which
        # end a ramp without faults.
        self.stops_when_none_ok = not specs
        self.replicas = replicas
        self.schedule = FaultSchedule(specs, planned_s(cfg), replicas=replicas, admin_urls=admin_urls, say=self.say)

    def started(self, clock0: float) -> None:
        self.schedule.start(clock0)

    def run(self) -> dict:
        try:
            result = super().run()
        except BaseException:
            self.schedule.stop(CUT_WAIT_S)  # nothing measured: no event of it is reported
            raise
        # Every step run is in `result`: a signal now keeps it, as one after the last step (raised here, it lost it).
        interrupted = result.get("interrupted")
        try:
            self.schedule.stop(CUT_WAIT_S if interrupted else None)
        except KeyboardInterrupt as exc:
            # In the wait for a replica restarting (minutes): from here at most CUT_WAIT_S, as for a cut run.
            self.late(exc, "as the fault schedule stopped")
            self.schedule.stop(CUT_WAIT_S)
        result, came = run_held(lambda: self._with_faults(result))
        if came is not None:
            self.late(came, "as the faults were reported")
        return result

    def _with_faults(self, result: dict) -> dict:
        """`result` with its `faults` section, the schedule stopped."""
        interrupted = result.get("interrupted")
        if self.timeline:
            intended, done, lat, codes = (np.concatenate([t[k] for t in self.timeline]) for k in range(4))
        else:
            intended = done = lat = np.empty(0)
            codes = np.empty(0, dtype=np.int16)
        section = fault_report(
            intended,
            done,
            lat,
            codes,
            specs=self.schedule.specs,
            events=self.schedule.sorted_events(),
            slo_p99_ms=self.cfg.slo_p99_ms,
            n_replicas=len(self.replicas) if self.replicas is not None else None,
        )
        # What the calls had, not what was asked: `--rpc stream`'s streams are not retried.
        section["retries"] = retries_in_effect(self.cfg.retries, self.cfg.rpc)
        section["retries_requested"] = self.cfg.retries
        section["balancer"] = result["config"].get("balancer")
        section["planned_s"] = self.schedule.planned_s
        # A signal ends the run when the user chose: faults planned from then on were not due.
        section["cut_s"] = self.schedule.stopped_s if interrupted and interrupted["by_signal"] else None
        if self.replicas is not None:
            # Again after the schedule stopped: a restart it waited for started a process.
            result["replicas"] = section["replicas"] = self.replicas.describe()
        result["faults"] = section
        for f, problem in zip(section["faults"], not_in_effect(section)):
            if problem is not None:
                result["warnings"].append(f"fault {quoted_name(f['fault'])} {problem}")
        warning = loss_warning(section, self.cfg.retries, self.cfg.rpc)
        if warning is not None:
            result["warnings"].append(warning)
        return result


# -- text ---------------------------------------------------------------------------------


def retries_in_effect(retries: bool, rpc: str | None) -> bool:
    """Whether the ramp's calls were retried on UNAVAILABLE: asked for (no `--no-retries`), and
    not `--rpc stream`'s streams, which are never replayed (`stream_retries=False`, docs/bench.md)."""
    return bool(retries) and rpc != "stream"


def retries_label(retries: bool, rpc: str | None) -> str:
    """Whether gRPC retried the ramp's calls. Retries on (no `--no-retries`) still leave out the
    streams of `--rpc stream` (`stream_retries=False`, docs/bench.md): a replay would resend their
    requests late."""
    if not retries:
        return "retries off"
    return "retries off (streams)" if rpc == "stream" else "retries on"


def loss_warning(section: dict, retries: bool, rpc: str | None) -> str | None:
    """The result's warning for requests lost although retried; None without retries in effect
    (`--no-retries`, or the streams of `--rpc stream`): a fault's losses are expected then."""
    lost = section["requests"]["lost"]
    if not lost or not retries_in_effect(retries, rpc):
        return None
    return f"{lost} request(s) lost with retries on: {by_code(section['lost_by_code'])}"


def fmt(v, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def by_code(counts: dict | None, none: str = "-") -> str:
    """Counts by status name as the text and the HTML report say them, `INTERNAL 30, UNAVAILABLE 2`
    (a dict's repr was printed); `none` for none."""
    return ", ".join(f"{code} {n}" for code, n in (counts or {}).items()) or none


def section_console(result: dict, key: str, file=None):
    """(result[key], a rich Console on `file` or stdout), or (None, None) without that section."""
    from rich.console import Console

    section = result.get(key)
    if not section:
        return None, None
    return section, Console(file=file or sys.stdout, width=160)


def not_in_effect(section: dict) -> list[str | None]:
    """Per fault of a `faults` section: why it did not run as asked (None: it did). A run whose
    fault never happened, or never ended, measured something other than what was asked. A fault
    planned after a signal cut the run (`cut_s`) was not due, so it is not counted; one due
    before the cut that failed still is."""
    out = []
    cut_s = section.get("cut_s")
    for i, f in enumerate(section["faults"]):
        errors = [e for e in section["events"] if e["fault"] == i and "error" in e]
        if f.get("start_s") is None and not errors and cut_s is not None and _planned_start(f, section) >= cut_s:
            out.append(None)
        elif f.get("start_s") is None:
            why = errors[0]["error"] if errors else "the ramp ended before its time"
            out.append(f"did not take effect: {why}")
        elif errors:
            out.append("; ".join(f"its {e['action']} failed: {e['error']}" for e in errors))
        elif f.get("expired_s") is not None:
            end = "its end" if f.get("end_s") is None else f"its off at {f['end_s']:g} s"
            out.append(f"expired at {f['expired_s']:g} s, before {end}: the ramp ran past its planned time")
        else:
            out.append(None)
    return out


def _planned_start(fault: dict, section: dict) -> float:
    """A fault's planned start, seconds from the ramp's start (as the schedule placed it)."""
    return parse_fault(fault["fault"]).at.seconds(section["planned_s"])


FAULT_HEAD = ("fault", "start s", "end s", "P99 before", "during", "after", "lost", "errors during", "recovery s")
TIMELINE_HEAD = ("t s", "sent", "ok", "errors", "lost", "P99 ms", "up", "window", "events")


def requests_summary(result: dict) -> tuple[str, str, str]:
    """The line over the fault table in three parts, the middle one (the requests lost) the one to stress:
    the text and the HTML report say the same."""
    section = result["faults"]
    req = section["requests"]
    # The label tells the setting from its effect; results before `retries_requested` held the
    # setting in `retries`.
    requested = section.get("retries_requested", section.get("retries", True))
    unsent = f"({req['not_sent']} never sent, in no figure) " if req.get("not_sent") else ""
    tail = (
        f" {unsent}({retries_label(requested, (result.get('config') or {}).get('rpc'))}, "
        f"balancer {section.get('balancer') or 'grpc'}); not OK by code: {by_code(section['errors_by_code'])}"
    )
    return f"requests: {req['sent']} sent, {req['ok']} ok, {req['errors']} errors, ", f"{req['lost']} lost", tail


def fault_rows(section: dict) -> list[list[str]]:
    """The fault table's rows (FAULT_HEAD), one per fault."""
    return [
        [
            f["fault"],
            fmt(f.get("start_s")),
            fmt(f.get("end_s")),
            fmt(f.get("p99_before_ms")),
            fmt(f.get("p99_during_ms")),
            fmt(f.get("p99_after_ms")),
            str(f.get("lost_during", "-")),
            by_code(f.get("errors_during")),
            "never" if f.get("start_s") is not None and f.get("recovery_s") is None else fmt(f.get("recovery_s")),
        ]
        for f in section["faults"]
    ]


def problem_lines(section: dict) -> list[str]:
    """A line per fault that did not run as asked (`not_in_effect`), as the result's warnings word it."""
    return [
        f"fault {quoted_name(f['fault'])} {problem}"
        for f, problem in zip(section["faults"], not_in_effect(section))
        if problem is not None
    ]


def timeline_rows(section: dict) -> list[list[str]]:
    """The timeline's rows (TIMELINE_HEAD) around the faults: its windows from 2 s before the first
    start to 3 s after the last recovery or end; none when no fault took effect."""
    tl = section["timeline"]
    starts = [f["start_s"] for f in section["faults"] if f.get("start_s") is not None]
    if not starts:
        return []
    stops = [
        (f["start_s"] + (f["recovery_s"] or 0.0), f.get("end_s") or f["start_s"])
        for f in section["faults"]
        if f.get("start_s") is not None
    ]
    lo, hi = min(starts) - 2.0, max(max(s) for s in stops) + 3.0
    events: dict[int, list[str]] = {}
    w = section["definitions"]["window_s"]
    for e in section["events"]:
        events.setdefault(int(e["t_s"] // w), []).append(f"{e['action']} r{e.get('replica', '')}")
    up = tl.get("replicas_up")
    return [
        [
            f"{t:.1f}",
            str(tl["sent"][k]),
            str(tl["ok"][k]),
            str(tl["errors"][k]),
            str(tl["lost"][k]),
            fmt(tl["p99_ms"][k]),
            "-" if up is None else str(up[k]),
            "bad" if tl["good"][k] is False else "",
            ", ".join(events.get(k, [])),
        ]
        for k, t in enumerate(tl["t_s"])
        if lo <= t <= hi
    ]


def print_rows(console, title: str, head: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """A titled table of text cells: the fault table, the timeline, the replicas (bench/report.py)."""
    from rich.table import Table

    table = Table(title=title)
    for name in head:
        table.add_column(name)
    for row in rows:
        table.add_row(*row)
    console.print(table)


def print_faults(result: dict, file=None) -> None:
    """The requests' line, the fault table, and the timeline around the faults. No table without a fault (--replicas
    alone): it printed one with a head and no row until 2026-12-07."""
    section, console = section_console(result, "faults", file)
    if section is None:
        return
    head, lost, tail = requests_summary(result)
    console.print(f"{head}[bold]{lost}[/bold]{tail}")
    if section["faults"]:
        title = f"faults (SLO P99 {section['definitions']['slo_p99_ms']:g} ms)"
        print_rows(console, title, FAULT_HEAD, fault_rows(section))
    for line in problem_lines(section):
        console.print(f"[bold]{line}[/bold]", markup=True, highlight=False)
    rows = timeline_rows(section)
    if rows:
        print_rows(console, "timeline (by send time)", TIMELINE_HEAD, rows)


# -- the command line ---------------------------------------------------------------------


def add_arguments(p) -> None:
    """`wok bench ramp`'s replica, fault and retry options."""
    g = p.add_argument_group("replicas and faults", "see docs/reliability.md")
    g.add_argument(
        "--replicas", type=int, help="start N local `wok serve` replicas and ramp all of them (through --balancer)"
    )
    g.add_argument(
        "--replica-host",
        metavar="ADDR",
        help=f"loopback address the replicas bind, their gRPC and (unless --serve-args gives --metrics-host) HTTP "
        f"ports: ::1 where the machine has no {REPLICA_HOST} (default {REPLICA_HOST})",
    )
    g.add_argument(
        "--serve-args",
        help='arguments of each replica\'s `wok serve`, as one string (default: "--models MODELS-OF-THE-MIX")',
    )
    g.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="SPEC",
        help="kill:replica=1,at=30%%,restart=60%% | pause:replica=1,at=30%%,resume=60%% | "
        "slow:model=mlp,delay=50ms,at=30%%,until=60%% | fail:model=mlp,at=30%%,until=60%% (repeatable)",
    )
    g.add_argument(
        "--admin-url",
        action="append",
        default=[],
        metavar="URL",
        help="admin API (http://HOST:METRICS-PORT of a `wok serve --admin`) for slow/fail faults without "
        "--replicas; repeat for several, replica=N picks one",
    )
    g.add_argument("--no-retries", action="store_true", help="do not retry calls that end with UNAVAILABLE")
    g.add_argument(
        "--balancer",
        choices=("grpc", "wok"),
        help="grpc: one channel, gRPC's round_robin; wok: a channel per replica, least loaded of two, hedging, "
        "outlier ejection (default: wok for several targets or a dns: name, grpc for one server or --rpc stream)",
    )
    g.add_argument(
        "--hedge-after",
        default="auto",
        metavar="DURATION",
        help="wok balancer: send a second attempt to another replica after this long without an answer: "
        "a duration, auto (P95 of recent answers, at least 20ms; the default) or off",
    )


def parse_hedge_after(text: str) -> float | str | None:
    """`--hedge-after`: "auto", "off" (None) or a duration in seconds ("30ms"); ValueError otherwise."""
    text = text.strip(SPACES)
    if text in ("auto", "off"):
        return None if text == "off" else "auto"
    try:
        value = parse_duration(text)
    except ValueError as exc:  # in the option's name: it was "invalid duration ..." alone
        raise ValueError(f"--hedge-after: {exc}") from None
    if not 0 < value < math.inf:  # (an infinite one, "1e400s", is no hedging: off)
        raise ValueError(f"--hedge-after {quoted_name(text)}: expected a finite duration > 0, auto or off")
    return value


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def serve_args_of(args, cfg: RampConfig) -> list[str]:
    """The arguments of each replica's `wok serve`: --serve-args split as a shell would; ValueError
    naming the option for one a shell could not split (an unclosed quote)."""
    import shlex

    if args.serve_args is None:
        return ["--models", ",".join(m for m, _ in cfg.models)]
    try:
        return shlex.split(args.serve_args)
    except ValueError as exc:  # shlex's "No closing quotation", in no option's name
        raise ValueError(f"--serve-args {quoted_name(args.serve_args)}: {exc}") from None


def start_replicas(args, cfg: RampConfig, say: Callable[[str], None], *, admin: bool = False):
    """(ReplicaSet, cfg aimed at it) for `--replicas N`; (None, cfg) without it."""
    if args.replicas is None:
        return None, cfg
    if (refusal := integer_refusal("--replicas", args.replicas, 1)) is not None:
        raise ValueError(refusal)
    serve_args = serve_args_of(args, cfg)
    say(f"starting {args.replicas} replica(s): wok serve {' '.join(serve_args)}")
    replicas = ReplicaSet(args.replicas, serve_args, admin=admin, host=replica_host(args.replica_host))
    say(f"replicas serving on {replicas.target}")
    if args.metrics_url != "auto":  # none, or a URL scraped as given (a Prometheus of the fleet's)
        return replicas, replace(cfg, target=replicas.target)
    off = [str(r.index) for r in replicas if not r.metrics_on]
    if off:
        # As each said at its start, not as --serve-args reads: "--no-metr" or a later "--metrics-port -1"
        # also turn them off, and each step would have warned that the replicas "could not be scraped".
        say(
            f"--metrics-url auto: replica(s) {', '.join(off)} serve no /metrics (metrics off in --serve-args); "
            "server-side columns `-`"
        )
        return replicas, replace(cfg, target=replicas.target, metrics_url=None)
    # Each replica's own /metrics, its figures summed over them at each step (scrape.Fleet).
    urls = [r.metrics_url for r in replicas]
    say(f"server-side columns summed over the replicas' /metrics: {', '.join(urls)}")
    return replicas, replace(cfg, target=replicas.target, metrics_url=None, replica_metrics=urls)


def check_options(args, cfg: RampConfig) -> list[FaultSpec]:
    """The --fault specs, checked with the replica options against each other and the ramp's plan
    before anything connects or starts (`wok bench ramp` calls this before it scrapes --metrics-url);
    ValueError naming the option."""
    specs = [parse_fault(s) for s in args.fault]
    if args.replicas is not None:
        if (refusal := integer_refusal("--replicas", args.replicas, 1)) is not None:
            raise ValueError(refusal)
        for s in specs:
            if s.replica is not None and s.replica >= args.replicas:
                raise ValueError(f"--fault {quoted_name(s.text)}: replica={s.replica}, but --replicas {args.replicas}")
        serve_args_of(args, cfg)
    elif any(not s.server_side for s in specs):
        raise ValueError("--fault kill: and pause: need --replicas: the bench signals only replicas it started")
    elif any(s.server_side for s in specs) and not args.admin_url:
        raise ValueError("--fault slow: and fail: need --replicas or --admin-url")

    def server_of(s: FaultSpec) -> str:
        i = s.replica or 0
        if args.replicas is None and i < len(args.admin_url):
            return args.admin_url[i]
        return f"replica {i}"

    # Before any replica starts; the schedule checks again with the servers' own URLs.
    check_overlaps(specs, planned_s(cfg), server_of)
    return specs


def run_faults(args, cfg: RampConfig) -> dict:
    """The ramp with `--replicas` and `--fault`: start the replicas, run, stop them, return the result."""
    specs = check_options(args, cfg)
    if specs:
        # A fault is expected to break the SLO for a while; stopping there would skip its end.
        cfg = replace(cfg, stop_factor=math.inf)
    replicas, cfg = start_replicas(args, cfg, say, admin=any(s.server_side for s in specs))
    try:
        result = FaultRamp(cfg, specs, replicas=replicas, admin_urls=args.admin_url, progress=say).run()
    except BaseException:
        if replicas is not None:
            replicas.close(say)
        raise
    close_replicas_held(replicas, say)
    return result


def close_replicas_held(replicas, say: Callable[[str], None], kept: str = Ramp.kept) -> None:
    """Stop the bench's `replicas` (None: none) once the run has its result. A signal as they stop waits for them:
    raised in their wait, it lost the result (exit 130, no table), and left the replicas to end with the bench.
    `kept`: what the result is, said with such a signal (a soak's is its soak)."""
    if replicas is None:
        return
    doing = f"the replicas stop (up to {replicas.stop_wait_s:g} s)"
    _, came = run_held(lambda: replicas.close(say), doing=doing, kept=kept)
    if came is not None:
        say(f"{type(came).__name__}: {came} as the replicas stopped: {kept}")
