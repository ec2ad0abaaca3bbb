"""Every thread of a running `wok serve` (the one with a `wok-run-0` thread): share of an 8 s
window on a CPU (`run`), runnable but waiting for one (`runq-wait`), and its context switches,
from /proc/PID/task/TID/schedstat and status. Waits for the server to start, then for
`delay` seconds (first argument, default 8)."""

import os
import sys
import time
from pathlib import Path


def read(path: str) -> str:
    return Path(path).read_text()


def find() -> tuple[str, str] | None:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = read(f"/proc/{pid}/cmdline")
            if "serve" not in cmd or "wok" not in cmd:
                continue
            for tid in os.listdir(f"/proc/{pid}/task"):
                if read(f"/proc/{pid}/task/{tid}/comm").strip() == "wok-run-0":
                    return pid, tid
        except OSError:
            continue
    return None


def snap(pid: str) -> tuple[dict, float]:
    out = {}
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            comm = read(f"/proc/{pid}/task/{t}/comm").strip()
            run_ns, wait_ns, _ = read(f"/proc/{pid}/task/{t}/schedstat").split()
            status = dict(line.split(":\t") for line in read(f"/proc/{pid}/task/{t}/status").splitlines())
            vol = int(status["voluntary_ctxt_switches"])
            invol = int(status["nonvoluntary_ctxt_switches"])
            out[t] = (comm, int(run_ns), int(wait_ns), invol, vol)
        except (OSError, ValueError, KeyError):
            continue
    return out, time.monotonic()


def main() -> None:
    while (found := find()) is None:
        time.sleep(0.2)
    pid, _ = found
    time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 8)
    a, ta = snap(pid)
    time.sleep(8)
    b, tb = snap(pid)
    w = tb - ta
    print(f"window {w:.2f}s pid {pid}")
    for t, (comm, run, wait, invol, vol) in b.items():
        if t not in a:
            continue
        _, run0, wait0, invol0, vol0 = a[t]
        r, q = (run - run0) / 1e9, (wait - wait0) / 1e9
        if r > 0.01 or q > 0.01:
            print(
                f"{t} {comm:16s} run {100 * r / w:5.1f}%  runq-wait {100 * q / w:5.1f}%  "
                f"invol {invol - invol0} vol {vol - vol0}"
            )


if __name__ == "__main__":
    main()
