"""Child processes that end with their parent: `wok demo`'s server, `wok bench ramp --replicas`.

A parent killed outright (SIGKILL, a crash) runs no cleanup, so its children would run on
as orphans. On Linux, PR_SET_PDEATHSIG has the kernel signal the child when its parent ends.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A `subprocess.Popen` preexec_fn that has the child get `sig` when its parent ends (Linux;
    None elsewhere, where there is no such call).

    The signal follows the *thread* that forked, not the process: a child forked from a thread
    that ends (a worker of a pool, a thread started for one restart) gets it at that moment.
    Callers fork from a thread that lives as long as they want the child to."""
    if sys.platform != "linux":
        return None
    parent = os.getpid()
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork, not in the child

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent:  # the parent ended before the line above: no signal will come
            os.kill(os.getpid(), sig)

    return arm
