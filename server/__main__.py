"""The `wok` command. Only this module exits the process; the library raises."""

from __future__ import annotations

if __name__ == "__main__":
    # `python -m wok`: this module's own imports (gRPC, asyncio: 0.1 s) would run before `main` holds
    # SIGINT, and a Ctrl-C then was a KeyboardInterrupt traceback. The console script's entry point
    # guards them (wok.entry): it imports this module again, as wok.__main__, and runs its `main`.
    # The working directory leaves the path first: a stray module there must not be found by a
    # model's factory import (only the repository's own files and installed modules are,
    # docs/security.md). The package itself is already imported.
    import os as _os
    import sys as _sys

    _cwd = _os.getcwd()
    _sys.path[:] = [p for p in _sys.path if p not in ("", ".", _cwd)]
    from .entry import main as _entry

    _sys.exit(_entry())

import argparse
import asyncio
import gc
import logging
import os
import re
import signal
import socket
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

# gRPC's environment (GRPC_VERBOSITY, GRPC_ENABLE_FORK_SUPPORT) is the command's to set, in wok.entry before
# grpc loads, not this module's import: importing it as a library would keep them for the whole process.
from .cliargs import ArgumentParser, one_line
from .entry import leave, reset_in_forked_children
from .errors import ConfigError, InterruptedWorkLeft, WarmupError, error_line, quoted_name
from .numerals import digits_note, read_float, read_int

# The demo models `wok serve` serves when --models is not given (server.models.DEMO_MODELS, without
# importing it here).
_DEFAULT_DEMO_MODELS = "mlp,recsys,encoder"


# A word that begins as a negative number does, as newer argparse matches them ("-\.?\d"). \d, not
# [0-9] as numbers are read (numerals.py): this only tells a value from an option, and "-٣ms" is no
# option; taken as the value, the option's own check refuses it saying numbers are read in ASCII,
# where [0-9] left it to argparse as an option: "--slo: expected one argument".
_DASH_NUMBER = re.compile(r"-\.?\d")


class _Parser(ArgumentParser):
    """The parser of `wok` and, through add_subparsers (whose parsers are of their parent's class), of
    every subcommand, bench's and demo's included.

    argparse takes a word that begins with '-' for an option unless it is a plain negative number
    (-5, -1.5): `--slo -5ms` was --slo without a value ("expected one argument", after the whole
    usage), and the option's own check, which `--slo=-5ms` reaches, never ran. Here a word that
    begins as a negative number does (_DASH_NUMBER: -5ms, -.5s, -1e3) is the option's value unless
    this parser would read it as one of its own options; the pair goes on to argparse as
    `--slo=-5ms`, the form it documents for a long option's value. Other words beginning with '-'
    stay options: a mistyped option after one that takes a value (`--json --stpes 100`) is refused,
    not written to as a file. Not argparse's negative-number matcher (which bench/cli.py widens to "-5ms"
    on its own parsers): it is private, and a pattern wide enough for "-x" would make every unknown
    option a positional's value (`wok bench merge --bogus a.json` would merge a file named --bogus).
    Short options (wok's only one is -h) are left to argparse.

    A refused option value (a bad type, a choice not offered, a value missing) is one line naming
    the option, as the commands' own refusals are; a missing or unknown command keeps argparse's
    usage, which lists them. --help is untouched."""

    def __init__(self, *args, **kwargs) -> None:
        # Refusals come back as ArgumentError (with the option's name), for parse_known_args to word.
        kwargs.setdefault("exit_on_error", False)
        super().__init__(*args, **kwargs)
        self._commands = None

    def add_subparsers(self, **kwargs):
        self._commands = super().add_subparsers(**kwargs)
        return self._commands

    def parse_args(self, args=None, namespace=None):
        # Each parser puts itself in the namespace; a subcommand's parser, parsing after its parent,
        # wins. argparse refuses words no parser took with the top parser's usage, every command
        # listed (`wok bench ramp --bogus` printed `usage: wok [-h] {serve,bench,...}`): here the
        # command that was given says what it takes.
        _mark_parsers(self)
        parsed, extras = self.parse_known_args(args, namespace)
        parser = vars(parsed).pop(_PARSER, self)
        if extras:
            parser.error(f"unrecognized arguments: {' '.join(map(quoted_name, extras))}")
        return parsed

    def parse_known_args(self, args=None, namespace=None):
        args = sys.argv[1:] if args is None else list(args)
        try:
            return super().parse_known_args(self._dash_values(args), namespace)
        except argparse.ArgumentError as exc:
            if not (exc.argument_name or "").startswith("-"):
                self.error(str(exc))  # a command or a positional: the usage says what is expected
            # Prefixed as the command's own refusals are (`wok bench: --rows: ...`, main's ValueError),
            # not with a bench subcommand's prog (`wok bench ramp`): one prefix whichever refused.
            self.exit(2, f"{' '.join(self.prog.split()[:2])}: {exc.argument_name}: {one_line(exc.message)}\n")

    def _dash_values(self, args: list[str]) -> list[str]:
        """`args` with each option that takes a value and is followed by a word beginning with '-'
        that is not one of this parser's options joined to it as OPTION=WORD. A subcommand's words
        are left to its own parser."""
        out: list[str] = []
        i = 0
        while i < len(args):
            arg = args[i]
            i += 1
            if arg == "--":  # argparse's end of the options: what follows is positional, as given
                return [*out, arg, *args[i:]]
            option = self._value_option(arg)
            if option is None:
                out.append(arg)
                if self._commands is not None and not arg.startswith("-"):  # the subcommand
                    return [*out, *args[i:]]
            elif i < len(args) and _DASH_NUMBER.match(args[i]) and not self._is_option(args[i]):
                out.append(f"{option}={args[i]}")
                i += 1
            else:
                # The value as argparse takes it, skipped here so that it is not taken for the subcommand.
                out.append(arg)
                if i < len(args) and not self._is_option(args[i]):
                    out.append(args[i])
                    i += 1
        return out

    def _value_option(self, arg: str) -> str | None:
        """The long option string `arg` names, given whole or abbreviated, if that option takes one
        value (nargs None or '?') and `arg` does not carry it (--OPTION=VALUE); None otherwise."""
        if not arg.startswith("--") or "=" in arg:
            return None
        options = self._option_string_actions  # read only; argparse's map of option strings
        if arg not in options:
            matches = [s for s in options if s.startswith(arg)] if self.allow_abbrev else []
            if len(matches) != 1:
                return None
            arg = matches[0]
        return arg if options[arg].nargs in (None, argparse.OPTIONAL) else None

    def _is_option(self, word: str) -> bool:
        """Whether argparse would read `word` as one of this parser's options: whole, with =VALUE,
        a short one with its value attached, or abbreviated (ambiguously too: argparse says so)."""
        if word == "--":
            return True
        if not word.startswith("-") or word == "-":  # "-" is a value to argparse (stdin, stdout)
            return False
        options = self._option_string_actions
        name = word.partition("=")[0]
        if name in options or (word[1:2] != "-" and word[:2] in options):
            return True
        return self.allow_abbrev and any(s.startswith(name) for s in options)


_PARSER = "_wok_parser"  # the namespace key of the parser that parsed last (_Parser.parse_args)


def _mark_parsers(parser: _Parser) -> None:
    """`parser` and the parsers of its subcommands (of its class: add_subparsers makes them so), each
    named in its own defaults."""
    parser.set_defaults(**{_PARSER: parser})
    for sub in parser._commands.choices.values() if parser._commands is not None else ():
        _mark_parsers(sub)


def wok_parser(*, serve_only: bool = False) -> _Parser:
    """`wok`'s parser, with every command's; with `serve_only`, `wok serve`'s alone."""
    parser = _Parser(prog="wok", description="wok: a dynamic-batching inference server")
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    if not serve_only:
        # Not for `wok serve`: the bench's parsers import its clients, numpy and the fault
        # machinery (about 0.3 s of a server's start, before its own imports).
        from .bench import cli as bench_cli

        # Each figure-producing command registers itself with `p.set_defaults(run=fn, name=...)`;
        # `run(args)` returns the exit status and raises ValueError for a bad option value.
        for register in bench_cli.COMMANDS:
            register(sub)
        from .demo.cli import add_demo_parser

        add_demo_parser(sub)
    return parser


class StartError(RuntimeError):
    """The server could not start (a port taken, a device missing): exit 1. A model that fails its
    start-up warm-up is a config error instead (exit 2)."""


def _serve_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve models over the KServe V2 gRPC protocol")
    p.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; IPv6 as ::1 or [::1], :: for all)"
    )
    p.add_argument("--port", type=int, default=8001, help="gRPC port (default 8001; 0 picks a free one)")
    p.add_argument(
        "--model-repository",
        type=Path,
        metavar="DIR",
        help="folder of models (default: none, the demo models serve); with it, no --models nor --demo-option",
    )
    # No default here: given, beside --model-repository, it is refused (_check_serve_options).
    p.add_argument(
        "--models", metavar="NAMES", help=f"demo models to serve, comma-separated (default: {_DEFAULT_DEMO_MODELS})"
    )
    p.add_argument(
        "--grace-period",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="seconds to drain on SIGTERM, SIGINT or SIGHUP (default 30)",
    )
    p.add_argument(
        "--max-connection-age",
        type=float,
        metavar="SECONDS",
        help="close each client connection after about this long (GOAWAY), so round-robin clients reconnect and "
        "reach replicas added since (default: never); see docs/reliability.md",
    )
    p.add_argument(
        "--max-connection-age-grace",
        type=float,
        metavar="SECONDS",
        help="time the calls in flight on such a connection get to finish (default: --grace-period)",
    )
    p.add_argument(
        "--health-port",
        type=int,
        metavar="PORT",
        help="also serve grpc.health.v1, and only it, in plaintext on this port (0 picks a free one): for probes "
        "that cannot speak TLS, such as the kubelet's gRPC probe (default: none)",
    )
    p.add_argument(
        "--health-host", metavar="ADDR", help="address the health port binds to (default: the same as --host)"
    )
    p.add_argument(
        "--max-request-bytes",
        type=int,
        default=64 << 20,
        metavar="BYTES",
        help="largest ModelInfer request accepted, in bytes (default 67108864, 64 MiB; at least 1024); larger ones "
        "get INVALID_ARGUMENT, and gRPC's message limit, both ways, is 4 × BYTES + 1 MiB; see docs/security.md",
    )
    p.add_argument(
        "--stream-window",
        type=int,
        default=1024,
        metavar="N",
        help="requests one ModelStreamInfer stream may owe (read, not yet answered) before the server reads no "
        "more from it: bounds the answers an unread stream holds (default: 1024)",
    )
    p.add_argument("--torch-threads", type=int, metavar="N", help="torch intra-op threads (default: torch's choice)")
    p.add_argument(
        "--cpu-linear",
        choices=("onednn", "torch"),
        default="onednn",
        help="how CPU instances run nn.Linear layers: oneDNN's matmul kernel from 4 rows (default), or torch's "
        "addmm throughout; see docs/performance.md",
    )
    p.add_argument(
        "--switch-interval",
        type=float,
        metavar="MS",
        dest="switch_interval_ms",
        help="GIL switch interval in ms (default: Python's, 5 ms); see docs/performance.md",
    )
    p.add_argument(
        "--accept-tasks",
        type=int,
        default=4,
        metavar="N",
        help="tasks accepting unary ModelInfer calls beside grpc.aio's own (default 4; 0: grpc.aio's alone); "
        "see docs/performance.md",
    )
    p.add_argument(
        "--wakeup-drain",
        action="store_true",
        help="take every finished gRPC operation waiting in one event-loop pass, not one per pass: for long "
        "passes (default off); see docs/performance.md",
    )
    p.add_argument(
        "--cpu-wakeup-latency",
        type=int,
        metavar="US",
        dest="cpu_wakeup_latency_us",
        help="hold idle CPUs' wake-up latency at most US µs while serving (Linux PM QoS, /dev/cpu_dma_latency; "
        "needs root); 0 keeps idle cores polling: lower tail latency at light load, for power (default: none); "
        "see docs/performance.md",
    )
    p.add_argument(
        "--server-timing",
        action="store_true",
        help="send each ModelInfer answer's stage times in a server-timing trailer, for `wok bench ramp "
        "--server-timing` (default off); see docs/metrics.md",
    )
    p.add_argument(
        "--metrics-host", default="127.0.0.1", metavar="ADDR", help="address of the /metrics port (default 127.0.0.1)"
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=8002,
        metavar="PORT",
        help="HTTP port of /metrics (default 8002; 0 picks a free one; -1: none)",
    )
    p.add_argument(
        "--no-metrics",
        action="store_true",
        help="record no metrics (to measure what they cost) and open no HTTP port; with --admin the port opens for "
        "the admin API alone, and /metrics there answers 404",
    )
    p.add_argument(
        "--admin",
        action="store_true",
        help="serve the admin API on the metrics port: fault injection, live batching policy, /events "
        "(see docs/demo.md); it binds where --metrics-host says, loopback by default",
    )
    p.add_argument(
        "--demo-option",
        action="append",
        default=[],
        metavar="MODEL.KEY=VALUE",
        help="size option of a demo model served, e.g. recsys.num_embeddings=50000 (repeatable; default: none, "
        "the models' own sizes)",
    )
    p.add_argument(
        "--log-level",
        default="INFO",
        type=str.upper,
        choices=("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"),
        help="least level of the server's log lines (default INFO); the start-up lines `wok: ...` print at any level",
    )
    sec = p.add_argument_group("security", "TLS and bearer tokens on the gRPC port; see docs/security.md")
    sec.add_argument(
        "--tls-cert",
        type=Path,
        metavar="PATH",
        help="PEM certificate chain: the gRPC port then speaks only TLS (default: none, plaintext)",
    )
    sec.add_argument("--tls-key", type=Path, metavar="PATH", help="PEM private key of --tls-cert (unencrypted)")
    sec.add_argument(
        "--tls-client-ca",
        type=Path,
        metavar="PATH",
        help="PEM CA certificate(s): clients must then present a certificate (mTLS) (default: none)",
    )
    # Tokens never on the command line: `ps` shows it to every user of the machine.
    sec.add_argument(
        "--auth-token-file",
        type=Path,
        metavar="PATH",
        help="file of accepted bearer tokens, one per line: calls must then send 'authorization: Bearer <token>' "
        "(default: none; with neither this nor --auth-token-env, no token is needed)",
    )
    sec.add_argument(
        "--auth-token-env",
        metavar="VAR",
        help="environment variable holding accepted bearer tokens (comma-separated) (default: none)",
    )


def _parse_value(v: str):
    for cast in (read_int, read_float):
        try:
            return cast(v)
        except ValueError:
            pass
    return v


def _demo_options(items: list[str]) -> dict:
    """Checked against the builders' keywords without importing them: a refusal costs no torch."""
    from .models import DEMO_MODELS, DEMO_OPTIONS

    out: dict[str, dict] = {}
    for item in items:
        key, eq, value = item.partition("=")
        model, dot, opt = key.partition(".")
        if not eq or not dot:
            raise ConfigError(f"--demo-option {quoted_name(item)}: expected MODEL.KEY=VALUE")
        options = DEMO_OPTIONS.get(model)
        if options is None:
            raise ConfigError(
                f"--demo-option {quoted_name(item)}: unknown demo model {quoted_name(model)}; known: "
                f"{', '.join(DEMO_MODELS)}"
            )
        if opt not in options:
            raise ConfigError(
                f"--demo-option {quoted_name(item)}: demo model {quoted_name(model)} has no option {quoted_name(opt)}; "
                f"its options: {', '.join(options)}"
            )
        parsed = _parse_value(value)
        kind = options[opt]
        # A float option takes an int too; an int one only an int (not 1.5, nor 1e3).
        if not isinstance(parsed, (int, float) if kind is float else int):
            expected = "a number" if kind is float else "an integer"
            raise ConfigError(
                f"--demo-option {quoted_name(item)}: option {quoted_name(opt)} of demo model {quoted_name(model)}: "
                f"expected {expected}; got {quoted_name(value)}{digits_note(value)}"
            )
        out.setdefault(model, {})[opt] = parsed
    return out


def _demo_models(args) -> tuple[str, ...]:
    """The demo models `--models` names, each without the spaces around it ("mlp, recsys"), or all
    three when it is not given. None at all ("", ",") is () (refused by the caller: no model to
    serve); an empty name among others ("mlp,,recsys", "mlp,") or a name given twice is refused here
    (ConfigError)."""
    if args.models is None:
        return tuple(_DEFAULT_DEMO_MODELS.split(","))
    names = [m.strip() for m in args.models.split(",")]
    if not any(names):
        return ()
    if "" in names:
        raise ConfigError(
            f"--models {quoted_name(args.models)}: name {names.index('') + 1} of {len(names)} is empty; "
            f"expected names separated by single commas, e.g. {_DEFAULT_DEMO_MODELS}"
        )
    for i, name in enumerate(names):
        if name in names[:i]:  # refused here, before seconds of torch imports and a first model built
            raise ConfigError(
                f"--models {quoted_name(args.models)}: {quoted_name(name)} is named twice (names "
                f"{names.index(name) + 1} and {i + 1}); each model is served once, under its own name"
            )
    return tuple(names)


def _check_serve_options(args) -> None:
    """Options that do not apply to what would be served are refused (ConfigError), not ignored, as
    `wok bench` refuses them: checked before anything loads (no torch, no signal bound to a loop)."""
    if args.metrics_port < -1:
        # Taken as "none" before: a typo (-8002) turned the metrics off without a word.
        raise ConfigError(
            f"--metrics-port {args.metrics_port}: expected a port 0-65535 (0: a free one), or -1 for none"
        )
    if args.model_repository is not None:
        if args.models is not None:
            raise ConfigError(
                f"--models {quoted_name(args.models)} with --model-repository: the repository's models are served; "
                "give one of the two"
            )
        if args.demo_option:
            raise ConfigError(
                f"--demo-option {quoted_name(args.demo_option[0])} with --model-repository: demo options apply to the "
                "demo models only"
            )
        return
    served = _demo_models(args)
    if not served:
        raise ConfigError(f"--models {quoted_name(args.models)}: no model to serve")
    if args.demo_option:
        _demo_options(args.demo_option)  # a malformed one or an unknown model: its own refusal first
    for item in args.demo_option:
        model = item.partition("=")[0].partition(".")[0]
        if model not in served:
            given = _DEFAULT_DEMO_MODELS if args.models is None else args.models
            raise ConfigError(
                f"--demo-option {quoted_name(item)}: demo model {quoted_name(model)} is not among --models "
                f"{quoted_name(given)}"
            )


def _pick_loop() -> None:
    try:
        import uvloop
    except ImportError:
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def _say(line: str) -> None:
    """A line on stderr that cannot fail: after a hangup stderr may be a closed terminal (EIO)
    or a pipe nobody reads, and an exception on the way out would skip the os._exit after it."""
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def _say_in_handler(line: str) -> None:
    """A line on stderr from a signal handler. os.write, not print: before the loop runs, the
    handler may interrupt a print to stderr, and a reentrant print raises."""
    try:
        os.write(2, line.encode() + b"\n")
    except OSError:  # stderr gone with the terminal: carry on all the same
        pass


class _StopSignal:
    """SIGTERM, SIGINT and SIGHUP from the first moment of `wok serve`.

    As PID 1 (a container's entrypoint) a signal without a handler is dropped by the kernel,
    so the handlers go in before anything slow (importing torch, building the models). Until
    the event loop runs, the handler records the signal; from `bind` on it has the loop set
    `event` (created there: it belongs to that loop). The handlers stay these plain ones to the
    process's end, never the loop's (`bind` says why).

    SIGHUP (the terminal or ssh session that started the server closed, or a process manager)
    drains as SIGTERM does, but never cuts a drain short: a closing terminal sends it twice to
    a foreground job (the shell forwards it, then the kernel sends it as the shell exits). A
    SIGHUP ignored at the start (nohup) stays ignored.

    Only the second SIGTERM or SIGINT forces the exit: a drain begun by SIGHUP goes on through
    the first of them, which a process manager sends as its own stop, often together with
    the hangup, and which the kernel may hand over second, SIGHUP's number being lower. Second as this handler
    sees it: Python keeps one pending mark per signal, so a signal that comes again before the main thread runs
    again calls it once (README). Not counted from the wakeup fd's bytes (one per delivery): under uvloop that fd
    is the loop's own, which reads it, so only asyncio's loop could, and the two would differ for a window the
    kernel keeps anyway (it merges a signal sent again before it was delivered).

    Once the stop has run (`stopped`), a signal has nothing left to cut short but the exit, which Python's joins
    hold as long as a thread left running (a model's own helper thread) lasts: it leaves at once with the stop's
    status, as wok.entry's `_ExitSignals` makes it once `main` has returned.

    Not `serving` (another command, whose parsers load under these handlers): the first signal alone is kept, for
    `uninstall` to hand to the command's own handler; a second said "exiting without draining" and exited 1, and
    SIGTERM after SIGHUP "already draining", words of `wok serve`'s in a command that has no drain (two SIGTERMs
    in `wok plan`'s first 0.1 s: 1, where one killed it by the signal).
    """

    def __init__(self, serving: bool = True) -> None:
        self.serving = serving
        self.received: int | None = None  # the first signal's number
        self.event: asyncio.Event | None = None
        self.status: int | None = None  # the exit status, once the stop has run: see `stopped`
        self._forcing = False  # a SIGTERM or SIGINT has come: the next one exits at once
        self._before: dict[int, object] = {}
        self._loop: asyncio.AbstractEventLoop | None = None  # bound: see `bind`
        self._wakeup: tuple[socket.socket, socket.socket] | None = None  # (read end, the wakeup fd) where bound
        self._installed = False  # from `install` to `uninstall`: a child forked meanwhile sets these back

    def install(self, held=None) -> None:
        """`held`: wok.entry's `_HeldSignals`, which held SIGTERM and SIGHUP as this module imported: the handlers
        it replaced are the ones `uninstall` puts back, and the signals it held count here, in their order, as if
        they came now."""
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            if sig == signal.SIGHUP and signal.getsignal(sig) is signal.SIG_IGN:
                continue
            before = signal.signal(sig, self._on_signal)
            self._before[sig] = before if held is None else held.before.get(sig, before)
        # After the handlers: one held here came before any these take (one in the moment between is taken first).
        for sig in () if held is None else held.received:
            self._on_signal(sig)
        self._installed = True
        reset_in_forked_children(lambda: self._installed, self._in_forked_child)

    def _in_forked_child(self) -> None:
        """A child forked from this process (a python model's own `multiprocessing` process): the handlers these
        replaced, where still these, and no wakeup fd, the one it inherited being the parent's loop's. With these
        handlers a SIGTERM only marked a stop in the child's copy of the server, which runs nothing."""
        self._installed = False
        for sig, handler in self._before.items():
            if signal.getsignal(sig) == self._on_signal:
                signal.signal(sig, signal.SIG_DFL if handler is None else handler)  # None: set outside Python
        signal.set_wakeup_fd(-1)

    def uninstall(self) -> None:
        """Not `wok serve` after all: the handlers as they were, and a signal that came meanwhile
        delivered to them."""
        self._installed = False
        for sig, handler in self._before.items():
            signal.signal(sig, handler)
        if self.received is not None:
            signal.raise_signal(self.received)

    def _on_signal(self, signum: int, frame=None) -> None:
        if self.status is not None:  # the process is on its way out, its status decided
            leave(self.status)
        if self.received is not None:
            if not self.serving:  # the first is the command's: see the class
                return
            if signum == signal.SIGHUP:  # a hangup again, not an operator: see the class
                return
            if not self._forcing:  # the drain began on a hangup: this is the stop, not a second one
                self._forcing = True
                name = signal.Signals(signum).name
                _say_in_handler(f"wok: {name} received, already draining; a second SIGTERM or SIGINT exits at once")
                return
            # A second signal: the operator wants out now.
            _say_in_handler("wok: second signal, exiting without draining")
            os._exit(1)
        self.received = signum
        self._forcing = signum != signal.SIGHUP
        if self._loop is not None and not self._loop.is_closed():  # closed: an error of wok's own is on its way out
            # Set by the loop, in a callback of its own: this handler runs between any two bytecodes of the main
            # thread, the loop's own included.
            self._loop.call_soon_threadsafe(self.event.set)

    def name(self) -> str:
        """The first signal's name, "SIGHUP" say, for the log."""
        return signal.Signals(self.received).name if self.received is not None else "no signal"

    def bind(self, loop: asyncio.AbstractEventLoop) -> asyncio.Event:
        """`event`, set by `loop` (running, on this thread) at the first signal.

        Not the loop's own handlers (add_signal_handler, until 2026-12-07): its close put back what it chose, before
        `after_loop` put these back, and a signal between was lost under uvloop (its own handler, which does nothing,
        left: a model's thread then held the exit until a second signal) and under asyncio's loop met the default
        actions (SIGTERM killed the process by it; SIGINT a KeyboardInterrupt). Taking them from the loop at the end
        of `_serve` instead left the default actions between the two calls."""
        self.event = asyncio.Event()
        self._loop = loop
        if self.received is not None:
            self.event.set()
        # A Python handler runs on the main thread alone, at its next bytecode: a signal the kernel hands to another
        # thread must wake the loop asleep in its poll, as the signals' wakeup fd does with a byte per signal. uvloop
        # sets one of its own as it runs and reads it itself; asyncio's loop sets none but for add_signal_handler.
        own = signal.set_wakeup_fd(-1)
        if own != -1:
            signal.set_wakeup_fd(own, warn_on_full_buffer=False)  # as uvloop sets it
            return self.event
        woken, wake = socket.socketpair()
        woken.setblocking(False)
        wake.setblocking(False)  # as set_wakeup_fd requires: a full buffer drops a byte, it never blocks
        signal.set_wakeup_fd(wake.fileno(), warn_on_full_buffer=False)
        self._wakeup = (woken, wake)
        loop.add_reader(woken.fileno(), self._woken, woken)
        return self.event

    @staticmethod
    def _woken(woken: socket.socket) -> None:
        # The bytes only woke the loop: the handler has run, on the way to this callback.
        try:
            while woken.recv(4096):
                pass
        except BlockingIOError:
            pass

    def stopped(self, status: int) -> None:
        """The stop has run (or a failed start's) and the process exits with `status`: a signal from here on leaves
        at once with it. Until 2026-12-07 one was ignored (51965ea: a second SIGTERM as the interpreter tore down
        killed the process by the signal, or said "exiting without draining"), and a model's thread that never
        ended held the stopped server for good, but for SIGKILL."""
        self.status = status

    def after_loop(self, status: int) -> None:
        """The loop has closed, the process to exit with `status`: the handlers leave at once with it until wok.entry's
        `_ExitSignals` takes them as `main` returns (its teardown ignores them from the last exit function on, through
        the interpreter's finalization: a second signal there neither kills the process by the signal nor prints a
        traceback). The wakeup fd `bind` set, if it did, is unset: no loop reads it now."""
        self.stopped(status)
        if self._wakeup is None:
            return
        woken, wake = self._wakeup
        self._wakeup = None
        current = signal.set_wakeup_fd(-1)
        if current != wake.fileno():  # not ours: another's since, left as it is
            signal.set_wakeup_fd(current, warn_on_full_buffer=False)
        woken.close()
        wake.close()


# The option each server setting comes from, for the settings' refusals: "--port: ..." rather than
# "server settings: grpc_port: ...".
_SETTING_OPTIONS = {
    "host": "--host",
    "grpc_port": "--port",
    "model_repository": "--model-repository",
    "demo_models": "--models",
    "grace_period_s": "--grace-period",
    "max_connection_age_s": "--max-connection-age",
    "max_connection_age_grace_s": "--max-connection-age-grace",
    "health_host": "--health-host",
    "health_port": "--health-port",
    "max_request_bytes": "--max-request-bytes",
    "stream_window": "--stream-window",
    "torch_threads": "--torch-threads",
    "cpu_linear": "--cpu-linear",
    "switch_interval_ms": "--switch-interval",
    "accept_tasks": "--accept-tasks",
    "drain_wakeups": "--wakeup-drain",
    "server_timing": "--server-timing",
    "cpu_wakeup_latency_us": "--cpu-wakeup-latency",
    "metrics": "--no-metrics",
    "metrics_host": "--metrics-host",
    "metrics_port": "--metrics-port",
    "admin": "--admin",
    "tls_cert": "--tls-cert",
    "tls_key": "--tls-key",
    "tls_client_ca": "--tls-client-ca",
    "auth_token_file": "--auth-token-file",
    "auth_token_env": "--auth-token-env",
}


def _build(args):
    """Import torch and the server, and load the models: slow, so run on a thread (a signal meanwhile
    stops the start at once). Returns (settings, the repository). The settings are checked
    before torch is imported (`_settings`): a refused option costs no second of imports; and so are
    the ports (StartError for one the server cannot have)."""
    settings, demo_options = _settings(args)
    from .ports import check_ports

    try:
        # Before torch's import and the models' load: a port the server cannot have fails the start in
        # a second, not after minutes of loading.
        check_ports(settings)
    except OSError as exc:
        raise StartError(f"cannot start: {exc}") from exc
    from .app import build_repository

    return settings, build_repository(settings, demo_options)


def _settings(args):
    """(the server's settings, the demo models' options) of `wok serve`'s `args`, checked as far as
    they can be without torch and without binding a port; ConfigError naming the option. It reads
    the TLS and token files named, and nothing more."""
    from .config import server_settings

    settings = server_settings(
        _SETTING_OPTIONS,
        host=args.host,
        grpc_port=args.port,
        model_repository=args.model_repository,
        demo_models=_demo_models(args),
        grace_period_s=args.grace_period,
        max_connection_age_s=args.max_connection_age,
        max_connection_age_grace_s=args.max_connection_age_grace,
        health_host=args.health_host,
        health_port=args.health_port,
        max_request_bytes=args.max_request_bytes,
        stream_window=args.stream_window,
        torch_threads=args.torch_threads,
        cpu_linear=args.cpu_linear,
        switch_interval_ms=args.switch_interval_ms,
        accept_tasks=args.accept_tasks,
        drain_wakeups=args.wakeup_drain,
        server_timing=args.server_timing,
        cpu_wakeup_latency_us=args.cpu_wakeup_latency_us,
        metrics=not args.no_metrics,
        metrics_host=args.metrics_host,
        # Without metrics the port would answer nothing but 404s: it opens only for the admin API.
        metrics_port=None if args.metrics_port < 0 or (args.no_metrics and not args.admin) else args.metrics_port,
        admin=args.admin,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_client_ca=args.tls_client_ca,
        auth_token_file=args.auth_token_file,
        auth_token_env=args.auth_token_env,
    )
    if settings.admin and settings.metrics_port is None:
        raise ConfigError("--admin is served on the metrics port: it needs --metrics-port other than -1")
    if settings.model_repository is None:
        from .models import check_demo_name

        for name in settings.demo_models:
            try:
                check_demo_name(name)
            except ValueError as exc:
                raise ConfigError(f"--models: {exc}") from None
    # An unknown model or option: refused before torch too.
    return settings, _demo_options(args.demo_option)


class _Refused(Exception):
    """What a `_QuietParser` would have printed and exited with: `status`, `message` (None for --help)."""

    def __init__(self, status: int, message: str | None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class _QuietParser(_Parser):
    """`wok`'s parser that prints nothing and exits nowhere: a refusal (or --help) raises _Refused."""

    def print_usage(self, file=None) -> None:
        pass

    def print_help(self, file=None) -> None:
        pass

    def error(self, message: str):
        # Without argparse's "wok serve: error: " and the usage before it: the reason alone.
        raise _Refused(2, one_line(message))

    def exit(self, status: int = 0, message: str | None = None):
        raise _Refused(status, message)


_GIVEN = object()  # the default of an option that check_replica_args's `fixed` gives: still there, not given


def check_replica_args(words: Sequence[str], fixed: Mapping[str, str]) -> None:
    """Raise ValueError with the one-line reason `wok serve` would refuse `wok serve FIXED WORDS` for
    (`fixed`: option → value, what the caller gives every such server itself, --port 0 say, which
    `words` may not give again), as far as it checks before torch is imported or a port bound: its
    parser, then the options' and the settings' checks. Prints nothing and starts nothing: the
    bench's --serve-args are checked so before any replica starts, where a refused one ended the
    run with exit 1 and the child's whole usage."""
    parser = _QuietParser(prog="wok")
    _serve_parser(parser.add_subparsers(dest="command", required=True))
    (serve,) = parser._commands.choices.values()
    dests = {serve._option_string_actions[option].dest: option for option in fixed}
    serve.set_defaults(**dict.fromkeys(dests, _GIVEN))
    try:
        given = parser.parse_args(["serve", *words])
        for dest, option in dests.items():
            if getattr(given, dest) is not _GIVEN:
                raise ValueError(f"{option} is not to be given: each replica is started with {option} {fixed[option]}")
        args = parser.parse_args(["serve", *(w for pair in fixed.items() for w in pair), *words])
        _check_serve_options(args)
        _settings(args)
    except _Refused as exc:
        if exc.message is None:  # --help: printed, a replica would exit 0 without serving
            raise ValueError("-h/--help prints wok serve's help and exits: no replica would serve") from None
        raise ValueError(one_line(exc.message.strip().removeprefix(f"{serve.prog}: "))) from None
    except ConfigError as exc:
        raise ValueError(one_line(str(exc))) from None


def serve_grace_period(words: Sequence[str]) -> float:
    """The grace period, in seconds, that `wok serve WORDS` drains within, as its own parser reads the words (an
    abbreviation, `--grace-period=45`, a later value winning); the default for words it refuses or a negative,
    infinite or NaN period (such a server exits before it serves: it has nothing to drain). The bench waits for its
    replicas' stop by it: a fixed 30 s killed one given a longer period halfway through its drain."""
    parser = _QuietParser(prog="wok")
    _serve_parser(parser.add_subparsers(dest="command", required=True))
    (serve,) = parser._commands.choices.values()
    default = serve.get_default("grace_period")
    try:
        grace = parser.parse_args(["serve", *words]).grace_period
    except _Refused:
        return default
    return grace if 0 <= grace < float("inf") else default  # NaN fails both


async def _until_stop(step, stop: asyncio.Event) -> bool:
    """Await `step` unless a signal comes first; True if it finished, False if the signal won (the
    step is then left running: the caller exits without it, or cancels it)."""
    task = asyncio.ensure_future(step)
    waiter = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
    if stop.is_set() and not task.done():
        return False
    await task
    return True


async def _serve(args, stop_signal: _StopSignal) -> int:
    loop = asyncio.get_running_loop()
    stop = stop_signal.bind(loop)
    built = loop.run_in_executor(None, _build, args)
    if not await _until_stop(built, stop):
        _exit_before_ready(stop_signal)
    settings, repository = built.result()
    import torch

    from .app import WokServer  # imported by _build already: no wait

    # On this thread: torch.set_num_threads sets the calling thread's OpenMP team size too.
    if settings.torch_threads:
        torch.set_num_threads(settings.torch_threads)
    if settings.switch_interval_ms is not None:
        sys.setswitchinterval(settings.switch_interval_ms / 1e3)
    # Its start-up lines are printed below (announce=False: not logged as well).
    server = WokServer(settings, repository, announce=False)
    starting = asyncio.ensure_future(server.start())
    try:
        if not await _until_stop(starting, stop):
            if not server.port:
                # No port is bound before the models are warm: abandon the start (a warm-up
                # cannot be interrupted, and waiting for it is what the signal said not to do).
                _exit_before_ready(stop_signal)
            # The gRPC port serves already (the health and metrics ports open after it) and no model
            # thread is busy: the start ends where it is, and the staged stop below answers the calls
            # the port took. Exiting at once cut them, unanswered.
            starting.cancel()
            await asyncio.wait({starting})
            if not starting.cancelled():
                starting.result()  # what the start met before the cancellation landed
    except (ConfigError, WarmupError) as exc:
        # The message names the model's config file: a config error (exit 2), not a failed start.
        await _stop_after_failed_start(server)
        line, status = _start_failure(exc)
        _exit_if_held(server, stop_signal, status, line, lost=getattr(exc, "device_lost", None))
        raise
    except Exception as exc:
        await _stop_after_failed_start(server)
        error = StartError(f"cannot start: {exc}")
        _exit_if_held(server, stop_signal, 1, _start_failure(error)[0])
        raise error from exc
    # Not when the signal came during the start: it stops before the ready line.
    serving = not stop.is_set()
    if serving:
        _say_serving(server, settings)
        await stop.wait()
    _say(f"wok: {stop_signal.name()} received, stopping")
    status = 0
    try:
        await server.stop()
    except Exception as exc:
        # Every stage ran and each failure is logged with its traceback: one line here. Left to Python, it printed
        # the traceback again and skipped the exits below, and a model thread still running then held the exit.
        _say(f"wok: the stop failed: {one_line(error_line(exc))}")
        status = 1
    # A signal now leaves at once with the status, asyncio's own end (tasks cancelled, its executor's threads joined)
    # and Python's exit cut short.
    stop_signal.stopped(status)
    if not serving:
        _say("wok: stopped by a signal before serving")
    _exit_if_held(server, stop_signal, 1)
    return status


def _start_failure(exc: Exception) -> tuple[str, int]:
    """The line `wok serve` says for a start that failed with `exc` (ConfigError, WarmupError or StartError), and
    its exit status: 2 for a config error (a warm-up's failure names the model's config file), else 1."""
    if isinstance(exc, StartError):
        return f"wok: {exc}", 1
    # A config's refusal names paths as given (a newline in one split the line), and a warm-up's the model's own
    # message (a terminal's escape reached the terminal): one line, as the options' refusals, and as `wok profile`
    # says the same WarmupError (main's one_line of a ValueError).
    return f"wok: {one_line(str(exc))}", 2


def _exit_if_held(server, stop_signal: _StopSignal, status: int, line: str | None = None, lost=None) -> None:
    """After the stop (a failed start's too): leave at once with `status`, through os._exit, where Python's own exit
    would hang or abort. `line`: one to say first (a failed start's); `lost`: a device lost that the server was not
    told of (a warm-up's)."""
    lost = server.device_lost if lost is None else lost
    if not server.abandoned_work and lost is None:
        return
    stop_signal.stopped(status)  # a signal now has nothing to cut short
    if line is not None:
        _say(line)  # a failed start's, which `main` would say after the loop
    if server.abandoned_work:
        # A model thread is stuck; Python would wait for it forever at exit (after a failed start as well: a
        # request the gRPC port took before a later port's bind failed).
        _say("wok: a model was still running after the grace period; exiting")
        os._exit(status)
    # Torch frees a lost device's memory at exit through calls that now fail, and a failure in a destructor aborts
    # the process (SIGABRT, seen on an H200): leave without those frees.
    _say(f"wok: exiting without freeing the lost device's memory ({lost})")
    logging.shutdown()
    os._exit(status)


async def _stop_after_failed_start(server) -> None:
    """Stop a server whose start failed; a failure of that stop is one line, the start's error staying the one
    raised. Raised, the stop's error replaced it: the traceback of the stop's stage, logged already, printed again
    by Python, and never the line saying why the start failed (nor its exit status 2 for a config error)."""
    try:
        await server.stop(grace=0)
    except Exception as exc:
        _say(f"wok: the stop failed: {one_line(error_line(exc))}")


def _say_serving(server, settings) -> None:
    """The start-up lines that scripts and tests parse, "wok: serving ..." among them."""
    from .auth import SecurityMode
    from .config import host_port

    # Everything built so far (torch, the models, gRPC) lives as long as the process; out of
    # the collector's sight, a full collection under load no longer walks it (at start-up,
    # walking it took 10-90 ms per gen-2 collection here).
    gc.collect()
    gc.freeze()
    if server.http is not None:
        http = host_port(settings.metrics_host, server.http.port)
        if settings.metrics:
            print(f"wok: metrics on http://{http}/metrics", file=sys.stderr, flush=True)
            if settings.admin:
                # Off loopback a warning names it (security_warnings); on loopback nothing said it was served.
                print(f"wok: admin API on http://{http} (/admin/*, /events)", file=sys.stderr, flush=True)
        else:
            print(
                f"wok: metrics off (--no-metrics); admin API on http://{http} (/metrics answers 404)",
                file=sys.stderr,
                flush=True,
            )
    elif not settings.metrics:
        print("wok: metrics off (--no-metrics): no HTTP port", file=sys.stderr, flush=True)
    else:
        print("wok: metrics off (--metrics-port -1): no HTTP port", file=sys.stderr, flush=True)
    target = host_port(settings.host, server.port)
    print(f"wok: serving {', '.join(server.runtimes)} on {target}", file=sys.stderr, flush=True)
    if server.health_port is not None:
        host = settings.health_bind_host
        print(f"wok: health (plaintext) on {host_port(host, server.health_port)}", file=sys.stderr, flush=True)
    print(f"wok: gRPC security: {SecurityMode.of(settings).describe()}", file=sys.stderr, flush=True)


def _exit_before_ready(stop_signal: _StopSignal) -> None:
    """A signal stopped the start: exit 0 at once. A thread may still be loading or warming a model,
    which cannot be interrupted, and Python (asyncio.run first) would wait for it at exit."""
    _say(f"wok: {stop_signal.name()} received, stopping")
    _say("wok: stopped by a signal before serving")
    logging.shutdown()
    os._exit(0)


def main(argv: list[str] | None = None, held=None) -> int:
    """`held`: the signals wok.entry held while this module imported (`_StopSignal.install`)."""
    # OpenMP threads that spin after each parallel region take the cores the event loop and
    # the gRPC threads need between batches; side by side on 2 cores, passive waiting cut
    # mlp's P99 at 1,000 QPS from 47 ms to 10 ms. Read when torch loads OpenMP, so set
    # before any import of torch; an operator's own setting wins.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # Before the parser, whose imports take a few hundred ms: see _StopSignal.
    given = sys.argv[1:] if argv is None else argv
    stop_signal = _StopSignal(serving=given[:1] == ["serve"])
    stop_signal.install(held)
    try:
        args = wok_parser(serve_only=stop_signal.serving).parse_args(argv)
    except BaseException:
        try:
            stop_signal.uninstall()
        except KeyboardInterrupt:  # Ctrl-C meanwhile: it wins over --help or a refused option
            print("wok: interrupted", file=sys.stderr)
            return 130
        raise
    if args.command == "serve":
        try:
            _check_serve_options(args)
        except ConfigError as exc:
            print(f"wok: {one_line(str(exc))}", file=sys.stderr)
            try:
                stop_signal.uninstall()
            except KeyboardInterrupt:  # Ctrl-C meanwhile: the refusal, said, is the status all the same
                pass
            return 2
    else:
        try:
            # A Ctrl-C while the parsers loaded, held by the handlers of `wok serve`, is raised here.
            stop_signal.uninstall()
            logging.basicConfig(level=logging.WARNING)
            # Called by wok.entry.main (`held`), whose exit takes the signals over from the command's own handlers,
            # which a command that has its result leaves to it (bench/cli.py's `_restore_signals`); else put back.
            args.exit_takes_signals = held is not None
            return args.run(args)
        except ValueError as exc:  # a bad option value, named by the parser that refused it
            print(f"wok {args.command}: {one_line(str(exc))}", file=sys.stderr)
            return 2
        except InterruptedWorkLeft as exc:
            # Python's exit joins the model's thread, which a stuck model never ends: out at once, as `wok serve`
            # leaves a model still running after its stop. Nothing was written: the table and files come after.
            print(f"wok {args.command}: interrupted; {exc}; exiting", file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(130)
        except KeyboardInterrupt:  # Ctrl-C before anything was measured: nothing to report
            print(f"wok {args.command}: interrupted", file=sys.stderr)
            return 130
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    _pick_loop()
    status = 1  # an error of wok's own escapes: Python's status after its traceback
    try:
        status = asyncio.run(_serve(args, stop_signal))
    except (ConfigError, WarmupError, StartError) as exc:
        # A warm-up on a lost device, or a model thread left running, has left through os._exit already (_serve).
        line, status = _start_failure(exc)
        # Before `after_loop`: from there a signal leaves at once with the status, and one before the line was
        # said left without it (status 2, no reason given).
        _say(line)
    finally:
        # A failed start tears down as long as a stopped server does (torch): the same holds.
        stop_signal.after_loop(status)
    return status
