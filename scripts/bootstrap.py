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
reach them, and the exit status is theirs. `test` alone runs the suite in two pytest passes (see
`suite_passes`), SIGTERM passed on, and exits with the first failing pass's status.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import venv
from collections.abc import Callable
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


def run(cmd: list[str]) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def ensure_venv(path: Path) -> Path:
    python = path / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    if not python.exists():
        venv.EnvBuilder(with_pip=True).create(path)
    return python


def pip(python: Path, *args: str) -> None:
    run([str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", *args])


def torch_to_install(requested: str | None, torch_imports: Callable[[], bool]) -> str | None:
    """The torch requirement to pip-install, or None to keep the environment's torch.

    A requested one (WOK_TORCH) is always installed, since the torch already there may not
    be the one asked for; otherwise the pinned version, only where torch does not import.
    """
    if requested:
        return requested
    return None if torch_imports() else f"torch=={TORCH_VERSION}"


def ensure_torch(python: Path, requested: str | None) -> None:
    def torch_imports() -> bool:
        return subprocess.run([str(python), "-c", "import torch"], capture_output=True).returncode == 0

    spec = torch_to_install(requested, torch_imports)
    if spec is None:
        return
    if has_nvidia_gpu():
        pip(python, spec)
        return
    # The CPU index carries "+cpu" builds, which pip prefers over PyPI's CUDA build of the
    # same version; where that index cannot be reached, a local CPU wheel (find-links) still wins.
    pip(python, "--extra-index-url", CPU_INDEX, "--retries", "1", spec)


def hand_over(cmd: list[str], cwd: Path | None = None) -> int:
    """Run `cmd` in place of this process, so that a signal sent to it (SIGTERM from a
    supervisor, Ctrl-C) stops the command itself instead of orphaning it."""
    if cwd is not None:
        os.chdir(cwd)
    sys.stdout.flush()
    sys.stderr.flush()
    if os.name == "nt":  # Windows' execv starts a new process and ends this one: the caller would stop waiting
        return subprocess.call(cmd)
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
    # Absolute: `test` runs from the checkout, whatever folder a relative WOK_VENV names.
    python = ensure_venv(Path(os.environ.get("WOK_VENV", ROOT / ".venv")).absolute())
    ensure_torch(python, os.environ.get("WOK_TORCH"))
    extras = "[test]" if command == "test" else ""
    pip(python, "-e", f"{ROOT}{extras}")
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
    alone, since they measure times or rates that a second worker's load would move."""
    pytest = [str(python), "-m", "pytest"]
    if cpus < 2:
        return [pytest]
    return [[*pytest, "-n", "2", "--dist", "loadfile", "-m", "not serial"], [*pytest, "-m", "serial"]]


def run_suite(passes: list[list[str]]) -> int:
    """Run the passes in turn from the checkout; the first failing status, else 0. A SIGTERM is
    passed on to the running pass, and a signal ends the suite there (Ctrl-C reaches the pass
    itself, as the terminal signals the whole foreground group). The handler is in place before
    a pass starts: a SIGTERM as it starts stops it too, not bootstrap alone with the pass orphaned."""
    status = 0
    stopped: list[int] = []
    running: list[subprocess.Popen] = []

    def forward(signum, frame):
        stopped.append(signum)
        if running:
            running[0].send_signal(signum)

    previous = signal.signal(signal.SIGTERM, forward)
    try:
        for cmd in passes:
            if stopped:  # between two passes: no further pass
                return 128 + stopped[0]
            print("+", " ".join(cmd), flush=True)
            proc = subprocess.Popen(cmd, cwd=ROOT)
            running.append(proc)
            if stopped:  # it came while the pass started
                proc.send_signal(stopped[0])
            while True:
                try:
                    code = proc.wait()
                    break
                except KeyboardInterrupt:  # the pass has it too: wait for it to end
                    stopped.append(signal.SIGINT)
            running.clear()
            if stopped or code < 0:  # no further pass
                return code if code > 0 else 128 + (stopped[0] if stopped else -code)
            status = status or code
    finally:
        signal.signal(signal.SIGTERM, previous)
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
