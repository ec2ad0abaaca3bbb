"""The `wok` console script's entry point (pyproject.toml), and `python -m wok`'s (server/__main__.py
hands over to it). The command's own module imports gRPC and
asyncio first, about 0.1 s before its `main` takes over SIGINT: a Ctrl-C then ended in a
KeyboardInterrupt traceback. Here it ends as a Ctrl-C a moment later does, one line and status 130.
Nothing but `sys` and `os` (both loaded with the interpreter) and `atexit` (built in) is imported before
the guard.

The command's gRPC settings (GRPC_DEFAULTS) are set here, before grpc loads, and not by importing
wok.__main__: a process that imports it as a library (a test, a script calling its functions,
bench/cli.py for `check_replica_args`) kept them for everything after, its children included."""

from __future__ import annotations

import os
import sys

# The environment the `wok` command gives gRPC, each where the operator has not set it; read by
# gRPC once, as it is imported, so set before that (`set_grpc_defaults`). Its children inherit them
# (a demo's server, a ramp's replicas and bench workers), as they do an operator's own.
GRPC_DEFAULTS = {
    # gRPC core logs every failed TLS handshake, a line per connection (at INFO; a TLS name the
    # certificate does not list at ERROR, with that name as the client sent it, line breaks and all):
    # whoever reaches the port could fill the log, or forge lines in it. wok logs what concerns it
    # itself, with its own rate limits (docs/security.md); an operator's own setting wins.
    "GRPC_VERBOSITY": "NONE",
    # `wok demo` starts its server, and `wok bench ramp --replicas` its replicas, with a preexec_fn
    # (server/children.py), so by fork, not vfork: gRPC core's fork handlers then restart its poller in
    # the child, which died before its exec about once in 100 forks (SIGABRT, "epoll_wait error: Bad
    # file descriptor": grpc/grpc#43055). wok runs no gRPC in a forked child.
    "GRPC_ENABLE_FORK_SUPPORT": "0",
}


def set_grpc_defaults() -> None:
    """GRPC_DEFAULTS into this process's environment, each not already set. Only before grpc is
    imported does it take effect (`sys.modules`, not checked here: the caller's order)."""
    for name, value in GRPC_DEFAULTS.items():
        os.environ.setdefault(name, value)


def main() -> int:
    import atexit  # built into the interpreter: imports nothing

    at_exit = _ExitSignals()
    # Registered before the command imports anything (multiprocessing, gRPC register theirs as they load): the
    # exit functions run last first, so this one runs after theirs and after Python's joins of threads.
    atexit.register(at_exit.teardown)
    try:
        set_grpc_defaults()
        from .__main__ import main as run

        status = run()
    except KeyboardInterrupt:  # only one that `run` did not handle itself: before its own guard
        print("wok: interrupted", file=sys.stderr)
        return 130
    at_exit.returned(status)
    return status


class _ExitSignals:
    """Ctrl-C, SIGTERM and SIGHUP once the command has returned its status, its output written.

    Until the exit functions have run, Python joins what is left running: a thread not a daemon (a python model's
    own helper thread, in `wok profile` or `wok serve`), multiprocessing's children. One that never ends held the
    exit for good; a signal there leaves at once, with the command's status, its output flushed first. Ignored from
    the last exit function on, while the interpreter and torch tear down (about 0.3 s after a bench run), which joins
    nothing of Python's: ignored, not handled, as the interpreter's finalization puts a Python handler back to the
    default action, and a Ctrl-C there ended the process by the signal (status -2 to its parent, no word), its
    status lost; SIG_IGN it keeps. (Ignored from the return on, in `wok serve` from its loop's end, until 2026-12-07,
    a hang in those joins could not be ended but by SIGKILL.) A signal ignored already (nohup) stays so.

    Left by a thread of its own, woken through the signals' wakeup fd: a Python handler runs on the main thread
    alone, and the kernel may hand the signal to another one, which leaves the main thread's join asleep (a
    handler alone left 9 in 40 such exits hung, with two threads besides)."""

    def __init__(self) -> None:
        self.status: int | None = None
        self.armed: list[int] = []

    def returned(self, status: int) -> None:
        import signal  # the command has imported it already
        import threading

        self.status = status
        # None: set outside Python, left as it is.
        armed = [
            s
            for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
            if signal.getsignal(s) not in (signal.SIG_IGN, None)
        ]
        # First: from the command's own handlers put back (bench/cli.py's) to here a signal is the default's, a
        # KeyboardInterrupt out of main or the process's end; the thread's start (~0.1 ms) before these widened that.
        for s in armed:
            signal.signal(s, self._leave)  # a Python handler: what has the signal written to the wakeup fd
        self.armed = armed
        _flush()  # block-buffered into a pipe, the output waited for the joins
        if not armed:
            return
        woken, wake = os.pipe()
        os.set_blocking(wake, False)  # as set_wakeup_fd requires: a full pipe drops a byte, it never blocks
        signal.set_wakeup_fd(wake, warn_on_full_buffer=False)
        threading.Thread(target=self._wait, args=(woken,), name="wok-exit-signal", daemon=True).start()

    def _wait(self, woken: int) -> None:
        os.read(woken, 1)  # a byte per signal handled by Python's: from the last exit function on, none comes
        self._leave()

    def _leave(self, _signum=None, _frame=None) -> None:
        leave(self.status or 0)  # None: 0, as sys.exit takes it

    def teardown(self) -> None:
        import signal

        # Every Python handler of the three, not only those `returned` took: a command that raised (a traceback,
        # status 1) never returned, and left its own (`wok serve`'s `_StopSignal`), which the finalization put back
        # to the default action: a signal as torch tore down after the traceback killed the process by it.
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            if callable(signal.getsignal(s)):
                signal.signal(s, signal.SIG_IGN)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, RuntimeError):  # closed (`wok … | head`), or a write it interrupted
            pass


def leave(status: int) -> None:
    """Out at once with `status` (it never returns), the output flushed first (block-buffered into a pipe): past the
    joins of Python's exit, which a thread left running holds (`_ExitSignals`; `wok serve`'s signals after its stop)."""
    _flush()
    os._exit(status)
