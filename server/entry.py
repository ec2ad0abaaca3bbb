"""The `wok` console script's entry point (pyproject.toml), and `python -m wok`'s (server/__main__.py
hands over to it). The command's own module imports gRPC and
asyncio first, about 0.1 s before its `main` takes over SIGINT: a Ctrl-C then ended in a
KeyboardInterrupt traceback. Here it ends as a Ctrl-C a moment later does, one line and status 130.
Nothing but `sys` and `os` (both loaded with the interpreter) is imported before the guard.

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
    try:
        set_grpc_defaults()
        from .__main__ import main as run

        status = run()
    except KeyboardInterrupt:  # only one that `run` did not handle itself: before its own guard
        print("wok: interrupted", file=sys.stderr)
        return 130
    _ignore_signals_at_exit()
    return status


def _ignore_signals_at_exit() -> None:
    """The command has returned its status, its output written: Ctrl-C, SIGTERM and SIGHUP are ignored while the
    interpreter tears down (torch, gRPC: about 0.3 s after a bench run). Ignored, not handled: the interpreter's
    finalization puts a Python handler back to the default action, and a Ctrl-C then ended the process by the
    signal (status -2 to its parent, no word), its status lost; SIG_IGN it keeps. `wok serve` does so itself
    (`_StopSignal.after_loop`)."""
    import signal  # the command has imported it already

    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)
