"""Side-by-side: the same model and the same ramp against wok and its peers, in one run.

    python bench/compare.py --servers wok,pytriton,mlserver --reps 3 --json docs/results/compare-DATE.json

Each peer is installed into its own virtual environment under `.bench-peers/` (git-ignored;
never a dependency of wok), rebuilt only when its recipe changes. One server runs at a time:
for each repetition, for each server (the order rotated every repetition), the harness starts
the server in its own session, waits until the model is ready over gRPC, runs wok's own ramp
against it in-process, reads the CPU time and RSS of the server's whole session from /proc,
and stops it (SIGTERM to the process group, then SIGKILL). Every server it started is stopped
on any exit, Ctrl-C included. The output (schema `wok.compare/1`) is described in
docs/performance.md.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import math
import os
import platform
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from wok.bench.arrivals import parse_arrivals, parse_duration, parse_steps
from wok.bench.outputs import refuse_unwritable, write_final, write_json_text
from wok.bench.payloads import integer_refusal

SCHEMA = "wok.compare/1"
ROOT = Path(__file__).resolve().parent.parent
PEERS_DIR = ROOT / ".bench-peers"
TEMPLATES = Path(__file__).resolve().parent / "peers"
SLOS_MS = (50.0, 200.0)
REPORT_AT = (100.0, 1000.0)
DEFAULT_STEPS = "100,200,400,800,1000,1200,1600,2000,2400,3200,4000"  # holds every REPORT_AT rate
STEP_KEYS = ("offered_qps", "achieved_qps", "requests", "ok", "errors", "success_rate", "latency_ms", "dispatch_lag_ms")


def say(msg: str) -> None:
    print(f"[compare {datetime.now(timezone.utc).strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- /proc accounting


@dataclass
class ProcStat:
    pid: int
    ppid: int
    pgrp: int
    session: int
    cpu_ticks: int  # utime + stime + cutime + cstime
    rss_pages: int


def parse_stat(text: str) -> ProcStat:
    """One /proc/PID/stat line. The command name may hold spaces and ')', so split after the last ')'."""
    pid = int(text[: text.index("(")].strip())
    rest = text[text.rindex(")") + 2 :].split()
    # rest[0] is field 3 (state); field n is rest[n - 3].
    ppid, pgrp, session = int(rest[1]), int(rest[2]), int(rest[3])
    utime, stime, cutime, cstime = (int(rest[i]) for i in (11, 12, 13, 14))
    rss = int(rest[21])
    return ProcStat(pid, ppid, pgrp, session, utime + stime + cutime + cstime, rss)


def read_procs(proc_root: Path = Path("/proc")) -> list[ProcStat]:
    out = []
    for entry in proc_root.iterdir() if proc_root.exists() else ():
        if not entry.name.isdigit():
            continue
        try:
            out.append(parse_stat((entry / "stat").read_text()))
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile, or not readable
    return out


def session_members(procs: Iterable[ProcStat], leader: int) -> list[ProcStat]:
    """The server's tree: every process of its session, plus descendants that left the session."""
    procs = list(procs)
    members = {p.pid: p for p in procs if p.session == leader or p.pid == leader}
    grew = True
    while grew:
        grew = False
        for p in procs:
            if p.pid not in members and p.ppid in members:
                members[p.pid] = p
                grew = True
    return list(members.values())


@dataclass
class Usage:
    cpu_s: float
    rss_bytes: int
    pids: int


def tree_usage(
    leader: int,
    proc_root: Path = Path("/proc"),
    ticks_per_s: float | None = None,
    page_size: int | None = None,
) -> Usage:
    """CPU seconds (user + system, reaped children included) and RSS summed over the server's tree."""
    hz = ticks_per_s or os.sysconf("SC_CLK_TCK")
    page = page_size or os.sysconf("SC_PAGE_SIZE")
    members = session_members(read_procs(proc_root), leader)
    return Usage(
        cpu_s=sum(p.cpu_ticks for p in members) / hz,
        rss_bytes=sum(p.rss_pages for p in members) * page,
        pids=len(members),
    )


# Threads of the server's leader process, grouped by what /proc/PID/task/TID/comm can tell:
# `loop` is the main thread (the event loop of wok and of the bare server), `model` wok's
# model workers (named by wok.executor), `grpc` gRPC core's own threads; `other` holds the
# rest, which the OS cannot tell apart (they keep the process's name): gRPC's Python poller
# thread, OpenMP's workers, libuv's pool.
THREAD_GROUPS = ("loop", "model", "grpc", "other")


def thread_group(pid: int, tid: int, comm: str) -> str:
    if tid == pid:
        return "loop"
    if comm.startswith("wok-"):
        return "model"
    if comm.startswith(("event_engine", "grpc_")):
        return "grpc"
    return "other"


def thread_ticks(pid: int, proc_root: Path = Path("/proc")) -> dict[str, int]:
    """CPU ticks (user + system) of the leader process's threads, by THREAD_GROUPS."""
    out = dict.fromkeys(THREAD_GROUPS, 0)
    task = proc_root / str(pid) / "task"
    for entry in task.iterdir() if task.exists() else ():
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue  # the thread ended meanwhile
        comm = text[text.index("(") + 1 : text.rindex(")")]
        rest = text[text.rindex(")") + 2 :].split()
        out[thread_group(pid, int(entry.name), comm)] += int(rest[11]) + int(rest[12])
    return out


def threads_per_request(before: dict, after: dict, ok_requests: int, ticks_per_s: float | None = None) -> dict:
    """µs of CPU per successful request, by thread group, over one step."""
    hz = ticks_per_s or os.sysconf("SC_CLK_TCK")
    if not ok_requests:
        return dict.fromkeys(THREAD_GROUPS)
    return {g: max(0, after.get(g, 0) - before.get(g, 0)) / hz / ok_requests * 1e6 for g in THREAD_GROUPS}


def cpu_per_request(before: Usage, after: Usage, wall_s: float, ok_requests: int) -> dict:
    """The server's CPU over one step: µs per successful request, and cores busy on average."""
    cpu = max(0.0, after.cpu_s - before.cpu_s)
    return {
        "cpu_s": cpu,
        "wall_s": wall_s,
        "requests": ok_requests,
        "us_per_request": cpu / ok_requests * 1e6 if ok_requests else None,
        "cores": cpu / wall_s if wall_s > 0 else None,
    }


def system_busy_s(proc_root: Path = Path("/proc"), ticks_per_s: float | None = None) -> float:
    """CPU seconds the whole machine has been busy (all cores; /proc/stat minus idle and iowait)."""
    hz = ticks_per_s or os.sysconf("SC_CLK_TCK")
    fields = (proc_root / "stat").read_text().splitlines()[0].split()[1:]
    ticks = [int(x) for x in fields[:8]]  # user nice system idle iowait irq softirq steal
    return (sum(ticks) - ticks[3] - ticks[4]) / hz


def host_load(server_cpu_s: float, loadgen_cpu_s: float, busy_s: float, wall_s: float) -> dict:
    """Cores used by the load generator and by everything else (neither it nor the server) over a step."""
    other = max(0.0, busy_s - server_cpu_s - loadgen_cpu_s)
    return {"loadgen_cores": loadgen_cpu_s / wall_s, "other_cores": other / wall_s}


class RssSampler:
    """Peak of the tree's summed RSS, sampled every `interval_s` in a thread."""

    def __init__(self, leader: int, interval_s: float = 0.25) -> None:
        self.leader, self.interval_s = leader, interval_s
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def sample(self) -> None:
        self.peak = max(self.peak, tree_usage(self.leader).rss_bytes)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


# --------------------------------------------------------------------------- servers


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def local_wok(serve_args: Iterable[str], cwd: Path = ROOT, rev: str | None = None):
    """`wok serve` on free loopback ports, in its own session, for a benchmark script.

    Yields (target, metrics URL, pid) once it serves; on exit, SIGTERM to its session, then
    SIGKILL after 30 s. Its stderr is read to the end by a thread, so a chatty log never blocks it.
    `rev`: serve wok as committed at that git revision (as `wok@REV` in the harness) instead.
    """
    port, mport = free_port(), free_port()
    cmd = [sys.executable, "-m", "wok", "serve", *serve_args, "--port", str(port), "--metrics-port", str(mport)]
    env = None
    if rev is not None:
        _, extra_env, cwd = _launch_wok(wok_at_rev(f"wok@{rev}"), {"grpc": port, "metrics": mport})
        env = {**os.environ, **extra_env}
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        for line in proc.stderr:
            if "serving" in line:
                break
        else:
            raise RuntimeError(f"wok serve exited with {proc.wait()}")
        threading.Thread(target=collections.deque, args=(proc.stderr, 0), daemon=True).start()
        yield f"127.0.0.1:{port}", f"http://127.0.0.1:{mport}/metrics", proc.pid
    finally:
        _signal_tree(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            _signal_tree(proc.pid, signal.SIGKILL)
            proc.wait()


@dataclass
class Peer:
    name: str
    pip: list[str]  # what `pip install` gets in the peer's own venv; empty for wok itself
    launch: Callable[[Peer, dict], tuple[list[str], dict, Path]]  # ports -> (argv, extra env, cwd)
    ready_timeout_s: float = 180.0
    extra: dict = field(default_factory=dict)

    @property
    def venv(self) -> Path:
        return PEERS_DIR / self.name

    @property
    def python(self) -> str:
        return sys.executable if not self.pip else str(self.venv / "bin" / "python")

    @property
    def recipe(self) -> str:
        if self.pip:
            return "pip install " + " ".join(self.pip)
        if "rev" in self.extra:
            return f"git archive {self.extra['rev']} (server, bench, clients, demo as package wok), this .venv"
        extra = self.extra.get("args")
        how = ", requests on ModelStreamInfer" if self.extra.get("rpc") == "stream" else ""
        return "this checkout (.venv)" + (f", wok serve … {shlex.join(extra)}" if extra else "") + how


def _venv_libdir(python: str) -> str:
    return subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_config_var('LIBDIR'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def _launch_wok(peer: Peer, ports: dict) -> tuple[list[str], dict, Path]:
    argv = [sys.executable, "-m", "wok", "serve", "--models", "mlp"]
    argv += ["--port", str(ports["grpc"]), "--metrics-port", str(ports["metrics"]), "--log-level", "WARNING"]
    argv += list(peer.extra.get("args", ()))
    if "rev" in peer.extra:  # wok@REV: that revision's package first on the path (python -m adds the cwd)
        top = rev_tree(peer.extra["rev"])
        return argv, {"PYTHONPATH": str(top)}, top
    return argv, {}, ROOT


def wok_variant(spec: str) -> Peer:
    """NAME=ARGS: wok served with extra `wok serve` arguments, compared side by side with plain wok."""
    from wok.errors import quoted_name

    name, eq, args = spec.partition("=")
    if not eq or not re.fullmatch(r"wok-[A-Za-z0-9_.-]+", name):
        raise ValueError(
            f"--wok-variant {quoted_name(spec)}: expected wok-NAME='ARGS', e.g. wok-t1='--torch-threads 1'"
        )
    try:
        argv = shlex.split(args)
    except ValueError as exc:  # shlex's "No closing quotation", in no option's name
        raise ValueError(f"--wok-variant {quoted_name(spec)}: {exc}") from None
    return Peer(name, [], _launch_wok, ready_timeout_s=120.0, extra={"args": argv})


REV_PEER = re.compile(r"wok@([A-Za-z0-9_.~^/-]+)")


def wok_at_rev(name: str) -> Peer:
    """`wok@REV`: wok's server as committed at git revision REV, run with this checkout's venv.

    For before/after runs in one harness run: the revision's server/, bench/, clients/ and demo/
    are laid out as the package `wok` under `.bench-peers/wok@SHA/` (as pyproject's package-dir
    maps them), which comes first on the server's PYTHONPATH.
    """
    from wok.errors import quoted_name

    m = REV_PEER.fullmatch(name)
    if m is None:
        raise ValueError(f"{quoted_name(name)}: expected wok@REV, e.g. wok@HEAD or wok@76aec29")
    rev = m.group(1)
    out = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--verify", f"{rev}^{{commit}}"], capture_output=True, text=True
    )
    if out.returncode != 0:
        raise ValueError(f"{quoted_name(name)}: git does not know revision {quoted_name(rev)}")
    sha = out.stdout.strip()
    return Peer(name, [], _launch_wok, ready_timeout_s=120.0, extra={"rev": sha})


def rev_tree(sha: str) -> Path:
    """`.bench-peers/wok@SHA/`: the revision's packages laid out as `wok`, extracted once (also what
    bench/batcher_loop_cost.py imports a revision's wok from)."""
    top = PEERS_DIR / f"wok@{sha}"
    pkg = top / "wok"
    if (top / ".complete").exists():
        return top
    shutil.rmtree(top, ignore_errors=True)
    src = top / "src"
    src.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", sha, "server", "bench", "clients", "demo"],
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    shutil.move(str(src / "server"), str(pkg))
    for sub, dest in (("bench", "bench"), ("clients", "clients"), ("demo", "demo")):
        if (src / sub).exists():
            shutil.move(str(src / sub), str(pkg / dest))
    shutil.rmtree(src)
    (top / ".complete").write_text(sha + "\n")
    return top


def _launch_bare(peer: Peer, ports: dict) -> tuple[list[str], dict, Path]:
    return [sys.executable, str(TEMPLATES / "bare_server.py"), str(ports["grpc"])], {}, ROOT


def _launch_pytriton(peer: Peer, ports: dict) -> tuple[list[str], dict, Path]:
    # tritonserver needs the interpreter's libpython on the loader path.
    libdir = _venv_libdir(peer.python)
    env = {"LD_LIBRARY_PATH": ":".join(x for x in (libdir, os.environ.get("LD_LIBRARY_PATH", "")) if x)}
    script = TEMPLATES / "pytriton_server.py"
    argv = [peer.python, str(script), str(ports["grpc"]), str(ports["http"]), str(ports["metrics"])]
    return argv, env, PEERS_DIR


def _launch_mlserver(peer: Peer, ports: dict) -> tuple[list[str], dict, Path]:
    run = PEERS_DIR / "run"
    folder = run / "mlserver_model"
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(TEMPLATES / "mlserver_model", folder)
    settings = {"http_port": ports["http"], "grpc_port": ports["grpc"], "metrics_port": ports["metrics"]}
    (folder / "settings.json").write_text(json.dumps(settings) + "\n")
    return [str(peer.venv / "bin" / "mlserver"), "start", folder.name], {}, run


PEERS: dict[str, Peer] = {
    "wok": Peer("wok", [], _launch_wok, ready_timeout_s=120.0),
    # wok driven through ModelStreamInfer (wok bench ramp --rpc stream): streams kept open per worker.
    "wok-stream": Peer("wok-stream", [], _launch_wok, ready_timeout_s=120.0, extra={"rpc": "stream"}),
    # Not a server of the model: the ceiling of Python gRPC (grpc.aio on uvloop) on this machine.
    "bare": Peer("bare", [], _launch_bare, ready_timeout_s=60.0),
    "pytriton": Peer("pytriton", ["nvidia-pytriton==0.7.0", "torch==2.13.0", "numpy"], _launch_pytriton),
    "mlserver": Peer("mlserver", ["mlserver==1.7.1", "uvloop==0.21.0", "torch==2.13.0", "numpy"], _launch_mlserver),
}


def ensure_venv(peer: Peer) -> None:
    """Create the peer's venv unless one built from the same recipe is there (marker `.wok-recipe`)."""
    if not peer.pip:
        return
    marker = peer.venv / ".wok-recipe"
    if marker.exists() and marker.read_text().strip() == peer.recipe:
        return
    say(f"{peer.name}: building {peer.venv} ({peer.recipe})")
    shutil.rmtree(peer.venv, ignore_errors=True)
    PEERS_DIR.mkdir(parents=True, exist_ok=True)
    base = getattr(sys, "_base_executable", None) or sys.executable
    subprocess.run([base, "-m", "venv", str(peer.venv)], check=True)
    log = PEERS_DIR / f"{peer.name}.install.log"
    with log.open("w") as f:
        subprocess.run([peer.python, "-m", "pip", "install", *peer.pip], check=True, stdout=f, stderr=f)
    marker.write_text(peer.recipe + "\n")


def peer_version(peer: Peer) -> str:
    if not peer.pip:
        from importlib.metadata import version

        if "rev" in peer.extra:
            return f"wok at git {peer.extra['rev'][:12]}"
        if peer.name == "bare":
            return f"grpcio {version('grpcio')}, uvloop {version('uvloop')} (no model)"
        return f"wok {version('wok')}"
    dist = peer.pip[0].split("==")[0]
    code = f"from importlib.metadata import version as v; print(v('{dist}'), v('torch'))"
    out = subprocess.run([peer.python, "-c", code], capture_output=True, text=True).stdout.split()
    return f"{dist} {out[0]}, torch {out[1]}" if len(out) == 2 else "?"


class Server:
    """One running server, in its own session so the whole tree can be measured and killed."""

    def __init__(self, peer: Peer, log_dir: Path) -> None:
        self.peer = peer
        self.ports = {"grpc": free_port(), "http": free_port(), "metrics": free_port()}
        self.target = f"127.0.0.1:{self.ports['grpc']}"
        self.log_path = log_dir / f"{peer.name}.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> float:
        argv, env, cwd = self.peer.launch(self.peer, self.ports)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env={**os.environ, **env},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        _RUNNING.add(self)
        self.wait_ready(t0)
        return time.monotonic() - t0

    def wait_ready(self, t0: float) -> None:
        from wok.clients import Client

        deadline = t0 + self.peer.ready_timeout_s
        with Client(self.target) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{self.peer.name} exited with {self.proc.returncode}; see {self.log_path}")
                try:
                    if client.model_ready("mlp", timeout=1.0):
                        return
                except Exception:
                    pass
                time.sleep(0.25)
        raise TimeoutError(f"{self.peer.name} not ready after {self.peer.ready_timeout_s:g} s; see {self.log_path}")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self, grace_s: float = 20.0) -> None:
        if self.proc is None:
            return
        pgid = self.proc.pid
        _signal_tree(pgid, signal.SIGTERM)
        try:
            self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
        # Whatever is left of the tree (tritonserver, python stubs, workers) gets SIGKILL.
        deadline = time.monotonic() + 5.0
        while _tree_pids(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _tree_pids(pgid):
            _signal_tree(pgid, signal.SIGKILL)
            deadline = time.monotonic() + 5.0
            while _tree_pids(pgid) and time.monotonic() < deadline:
                time.sleep(0.1)
        if self.proc.poll() is None:
            self.proc.wait(5.0)
        _RUNNING.discard(self)


_RUNNING: set[Server] = set()


def _tree_pids(leader: int) -> list[int]:
    return [p.pid for p in session_members(read_procs(), leader) if p.pid != os.getpid()]


def _signal_tree(leader: int, sig: int) -> None:
    try:
        os.killpg(leader, sig)
    except ProcessLookupError:
        pass
    for pid in _tree_pids(leader):  # descendants that moved to another group
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def stop_all() -> None:
    for server in list(_RUNNING):
        try:
            server.stop(grace_s=10.0)
        except Exception as exc:  # keep stopping the others
            say(f"stopping {server.peer.name}: {exc}")


# --------------------------------------------------------------------------- one ramp


def metered_ramp(server: Server, cfg, progress: Callable[[str], None], processes=None) -> dict:
    """wok's ramp, with the server tree's CPU read before and after each step; on the workers of `processes` (a
    started WorkerProcesses, kept for the next ramp), else on its own."""
    import numpy as np

    from wok.bench.runner import Ramp
    from wok.bench.workers import OK

    class MeteredRamp(Ramp):
        def run_step(self, workers, qps, label, **kwargs):
            me = os.getpid()
            threads0 = thread_ticks(server.pid)
            before, gen0, busy0, t0 = tree_usage(server.pid), tree_usage(me), system_busy_s(), time.monotonic()
            step = super().run_step(workers, qps, label, **kwargs)
            after, gen1, busy1 = tree_usage(server.pid), tree_usage(me), system_busy_s()
            threads1 = thread_ticks(server.pid)
            wall = time.monotonic() - t0
            # Every request of the step counts here (warm-up included), as does its CPU.
            ok = int(np.count_nonzero(self.timeline[-1][3] == OK))
            step["server_cpu"] = cpu_per_request(before, after, wall, ok)
            step["server_cpu"]["threads_us_per_request"] = threads_per_request(threads0, threads1, ok)
            # Noise check on a shared machine: who else was busy during the step.
            # The server is this process's child, so this process's tree holds it: take it out.
            server_s = after.cpu_s - before.cpu_s
            step["host_cpu"] = host_load(server_s, gen1.cpu_s - gen0.cpu_s - server_s, busy1 - busy0, wall)
            if step["host_cpu"]["other_cores"] > 0.25:
                self.say(f"warning: other processes used {step['host_cpu']['other_cores']:.2f} cores during this step")
            return step

    return MeteredRamp(cfg, progress=progress, processes=processes).run()


def summarize_run(result: dict) -> dict:
    from wok.bench.analysis import max_qps_under_slo

    steps = [
        {k: s.get(k) for k in STEP_KEYS}
        | {"server_cpu": s.get("server_cpu"), "host_cpu": s.get("host_cpu"), "server": s.get("server")}
        for s in result["steps"]
    ]
    return {
        "max_qps": {f"{slo:g}": max_qps_under_slo(result["steps"], slo) for slo in SLOS_MS},
        "max_qps_capped": {f"{slo:g}": capped(result["steps"], slo) for slo in SLOS_MS},
        "steps": steps,
        "warnings": result.get("warnings", []),
        # The ramp's stop rule ending it before its last planned step: a max QPS of fewer steps than asked.
        "stopped_early": result.get("stopped_early"),
    }


def capped(steps: list[dict], slo_p99_ms: float) -> bool:
    """Whether a ramp's max QPS under the SLO is its top step with every step passing: then it is
    only a lower bound (the ramp never found where the server fails)."""
    from wok.bench.analysis import passes_slo

    return bool(steps) and all(passes_slo(s, slo_p99_ms) for s in steps)


# --------------------------------------------------------------------------- aggregation


def spread(values: Iterable[float | None]) -> dict:
    """Median and min–max over the repetitions; None values (not measured) are left out."""
    vals = [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not vals:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def step_at(run: dict, qps: float) -> dict | None:
    for s in run.get("steps", []):
        if abs(s["offered_qps"] - qps) < 1e-9:
            return s
    return None


def _lat(run: dict, qps: float, key: str) -> float | None:
    s = step_at(run, qps)
    return None if s is None else s["latency_ms"].get(key)


def _cpu(run: dict, qps: float) -> float | None:
    s = step_at(run, qps)
    return None if s is None or not s.get("server_cpu") else s["server_cpu"]["us_per_request"]


def aggregate(runs: list[dict], servers: list[str], report_at: Iterable[float] = REPORT_AT) -> dict:
    """Per server: median and spread of each headline figure over its successful runs.

    A ramp whose lowest step already misses an SLO counts as 0 QPS for that SLO. `capped` in a max
    QPS figure counts the runs whose maximum is their top step with every step passing: lower
    bounds, which the table marks (read from the steps, so older documents get it too).
    """
    out = {}
    for name in servers:
        mine = [r for r in runs if r["server"] == name and not r.get("error")]
        summary = {"runs": len(mine)}
        for slo in SLOS_MS:
            key = f"{slo:g}"
            summary[f"max_qps_p99_{key}ms"] = spread((r["max_qps"][key] or 0.0) for r in mine) | {
                "capped": sum(capped(r.get("steps", []), slo) for r in mine)
            }
        for q in report_at:
            summary[f"p50_ms_at_{q:g}"] = spread(_lat(r, q, "p50") for r in mine)
            summary[f"p99_ms_at_{q:g}"] = spread(_lat(r, q, "p99") for r in mine)
            summary[f"cpu_us_per_request_at_{q:g}"] = spread(_cpu(r, q) for r in mine)
        summary["peak_rss_mb"] = spread(r["peak_rss_bytes"] / 2**20 for r in mine if r.get("peak_rss_bytes"))
        summary["ready_s"] = spread(r.get("ready_s") for r in mine)
        summary["host_probe_cold_us"] = spread((r.get("host_probe") or {}).get("cold_forward_us") for r in mine)
        summary["other_cores_max"] = spread(
            max((s["host_cpu"]["other_cores"] for s in r["steps"] if s.get("host_cpu")), default=None) for r in mine
        )
        out[name] = summary
    return out


def _fmt(sp: dict, digits: int = 0) -> str:
    if not sp or sp.get("median") is None:
        return "-"
    f = f"{{:,.{digits}f}}"
    med = f.format(sp["median"])
    notes = [f"{f.format(sp['min'])}–{f.format(sp['max'])}"] if sp["n"] > 1 else []
    if sp.get("capped"):  # a max QPS that is a lower bound in some runs
        notes.append(f"top step in {sp['capped']} of {sp['n']}" if sp["n"] > 1 else "top step")
    return f"{med} ({'; '.join(notes)})" if notes else med


def table_rows(doc: dict) -> tuple[list[str], list[list[str]]]:
    servers = doc["config"]["servers"]
    report_at = doc["config"]["report_at_qps"]
    header = ["metric", *servers]
    rows = []
    for slo in SLOS_MS:
        rows.append(
            [f"max QPS, P99 ≤ {slo:g} ms"] + [_fmt(doc["summary"][s][f"max_qps_p99_{slo:g}ms"]) for s in servers]
        )
    for q in report_at:
        for p in ("p50", "p99"):
            rows.append(
                [f"{p.upper()} ms at {q:,g} QPS"] + [_fmt(doc["summary"][s][f"{p}_ms_at_{q:g}"], 1) for s in servers]
            )
    for q in report_at:
        rows.append(
            [f"CPU µs/request at {q:,g} QPS"]
            + [_fmt(doc["summary"][s][f"cpu_us_per_request_at_{q:g}"]) for s in servers]
        )
    if any(doc["summary"][s].get("host_probe_cold_us", {}).get("n") for s in servers):
        rows.append(
            ["host probe: cold forward, µs"] + [_fmt(doc["summary"][s].get("host_probe_cold_us")) for s in servers]
        )
    rows.append(["peak RSS, MiB"] + [_fmt(doc["summary"][s]["peak_rss_mb"]) for s in servers])
    rows.append(
        ["other load, cores (worst step)"] + [_fmt(doc["summary"][s].get("other_cores_max"), 2) for s in servers]
    )
    rows.append(["runs (ok)"] + [str(doc["summary"][s]["runs"]) for s in servers])
    return header, rows


def render_table(doc: dict, markdown: bool = False) -> str:
    return format_table(*table_rows(doc), markdown=markdown)


def format_table(header: list[str], rows: list[list[str]], *, markdown: bool = False, left: int = 1) -> str:
    """Columns padded to their widest cell, or a Markdown table; the first `left` columns are
    labels (aligned left), the others figures (aligned right)."""
    if markdown:
        lines = [
            "| " + " | ".join(header) + " |",
            "|" + "|".join(["---"] * left + ["--:"] * (len(header) - left)) + "|",
        ]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def fmt(r: list[str]) -> str:
        return "  ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))

    return "\n".join([fmt(header), "  ".join("-" * w for w in widths), *map(fmt, rows)])


def build_doc(config: dict, versions: dict, runs: list[dict], created: str | None = None) -> dict:
    return {
        "schema": SCHEMA,
        "created": created or datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "host": host_info(),
        "config": config,
        "servers": versions,
        "runs": runs,
        "summary": aggregate(runs, config["servers"], config["report_at_qps"]),
    }


def host_info() -> dict:
    info = {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()}
    try:
        info["loadavg_at_end"] = list(os.getloadavg())
    except OSError:
        pass
    return info


# --------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    """This script's parser (tests/deploy/test_doc_commands.py parses the docs' command lines with it)."""
    from wok.cliargs import ArgumentParser  # argparse's, its refusals in wok's words

    p = ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--servers",
        default="wok,pytriton,mlserver",
        help=f"comma list of {', '.join(PEERS)}, or wok@REV (wok as committed at git revision REV)",
    )
    p.add_argument("--steps", default=DEFAULT_STEPS, help="offered QPS per step: a list, or start:stop:factor")
    p.add_argument("--step-duration", default="5s", help="measured length of each step (default 5s)")
    p.add_argument("--warmup", default="1s", help="uncounted start of each step (default 1s)")
    p.add_argument("--reps", type=int, default=3, help="repetitions; server order rotates each one (default 3)")
    p.add_argument("--json", type=Path, help="write the wok.compare/1 document here")
    p.add_argument(
        "--stop-factor",
        type=float,
        default=20.0,
        help="end a server's ramp after a step whose P99 exceeds this × the 200 ms SLO (default 20)",
    )
    p.add_argument("--workers", type=int, default=2, help="load-generator processes (default 2)")
    p.add_argument("--arrival", default="poisson")
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="the load's random seed (arrival times, payloads) in repetition 1 (default 0)",
    )
    p.add_argument(
        "--seeds",
        choices=("per-rep", "same"),
        default="per-rep",
        help="per-rep (default): repetition r runs seed + r - 1, every server of a repetition the same one, "
        "so the spreads include the schedule's own variance; same: every repetition runs --seed",
    )
    p.add_argument("--report-at", default="100,1000", help="offered QPS at which latency and CPU are tabled")
    p.add_argument("--install-only", action="store_true", help="build the peers' venvs and exit")
    p.add_argument(
        "--cpu-wakeup-latency",
        type=int,
        metavar="US",
        help="hold the machine's idle CPUs to this wake-up latency (µs; Linux PM QoS, root) for the whole run, "
        "so that every server (and the generator) runs under the same bound; default: none",
    )
    p.add_argument(
        "--host-probe",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="probe the host's speed for this long before and after each server's ramp "
        "(wok.bench.hostprobe; default 2; 0: off)",
    )
    p.add_argument(
        "--wok-variant",
        action="append",
        default=[],
        metavar="wok-NAME=ARGS",
        help="also serve wok with these extra `wok serve` arguments under NAME (list NAME in --servers)",
    )
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from wok.errors import quoted_name

    p = build_parser()
    args = p.parse_args(argv)
    refuse_unwritable(p, args, "--json", parents_made=True)
    for spec in args.wok_variant:
        try:
            v = wok_variant(spec)
        except ValueError as exc:
            p.error(str(exc))
        PEERS[v.name] = v
    args.server_list = [s.strip() for s in args.servers.split(",") if s.strip()]
    for name in args.server_list:
        if name not in PEERS and REV_PEER.fullmatch(name):
            try:
                PEERS[name] = wok_at_rev(name)
            except ValueError as exc:
                p.error(str(exc))
    unknown = [s for s in args.server_list if s not in PEERS]
    if unknown:
        p.error(f"unknown server(s) {', '.join(map(quoted_name, unknown))}; known: {', '.join(PEERS)}")
    if not args.server_list:
        p.error(f"--servers: expected at least one server name; got {quoted_name(args.servers)}")
    twice = sorted({s for s in args.server_list if args.server_list.count(s) > 1})
    if twice:
        p.error(f"--servers: expected each server once; got {', '.join(twice)} more than once")
    if not (args.host_probe >= 0 and math.isfinite(args.host_probe)):
        p.error(f"--host-probe: expected seconds >= 0 (0: off); got {args.host_probe:g}")
    # Every value checked here: a bad one found once the first server is up costs its start.
    for option, value in (("--reps", args.reps), ("--workers", args.workers)):
        if (refusal := integer_refusal(option, value, 1)) is not None:
            p.error(refusal)
    if not (args.stop_factor > 0 and math.isfinite(args.stop_factor)):
        p.error(f"--stop-factor: expected a number > 0; got {args.stop_factor:g}")
    try:
        args.step_list = parse_steps(args.steps)
    except ValueError as exc:
        p.error(f"--steps: {exc}")
    try:
        args.report_list = parse_steps(args.report_at)
    except ValueError as exc:
        p.error(f"--report-at: {exc}")
    for option, text in (("--step-duration", args.step_duration), ("--warmup", args.warmup)):
        try:
            setattr(args, option.removeprefix("--").replace("-", "_") + "_s", parse_duration(text))
        except ValueError as exc:
            p.error(f"{option}: {exc}")
    if args.step_duration_s <= 0:
        p.error(f"--step-duration: expected a duration > 0; got {quoted_name(args.step_duration)}")
    try:
        # As each step parses it (runner.run_step). A rate only has to be > 0 (the lowest step) and
        # its multiples finite (the highest): the two ends stand for every step, a trace read twice.
        for qps in {min(args.step_list), max(args.step_list)}:
            parse_arrivals(args.arrival, qps, duration_s=args.warmup_s + args.step_duration_s)
    except (ValueError, OSError) as exc:
        p.error(f"--arrival: {exc}")
    missing = [q for q in args.report_list if q not in args.step_list]
    if missing:
        print(
            f"compare.py: warning: --report-at {','.join(f'{q:g}' for q in missing)} not among --steps: "
            "those rows of the table will be empty",
            file=sys.stderr,
        )
    return args


def rep_seed(args: argparse.Namespace, rep: int) -> int:
    """The load's seed in repetition `rep` (from 1): the servers of one repetition share it."""
    return args.seed + (rep - 1 if args.seeds == "per-rep" else 0)


def run_one(peer: Peer, rep: int, cfg_kwargs: dict, log_dir: Path, probe_s: float = 0.0, processes=None) -> dict:
    from wok.bench import hostprobe
    from wok.bench.runner import RampConfig

    record: dict = {"rep": rep, "server": peer.name, "error": None, "cpu_wakeup_bound_us": None, "host_probe": None}
    record["seed"] = cfg_kwargs.get("seed", 0)
    server = Server(peer, log_dir)
    record["target"] = server.target
    try:
        say(f"rep {rep}: starting {peer.name}")
        record["ready_s"] = server.start()
        say(f"rep {rep}: {peer.name} ready in {record['ready_s']:.1f} s on {server.target}")
        # Read once the server is up, so that a bound the server holds itself counts too.
        record["cpu_wakeup_bound_us"] = _wakeup_bound()
        wok = peer.launch is _launch_wok  # wok, its variants and revisions serve wok's /metrics
        metrics = f"http://127.0.0.1:{server.ports['metrics']}/metrics" if wok else None
        rpc = peer.extra.get("rpc", "unary")
        cfg = RampConfig(target=server.target, models=[("mlp", 1.0)], metrics_url=metrics, rpc=rpc, **cfg_kwargs)
        before = hostprobe.try_probe(probe_s, say)
        with RssSampler(server.pid) as rss:
            result = metered_ramp(server, cfg, lambda m: say(f"rep {rep} {peer.name}: {m}"), processes)
        record.update(summarize_run(result))
        cut = result.get("interrupted")
        if cut:
            # Its max QPS would be the last step it reached, not where the server fails: the run
            # is left out of the summary (its steps kept), and a signal stops the harness (this
            # run then goes unrecorded, as any run the signal cuts).
            record["error"] = f"interrupted: {cut['reason']}"
            if cut["by_signal"]:
                raise KeyboardInterrupt(cut["reason"])
        elif server.proc.poll() is not None:
            # Read before our own stop: a server gone mid-ramp fails every later step, which the
            # ramp's stop rule takes for overload (`interrupted` null), so its max QPS would count
            # where the server died. Left out of the summary as a cut run is.
            record["error"] = (
                f"interrupted: the server exited with {server.proc.returncode} during the ramp; see {server.log_path}"
            )
            say(f"rep {rep}: {peer.name} left out of the summary: {record['error']}")
        if probe_s:
            record["host_probe"] = hostprobe.around(before, hostprobe.try_probe(probe_s, say))
        record["peak_rss_bytes"] = rss.peak
        say(
            f"rep {rep}: {peer.name} max QPS under P99≤50 ms {record['max_qps']['50']}, "
            f"≤200 ms {record['max_qps']['200']}, peak RSS {rss.peak / 2**20:.0f} MiB"
        )
    except KeyboardInterrupt:
        raise
    except Exception as exc:
        record["error"] = f"{type(exc).__name__}: {exc}"
        say(f"rep {rep}: {peer.name} failed: {record['error']}")
    finally:
        server.stop()
        left = _tree_pids(server.pid) if server.proc else []
        if left:
            say(f"warning: {peer.name} left processes {left}")
    return record


def _wakeup_bound() -> int | None:
    """The machine's CPU wake-up latency bound (µs) as a run starts; None where it cannot be read."""
    from wok.cpulatency import read_constraint

    try:
        return read_constraint()
    except OSError:
        return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    peers = [PEERS[s] for s in args.server_list]
    for peer in peers:
        ensure_venv(peer)
    if args.install_only:
        return 0
    if args.cpu_wakeup_latency is None:
        return _compare(args, peers)
    from wok.cpulatency import CpuWakeupLatency

    try:
        bound = CpuWakeupLatency(args.cpu_wakeup_latency)
        bound.acquire()
    except (OSError, ValueError) as exc:
        print(f"compare: --cpu-wakeup-latency: {exc}", file=sys.stderr)
        return 2
    with bound:  # held already; released however the run ends
        return _compare(args, peers)


def _compare(args: argparse.Namespace, peers: list[Peer]) -> int:
    from wok.bench.workers import WorkerProcesses

    cfg_kwargs = {
        "steps": args.step_list,
        "step_duration_s": args.step_duration_s,
        "warmup_s": args.warmup_s,
        "arrival": args.arrival,
        "slo_p99_ms": max(SLOS_MS),
        "workers": args.workers,
        "stop_factor": args.stop_factor,
    }
    load_at_start = list(os.getloadavg())
    versions = {p.name: {"version": peer_version(p), "recipe": p.recipe} for p in peers}
    log_dir = PEERS_DIR / "logs" / datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    runs: list[dict] = []
    orders = []
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    for s in previous:
        signal.signal(s, on_signal)
    interrupted = False
    # Every ramp on the same --workers load-generator processes, started once (each start is a spawned
    # interpreter's imports, a few tenths of a second a ramp): the host each server's ramp runs beside is the same.
    processes = WorkerProcesses().start()
    try:
        for rep in range(1, args.reps + 1):
            k = (rep - 1) % len(peers)
            order = peers[k:] + peers[:k]
            orders.append([p.name for p in order])
            for peer in order:
                kwargs = {**cfg_kwargs, "seed": rep_seed(args, rep)}
                runs.append(run_one(peer, rep, kwargs, log_dir, args.host_probe, processes))
    except KeyboardInterrupt:
        interrupted = True
        say("interrupted: stopping servers and writing what was measured")
    finally:
        stop_all()
        processes.stop()
        for s, h in previous.items():
            signal.signal(s, h)
    config = {
        "servers": args.server_list,
        "reps": args.reps,
        "orders": orders,
        "steps_qps": args.step_list,
        "report_at_qps": args.report_list,
        "slos_p99_ms": list(SLOS_MS),
        "min_success_rate": 0.99,
        "interrupted": interrupted,
        "loadavg_at_start": load_at_start,
        "cpu_wakeup_latency_us": args.cpu_wakeup_latency,
        "host_probe_s": args.host_probe,
        "seed": args.seed,
        "seeds": args.seeds,
        "logs": str(log_dir.relative_to(ROOT)) if log_dir.is_relative_to(ROOT) else str(log_dir),
        **{k: v for k, v in cfg_kwargs.items() if k != "steps"},
    }
    doc = build_doc(config, versions, runs)
    print(render_table(doc))
    failed = write_final(doc, [("--json", args.json, _write_doc)], parents_made=True)
    if failed:
        say(failed)
        return 1
    if args.json:
        say(f"wrote {args.json}")
    return 130 if interrupted else (1 if any(r["error"] for r in runs) else 0)


def _write_doc(doc: dict, path: Path) -> None:
    write_json_text(clean(doc), path, allow_nan=False, default=_json_default)


def clean(obj):
    """NaN and infinities become null, numpy scalars plain numbers: strict JSON."""
    if isinstance(obj, dict):
        return {k: clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def _json_default(obj):
    if hasattr(obj, "item"):
        return obj.item()
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


if __name__ == "__main__":
    sys.exit(main())
