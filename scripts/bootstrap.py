"""Set up a virtual environment for wok from nothing but Python and pip, then run a command in it.

    python3 scripts/bootstrap.py serve [wok serve options]   # install, then start the server
    python3 scripts/bootstrap.py test  [pytest options]      # install with test extras, then run the suite
    python3 scripts/bootstrap.py install                     # install only
    python3 scripts/bootstrap.py [COMMAND] --help            # this usage (-h too); installs nothing

Torch is installed first and on its own: a machine without an NVIDIA GPU gets the CPU
build (the plain PyPI wheel for Linux x86-64 is a multi-GB CUDA build). Set WOK_TORCH to
choose the requirement (for example ``WOK_TORCH="torch==2.13.0"``): it is installed on every
run, also into an environment that already has a torch (pip leaves one that satisfies it
alone). WOK_VENV chooses the environment's folder (default ``.venv`` in the checkout).
`serve` and `test` with options then become `wok serve` and pytest (the same process): signals
reach them, also those that bootstrap was started with blocked (an ignored one stays ignored), and
the exit status is theirs. `test` alone runs the whole suite: with two or more CPUs in two pytest
passes, the tests not marked `serial` on two workers, then the `serial` ones alone (they time things
a second worker would disturb); with one CPU in one pass. Each pass ends by listing its 15 slowest
tests, and the exit status is the first failing pass's. Ctrl-C, SIGTERM and SIGHUP are passed on to
the running pass and end the suite there, with one line saying where, and the status of a pass that
had failed before, else 128 + the signal's number (130 for Ctrl-C).
While installing, they are passed on to the running step (pip) and end bootstrap there, after it,
with one line and status 128 + the signal's number, as one that comes after the install, before
`wok serve` or pytest starts, does; a failed step ends it with the step's status.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import venv
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TORCH_VERSION = "2.13.0"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
COMMANDS = ("serve", "test", "install")
HELP = ("-h", "--help")
# After the usage, for `COMMAND --help`: where that command's own options are listed.
COMMAND_HELP = {
    "serve": "serve: the options after it are `wok serve`'s; once installed, `wok serve --help` lists them.",
    "test": "test: the options after it are pytest's; once installed, `python -m pytest --help` lists them.",
    "install": "install: installs only; it takes no options.",
}


def has_nvidia_gpu() -> bool:
    return shutil.which("nvidia-smi") is not None or Path("/dev/nvidia0").exists()


class InstallStopped(Exception):
    """An install step failed, or a signal came while installing: the line to print, and bootstrap's
    exit status."""

    def __init__(self, line: str, status: int):
        super().__init__(line)
        self.status = status


def _interrupted_install(steps: Forwarding, where: str) -> InstallStopped:
    signum = steps.stopped[0]
    status = 128 + signum
    return InstallStopped(
        f"bootstrap: {signal.Signals(signum).name} {where}; nothing was run (status {status})", status
    )


def run(cmd: list[str], steps: Forwarding) -> None:
    """One install step, its signals passed on by `steps` (a Ctrl-C ends pip, which cleans up what it
    began, and then bootstrap). Raises InstallStopped when it fails or a signal came."""
    if steps.stopped:  # since the step before ended
        raise _interrupted_install(steps, f"before {' '.join(cmd)}")
    print("+", " ".join(cmd), flush=True)
    code = steps.run(cmd)
    if steps.stopped:
        raise _interrupted_install(steps, f"in {' '.join(cmd)}")
    if code:
        how = f"was ended by {signal.Signals(-code).name}" if code < 0 else f"failed with status {code}"
        raise InstallStopped(
            f"bootstrap: an install step {how}: {' '.join(cmd)}; nothing was run", 128 - code if code < 0 else code
        )


def ensure_venv(path: Path, steps: Forwarding) -> Path:
    """The environment's python, the environment made first where it has none. A failed or
    interrupted making removes the folder where bootstrap made it: the python left in it would be
    taken for a whole environment by the next run."""
    python = path / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    if python.exists():
        return python
    made = not path.exists()
    print(f"+ {sys.executable} -m venv {path}", flush=True)
    try:
        # In-process, and its ensurepip in bootstrap's process group: a terminal's Ctrl-C ends it
        # (CalledProcessError); a signal sent to bootstrap alone waits for it, a few seconds.
        venv.EnvBuilder(with_pip=True).create(path)
        if steps.stopped:
            raise _interrupted_install(steps, f"in making the virtual environment {path}")
    except (InstallStopped, subprocess.CalledProcessError, OSError) as exc:
        if made:
            shutil.rmtree(path, ignore_errors=True)
        if isinstance(exc, InstallStopped):
            raise
        if steps.stopped:
            raise _interrupted_install(steps, f"in making the virtual environment {path}") from None
        if isinstance(exc, subprocess.CalledProcessError):
            said = (exc.output or b"").decode(errors="replace").strip().splitlines()
            raise InstallStopped(
                f"bootstrap: making the virtual environment {path} failed: {' '.join(map(str, exc.cmd))} exited "
                f"with status {exc.returncode}{': ' + said[-1] if said else ''} (on Debian and Ubuntu the "
                "python3-venv package provides ensurepip); nothing was run",
                1,
            ) from None
        raise InstallStopped(
            f"bootstrap: making the virtual environment {path} failed: {exc}; nothing was run", 1
        ) from None
    return python


def pip(python: Path, *args: str, steps: Forwarding) -> None:
    run([str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", *args], steps)


def torch_to_install(requested: str | None, torch_imports: Callable[[], bool]) -> str | None:
    """The torch requirement to pip-install, or None to keep the environment's torch.

    A requested one (WOK_TORCH) is always installed, since the torch already there may not
    be the one asked for; otherwise the pinned version, only where torch does not import.
    """
    if requested:
        return requested
    return None if torch_imports() else f"torch=={TORCH_VERSION}"


def ensure_torch(python: Path, requested: str | None, steps: Forwarding) -> None:
    def torch_imports() -> bool:
        return subprocess.run([str(python), "-c", "import torch"], capture_output=True).returncode == 0

    spec = torch_to_install(requested, torch_imports)
    if spec is None:
        return
    if has_nvidia_gpu():
        pip(python, spec, steps=steps)
        return
    # The CPU index carries "+cpu" builds, which pip prefers over PyPI's CUDA build of the
    # same version; where that index cannot be reached, a local CPU wheel (find-links) still wins.
    pip(python, "--extra-index-url", CPU_INDEX, "--retries", "1", spec, steps=steps)


# The signals bootstrap passes on (`Forwarding`) and lets through to what it hands over to (`hand_over`);
# the last three are POSIX-only.
PASSED_ON = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGTSTP")


def passed_on(ignored_too: bool = False) -> list[signal.Signals]:
    """PASSED_ON's signals that this platform has and, unless `ignored_too`, that bootstrap was not
    started ignoring: one ignored (nohup's SIGHUP) stays ignored."""
    found = [getattr(signal, name) for name in PASSED_ON if hasattr(signal, name)]
    return found if ignored_too else [sig for sig in found if signal.getsignal(sig) != signal.SIG_IGN]


def hand_over(cmd: list[str], cwd: Path | None = None) -> int:
    """Run `cmd` in place of this process, so that a signal sent to it (SIGTERM from a
    supervisor, Ctrl-C) stops the command itself instead of orphaning it.

    The command gets bootstrap's signal mask less PASSED_ON's signals: a caller that started bootstrap
    with them blocked (see `Forwarding`) would leave `wok serve` deaf to a process manager's SIGTERM, its
    staged shutdown never run. Their actions are the caller's: an ignored one stays ignored (one that
    came while blocked is dropped as it is let through), the others are the default ones, as an exec
    leaves them. One of the others that came since bootstrap last let them through waits, pending,
    until here: SIGTSTP then stops bootstrap, and the rest end it with one line and status 128 + its
    number, the command not run, as they end it while installing."""
    if cwd is not None:
        os.chdir(cwd)
    sys.stdout.flush()
    sys.stderr.flush()
    if os.name == "nt":  # Windows' execv starts a new process and ends this one: the caller would stop waiting
        return subprocess.call(cmd)
    held, handled = passed_on(ignored_too=True), passed_on()
    # Held while their actions become the defaults: one that comes between the unblocking and the exec
    # then ends bootstrap as it would end the command before its own handlers, not in a KeyboardInterrupt
    # traceback (Python's SIGINT handler) with the command not run.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    for sig in handled:
        signal.signal(sig, signal.SIG_DFL)
    ending = [sig for sig in handled if sig != getattr(signal, "SIGTSTP", None)]
    pending = signal.sigpending() & set(ending)
    if pending:
        signum = signal.sigwait(pending)  # takes it at once (sigwait: macOS has no sigtimedwait)
        status = 128 + signum
        print(
            f"bootstrap: {signal.Signals(signum).name} before {' '.join(cmd)}; nothing was run (status {status})",
            file=sys.stderr,
            flush=True,
        )
        return status
    signal.pthread_sigmask(signal.SIG_SETMASK, mask - set(held))
    os.execv(cmd[0], cmd)
    raise AssertionError("unreachable: execv returns only by raising")


def main(argv: list[str]) -> int:
    if argv and argv[0] in HELP:
        print(__doc__)
        return 0
    if not argv or argv[0] not in COMMANDS:
        got = repr(argv[0]) if argv else "nothing"
        print(f"bootstrap: expected a command, one of {', '.join(COMMANDS)}; got {got}\n{__doc__}", file=sys.stderr)
        return 2
    command, rest = argv[0], argv[1:]
    if any(arg in HELP for arg in rest):  # usage only: nothing is installed, nor run
        print(f"{__doc__}\n{COMMAND_HELP[command]}")
        return 0
    try:
        with Forwarding() as steps:
            # Absolute: `test` runs from the checkout, whatever folder a relative WOK_VENV names.
            python = ensure_venv(Path(os.environ.get("WOK_VENV", ROOT / ".venv")).absolute(), steps)
            ensure_torch(python, os.environ.get("WOK_TORCH"), steps)
            extras = "[test]" if command == "test" else ""
            pip(python, "-e", f"{ROOT}{extras}", steps=steps)
        # One that Forwarding's handler took after the last step's check, before it let go: not passed on
        # to anything, nor pending for hand_over.
        if steps.stopped and command != "install":
            what = "the suite" if command == "test" and not rest else command
            raise _interrupted_install(steps, f"after installing, before {what}")
    except InstallStopped as exc:
        print(exc, file=sys.stderr, flush=True)
        return exc.status
    if command == "serve":
        return hand_over([str(python), "-m", "wok", "serve", *rest])
    if command == "test":
        if rest:
            return hand_over([str(python), "-m", "pytest", *rest], cwd=ROOT)
        return run_suite(suite_passes(python, cpu_count()))
    return 0


def suite_passes(python: Path, cpus: int) -> list[list[str]]:
    """The pytest runs of the whole suite: on two or more CPUs, the files not marked `serial`
    on two workers (pytest-xdist, a file's tests together on one), then the `serial` ones
    alone, since they measure times or rates that a second worker's load would move. Each pass
    names its slowest tests at the end: what to look at when the suite grows slow."""
    pytest = [str(python), "-m", "pytest", "--durations=15"]
    if cpus < 2:
        return [pytest]
    return [[*pytest, "-n", "2", "--dist", "loadfile", "-m", "not serial"], [*pytest, "-m", "serial"]]


# Runs beside a pass, in a session of its own, and kills the pass's process group unless bootstrap
# says "done" before its end of the pipe closes: bootstrap killed outright (SIGKILL to it or to its
# group: `timeout -s KILL`, a CI runner) would otherwise leave the pass and its xdist workers running,
# as they are out of bootstrap's group.
# It starts with the signals that bootstrap passes on blocked (see `Forwarding.run`), their numbers
# after the group's: one sent to bootstrap's group before it left it (setsid) waits, pending, and is
# dropped here (ignoring a signal discards a pending one), then they are let through again.
PASS_GUARD = """
import os, signal, sys
held = [signal.Signals(int(arg)) for arg in sys.argv[2:]]
for sig in held:
    signal.signal(sig, signal.signal(sig, signal.SIG_IGN))
signal.pthread_sigmask(signal.SIG_UNBLOCK, held)
if sys.stdin.buffer.read() != b"done":
    try:
        os.killpg(int(sys.argv[1]), signal.SIGKILL)
    except ProcessLookupError:
        pass
"""


def _die_with_bootstrap() -> Callable[[], None] | None:
    """A preexec_fn that kills the pass if bootstrap dies before its guard runs (Linux; else None).
    Its workers are started later than that, and the guard kills them."""
    if sys.platform != "linux":
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork, not in the child
    parent = os.getpid()

    def arm() -> None:
        prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # bootstrap ended before the line above: no signal will come
            os.kill(os.getpid(), signal.SIGKILL)

    return arm


def _guard(proc: subprocess.Popen, held: Iterable[int]) -> subprocess.Popen | None:
    """The pass's guard, started while bootstrap blocks the signals `held` (which it inherits)."""
    if os.name == "nt":
        return None
    return subprocess.Popen(
        [sys.executable, "-c", PASS_GUARD, str(proc.pid), *(str(int(s)) for s in held)],
        stdin=subprocess.PIPE,
        start_new_session=True,
    )


def _release(guard: subprocess.Popen | None) -> None:
    if guard is not None:
        guard.communicate(b"done")


class Forwarding:
    """Runs commands one at a time (`run`), each in a session of its own, and while in use (`with`)
    passes SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to bootstrap on to the running command's whole
    process group: pytest-xdist's workers and pip's build processes too, which a signal to the command
    alone would leave running. A terminal's Ctrl-C, Ctrl-\\ and hang-up reach bootstrap only (the
    command is out of the terminal's foreground group), so the command gets each once, and Ctrl-Z
    stops it with bootstrap. A signal that bootstrap was started ignoring (nohup) stays ignored. The
    handlers are in place before a command starts: a signal as it starts reaches it too, not bootstrap
    alone with the command orphaned. Bootstrap killed outright cannot pass anything on: then the
    command's guard (PASS_GUARD) kills its group, and the command dies with bootstrap before the guard
    runs. `stopped` holds the signals that came; what they stop is the caller's to decide.

    The signals it passes on, ignored ones too, are let through while in use, and so to the commands,
    which inherit the mask: a caller that started bootstrap with them blocked (a leftover of its own
    signal handling; ignoring one, as nohup, is the way to keep it out) would leave bootstrap's handlers
    and the command's own (pytest's on SIGINT, a `wok serve` it starts) never called, and the command
    running on. One sent to bootstrap while it was blocked comes as they are let through."""

    def __init__(self) -> None:
        self.stopped: list[int] = []
        self._running: list[subprocess.Popen] = []
        self._previous: dict = {}
        self._mask: set[int] | None = None  # the signal mask bootstrap had, where it has one (POSIX)

    def __enter__(self) -> Forwarding:
        handlers = {sig: self._forward for sig in passed_on()}
        if hasattr(signal, "SIGTSTP") and signal.SIGTSTP in handlers:
            handlers[signal.SIGTSTP] = self._suspend
        self._previous = {sig: signal.signal(sig, handler) for sig, handler in handlers.items()}
        if hasattr(signal, "pthread_sigmask"):  # after the handlers: a pending one comes here, to them
            # The ignored ones too, as hand_over does: the commands inherit the mask, and one held back
            # there would reach none of the processes they start that take it (a `wok serve` a test
            # starts). Ignored, one pending is dropped as it is let through.
            self._mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, passed_on(ignored_too=True))
        return self

    def __exit__(self, *exc) -> None:
        if self._mask is not None:  # first: one that comes after waits for the caller, as before
            signal.pthread_sigmask(signal.SIG_SETMASK, self._mask)
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    @contextmanager
    def _held(self) -> Iterator[None]:
        """Blocks the signals it handles: one that comes meanwhile is handled as the block ends."""
        if not hasattr(signal, "pthread_sigmask"):  # Windows
            yield
            return
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, self._previous)  # handles those that came before it
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)

    def run(self, cmd: list[str], cwd: Path | None = None) -> int:
        """The command's exit status (negative: the signal that ended it)."""
        proc = subprocess.Popen(cmd, cwd=cwd, start_new_session=True, preexec_fn=_die_with_bootstrap())
        # Held back: one sent to bootstrap's group would end the guard until its setsid (it inherits the
        # block, and drops one that came); and its handler must not pass one on between the command's
        # becoming the running one and the check below, which would pass it on again.
        with self._held():
            guard = _guard(proc, self._previous)
            self._running.append(proc)
            if self.stopped:  # it came while the command started
                self._signal(proc, self.stopped[0])
        code = proc.wait()
        _release(guard)
        self._running.clear()
        return code

    @staticmethod
    def _signal(proc: subprocess.Popen, signum: int) -> None:
        if os.name == "nt":  # no process groups; a console's Ctrl-C reaches the command itself
            if signum == signal.SIGTERM:
                proc.terminate()
            return
        try:
            os.killpg(proc.pid, signum)  # its session's one process group has the command's id
        except ProcessLookupError:  # the command and all it started have ended
            pass

    def _forward(self, signum, frame) -> None:
        self.stopped.append(signum)
        if self._running:
            self._signal(self._running[0], signum)

    def _suspend(self, signum, frame) -> None:
        # SIGSTOP, as the kernel drops a SIGTSTP sent to the command: its process group is orphaned
        # (its parent, bootstrap, is in another session).
        if self._running:
            self._signal(self._running[0], signal.SIGSTOP)
        signal.signal(signal.SIGTSTP, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTSTP)  # stops here, until the shell's SIGCONT (fg, bg)
        signal.signal(signal.SIGTSTP, self._suspend)
        if self._running:
            self._signal(self._running[0], signal.SIGCONT)


def run_suite(passes: list[list[str]]) -> int:
    """Run the passes in turn from the checkout, their signals passed on (`Forwarding`); the first
    failing pass's status, else 0.

    A signal ends the suite: no further pass starts, and bootstrap says on one line where it stopped.
    Its status is then that of a pass that had failed before, which an interrupted run must not
    hide, else 128 + the signal's number (130 for Ctrl-C), as a shell reports an interrupted command.
    """
    status = 0
    failed: list[str] = []  # "pass N of M", for the line an interrupt prints

    def interrupted(where: str) -> int:
        why = f"{status}: {', '.join(failed)} had failed" if failed else 128 + steps.stopped[0]
        print(
            f"bootstrap: {signal.Signals(steps.stopped[0]).name} {where}; the suite stops there (status {why})",
            file=sys.stderr,
            flush=True,
        )
        return status or 128 + steps.stopped[0]

    with Forwarding() as steps:
        for number, cmd in enumerate(passes, 1):
            if not steps.stopped:
                print("+", " ".join(cmd), flush=True)
            if (
                steps.stopped
            ):  # since the last pass ended (or while the line above was written): this one does not start
                return interrupted(f"before pass {number} of {len(passes)}")
            code = steps.run(cmd, cwd=ROOT)
            if steps.stopped:
                return interrupted(f"in pass {number} of {len(passes)}")
            if code < 0:  # a signal that did not come through bootstrap (the OOM killer's): no further pass
                return status or 128 - code
            if code:
                failed.append(f"pass {number} of {len(passes)}")
                status = status or code
    return status


def cpu_count() -> int:
    """The CPUs this process may run on: its affinity where the OS has one (a container's cpuset,
    taskset), which os.cpu_count (the machine's) ignores."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # Windows, macOS
        return os.cpu_count() or 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
