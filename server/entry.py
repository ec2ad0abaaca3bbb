"""The `wok` console script's entry point (pyproject.toml), and `python -m wok`'s (server/__main__.py
hands over to it). The command's own module imports gRPC and
asyncio first, about 0.1 s before its `main` takes over SIGINT: a Ctrl-C then ended in a
KeyboardInterrupt traceback. Here it ends as a Ctrl-C a moment later does, one line and status 130.
Nothing but `sys` and `os` (both loaded with the interpreter) and `atexit` (built in) is imported before
the guard. SIGTERM and SIGHUP are held from the guard's first line until the command takes them (`_HeldSignals`):
they killed `wok serve` by the signal there.

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
    held = _HeldSignals()
    try:
        held.install()
        set_grpc_defaults()
        from .__main__ import main as run

        status = run(held=held)
    except KeyboardInterrupt:  # only one that `run` did not handle itself: before its own guard
        print("wok: interrupted", file=sys.stderr)
        status = 130
    except SystemExit as exc:  # argparse's exits (--help, a refusal), said already
        status = _exit_status(exc.code)
    except BaseException:  # an error of wok's own
        # Said here, as Python would say it at the top, so that the exit's signals are armed on this way out too: a
        # thread left running holds the exit as after a status returned.
        sys.excepthook(*sys.exc_info())
        status = 1
    while True:
        try:
            at_exit.returned(status)
            return status
        except KeyboardInterrupt:
            # A Ctrl-C from the command's own handlers put back to `returned`'s first (a bench run that has no result:
            # bench/cli.py's `_restore_signals`, which leaves a whole run's to `returned`): the default's, raised there
            # before SIGINT is armed (nothing done yet). The command has its status; a traceback and death by SIGINT
            # (-2) lost it (seen once under CI's load). SIGTERM or SIGHUP in that moment still meet the default
            # action.
            pass


def _exit_status(code) -> int:
    """The status Python exits with for `SystemExit(code)`, anything but an int or None said on stderr first, as Python
    says it."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


class _HeldSignals:
    """SIGTERM and SIGHUP (unless ignored at the start, as under nohup) from `main`'s first line until the command's
    `main` takes them (server/__main__.py's `_StopSignal.install`, with those that came meanwhile). The command's
    module imports gRPC and asyncio first (~0.1 s): until 2026-12-07 either signal there met the default action and
    killed `wok serve` by it (143 or 129 as a shell says it, nothing said), where one a moment later stops the
    start ("stopped by a signal before serving", status 0). Held, not acted on: what a signal means is the command's
    (`wok serve`'s `_StopSignal`; another command's handler before this one, the default action, gets it once the
    parsers have loaded and `_StopSignal.uninstall` hands the signals back: killed by it, as it was at once). SIGINT
    is not held: a KeyboardInterrupt there is `main`'s own ("wok: interrupted", 130)."""

    def __init__(self) -> None:
        self.before: dict[int, object] = {}  # each held signal's handler before `install`
        self.received: list[int] = []  # in the order they came; signals that arrive together count once

    def install(self) -> None:
        import signal

        for s in (signal.SIGTERM, signal.SIGHUP):
            if s == signal.SIGHUP and signal.getsignal(s) is signal.SIG_IGN:
                continue
            self.before[s] = signal.signal(s, self._hold)

    def _hold(self, signum: int, _frame=None) -> None:
        self.received.append(signum)


class _ExitSignals:
    """Ctrl-C, SIGTERM and SIGHUP once the command has ended, its output written: on every way out of `main`, a status
    returned, a Ctrl-C before the command's own guard (130), a SystemExit (its status), an error of the command's own
    (its traceback said, status 1, as Python's). Until 2026-12-07 only a status returned armed them: after the others a
    signal the kernel handed to a thread other than the main one left the exit asleep in its join.

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
        self.ignored: list[int] = []  # those `teardown` ignores

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
        # First: from the command's own handlers put back to here a signal is the default's, a KeyboardInterrupt out
        # of main or the process's end (a bench run with its result leaves its own to this, `main`'s `held` given:
        # bench/cli.py's `_restore_signals`); the thread's start (~0.1 ms) before these widened that.
        for s in armed:
            signal.signal(s, self._leave)  # a Python handler: what has the signal written to the wakeup fd
        self.armed = armed
        # A thread left running may fork (a python model's own `multiprocessing` process): its child would leave with
        # this status at SIGTERM, not die by it, and its signals would write to the wakeup fd below, which this
        # process's thread reads as its own: it left, as its child was told to.
        reset_in_forked_children(lambda: True, self._in_forked_child)
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

    def _in_forked_child(self) -> None:
        """A child forked once the command returned: Python's defaults for those these handle or ignored (none was
        ignored at the start: those stay so), and no wakeup fd, the one it inherited being this process's."""
        import signal

        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            current = signal.getsignal(s)
            if (s in self.armed and current == self._leave) or (s in self.ignored and current is signal.SIG_IGN):
                signal.signal(s, signal.default_int_handler if s == signal.SIGINT else signal.SIG_DFL)
        signal.set_wakeup_fd(-1)

    def teardown(self) -> None:
        import signal

        # Every Python handler of the three, not only those `returned` took (an exit function may have set one since):
        # the finalization puts a Python handler back to the default action, and a signal as torch tore down after a
        # traceback (`wok serve`'s `_StopSignal` left, `returned` skipped until 2026-12-07) killed the process by it.
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            if callable(signal.getsignal(s)):
                signal.signal(s, signal.SIG_IGN)
                self.ignored.append(s)


def reset_in_forked_children(applies, reset) -> None:
    """Has a child forked from here on (a python model's `multiprocessing` process of the fork context, say) run
    `reset` first, where `applies()` says so: wok's signal handlers and wakeup fd set back, which it inherits. Under
    `wok serve`'s handlers such a child ignored SIGTERM (`Process.terminate()` left it running until SIGKILL), and its
    signals, written to the wakeup fd it shares with the parent, woke the parent's loop for them (until e9d49a3 that
    stopped the server).

    SIGINT, SIGTERM and SIGHUP are blocked on the forking thread from before the fork until `reset` has run in the
    child (the parent's mask back right after the fork): one sent to the child before then was lost, taken by the
    handler its fork inherited or dropped as Python cleared its pending signals (`start()` then `terminate()`: 50 in
    50 lost with the handlers reset alone), where now it waits for the handlers `reset` puts back.
    os.register_at_fork cannot be undone: `applies` is asked at each fork."""
    import signal
    import threading

    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    masks: dict[int, set] = {}  # the forking thread's mask before the fork, by thread: two may fork at once

    def before() -> None:
        if applies():
            masks[threading.get_ident()] = signal.pthread_sigmask(signal.SIG_BLOCK, signals)

    def after_in_parent() -> None:
        mask = masks.pop(threading.get_ident(), None)
        if mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)

    def after_in_child() -> None:
        # The forking thread is the child's main thread (its ident kept), where signal.signal is allowed.
        mask = masks.pop(threading.get_ident(), None)
        if mask is None:
            return
        try:
            reset()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)

    os.register_at_fork(before=before, after_in_parent=after_in_parent, after_in_child=after_in_child)


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
